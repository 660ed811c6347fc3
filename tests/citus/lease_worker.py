#!/usr/bin/env python3
"""One worker of the Citus lease fleet (tests/citus/lease.py): a
pg_claim.Worker in lease mode through PgBouncer on the coordinator.

Its share of `orders` (distributed by skey, routed to slots by `cust`) comes
from the library's fetch (my_items); its handler writes each batch with
statements that name the slot's shard key, so each is one task on the node
of that shard: the UPDATE of the batch's rows, and their rows of the
processing log (distributed by skey too, colocated with `orders`), each
with its place in the global order of processing (the coordinator's
sequence log_ord). Events on stdout, one JSON line each (fleet_worker):
"fetch" (with sharded: true or false) for each of the library's fetches, "count" for each count window
of its balance (in a fetch's message, or a census's), "handled" for each batch.

With LEASE_SHARD_KEYS (a JSON object: slot -> shard key), the worker is
given shard_column="skey" and those shard_keys: its fetches and count
windows name the slot's shard key too, each one task on the slot's shard.

Environment: LEASE_DSN, LEASE_LABEL, LEASE_N, LEASE_TTL_S, LEASE_BATCH,
LEASE_ITEM_US, LEASE_SHARD_KEYS (optional).
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
import fleet_worker  # noqa: E402
import pg_claim  # noqa: E402
from psycopg import sql  # noqa: E402

NAME = "citus_orders"
MARK = "UPDATE orders SET done = true WHERE skey = %s AND id = ANY(%s::bigint[])"
LABEL = os.environ["LEASE_LABEL"]
ITEM_US = int(os.environ["LEASE_ITEM_US"])
emit = fleet_worker.emitter(LABEL)


def handle(tx, rows):
    keys = {r["skey"] for r in rows}
    if len(keys) != 1:
        raise RuntimeError(f"a batch of slot {rows.slot} holds the shard keys {sorted(keys)}")
    (key,) = keys
    ids = [r["id"] for r in rows]
    time.sleep(ITEM_US * len(ids) / 1e6)
    tx.execute(MARK, (key, ids))
    (ords,) = tx.execute("SELECT array_agg(nextval('log_ord') ORDER BY g) FROM generate_series(1, %s) g",
                         (len(ids),)).fetchone()
    values = sql.SQL(", ").join(
        sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Literal, (key, r["id"], r["cust"], r["seq"], o,
                                                                     LABEL, rows.slot, rows.token))))
        for r, o in zip(rows, ords))
    tx.execute(sql.SQL("INSERT INTO processing_log (skey, item, cust, seq, ord, worker, slot, token)"
                       " VALUES {}").format(values))
    emit("handled", slot=rows.slot, token=rows.token, skey=key, items=len(ids))


class Worker(pg_claim.Worker):
    """The library's worker, reporting each fetch it sends (its _begin with a fetch)."""

    def _begin(self, conn, slot, token, fetch=None):
        rows = super()._begin(conn, slot, token, fetch)
        if fetch is not None:
            sharded = self.shard_keys is not None
            emit("fetch", slot=slot, rows=len(rows), sharded=sharded)
            if self._last_fetch[1] is not None:  # a count window of balance in the same message
                emit("count", slot=slot, pending=self._last_fetch[1][0], sharded=sharded)
        return rows


    def _census(self, conn, slots, own):
        super()._census(conn, slots, own)
        for slot in slots:  # one count window each, in one message
            emit("count", slot=slot, pending=None, sharded=self.shard_keys is not None)


def main():
    keys = os.environ.get("LEASE_SHARD_KEYS")
    shard = {} if keys is None else {"shard_column": "skey",
                                     "shard_keys": {int(s): k for s, k in json.loads(keys).items()}}
    w = Worker(os.environ["LEASE_DSN"], name=NAME, table="orders", n=int(os.environ["LEASE_N"]),
               pending="done", key="id", route="cust", batch=int(os.environ["LEASE_BATCH"]), mode="lease",
               ttl=float(os.environ["LEASE_TTL_S"]), poll_interval=0.2, handler=handle,
               on_event=lambda event, fields: emit(event, **fields), **shard)
    w.run()


if __name__ == "__main__":
    fleet_worker.run(main, emit, 120)
