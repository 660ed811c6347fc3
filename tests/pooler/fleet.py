#!/usr/bin/env python3
"""One lease worker in Python (psycopg 3), started by tests/pooler/run.py.

It connects through PgBouncer in pool_mode = transaction (the PG* environment
variables), claims a lease of FLEET_NAME with n = FLEET_N (a standby polls
until a slot is free), walks its share of `items` with my_items and writes
each batch in one transaction behind fence(); a thread renews the lease on
its own connection every FLEET_RENEW_S, whatever the batch does. It reports
every claim, batch, write, rejected write, lost lease and reconnection as
one JSON line on stdout.

The part between the "docs/leases.md" markers is shown verbatim in
docs/leases.md ("Worker loops"); run.py fails when the two differ.
"""
import datetime
import json
import os
import secrets
import socket
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
from fleet_worker import run  # noqa: E402

NAME = os.environ["FLEET_NAME"]
N = int(os.environ["FLEET_N"])
TTL = datetime.timedelta(seconds=float(os.environ["FLEET_TTL_S"]))
RENEW_S = float(os.environ["FLEET_RENEW_S"])
BATCH = int(os.environ["FLEET_BATCH"])
ITEM_S = float(os.environ["FLEET_ITEM_MS"]) / 1000
POLL_S = 0.2  # a standby's claim interval, and a walked share's pause
# one claim instance: this process, on this host (a pid is reused, the random part is not)
HOLDER = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"


def emit(event, **fields):
    print(json.dumps({"event": event, "worker": HOLDER, "t": time.time(), **fields}), flush=True)


def process(ids):
    time.sleep(ITEM_S * len(ids))  # the work on one batch (e-mails, calls, ...)


# docs/leases.md: begin
class Lease:
    """The lease of `slot`, renewed every RENEW_S by a thread of its own on a
    connection of its own, whatever the batch in progress does (a batch may
    wait in the pool behind other clients' transactions). `over` is set when
    the lease is lost (a renewal returned NULL, or none succeeded for a TTL)
    or given up (stop)."""

    def __init__(self, slot, token):
        self.slot, self.token, self.why = slot, token, None
        self.over = threading.Event()
        threading.Thread(target=self._renew, daemon=True).start()

    def stop(self):
        self.over.set()

    def _renew(self):
        valid_until, conn = time.monotonic() + TTL.total_seconds(), None
        while not self.over.wait(RENEW_S):
            asked = time.monotonic()
            try:
                conn = conn or psycopg.connect(autocommit=True, prepare_threshold=None)
                (until,) = conn.execute("SELECT renew_lease(%s, %s, %s, %s)",
                                        (NAME, self.slot, self.token, TTL)).fetchone()
            except psycopg.Error:  # again at the next period, on a new connection
                conn = None
                if time.monotonic() < valid_until:
                    continue
                until = None
            if until is None:
                self.why = "renew_lease returned NULL or failed for a TTL"
                self.over.set()
            else:
                valid_until = asked + TTL.total_seconds()
        if conn is not None:
            conn.close()


def work(conn, lease):
    """Process the share of the lease's slot until the lease is over; returns why."""
    slot, token, after = lease.slot, lease.token, None
    while not lease.over.is_set():
        rows = conn.execute(
            "SELECT id, done FROM my_items(NULL::items, %s, %s, after => %s, batch => %s)",
            (slot, N, after, BATCH)).fetchall()
        if not rows:  # the whole share is walked: start again from its beginning
            after = None
            time.sleep(POLL_S)
            continue
        after = str(rows[-1][0])
        todo = [item for item, done in rows if not done]
        if not todo:
            continue
        emit("fetched", slot=slot, token=token, items=len(todo))
        process(todo)  # a batch takes well under the TTL
        try:
            with conn.transaction():  # the batch's writes commit only if the lease is ours
                conn.execute("SELECT fence(%s, %s, %s)", (NAME, slot, token))
                conn.execute("UPDATE items SET done = true WHERE id = ANY(%s)", (todo,))
                conn.execute("INSERT INTO processing_log (item, worker, token)"
                             " SELECT unnest(%s::bigint[]), %s, %s", (todo, HOLDER, token))
        except psycopg.Error as e:
            if e.sqlstate != "PC001":
                raise
            emit("rejected", slot=slot, token=token, items=len(todo), how="PC001")
            return "fence raised PC001"
        emit("wrote", slot=slot, token=token, items=len(todo))
    return lease.why


def serve(conn):
    """Claim a lease (or wait as a standby) and work on it, again and again."""
    while True:
        row = conn.execute("SELECT slot, token FROM claim_lease(%s, %s, %s, %s)",
                           (NAME, N, HOLDER, TTL)).fetchone()
        if row is None:  # all n slots are leased: a standby
            time.sleep(POLL_S)
            continue
        lease = Lease(*row)
        emit("claimed", slot=lease.slot, token=lease.token)
        try:
            why = work(conn, lease)
        finally:
            lease.stop()
        emit("lost", slot=lease.slot, token=lease.token, why=why)


def main():
    while True:
        conn = None
        try:
            # PgBouncer 1.18 has no max_prepared_statements: no server-side prepares
            conn = psycopg.connect(autocommit=True, prepare_threshold=None)
            serve(conn)
        except psycopg.Error as e:
            # the connection is gone (a server restart, the network, the server
            # ending a session idle in a transaction for too long): connect and
            # claim again; the same holder gets its lease back if it is still its own
            if conn is not None and not (conn.broken or conn.closed):
                raise
            emit("reconnecting", error=str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            time.sleep(POLL_S)
        finally:
            if conn is not None:
                conn.close()
# docs/leases.md: end


if __name__ == "__main__":
    run(main, emit, float(os.environ.get("FLEET_LIFETIME_S", "100")))
