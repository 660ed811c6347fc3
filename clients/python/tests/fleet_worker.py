#!/usr/bin/env python3
"""A worker of the fleet test (fleet.py): pg_claim.Worker in lease mode on
the table `items`, through the pooler (FLEET_DSN), LISTENing through a direct
connection when FLEET_NOTIFY_DSN is set. The handler works ITEM_MS per item
(inside the batch's fenced transaction), marks the items done and logs them
with the batch's slot and token; an item whose payload is 'poison' raises.
Every event of the worker is a JSON line on stdout."""
import json
import os
import sys
import threading
import time

import pg_claim

ITEM_S = float(os.environ.get("FLEET_ITEM_MS", "10")) / 1000


_out = threading.Lock()  # events come from the worker's threads: one line at a time


def emit(event, **fields):
    line = json.dumps(dict(event=event, **fields), default=str)
    with _out:
        print(line, flush=True)


def handle(tx, rows):
    for r in rows:
        if r["payload"] == "poison":
            raise RuntimeError(f"poison item {r['id']}")
    time.sleep(ITEM_S * len(rows))  # the work (I/O), inside the fenced transaction
    ids = [r["id"] for r in rows]
    tx.execute("UPDATE items SET done = true WHERE id = ANY(%s)", (ids,))
    tx.execute("INSERT INTO processing_log (item, holder, slot, token)"
               " SELECT unnest(%s::bigint[]), %s, %s, %s", (ids, worker.holder, rows.slot, rows.token))


worker = pg_claim.Worker(
    os.environ["FLEET_DSN"], name="fleet", table="items", n=int(os.environ.get("FLEET_N", "8")),
    pending="done", batch=int(os.environ.get("FLEET_BATCH", "10")), mode="lease",
    ttl=float(os.environ.get("FLEET_TTL_S", "2")), handler=handle,
    notify_conninfo=os.environ.get("FLEET_NOTIFY_DSN") or None,
    poll_interval=float(os.environ.get("FLEET_POLL_S", "0.5")),
    max_attempts=int(os.environ.get("FLEET_MAX_ATTEMPTS", "3")), backoff="100 milliseconds",
    on_event=lambda event, fields: emit(event, **fields))

if __name__ == "__main__":
    worker.run()
    emit("exit")
    sys.exit(0)
