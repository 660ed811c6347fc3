#!/usr/bin/env python3
"""A pg_claim worker in Python (psycopg 3) for the example schema
(examples/schema.sql): it sends the messages of `outbox`.

    PGHOST=... PGDATABASE=app python3 examples/python/worker.py [--exit-when-empty]

Start as many as you like: together they serve the 8 slots of the fleet
'mailer' (claim_slots: a worker serves its own slot plus unserved ones, and
gives extras back to a newcomer). Each walks the share of its slots with
my_items, marks a message sent in the transaction that sends it, records a
failure when sending fails (retried with back-off, set aside after
MAILER_MAX_ATTEMPTS), sleeps until a notification says a message arrived for
one of its slots (or MAILER_POLL_S pass), reconnects with back-off when the
connection or the server goes away, and exits on SIGTERM or SIGINT (after the
message at hand), or with --exit-when-empty once its slots have nothing left.
It prints one line per event: slots, skipped, failed, dead, waiting, woken,
reconnecting, exit.

It needs its connection to be one server session: its claims are session
locks and it LISTENs. At start it compares the server process of its first
statement with the one the connection was opened with (behind a pooler
these differ: the pooler answers the start-up itself), and checks it again
with every claim; behind a pooler it refuses to work (status 2) unless
MAILER_SESSION_POOL=1 says the pool is in session mode. Behind a
transaction-mode pooler use leases instead (docs/leases.md).
"""
import os
import signal
import sys
import threading
import time

import psycopg
from psycopg import sql

NAME, N, BATCH = "mailer", 8, 50
MAX_ATTEMPTS = int(os.environ.get("MAILER_MAX_ATTEMPTS", "5"))
BACKOFF = os.environ.get("MAILER_BACKOFF", "10 seconds")
POLL_S = float(os.environ.get("MAILER_POLL_S", "30"))  # the fallback poll
EXIT_WHEN_EMPTY = "--exit-when-empty" in sys.argv[1:]
SESSION_POOL = os.environ.get("MAILER_SESSION_POOL") == "1"  # a pooler in session mode is in between
WORKER = f"python-{os.getpid()}"
STOP = threading.Event()


def say(*words):
    print(*words, flush=True)


class NotASession(Exception):
    """The connection is not one server session: a pooler in between."""


def send(conn, recipient, body, item):
    """Deliver one message. Here: a row in `deliveries`, in the caller's
    transaction; the reserved domain .invalid stands for a bounce."""
    if recipient.endswith(".invalid"):
        raise RuntimeError(f"550 no such mailbox: {recipient}")
    conn.execute("INSERT INTO deliveries (outbox_id, worker) VALUES (%s, %s)", (item, WORKER))


# docs/workers.md: begin
FETCH = """
    SELECT o.id, o.recipient, o.body, o.sent_at IS NULL AS pending, f.state AS failure
    FROM my_items(NULL::outbox, %s, %s, after => %s, pending => 'sent_at', batch => %s) o
    LEFT JOIN item_failures(%s) f ON f.item = o.id::text"""
CLAIM = "SELECT claim_slots(%s, %s, %s, '1 second'), pg_backend_pid()"
# seconds until the first retry of a failed, still unsent message of this
# session's slots; NULL: none (a record of a message sent meanwhile by another
# kind of worker does not count)
NEXT_RETRY = """
    SELECT extract(epoch FROM min(f.retry_at) - clock_timestamp())
    FROM item_failures(%s) f JOIN outbox o ON o.id = f.item::bigint AND o.sent_at IS NULL
    WHERE f.state <> 'dead' AND slot_of(o.id, %s) = ANY (my_slots(%s))"""


def claim(conn, server):
    """This session's slots, claimed again: its own plus unserved ones."""
    held, pid = conn.execute(CLAIM, (NAME, N, N)).fetchone()
    if pid != server:  # a transaction-mode pooler: the claim stays with another connection
        raise NotASession(f"claim_slots ran in server process {pid}, not {server}:"
                          " the pool is not in session mode")
    return held


def process(conn, item, recipient, body, failure):
    """Send one message and mark it sent in one transaction; record a failure."""
    try:
        with conn.transaction():
            if conn.execute("UPDATE outbox SET sent_at = now() WHERE id = %s AND sent_at IS NULL",
                            (item,)).rowcount == 0:
                say("skipped", item)  # sent meanwhile by another kind of worker (docs/migrating.md)
                return
            send(conn, recipient, body, item)
            if failure is not None:  # it failed before: forget that
                conn.execute("SELECT clear_failure(%s, %s)", (NAME, str(item)))
    except psycopg.Error:
        raise  # the database's error, not the message's: never recorded as its failure
    except Exception as e:  # the delivery failed
        (state,) = conn.execute("SELECT record_failure(%s, %s, %s, %s, %s)",
                                (NAME, str(item), str(e), MAX_ATTEMPTS, BACKOFF)).fetchone()
        say("failed" if state == "retry" else "dead", item, e)


def serve(conn, server):
    """Work until told to stop (True) or the share is empty (False)."""
    slots, after, busy, quiet = [], {}, set(), {}
    while not STOP.is_set():
        # between batches: take unserved slots, give one back to a waiting newcomer
        held = claim(conn, server)
        for s in set(slots) ^ set(held):  # LISTEN on the channels of the slots held
            (channel,) = conn.execute("SELECT slot_channel(%s, %s)", (NAME, s)).fetchone()
            verb = "LISTEN" if s in held else "UNLISTEN"
            conn.execute(sql.SQL(verb + " {}").format(sql.Identifier(channel)))
            after.pop(s, None)
            busy.discard(s)
            quiet[s] = False
        if held != slots:
            say("slots", *held)
        slots = held
        for s in slots:  # one batch of each slot's share
            rows = conn.execute(FETCH, (s, N, after.get(s), BATCH, NAME)).fetchall()
            due = [r for r in rows if r[3] and r[4] in (None, "due")]
            for item, recipient, body, _, failure in due:
                if STOP.is_set():
                    return True
                process(conn, item, recipient, body, failure)
            if due:
                busy.add(s)
                quiet[s] = False
            if len(rows) < BATCH:  # the share is walked: quiet if nothing was due
                after.pop(s, None)
                quiet[s] = s not in busy
                busy.discard(s)
            else:
                after[s] = str(rows[-1][0])
        if not slots or not all(quiet[s] for s in slots):
            continue
        (retry_in,) = conn.execute(NEXT_RETRY, (NAME, N, NAME)).fetchone()
        if retry_in is None and EXIT_WHEN_EMPTY:
            return False
        say("waiting")
        # at least 0.1 s: a retry due now is fetched by the next pass, not by a busy loop
        until = time.monotonic() + (POLL_S if retry_in is None else min(POLL_S, max(float(retry_in), 0.1)))
        while time.monotonic() < until and not STOP.is_set():
            if wait(conn, min(until - time.monotonic(), 1)):
                say("woken")
                break
            # each second: claim again, as another worker may have given a slot up for this one
            if claim(conn, server) != slots:
                break
        quiet = dict.fromkeys(slots, False)  # woken or not: walk every share again
    return True
# docs/workers.md: end


def wait(conn, seconds):
    """Until a notification arrives (True), `seconds` pass or STOP is set."""
    deadline = time.monotonic() + seconds
    while not STOP.is_set() and (left := deadline - time.monotonic()) > 0:
        for _ in conn.notifies(timeout=min(left, 0.5), stop_after=1):
            return True
    return False


def check_session(conn):
    """The server process of this connection; refuses one behind a pooler."""
    (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()
    if pid != conn.info.backend_pid and not SESSION_POOL:
        raise NotASession(
            f"the server process (pid {pid}) is not the one the connection was opened with"
            f" (pid {conn.info.backend_pid}): a connection pooler is in between. This worker holds"
            " its slots with session locks and LISTENs, which need one server session per connection:"
            " connect to PostgreSQL directly, or through a pool in session mode and set"
            " MAILER_SESSION_POOL=1. Behind a transaction-mode pooler use leases (docs/leases.md).")
    return pid


def main():
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: STOP.set())
    pause = 0.1
    while True:
        try:
            with psycopg.connect(autocommit=True, application_name=NAME) as conn:
                pause = 0.1
                told = serve(conn, check_session(conn))
            say("exit", "told to stop" if told else "nothing left")
            return 0
        except NotASession as e:
            say("exit", "refused:", e)
            return 2
        except psycopg.OperationalError as e:  # the server restarted, the network failed, ...
            say("reconnecting", f"in {pause:g} s:", str(e).strip().splitlines()[0])
            if STOP.wait(pause):
                say("exit", "told to stop")
                return 0
            pause = min(pause * 2, 5)


if __name__ == "__main__":
    sys.exit(main())
