"""One worker of the tenants benchmark (bench/tenants.py): pg_claim.Worker
in lease mode (clients/python) through the pooler (TEN_DSN), holder
TEN_LABEL, in one of five schemes on the table `items`:

  key     rows mapped by id (slot_of(id, n)), each slot in key order: no
          cap on the workers of one tenant, no fairness;
  fair    rows mapped by id, fair => 'tenant': each batch takes the slot's
          tenants in turn (my_items_fair), no cap;
  spread  route => 'tenant', spread => k: a tenant on at most k slots
          (slot_of_spread(tenant, id, n, k)), its batches fair;
  cap_w, cap_g  as fair, in a fleet the driver capped (cap_fleet).

The handler sleeps TEN_HANDLER_MS per row (I/O-bound work), then in one
statement of the batch's transaction marks the rows done (done_at, times +
1) and writes one row per tenant of the batch into tenant_log (worker,
slot, tenant, start and end of the handler's work): the driver computes from it
the most workers on one tenant at once. Events are JSON lines on stdout
(tests/pylib/fleet_worker.py); SIGTERM: the batch at hand is finished, then
the worker leaves.
"""
import datetime
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
import pg_claim  # noqa: E402
from fleet_worker import emitter, run  # noqa: E402

SCHEME = os.environ["TEN_SCHEME"]
LABEL = os.environ["TEN_LABEL"]
DSN = os.environ["TEN_DSN"]
NAME = os.environ["TEN_NAME"]
N = int(os.environ["TEN_N"])
K = int(os.environ["TEN_K"])
BATCH = int(os.environ.get("TEN_BATCH", "50"))
ROW_S = float(os.environ.get("TEN_HANDLER_MS", "2")) / 1000
TTL_S = float(os.environ.get("TEN_TTL_S", "5"))
LIFETIME_S = float(os.environ.get("TEN_LIFETIME_S", "900"))

emit = emitter(LABEL)
EVENTS = {"started", "slots", "rejected", "claim_failed", "reconnecting", "left", "leave_failed", "stopped"}
MARK = ("WITH u AS (UPDATE items SET done_at = clock_timestamp(), times = times + 1 WHERE id = ANY(%s)"
        " RETURNING tenant)"
        " INSERT INTO tenant_log (worker, slot, tenant, started, ended) SELECT %s, %s, tenant, %s, %s FROM u GROUP BY tenant")


def handle(tx, rows):
    start = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(ROW_S * len(rows))
    end = datetime.datetime.now(datetime.timezone.utc)
    tx.execute(MARK, ([r["id"] for r in rows], LABEL, rows.slot, start, end))


def main():
    options = {"key": {}, "fair": {"fair": "tenant"}, "spread": {"route": "tenant", "spread": K},
               "cap_w": {"fair": "tenant"}, "cap_g": {"fair": "tenant"}}[SCHEME]
    worker = pg_claim.Worker(
        DSN, name=NAME, table="items", n=N, pending="done_at", batch=BATCH, mode="lease", ttl=TTL_S,
        holder=LABEL, poll_interval=0.1, handler=handle,
        on_event=lambda event, fields: event in EVENTS and emit(event, **fields), **options)
    worker.run()
    emit("exit")


if __name__ == "__main__":
    run(main, emit, LIFETIME_S)
