"""What the pooler tests share (test_claim_slot.py, test_fleets.py,
test_wake.py, test_elastic.py, test_balance.py): the test database,
connections direct and through PgBouncer (the `pgbouncer` fixture's, or
scripts/test's: PGC_POOLER_PORT, PGC_POOLER_POOL), the library workers of
fleet.py and fleet.js, and what the fleet tests read of the leases."""
import os
import signal
import sys
import time

import psycopg

import harness
from harness import Failure, WorkerProcess, check, log, poll
from harness.server import ServerConnections, admin as pooler_admin

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DB = "pg_claim_pooler"
NAME = "fleet"
ITEMS = 3000
N = 8
PYTHON_WORKERS = 6
NODE_WORKERS = 6
TTL_S = 2.0
BATCH = 10
ITEM_MS = 8  # a batch of 10 is 80 ms of "work", inside its transaction
DIRECT_APP = "pg_claim pooler test (direct)"


def pooler_port():
    """The port of the PgBouncer in transaction mode in front of the server."""
    if "PGC_POOLER_PORT" not in os.environ:
        raise Failure("PGC_POOLER_PORT is not set (the pgbouncer fixture, or scripts/lib.sh pgc_pgbouncer_start)")
    return int(os.environ["PGC_POOLER_PORT"])


def pool_size():
    """Its server connections per database and user."""
    return int(os.environ.get("PGC_POOLER_POOL", "4"))


def direct(dbname=DB):
    """A direct connection to the server (PGHOST/PGPORT)."""
    return harness.connect(dbname=dbname, application_name=DIRECT_APP)


def pooled(dbname=DB):
    """A client connection through PgBouncer (no server-side prepares: 1.18)."""
    return harness.connect(host="127.0.0.1", port=pooler_port(), dbname=dbname, user="postgres",
                           prepare_threshold=None)


def admin(command):
    """A command of PgBouncer's admin console: its rows as dicts."""
    return pooler_admin(pooler_port(), command)


def check_pooler(db=DB):
    config = {r["key"]: r["value"] for r in admin("SHOW CONFIG")}
    check(config["pool_mode"] == "transaction" and int(config["default_pool_size"]) == pool_size(),
          f"PgBouncer runs pool_mode = {config['pool_mode']}, default_pool_size = {config['default_pool_size']}")
    version = admin("SHOW VERSION")[0]["version"]
    log(f"{version} on 127.0.0.1:{pooler_port()}: pool_mode = transaction, default_pool_size = {pool_size()}")
    # server connections of an earlier run to the database about to be re-created
    if any(r["database"] == db for r in admin("SHOW SERVERS")):
        admin(f"KILL {db}")
        admin(f"RESUME {db}")


# --------------------------------------------------------------------------
# 2. the fleets

class Worker(WorkerProcess):
    def __init__(self, lang, workdir, env):
        cmd = ([sys.executable, os.path.join(HERE, "fleet.py")] if lang == "python"
               else ["node", os.path.join(HERE, "fleet.js")])
        self.lang = lang
        super().__init__(cmd, env, os.path.join(workdir, f"{lang}-{len(os.listdir(workdir))}.err"))
        self.holder = f"{'py' if lang == 'python' else 'js'}-{self.pid}"  # for the log; the lease's
        # holder is host:pid:random (pid_of)

    def __str__(self):
        return self.holder


def server_connections(db):
    """harness.server.ServerConnections of db behind the layer's PgBouncer."""
    return ServerConnections(db, pooler_port(), DIRECT_APP)


def pid_of(holder):
    """The process id in a fleet worker's holder text, host:pid:random."""
    host, pid, rand = holder.split(":")
    check(host and len(rand) == 16, f"holder {holder!r} is not host:pid:random")
    return int(pid)


def holders(d):
    return {r[0]: r for r in d.execute(
        "SELECT slot, holder, token, acquired_at, expired FROM lease_holders(%s)", (NAME,)).fetchall()}


def balanced(d, workers, n=N):
    """Polls until every slot has a live lease of its own holder, and the
    holders are n different workers: {slot: row of lease_holders}."""
    pids = {w.pid for w in workers}

    def ok():
        h = holders(d)
        live = {s: r for s, r in h.items() if not r[4]}
        owners = {pid_of(r[1]) for r in live.values()}
        return live if len(live) == n and len(owners) == n and owners <= pids else None
    return poll(ok, 30, f"{n} live leases, one per worker")


def probe_stale_token(slot, token, db=DB, name=NAME, n=N):
    """The SQL-level guarantees, on a stale token of slot `slot` of the fleet
    `name` of n slots, through the pool to database `db`: fence raises PC001
    inside a transaction, lease_valid is false, and a write of the table
    `items` guarded by it in one statement touches no row (had it touched
    one, the processing log would show a duplicate)."""
    with pooled(db) as c:
        try:
            with c.transaction():
                c.execute("SELECT fence(%s, %s, %s)", (name, slot, token))
            raise Failure(f"fence passed the stale token {token} of slot {slot}")
        except psycopg.Error as e:
            check(e.sqlstate == "PC001", f"fence on a stale token: {e.sqlstate} {e}")
        (valid,) = c.execute("SELECT lease_valid(%s, %s, %s)", (name, slot, token)).fetchone()
        check(valid is False, f"lease_valid of the stale token {token} of slot {slot}: {valid}")
        cur = c.execute(
            """WITH done AS (
                 UPDATE items SET done = true
                 WHERE id IN (SELECT id FROM my_items(NULL::items, %(slot)s, %(n)s, batch => 10))
                   AND (SELECT lease_valid(%(name)s, %(slot)s, %(token)s))
                 RETURNING id)
               INSERT INTO processing_log (item, worker, token) SELECT id, 'probe', %(token)s FROM done""",
            {"slot": slot, "n": n, "name": name, "token": token})
        check(cur.rowcount == 0, f"a write behind lease_valid with the stale token wrote {cur.rowcount} rows")


def stop_mid_batch(w, item_ms=ITEM_MS, tries=10):
    """SIGSTOP w while its handler works on a batch (inside the batch's
    fenced transaction, before its write), item_ms per item: returns (slot,
    token, time of the stop)."""
    for _ in range(tries):
        since = len(w.events)
        ev = w.wait_event("fetched", since, 10)
        os.kill(w.pid, signal.SIGSTOP)
        stopped_at = time.time()
        # its process() sleeps item_ms per item after reporting the batch: a
        # stop sent well within that lands before its write
        if stopped_at < ev["t"] + 0.7 * ev["items"] * item_ms / 1000:
            poll(lambda: w.state() == "T", 5, f"{w} to stop")
            return ev["slot"], int(ev["token"]), stopped_at
        os.kill(w.pid, signal.SIGCONT)  # too late for this batch: the next one
    raise Failure(f"could not stop {w} in the middle of a batch")


def late_write_lost(d, w, since, slot, token, stopped_at):
    """w was stopped (SIGSTOP, stop_mid_batch at `stopped_at`) in its batch
    of slot `slot` with `token`, past the ttl, and resumed: from its event
    `since` on, the late write of that batch fails, and none of it lands in
    the processing log (slot, token: the elastic tests'). A library worker
    tries it in the batch's fenced transaction, which the server ended while
    it was stopped (idle_in_transaction_session_timeout = ttl): the
    handler's write fails with the session ("refused"); a fence that
    refuses the token says "rejected" (PC001). The event."""
    e = w.wait_event(("refused", "rejected", "wrote"), since, 15)
    check(e["event"] in ("refused", "rejected") and e["slot"] == slot and int(e["token"]) == token,
          f"{w}'s late write after its slot was taken over: {e}")
    (late,) = d.execute("SELECT count(*) FROM processing_log WHERE slot = %s AND token = %s"
                        " AND logged_at >= to_timestamp(%s)", (slot, token, stopped_at)).fetchone()
    check(late == 0, f"{w}'s late write with token {token} of slot {slot} landed: {late} log rows")
    return e
