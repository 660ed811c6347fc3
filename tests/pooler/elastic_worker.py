#!/usr/bin/env python3
"""One elastic lease worker in Python, started by tests/pooler/test_elastic.py
and tests/pooler/test_balance.py: a pg_claim.Worker (clients/python, psycopg
3) in lease mode.

It connects through PgBouncer in pool_mode = transaction (the PG* environment
variables) and holds, with the holder ELASTIC_HOLDER, every slot of the n =
ELASTIC_N slots of ELASTIC_NAME its share gives it: the library calls
claim_leases(..., ttl => ELASTIC_TTL_S) every ELASTIC_PERIOD_S on a
connection of its own, walks each held slot's share of `items` (routed by
customer) in batches of ELASTIC_BATCH and calls the handler below once per
batch inside the batch's transaction, which passed fence() first. The
handler works ELASTIC_ITEM_MS per item, then marks the rows done and logs
each item with the holder, the slot and the token. On SIGTERM the library
finishes its batch, gives every slot back (claim_leases(..., max => 0)) and
run() returns: exit 0.

With ELASTIC_BALANCE=1 (test_balance.py) the library balances by remaining
work (docs/leases.md, "Balancing"): each batch reports its slot's weight
with report_backlog, and a slot the report says another holder wants is
released after the batch commits. The weight is the library's own: the
slot's pending rows ahead of its cursor, counted in windows (so the uneven
slots of test_balance.py are told apart). Without
ELASTIC_BALANCE, balance is off: claim_leases shares the slots by count
(test_elastic.py's floor/ceil shares).

Every event of the library is one JSON line on stdout, in the words the
tests read: "fetched" (the handler, before its work), "wrote" (a batch that
committed), "refused" (a write of the handler that failed: a worker stopped
past the ttl inside its batch finds its session ended by the server),
"rejected" (the fence refused the token, PC001), "held" (the held slots
changed: slot and token pairs), "gave" (a slot released on request: the
library's `lost` with reason "given back" told by the work loop, which
runs in the main thread, after the report of a batch; the claimer thread's
"given back" is claim_leases' own give-back), and the library's own names
for the others ("lost" with its reason, "started", "reconnecting",
"left", ...).
"""
import os
import sys
import threading
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "pylib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python", "src"))
import pg_claim  # noqa: E402
from fleet_worker import emitter, run  # noqa: E402

NAME = os.environ["ELASTIC_NAME"]
N = int(os.environ["ELASTIC_N"])
TTL_S = float(os.environ["ELASTIC_TTL_S"])
PERIOD_S = float(os.environ["ELASTIC_PERIOD_S"])
BATCH = int(os.environ["ELASTIC_BATCH"])
ITEM_S = float(os.environ["ELASTIC_ITEM_MS"]) / 1000
BALANCE = os.environ.get("ELASTIC_BALANCE") == "1"
POLL_S = 0.1  # an idle share's poll (the table has no notify_slot trigger)
HOLDER = os.environ.get("ELASTIC_HOLDER") or pg_claim.make_holder()
emit = emitter(HOLDER)
worker = None


def handle(tx, rows):
    """One batch: tx is the batch's connection inside its transaction, which
    passed fence(name, slot, token) first; rows a pg_claim.Batch."""
    ids = [r["id"] for r in rows]
    emit("fetched", slot=rows.slot, token=rows.token, items=len(ids))
    time.sleep(ITEM_S * len(ids))  # the work on one batch (e-mails, calls, ...)
    try:
        tx.execute("UPDATE items SET done = true WHERE id = ANY(%s)", (ids,))
        tx.execute("INSERT INTO processing_log (item, worker, slot, token)"
                   " SELECT unnest(%s::bigint[]), %s, %s, %s", (ids, HOLDER, rows.slot, rows.token))
    except psycopg.Error as e:  # e.g. the server ended the session idle in the transaction
        emit("refused", slot=rows.slot, token=rows.token, items=len(ids),
             how=(str(e).strip().splitlines() or [type(e).__name__])[0])
        raise  # the library rolls back, reconnects and claims again


def on_event(event, fields):
    if event == "batch":
        if fields["items"]:  # committed
            emit("wrote", **fields)
    elif event == "rejected":
        emit("rejected", how="PC001", **fields)
    elif event == "slots":
        emit("held", slots=sorted(worker.slots.items()), gained=fields["gained"], lost=fields["lost"])
    elif event == "lost" and fields["reason"] == "given back" \
            and threading.current_thread() is threading.main_thread():
        emit("gave", **fields)  # released after a batch's report said another holder wants it
    elif event not in ("idle", "woken"):
        emit(event, **fields)


def main():
    global worker
    worker = pg_claim.Worker("", name=NAME, table="items", n=N, pending="done", batch=BATCH, mode="lease",
                             ttl=TTL_S, renew_interval=PERIOD_S, route="customer", holder=HOLDER,
                             balance=BALANCE, poll_interval=POLL_S, handler=handle, on_event=on_event)
    worker.run()


if __name__ == "__main__":
    run(main, emit, float(os.environ.get("ELASTIC_LIFETIME_S", "120")))
