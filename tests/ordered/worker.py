#!/usr/bin/env python3
"""One ordered-outbox worker (psycopg 3), started by tests/ordered/test_ordered.py.

It sends the messages of `outbox` FIFO per customer: its share is every
customer whose customer_id maps to the slots it holds, which it walks with
my_items(..., route => 'customer_id', pending => 'sent_at') in id order.

  ORDERED_MODE=session  claim_slot('ordered', ORDERED_N), waiting as a standby
                        until a slot frees; its share is that slot of N
  ORDERED_MODE=group    a member of the dynamic group 'ordered': its share is
                        the partitions claim_partitions('ordered', ORDERED_N)
                        gives it, rebalanced after every round of batches;
                        on SIGTERM it leaves the group between two batches

A message listed in the table `faults` fails when sent: kind 'transient'
for its first `failures` attempts (the worker waits: it holds the customer
back and retries later), kind 'poison' always (the worker sets the message
aside in outbox_failed and goes on with the customer). Each failed attempt
is recorded in `attempts`. It reports its claims as JSON lines on stdout.

The part between the "docs/ordered.md" markers is shown verbatim in
docs/ordered.md ("The worker loop in Python"); test_ordered.py fails when
the two differ.
"""
import json
import os
import signal
import sys
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
from fleet_worker import run  # noqa: E402

MODE = os.environ["ORDERED_MODE"]
N = int(os.environ["ORDERED_N"])
BATCH = int(os.environ.get("ORDERED_BATCH", "50"))
ITEM_S = float(os.environ.get("ORDERED_ITEM_MS", "0.2")) / 1000
RETRY_S = 0.2  # how long a customer is held back after a transient failure
IDLE_S = 0.05  # pause when the share has nothing to send
stopping = False  # SIGTERM: leave between two batches


class Transient(Exception):
    """A failure worth retrying: the customer waits for this message."""


class Permanent(Exception):
    """A message that will never go: set it aside, the customer goes on."""


def emit(event, **fields):
    print(json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields}), flush=True)


class Mailer:
    """The application's side effect, with the failures of the `faults` table."""

    def __init__(self, conn):
        self.conn = conn
        self.faults = dict(conn.execute("SELECT item, kind FROM faults").fetchall())

    def send(self, item, customer, body):
        time.sleep(ITEM_S)  # the work (an SMTP call, an HTTP request, ...)
        kind = self.faults.get(item)
        if kind == "poison":
            raise Permanent(f"message {item} was rejected")
        if kind == "transient":
            (failed, allowed) = self.conn.execute(
                "SELECT (SELECT count(*) FROM attempts WHERE item = %s),"
                " (SELECT failures FROM faults WHERE item = %s)", (item, item)).fetchone()
            if failed < allowed:
                self.conn.execute("INSERT INTO attempts (item, customer_id, pid)"
                                  " VALUES (%s, %s, pg_backend_pid())", (item, customer))
                raise Transient(f"message {item}: try again later")


# docs/ordered.md: begin
def on_failure(error):
    """The application's choice for a message that failed: 'wait' holds its
    customer back until it is retried, 'set_aside' records it and goes on."""
    return "wait" if isinstance(error, Transient) else "set_aside"


class Share:
    """One slot's customers: their unsent messages, walked in id order."""

    def __init__(self, slot, n):
        self.slot, self.n = slot, n
        self.after = None  # the last id this pass went past; None: start a pass
        self.held = {}     # customer -> when to retry its failed message

    def step(self, conn, mailer):
        """Sends the next batch of this share; False when it had nothing to do."""
        now = time.monotonic()
        if self.held and min(self.held.values()) <= now:
            self.after = None  # a held customer's retry is due: walk from the start
        if self.after is None:  # a new pass retries every customer whose time came
            self.held = {c: t for c, t in self.held.items() if t > now}
        rows = conn.execute(
            "SELECT id, customer_id, body FROM my_items(NULL::outbox, %s, %s,"
            " route => 'customer_id', pending => 'sent_at', after => %s, batch => %s)",
            (self.slot, self.n, self.after, BATCH)).fetchall()
        if not rows:  # the end of the share: the next call starts a new pass
            self.after = None
            return False
        self.after = str(rows[-1][0])
        sent, failed, errors = [], [], []
        for item, customer, body in rows:
            if customer in self.held:
                continue  # an earlier message of this customer has not gone yet
            try:
                mailer.send(item, customer, body)
                sent.append(item)
            except (Transient, Permanent) as e:
                if on_failure(e) == "wait":
                    self.held[customer] = now + RETRY_S
                else:
                    failed.append(item)
                    errors.append(str(e))
        with conn.transaction():
            conn.execute("UPDATE outbox SET sent_at = now()"
                         " WHERE id = ANY(%s) AND sent_at IS NULL", (sent,))
            conn.execute(
                "WITH f AS (SELECT * FROM unnest(%s::bigint[], %s::text[]) AS f(id, error)),"
                " d AS (DELETE FROM outbox o USING f WHERE o.id = f.id AND o.sent_at IS NULL"
                "       RETURNING o.*, f.error)"
                " INSERT INTO outbox_failed SELECT * FROM d", (failed, errors))
        return bool(sent or failed)


def session_worker(conn, mailer):
    slot = None
    while slot is None:  # a standby until one of the N slots is free
        (slot,) = conn.execute("SELECT claim_slot('ordered', %s, '1 s')", (N,)).fetchone()
    emit("claimed", slot=slot, backend=conn.info.backend_pid)
    share = Share(slot, N)
    while True:
        if not share.step(conn, mailer):
            time.sleep(IDLE_S)


def group_worker(conn, mailer):
    shares = {}
    while not stopping:
        (parts,) = conn.execute("SELECT claim_partitions('ordered', %s)", (N,)).fetchone()
        # a partition this member just got starts a fresh walk (its previous
        # owner let it go after its last batch committed)
        if parts != list(shares):
            emit("partitions", partitions=parts)
        shares = {p: shares.get(p) or Share(p, N) for p in parts}
        busy = False
        for share in shares.values():
            busy |= share.step(conn, mailer)
        if not busy:
            time.sleep(IDLE_S)
    conn.execute("SELECT group_leave('ordered')")
# docs/ordered.md: end


def main():
    def stop(_sig, _frame):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)
    with psycopg.connect(autocommit=True, application_name=f"ordered-{MODE}") as conn:
        mailer = Mailer(conn)
        if MODE == "session":
            session_worker(conn, mailer)
        else:
            group_worker(conn, mailer)
            emit("left")


if __name__ == "__main__":
    run(main, emit, float(os.environ.get("ORDERED_LIFETIME_S", "170")))
