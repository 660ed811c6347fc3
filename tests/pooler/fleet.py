#!/usr/bin/env python3
"""One lease worker in Python, started by tests/pooler/test_fleets.py: a
pg_claim.Worker (clients/python, psycopg 3) in lease mode.

It connects through PgBouncer in pool_mode = transaction (the PG* environment
variables) and serves the fleet FLEET_NAME of n = FLEET_N slots of the table
`items`: the library claims (claim_leases every ttl / 3 on a connection of
its own), walks each held slot's share and calls the handler below once per
batch inside the batch's transaction, which passed fence() first. The
handler works FLEET_ITEM_MS per item, then marks the rows done and logs each
item with the holder and the token. It reports as one JSON line on stdout
each batch it fetched ("fetched", from inside the transaction), each batch
committed ("wrote"), each write of the handler that failed ("refused": a
worker stopped past the TTL finds its session ended), every change of the
held slots ("slots") and every event of the library.

The part between the "docs/leases.md" markers is shown verbatim in
docs/leases.md ("Worker loops"); test_claim_slot.py fails when the two differ.
"""
import os
import sys
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "pylib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python", "src"))
import pg_claim  # noqa: E402
from fleet_worker import emitter, run  # noqa: E402

NAME = os.environ["FLEET_NAME"]
N = int(os.environ["FLEET_N"])
TTL_S = float(os.environ["FLEET_TTL_S"])
BATCH = int(os.environ["FLEET_BATCH"])
ITEM_S = float(os.environ["FLEET_ITEM_MS"]) / 1000
HOLDER = pg_claim.make_holder()  # host:pid:random
emit = emitter(HOLDER)


def process(ids):
    time.sleep(ITEM_S * len(ids))  # the work on one batch (e-mails, calls, ...)


# docs/leases.md: begin
def handle(tx, rows):
    """One batch: tx is the batch's connection inside its transaction, which
    passed fence(name, slot, token) first; rows a pg_claim.Batch."""
    ids = [r["id"] for r in rows]
    emit("fetched", slot=rows.slot, token=rows.token, items=len(ids))
    process(ids)
    try:
        tx.execute("UPDATE items SET done = true WHERE id = ANY(%s)", (ids,))
        tx.execute("INSERT INTO processing_log (item, worker, token)"
                   " SELECT unnest(%s::bigint[]), %s, %s", (ids, HOLDER, rows.token))
    except psycopg.Error as e:  # e.g. the server ended the session idle in the transaction
        emit("refused", slot=rows.slot, token=rows.token, items=len(ids),
             how=(str(e).strip().splitlines() or [type(e).__name__])[0])
        raise  # the library rolls back, reconnects and claims again


def on_event(event, fields):
    if event == "batch" and fields["items"]:  # committed
        emit("wrote", **fields)
    else:
        emit(event, **fields)


def main():
    pg_claim.Worker("", name=NAME, table="items", n=N, pending="done", batch=BATCH, mode="lease",
                    ttl=TTL_S, holder=HOLDER, poll_interval=0.2, handler=handle,
                    balance=os.environ.get("FLEET_BALANCE") != "0", on_event=on_event).run()
# docs/leases.md: end


if __name__ == "__main__":
    run(main, emit, float(os.environ.get("FLEET_LIFETIME_S", "100")))
