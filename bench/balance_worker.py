"""One worker of the balance benchmark (bench/balance.py), in one of two
schemes with the same handler, rows and connection (the pooler, BAL_DSN):

  lease  pg_claim.Worker in lease mode (clients/python), holder BAL_LABEL;
  queue  a FOR UPDATE SKIP LOCKED loop: per batch one transaction that
         locks up to BAL_BATCH pending rows in key order, runs the handler
         and commits (the handler's time is inside the transaction, as in
         the Worker's fenced batch; idle_in_transaction_session_timeout is
         the lease's ttl in both, so a worker stopped in a batch loses its
         rows after a ttl in both).

The handler sleeps BAL_HANDLER_MS per row (I/O-bound work), then marks the
rows done: done_at, done_by (this worker's label) and times + 1, which the
driver checks is 1 for every row. Events are JSON lines on stdout
(tests/pylib/fleet_worker.py): "started" before the first claim or query,
"ready" after the queue's first query, the Worker's events of EVENTS
(none per batch), "exit".
SIGTERM: the batch at hand is finished, then the worker leaves (the Worker
gives its slots back with claim_leases(..., max => 0)).
"""
import os
import signal
import sys
import threading
import time

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
import pg_claim  # noqa: E402
from fleet_worker import emitter, run  # noqa: E402

SCHEME = os.environ["BAL_SCHEME"]
LABEL = os.environ["BAL_LABEL"]
DSN = os.environ["BAL_DSN"]
NAME = os.environ.get("BAL_NAME", "balance")
N = int(os.environ.get("BAL_N", "8"))
ROUTE = os.environ.get("BAL_ROUTE") or None
BATCH = int(os.environ.get("BAL_BATCH", "50"))
ROW_S = float(os.environ.get("BAL_HANDLER_MS", "2")) / 1000
TTL_S = float(os.environ.get("BAL_TTL_S", "5"))
POLL_S = float(os.environ.get("BAL_POLL_S", "0.1"))
LIFETIME_S = float(os.environ.get("BAL_LIFETIME_S", "900"))

emit = emitter(LABEL)
# BAL_BACKLOG="NAME=VALUE,...": constants of the library's weight counting
# (pg_claim/_backlog.py) set for a trial of another rule; MODULE.NAME for
# another module of the library (_claimer.HUNGRY_S=0.1)
for setting in filter(None, os.environ.get("BAL_BACKLOG", "").split(",")):
    key, value = setting.split("=")
    module, _, key = key.rpartition(".")
    setattr(getattr(pg_claim, module or "_backlog"), key, int(value) if value.isdigit() else float(value))
# the Worker's events the driver reads (not one per batch: the queue sends none)
EVENTS = {"started", "slots", "rejected", "claim_failed", "reconnecting", "left", "leave_failed", "stopped"}
MARK = "UPDATE items SET done_at = clock_timestamp(), done_by = %s, times = times + 1 WHERE id = ANY(%s)"


def handle(tx, ids):
    """The work of both schemes: ROW_S per row, then the rows marked done."""
    if ROW_S:
        time.sleep(ROW_S * len(ids))
    tx.execute(MARK, (LABEL, ids))


def lease(balance=True):
    worker = pg_claim.Worker(
        DSN, name=NAME, table="items", n=N, pending="done_at", batch=BATCH, mode="lease",
        ttl=TTL_S, route=ROUTE, holder=LABEL, poll_interval=POLL_S, balance=balance,
        handler=lambda tx, rows: handle(tx, [r["id"] for r in rows]),
        on_event=lambda event, fields: event in EVENTS and emit(event, **fields))
    worker.run()  # SIGTERM: worker.stop() (its own handler, main thread)


def queue():
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    conn = None
    first = True
    emit("started")
    while not stop.is_set():
        try:
            if conn is None:
                conn = psycopg.connect(DSN, autocommit=True, prepare_threshold=None,
                                       application_name=f"balance queue {LABEL}")
            with conn.transaction():
                conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                             (str(int(TTL_S * 1000)),))
                ids = [r[0] for r in conn.execute(
                    "SELECT id FROM items WHERE done_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                    (BATCH,))]
                if ids:
                    handle(conn, ids)
            if first:
                emit("ready")
                first = False
            if not ids:
                stop.wait(POLL_S)
        except psycopg.Error as e:  # a lost connection (a pause past the ttl, a pooler restart): again
            emit("reconnecting", error=str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            if conn is not None:
                conn.close()
            conn = None
            stop.wait(0.1)
    if conn is not None:
        conn.close()


def main():
    if SCHEME == "queue":
        queue()
    else:  # lease: balanced by remaining work (the default); count: balance=False
        lease(balance=SCHEME == "lease")
    emit("exit")


if __name__ == "__main__":
    run(main, emit, LIFETIME_S)
