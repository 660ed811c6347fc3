#!/usr/bin/env python3
"""A worker of the resize fleet test (test_resize.py) and of `scripts/bench
resize`: pg_claim.Worker in lease mode through the pooler (RESIZE_DSN) on
the ordered outbox, routed by customer with the jump mapping. The handler
works RESIZE_ITEM_MS per message, marks the batch's messages sent and logs each, in id order, in the batch's
transaction (sent_log: its seq, the item, the customer, the slot and token,
the time). Every event of the worker is a JSON line on stdout."""
import json
import os
import sys
import threading
import time

import pg_claim

ITEM_S = float(os.environ.get("RESIZE_ITEM_MS", "0")) / 1000

_out = threading.Lock()  # events come from the worker's threads: one line at a time


def emit(event, **fields):
    line = json.dumps(dict(event=event, **fields), default=str)
    with _out:
        print(line, flush=True)


def handle(tx, rows):
    time.sleep(ITEM_S * len(rows))  # the work (I/O), inside the fenced transaction
    ids = [r["id"] for r in rows]
    tx.execute("UPDATE outbox SET sent_at = clock_timestamp() WHERE id = ANY(%s)", (ids,))
    tx.execute("INSERT INTO sent_log (item, customer_id, slot, token, holder)"
               " SELECT o.id, o.customer_id, %s, %s, %s FROM outbox o WHERE o.id = ANY(%s) ORDER BY o.id",
               (rows.slot, rows.token, worker.holder, ids))


worker = pg_claim.Worker(
    os.environ["RESIZE_DSN"], name=os.environ.get("RESIZE_NAME", "resize"), table="outbox",
    n=int(os.environ["RESIZE_N"]), pending="sent_at", key="id", route="customer_id", method="jump",
    batch=int(os.environ.get("RESIZE_BATCH", "50")), mode="lease", ttl=float(os.environ.get("RESIZE_TTL_S", "2")),
    poll_interval=0.2, balance=os.environ.get("RESIZE_BALANCE", "1") != "0", handler=handle, on_event=lambda event, fields: emit(event, **fields))

if __name__ == "__main__":
    emit("holder", holder=worker.holder)
    worker.run()
    emit("exit")
    sys.exit(0)
