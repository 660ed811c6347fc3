#!/usr/bin/env python3
"""One worker of the fault fleet (tests/faults/test_faults.py): a pg_claim.Worker
(clients/python, psycopg 3) draining its share of the table FAULT_TABLE in
one of three modes:

- session: the library's session mode with at most one slot
  (claim_slots(name, n, 1) on its own connection; a standby waits in it);
  the handler reads the slot's fencing token with my_token(name);
- lease: the library's lease mode with at most one slot (claim_leases(name,
  n, holder, max => 1, ttl => ttl) every ttl / 3 on a connection of its
  own): the fleet has more workers than slots, the others hold none;
- elastic: the library's lease mode with every slot its share gives it
  (fewer workers than slots: some hold two), worked on in turn.

The library walks each held slot's share with my_items in key order and
calls the handler once per batch inside one transaction that passed the
slot's fence first (session mode: the session's own lock). The handler
writes the items' update and one row per item in processing_log (table,
item, worker, slot, token), so the log is the checker's record of who wrote
what with which token. Any broken connection (server stopped, backend
killed, failover, partition) makes the library reconnect with backoff and
claim again.

The server is found through FAULT_CONNINFO, which the driver gives as
`service=...` with PGSERVICEFILE naming a service file that it rewrites
after a failover: libpq reads that file at every connection, so the
library's reconnections follow the new primary.

Every change of the held slots ("held", with slot and token pairs), batch
fetched ("fetched", from inside the transaction, with the backend's pid),
batch committed ("wrote"), write that failed in the handler ("refused") and
every other event of the library is one JSON line on stdout for the driver.
"""
import os
import sys
import time

import psycopg
from psycopg import sql

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "pylib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python", "src"))
import pg_claim  # noqa: E402
from fleet_worker import emitter, run  # noqa: E402

MODE = os.environ["FAULT_MODE"]
NAME = os.environ["FAULT_NAME"]
TABLE = os.environ["FAULT_TABLE"]
N = int(os.environ["FAULT_N"])
TTL_S = float(os.environ["FAULT_TTL_S"])
BATCH = int(os.environ["FAULT_BATCH"])
ITEM_S = float(os.environ["FAULT_ITEM_MS"]) / 1000
HOLDER = os.environ.get("FAULT_HOLDER") or f"{MODE}-{os.getpid()}"
# the holder names the worker's sessions too (pg_stat_activity.application_name)
CONNINFO = f"{os.environ['FAULT_CONNINFO']} application_name={HOLDER}"
POLL_S = 0.1  # an idle share's poll (the tables have no notify_slot trigger)
emit = emitter(HOLDER)
worker = None
pid = [None]  # the backend of the last batch


def handle(tx, rows):
    """One batch, inside its transaction (fenced in lease mode)."""
    ids = [r["id"] for r in rows]
    token = rows.token
    pid[0] = tx.info.backend_pid
    try:
        if token is None:  # session mode: the token of the session's claim
            (token,) = tx.execute("SELECT my_token(%s)", (NAME,)).fetchone()
        emit("fetched", slot=rows.slot, token=token, items=len(ids), pid=pid[0])
        time.sleep(ITEM_S * len(ids))  # the work on one batch
        tx.execute(sql.SQL("UPDATE {} SET done = true WHERE id = ANY(%s)").format(rows.table), (ids,))
        tx.execute("INSERT INTO processing_log (tbl, item, worker, slot, token)"
                   " SELECT %s, unnest(%s::bigint[]), %s, %s, %s", (TABLE, ids, HOLDER, rows.slot, token))
    except psycopg.Error as e:  # a broken connection: the library reconnects and claims again
        emit("refused", slot=rows.slot, token=token, items=len(ids),
             error=(str(e).strip().splitlines() or [type(e).__name__])[0][:200])
        raise


def on_event(event, fields):
    if event == "slots":
        emit("held", slots=sorted(worker.slots.items()), pid=pid[0], gained=fields["gained"],
             lost=fields["lost"])
    elif event == "batch":
        if fields["items"]:
            emit("wrote", **fields)
    elif event not in ("idle", "woken"):
        emit(event, **fields)


def main():
    global worker
    while True:
        worker = pg_claim.Worker(
            CONNINFO, name=NAME, table=TABLE, n=N, pending="done", batch=BATCH, handler=handle,
            mode="session" if MODE == "session" else "lease", ttl=TTL_S, holder=HOLDER,
            max_slots=None if MODE == "elastic" else 1, poll_interval=POLL_S, on_event=on_event)
        try:
            worker.run()
            return
        except psycopg.errors.QueryCanceled as e:
            # a statement of the library's own cancelled (pg_cancel_backend,
            # the soak's cancel fault) ends run(), which gave the slots back:
            # the program starts the worker again (one in the handler is the
            # batch's failure: the library retries the batch item by item)
            emit("restarting", error=(str(e).strip().splitlines() or ["57014"])[0])


if __name__ == "__main__":
    run(main, emit, float(os.environ["FAULT_LIFETIME_S"]))
