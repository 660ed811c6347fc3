"""A fleet of the Node.js library's workers (clients/node, pg-claim) through a
real PgBouncer in transaction mode (the `pgbouncer` fixture's), against a
server the test restarts (the `cluster` fixture: PGC_DATA, PGC_BIN, its data
directory and binaries; PGHOST/PGPORT direct).

Each worker (node_fleet_worker.js) is a pg-claim Worker in lease mode on
n = 8 slots, ttl 2 s, batches of 10; its handler works 10 ms per item inside
the fenced transaction, marks the rows done and logs them. Item POISON always
fails. A producer adds items all along. In turn:

1. three workers share the 8 slots (3/3/2), a fourth joins (2/2/2/2);
2. one is stopped with SIGSTOP in the middle of a batch, past the ttl: the
   server ends its fenced transaction (the library's idle-in-transaction
   limit), the three others take all 8 slots; resumed with SIGCONT, it
   reconnects and joins again;
3. one is killed with SIGKILL: its slots move once their leases expired;
4. one leaves with SIGTERM: it exits 0 at once and holds no lease after;
5. two join at once;
6. the server restarts (pg_ctl restart -m fast): every worker reconnects,
   and the fleet goes on;
7. the producer stops; the fleet drains the table; SIGTERM to every worker:
   each exits 0 within 15 s and no lease is left.

Then: every item but the poison one processed exactly once (the processing
log), by a holder of its slot, never with a token older than one already
written for that slot; the poison item dead after 3 attempts (item_failures)
and never written; no worker error; never more server connections than the
pool.
"""
import collections
import os
import signal
import subprocess
import time

import psycopg

import harness
from harness.server import ServerConnections
from harness import Failure, Producer, WorkerProcess, check, check_processing_log, failure_state, log, poll

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DB = "node_fleet"
NAME = "nodefleet"
N = 8
TTL_S = 2
BATCH = 10
ITEM_MS = 10
ITEMS = 2000
POISON = 1234
PRODUCE_PER_S = 50
SETTLE_S = 20
TIME_LIMIT_S = 240
DIRECT_APP = "pg_claim node fleet test (direct)"
LOST_REASONS = ("given back", "taken", "expired", "released")  # clients/node/README.md, lease mode


def direct(dbname=DB):
    return harness.connect(dbname, application_name=DIRECT_APP)


class Worker(WorkerProcess):
    def __init__(self, label, workdir, env):
        self.label = label
        super().__init__(["node", os.path.join(HERE, "node_fleet_worker.js")], env,
                         os.path.join(workdir, f"{label}.err"))
        self.holder = self.wait_event("started", 0, 20)["holder"]

    def __str__(self):
        return self.label


def leases(d):
    return {r[0]: (r[1], r[2]) for r in d.execute(
        "SELECT slot, holder, token FROM lease_holders(%s) WHERE NOT expired", (NAME,)).fetchall()}


def settle(d, live, what):
    """Poll until every slot is held by one of `live`, floor or ceil of n/H each."""
    want = {w.holder for w in live}

    def balanced():
        try:
            h = leases(d)
        except psycopg.Error:
            return None
        c = collections.Counter(holder for holder, _ in h.values())
        ok = len(h) == N and set(c) == want and max(c.values()) - min(c.values()) <= 1
        return h if ok else None
    t0 = time.monotonic()
    h = poll(balanced, SETTLE_S, f"{what}: the slots to be shared by {', '.join(map(str, live))}", 0.1)
    c = collections.Counter(holder for holder, _ in h.values())
    shares = "/".join(str(c[w.holder]) for w in live)
    log(f"  {what}: balanced after {time.monotonic() - t0:.1f} s ({shares})")
    return h


def terminate(w, within=15):
    """SIGTERM: the worker finishes its batch, gives its slots back, exits 0."""
    t0 = time.monotonic()
    os.kill(w.pid, signal.SIGTERM)
    try:
        rc = w.proc.wait(within)
    except subprocess.TimeoutExpired:
        raise Failure(f"{w} did not exit within {within} s of SIGTERM") from None
    check(rc == 0, f"{w} exited with {rc} after SIGTERM: {open(w.err_path).read()[-2000:]}")
    check(w.last(("left",)) is not None, f"{w} exited without giving its slots back")
    return time.monotonic() - t0


def done_count(d):
    return d.execute("SELECT count(*) FROM processing_log").fetchone()[0]


def test_node_fleet(workdir, databases, pgbouncer, cluster, fleet):
    """The seven steps above, then the checks of the processing log."""
    POOLER_PORT, POOL = pgbouncer.port, pgbouncer.pool
    databases(DB)
    with direct() as d:
        d.execute(f"""
            CREATE SEQUENCE item_ids;
            CREATE TABLE items (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
            INSERT INTO items (id) SELECT nextval('item_ids') FROM generate_series(1, {ITEMS});
            CREATE INDEX ON items ((slot_of(id, {N})), id) WHERE NOT done;
            CREATE TABLE processing_log (seq bigserial PRIMARY KEY, item bigint NOT NULL, worker text NOT NULL,
                                         slot integer NOT NULL, token bigint NOT NULL);
            ANALYZE items;""")
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(POOLER_PORT), PGDATABASE=DB, PGUSER="postgres",
               FLEET_NAME=NAME, FLEET_N=str(N), FLEET_TTL_S=str(TTL_S), FLEET_BATCH=str(BATCH),
               FLEET_ITEM_MS=str(ITEM_MS), FLEET_POISON=str(POISON), FLEET_LIFETIME_S=str(TIME_LIMIT_S))
    env.pop("PGSERVICE", None)
    d = direct()
    watcher = ServerConnections(DB, POOLER_PORT, DIRECT_APP)
    producer = Producer(direct, "INSERT INTO items (id) SELECT nextval('item_ids') FROM generate_series(1, %s)", PRODUCE_PER_S)
    workers, live, stopped = fleet.workers, [], []
    count = iter(range(1, 100))

    def start():
        w = Worker(f"js-{next(count)}", workdir, env)
        fleet.add(w)
        live.append(w)
        return w

    t0 = time.monotonic()
    try:
        log(f"Node.js library fleet: lease mode, n = {N}, ttl {TTL_S} s, batches of {BATCH}, through PgBouncer"
            f" (transaction mode, pool {POOL}); {ITEMS} items and {PRODUCE_PER_S} more a second")
        for _ in range(3):
            start()
        settle(d, live, "3 workers")
        start()
        settle(d, live, "a join")

        # SIGSTOP in the middle of a batch (inside its fenced transaction), past the ttl
        w = live[0]
        since = len(w.events)
        ev = w.wait_event("fetched", since, 20)
        os.kill(w.pid, signal.SIGSTOP)
        stopped.append(w)
        live.remove(w)
        mine = {s for s, (holder, _) in leases(d).items() if holder == w.holder}
        log(f"  SIGSTOP {w} in a batch of slot {ev['slot']} (holding slots {sorted(mine)})")
        settle(d, live, f"{w} stopped")
        mark = len(w.events)
        os.kill(w.pid, signal.SIGCONT)
        stopped.remove(w)
        live.append(w)
        e = w.wait_event(("reconnecting", "lost", "batch"), mark, 20)
        check(e["event"] in ("reconnecting", "lost"), f"{w} resumed and committed its stale batch: {e}")
        check(e["event"] != "lost" or e["reason"] in ("expired", "taken"),
              f"{w} resumed past its ttl and says its slot was lost for another reason: {e}")
        log(f"  SIGCONT {w}: its transaction had been ended by the server; it reported '{e['event']}'"
            f" ({e.get('error') or e.get('reason')})")
        settle(d, live, f"{w} back")

        # SIGKILL
        w = live[1]
        os.kill(w.pid, signal.SIGKILL)
        live.remove(w)
        log(f"  SIGKILL {w}")
        settle(d, live, f"{w} killed")

        # a graceful leave
        w = live[1]
        live.remove(w)
        dt = terminate(w)
        left = [s for s, (holder, _) in leases(d).items() if holder == w.holder]
        check(not left, f"{w} left and still holds {left}")
        log(f"  SIGTERM {w}: exited 0 after {dt:.1f} s, no lease of it left")
        settle(d, live, f"{w} left")

        # two join at once
        start()
        start()
        settle(d, live, "two joins")

        # a server restart
        before = done_count(d)
        marks = [len(w.events) for w in live]
        d.close()
        cluster.restart()
        d = direct()
        for w, m in zip(live, marks):
            w.wait_event(("reconnecting", "claim_failed"), m, 20)
        poll(lambda: done_count(d) > before + 50, 30, "the fleet to go on after the restart")
        log(f"  server restarted: every worker reconnected; {done_count(d) - before} items since")
        settle(d, live, "after the restart")

        producer.stop()
        poll(lambda: d.execute("SELECT count(*) FROM items WHERE NOT done AND id <> %s", (POISON,)).fetchone()[0] == 0,
             60, "every item but the poison one to be done")
        poll(lambda: failure_state(d, NAME, POISON) == "dead", 20, "the poison item to be dead")
        log(f"  {ITEMS + producer.produced - 1} items done {time.monotonic() - t0:.1f} s after the start")
        # SIGTERM to every worker at once
        t1 = time.monotonic()
        for w in live:
            os.kill(w.pid, signal.SIGTERM)
        for w in live:
            try:
                rc = w.proc.wait(max(0.1, 15 - (time.monotonic() - t1)))
            except subprocess.TimeoutExpired:
                raise Failure(f"{w} did not exit within 15 s of SIGTERM") from None
            check(rc == 0, f"{w} exited with {rc}: {open(w.err_path).read()[-2000:]}")
        log(f"  SIGTERM: all {len(live)} workers exited 0 within {time.monotonic() - t1:.1f} s")
        rows = d.execute("SELECT slot, holder FROM lease_holders(%s) WHERE NOT expired", (NAME,)).fetchall()
        check(not rows, f"leases left after every worker left: {rows}")
    finally:
        for w in stopped:
            os.kill(w.pid, signal.SIGCONT)
        producer.stop()
        fleet.stop(kill=True)
        watcher.stop()

    items = check_processing_log(d, N, skip=POISON)
    poison = d.execute("SELECT state, attempts, last_error FROM item_failures(%s) WHERE item = %s",
                       (NAME, str(POISON))).fetchone()
    (poison_done,) = d.execute("SELECT done FROM items WHERE id = %s", (POISON,)).fetchone()
    check(poison is not None and poison[:2] == ("dead", 3) and not poison_done,
          f"the poison item: {poison}, done {poison_done}")
    errors = [(str(w), e) for w in workers for e in w.events if e["event"] in ("error", "garbage")]
    reasons = collections.Counter(e["reason"] for w in workers for e in w.events if e["event"] == "lost")
    check(set(reasons) <= set(LOST_REASONS), f"lost slots with reasons not documented: {reasons}")
    check(not errors, f"worker errors: {errors[:5]}")
    check(0 < watcher.max <= POOL, f"{watcher.max} server connections for a pool of {POOL}")
    stats = [w.last(("exit",)) for w in workers]
    batches = sum(s["stats"]["batches"] for s in stats if s)
    fenced = sum(s["stats"]["fenced"] for s in stats if s)
    d.close()
    log(f"summary: {items} items processed exactly once by {len(workers)} workers over at most"
        f" {watcher.max} server connections (pool {POOL}); the poison item dead after {poison[1]} attempts"
        f" ({poison[2]}); {batches} batches, {fenced} fenced refusals in the workers that exited;"
        f" slots lost: {dict(reasons)}")
