#!/usr/bin/env python3
"""A pg_claim worker in Python on the worker library (clients/python, import
name pg_claim) for the example schema (examples/schema.sql): it sends the
messages of `outbox`.

    pip install "./clients/python[binary]"
    PGHOST=... PGDATABASE=app python3 examples/python/worker.py [--exit-when-empty]

Start as many as you like: together they serve the 8 slots of the fleet
'mailer'. This one runs in session mode (claim_slots, LISTEN) on a direct
connection and refuses to work (status 2) behind a pooler; MAILER_MODE=lease
runs it in lease mode, for a transaction-mode pooler. The library
walks the share of its slots, calls `send_batch` once per batch in one
transaction, records a failing message (retried with back-off, set aside
after MAILER_MAX_ATTEMPTS), sleeps until a notification (or MAILER_POLL_S),
reconnects when the server goes away, and stops on SIGTERM or SIGINT after
the batch at hand; with --exit-when-empty this program stops it once its
slots have nothing left. It prints one line per event: slots, skipped,
failed, dead, waiting, woken, reconnecting, exit.
"""
import os
import sys

import pg_claim

MAX_ATTEMPTS = int(os.environ.get("MAILER_MAX_ATTEMPTS", "5"))
BACKOFF = os.environ.get("MAILER_BACKOFF", "10 seconds")
POLL_S = float(os.environ.get("MAILER_POLL_S", "30"))  # the fallback poll
EXIT_WHEN_EMPTY = "--exit-when-empty" in sys.argv[1:]
# session (claim_slots and LISTEN on a direct connection), or lease
# (claim_leases: through PgBouncer in transaction mode)
MODE = os.environ.get("MAILER_MODE", "session")
TTL = os.environ.get("MAILER_TTL", "30 seconds")  # lease mode: a dead worker's slots move on after this
WORKER = f"python-{os.getpid()}"
empty = []  # a true value once this program stopped the worker for having nothing left


def say(*words):
    print(*words, flush=True)


def send(tx, recipient, body, item):
    """Deliver one message. Here: a row in `deliveries`, in the batch's
    transaction; the reserved domain .invalid stands for a bounce."""
    if recipient.endswith(".invalid"):
        raise RuntimeError(f"550 no such mailbox: {recipient}")
    tx.execute("INSERT INTO deliveries (outbox_id, worker) VALUES (%s, %s)", (item, WORKER))


# docs/workers.md: begin
def send_batch(tx, rows):
    """One batch, in one transaction: what raises is retried message by message."""
    # the messages no one else sent or is sending (docs/migrating.md: a cut-over from a queue)
    mine = {i for (i,) in tx.execute(
        "UPDATE outbox SET sent_at = now() WHERE id IN (SELECT id FROM outbox WHERE id = ANY(%s)"
        " AND sent_at IS NULL FOR UPDATE SKIP LOCKED) RETURNING id", ([r["id"] for r in rows],))}
    for r in rows:
        if r["id"] not in mine:  # sent or being sent by another kind of worker; if unsent, next pass
            say("skipped", r["id"])
            continue
        send(tx, r["recipient"], r["body"], r["id"])


def on_event(event, f):
    if event == "slots":
        say("slots", *f["held"])
    elif event in ("failed", "dead"):
        say(event, f["item"], f["error"])
    elif event == "idle":
        if EXIT_WHEN_EMPTY and f["retry_in"] is None:  # nothing left to send or retry
            empty.append(True)
            worker.stop()
        else:
            say("waiting")
    elif event == "woken":
        say("woken")
    elif event == "reconnecting":
        say("reconnecting", f"in {f['pause']:g} s:", f["error"])


worker = pg_claim.Worker("", name="mailer", table="outbox", n=8, pending="sent_at", batch=50,
                         mode=MODE, ttl=TTL, handler=send_batch, max_attempts=MAX_ATTEMPTS,
                         backoff=BACKOFF, poll_interval=POLL_S, on_event=on_event)
# docs/workers.md: end


def main():
    try:
        worker.run()
    except pg_claim.PoolerError as e:
        say("exit", "refused:", e)
        return 2
    say("exit", "nothing left" if empty else "told to stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
