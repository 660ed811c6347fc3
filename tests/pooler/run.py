#!/usr/bin/env python3
"""pg_claim through a real transaction-mode pooler (PgBouncer).

Needs a running cluster with pg_claim installed (PGHOST/PGPORT, as
scripts/test sets them) and PgBouncer in pool_mode = transaction in front of
it (PGC_POOLER_PORT, PGC_POOLER_POOL: scripts/lib.sh pgc_pgbouncer_start).

1. claim_slot through the pooler: with every server connection of the pool
   pinned but one, the test chooses which server connection runs each
   statement, and checks what docs/claiming.md ("Connection poolers") says:
   the same client's next statement sees no slot, another client inherits
   the slot, and the claim outlives its clients as long as the pooler keeps
   the server connection. Leases through the same pool, for contrast.
2. Lease fleets of the worker libraries: 6 pg_claim.Worker (clients/python,
   psycopg 3, fleet.py) and 6 pg-claim Worker (clients/node, node-postgres,
   fleet.js) processes in lease mode, n = 8 slots (12 workers: 8 hold one
   slot each, 4 hold none), ttl 2 s, through the pool, drain 3,000 items.
   One holder is killed with SIGKILL; two holders (one per language) are
   stopped with SIGSTOP inside a batch's fenced transaction for longer than
   the ttl, until the server ended their sessions and other workers took
   their slots, and then resumed with SIGCONT: each must try its late write
   and have it refused. The stale tokens are then probed in SQL: fence
   raises PC001, lease_valid is false and a write behind it touches no row.
   Every item is processed exactly once (the processing log), no accepted
   write of a stale token after its takeover, no more server connections
   than the pool.
3. A busy pool with no fault: 10 library workers (5 + 5) over the pool,
   each batch's transaction holding a server connection 0.6 s: once the
   slots are shared out, no slot changes hands. A holder stopped inside its
   batch's transaction has its session ended by the server (the library's
   idle_in_transaction_session_timeout); resumed, it reconnects.

Every wait polls with a deadline; the whole run is bounded by an alarm, and
no worker outlives it (they also exit by themselves when the driver is gone).
Exits non-zero on any failed check.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
from fleet_driver import Failure, WorkerProcess, check, log, poll, run_fleet_test  # noqa: E402
DB = "pg_claim_pooler"
NAME = "fleet"
ITEMS = 3000
N = 8
PYTHON_WORKERS = 6
NODE_WORKERS = 6
TTL_S = 2.0
BATCH = 10
ITEM_MS = 8  # a batch of 10 is 80 ms of "work", inside its transaction
TIME_LIMIT_S = 170
if "PGC_POOLER_PORT" not in os.environ:
    sys.exit("tests/pooler/run.py: PGC_POOLER_PORT is not set (scripts/test sets it: pgc_pgbouncer_start)")
POOLER_PORT = int(os.environ["PGC_POOLER_PORT"])
POOL = int(os.environ.get("PGC_POOLER_POOL", "4"))
DIRECT_APP = "pg_claim pooler test (direct)"


def direct(dbname=DB):
    """A direct connection to the server (PGHOST/PGPORT)."""
    return psycopg.connect(dbname=dbname, autocommit=True, application_name=DIRECT_APP)


def pooled(dbname=DB):
    """A client connection through PgBouncer (no server-side prepares: 1.18)."""
    return psycopg.connect(host="127.0.0.1", port=POOLER_PORT, dbname=dbname, user="postgres",
                           autocommit=True, prepare_threshold=None)


def admin(command):
    """A command of PgBouncer's admin console (simple protocol): its rows as dicts."""
    with psycopg.connect(host="127.0.0.1", port=POOLER_PORT, dbname="pgbouncer", user="postgres",
                         autocommit=True, prepare_threshold=None,
                         cursor_factory=psycopg.ClientCursor) as c:
        cur = c.execute(command)
        if cur.description is None:
            return []
        names = [col.name for col in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def check_pooler(db=DB):
    config = {r["key"]: r["value"] for r in admin("SHOW CONFIG")}
    check(config["pool_mode"] == "transaction" and int(config["default_pool_size"]) == POOL,
          f"PgBouncer runs pool_mode = {config['pool_mode']}, default_pool_size = {config['default_pool_size']}")
    version = admin("SHOW VERSION")[0]["version"]
    log(f"{version} on 127.0.0.1:{POOLER_PORT}: pool_mode = transaction, default_pool_size = {POOL}")
    # server connections of an earlier run to the database about to be re-created
    if any(r["database"] == db for r in admin("SHOW SERVERS")):
        admin(f"KILL {db}")
        admin(f"RESUME {db}")


# --------------------------------------------------------------------------
# The documented worker loops are the tested ones.

def check_docs_excerpts():
    """The handlers and Workers of fleet.py and fleet.js are shown verbatim."""
    doc = open(os.path.join(ROOT, "docs", "leases.md"), encoding="utf-8").read()
    for file, lang in (("fleet.py", "python"), ("fleet.js", "js")):
        src = open(os.path.join(HERE, file), encoding="utf-8").read()
        m = re.search(r"^(?:#|//) docs/leases\.md: begin\n(.*?)^(?:#|//) docs/leases\.md: end\n",
                      src, re.S | re.M)
        check(m, f"{file}: no docs/leases.md markers")
        check(f"```{lang}\n{m.group(1)}```" in doc,
              f"docs/leases.md does not show the worker of tests/pooler/{file} verbatim")
    log("docs/leases.md shows the library workers of fleet.py and fleet.js verbatim")


# --------------------------------------------------------------------------
# 1. claim_slot (and dynamic groups) through the transaction-mode pooler

class ServerChooser:
    """POOL clients, each keeping one server connection of the pool busy with
    an open transaction; only(i) lets server connection pids[i] alone go free,
    so the next statement of any other client of the pool runs there."""

    def __init__(self):
        self.pins = [pooled() for _ in range(POOL)]
        self.pids = [self._pin(c) for c in self.pins]
        self.free = None
        check(len(set(self.pids)) == POOL, f"pinned server connections are not distinct: {self.pids}")

    @staticmethod
    def _pin(c):
        c.execute("BEGIN")
        return c.execute("SELECT pg_backend_pid()").fetchone()[0]

    def only(self, i):
        if self.free is not None:  # the one free server connection is taken again
            check(self._pin(self.pins[self.free]) == self.pids[self.free], "re-pinning a server connection")
        self.pins[i].execute("COMMIT")
        self.free = i
        return self.pids[i]

    def close(self):
        for i, c in enumerate(self.pins):
            if i != self.free and not c.closed:
                c.execute("COMMIT")  # else PgBouncer closes the server connection with the client
            c.close()


def run_on(client, server, sql):
    """One statement of `client`, which must run on server connection `server`."""
    *row, pid = client.execute(f"{sql}, pg_backend_pid()").fetchone()
    check(pid == server, f"{sql!r} ran on server connection {pid}, not {server}")
    return row[0] if len(row) == 1 else row


def claim_slot_through_pooler():
    log(f"claim_slot through PgBouncer (pool_mode = transaction, {POOL} server connections):")
    name = "pooler_demo"
    srv = ServerChooser()
    a, b = pooled(), pooled()
    try:
        s0 = srv.only(0)
        slot = run_on(a, s0, f"SELECT claim_slot('{name}', 1)")
        check(slot == 0, f"A's claim_slot: {slot}")
        log(f"  client A: claim_slot('{name}', 1) = 0, run by server connection {s0}")
        s1 = srv.only(1)
        mine, again = run_on(a, s1, f"SELECT my_slot('{name}'), claim_slot('{name}', 1)")
        check(mine is None and again is None,
              f"A's next statement on another server connection: my_slot {mine}, claim_slot {again}")
        log(f"  client A, next statement, on server connection {s1}: my_slot = NULL, and claim_slot"
            f" = NULL (its own claim, held by {s0}, makes it a standby)")
        srv.only(0)
        mine, again = run_on(b, s0, f"SELECT my_slot('{name}'), claim_slot('{name}', 1)")
        check(mine == 0 and again == 0, f"B on {s0}: my_slot {mine}, claim_slot {again}")
        log(f"  client B, which never claimed, on server connection {s0}: my_slot = 0 and"
            f" claim_slot = 0: B and A both \"hold\" the only slot of n = 1")

        # dynamic groups: session advisory locks too
        group = "pooler_group"
        parts = run_on(a, s0, f"SELECT claim_partitions('{group}', 8)")
        check(parts == list(range(8)), f"A's claim_partitions: {parts}")
        srv.only(1)
        mine, again = run_on(a, s1, f"SELECT my_partitions('{group}'), claim_partitions('{group}', 8)")
        check(mine == [] and again == [], f"A on {s1}: my_partitions {mine}, claim_partitions {again}")
        srv.only(0)
        theirs = run_on(b, s0, f"SELECT my_partitions('{group}')")
        check(theirs == list(range(8)), f"B on {s0}: my_partitions {theirs}")
        log(f"  dynamic groups alike: A's claim_partitions('{group}', 8) = all 8 on {s0}; A's next"
            f" statement on {s1}: my_partitions = {{}} and claim_partitions = {{}}; B on {s0}:"
            " my_partitions = all 8")
        run_on(b, s0, f"SELECT group_leave('{group}')")
        srv.only(1)
        run_on(a, s1, f"SELECT group_leave('{group}')")
    finally:
        srv.close()
        a.close()
        b.close()
    pids = srv.pids
    # the clients are gone; the claim is not
    with direct() as d:
        holders = d.execute("SELECT slot, pid FROM slot_holders(%s)", (name,)).fetchall()
        check(holders == [(0, pids[0])], f"after both clients disconnected: slot_holders {holders}")
        (standby,) = d.execute("SELECT claim_slot(%s, 1, '0')", (name,)).fetchone()
        check(standby is None, f"a direct standby got slot {standby} of a claim whose clients are gone")
        log(f"  A and B disconnected: slot 0 is still held by server connection {pids[0]}"
            " (slot_holders), a standby's claim_slot gets NULL")
        # only ending the server connection frees it (PgBouncer: server_idle_timeout, 600 s by default)
        d.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        poll(lambda: d.execute("SELECT claim_slot(%s, 1, '0')", (name,)).fetchone()[0] == 0, 10,
             "the slot to free when its server connection ends")
        d.execute("SELECT release_slot(%s)", (name,))
        poll(lambda: all(r["remote_pid"] != pids[0] for r in admin("SHOW SERVERS")), 10,
             "PgBouncer to drop the terminated server connection")
        log(f"  pg_terminate_backend({pids[0]}) freed it: a direct standby's claim_slot got slot 0")
    # leases through the same pool: one statement each, any server connection
    with pooled() as a, pooled() as b:
        la = a.execute("SELECT slot, token FROM claim_lease('pooler_demo_lease', 1, 'A', '10 s')").fetchone()
        lb = b.execute("SELECT slot, token FROM claim_lease('pooler_demo_lease', 1, 'B', '10 s')").fetchone()
        check(la is not None and la[0] == 0 and lb is None, f"leases through the pool: A {la}, B {lb}")
        renewed = a.execute("SELECT renew_lease('pooler_demo_lease', 0, %s, '10 s') IS NOT NULL",
                            (la[1],)).fetchone()[0]
        released = a.execute("SELECT release_lease('pooler_demo_lease', 0, %s)", (la[1],)).fetchone()[0]
        check(renewed and released, "A's renew_lease and release_lease through the pool")
        log("  leases through the same pool: A claim_lease = slot 0, B = no row (standby),"
            " A renews and releases it from whichever server connection runs the statement")


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


class ServerConnections:
    """The most server connections of database `db` seen at once, as
    PostgreSQL sees them (pg_stat_activity every 50 ms, by a thread), not
    counting the test's direct connections."""

    def __init__(self, db):
        self.db, self.max = db, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        with direct("postgres") as m:
            while not self._stop.is_set():
                (k,) = m.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                                 " AND backend_type = 'client backend' AND application_name <> %s",
                                 (self.db, DIRECT_APP)).fetchone()
                self.max = max(self.max, k)
                self._stop.wait(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join(5)


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


def probe_stale_token(slot, token):
    """The SQL-level guarantees, on a stale token through the pool: fence
    raises PC001 inside a transaction, lease_valid is false, and a write
    guarded by it in one statement touches no row (had it touched one, the
    processing log would show a duplicate)."""
    with pooled() as c:
        try:
            with c.transaction():
                c.execute("SELECT fence(%s, %s, %s)", (NAME, slot, token))
            raise Failure(f"fence passed the stale token {token} of slot {slot}")
        except psycopg.Error as e:
            check(e.sqlstate == "PC001", f"fence on a stale token: {e.sqlstate} {e}")
        (valid,) = c.execute("SELECT lease_valid(%s, %s, %s)", (NAME, slot, token)).fetchone()
        check(valid is False, f"lease_valid of the stale token {token} of slot {slot}: {valid}")
        cur = c.execute(
            """WITH done AS (
                 UPDATE items SET done = true
                 WHERE id IN (SELECT id FROM my_items(NULL::items, %(slot)s, %(n)s, batch => 10))
                   AND (SELECT lease_valid(%(name)s, %(slot)s, %(token)s))
                 RETURNING id)
               INSERT INTO processing_log (item, worker, token) SELECT id, 'probe', %(token)s FROM done""",
            {"slot": slot, "n": N, "name": NAME, "token": token})
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


def run_fleets(workdir):
    with direct() as d:
        d.execute("""
            DROP TABLE IF EXISTS items, processing_log;
            CREATE TABLE items (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
            INSERT INTO items SELECT g FROM generate_series(1, %s) g;
            CREATE INDEX ON items ((slot_of(id, %s)), id);
            CREATE TABLE processing_log (item bigint NOT NULL, worker text NOT NULL,
                                         token bigint NOT NULL, logged_at timestamptz NOT NULL DEFAULT clock_timestamp());
            ANALYZE items;
        """ % (ITEMS, N))
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(POOLER_PORT), PGDATABASE=DB, PGUSER="postgres",
               FLEET_NAME=NAME, FLEET_N=str(N), FLEET_TTL_S=str(TTL_S),
               FLEET_BATCH=str(BATCH), FLEET_ITEM_MS=str(ITEM_MS), FLEET_LIFETIME_S=str(TIME_LIMIT_S))
    env.pop("PGSERVICE", None)
    workers = []
    servers = ServerConnections(DB)
    d = direct()
    try:
        t0 = time.time()
        for i in range(PYTHON_WORKERS + NODE_WORKERS):
            workers.append(Worker("python" if i % 2 == 0 else "node", workdir, env))
        by_pid = {w.pid: w for w in workers}
        log(f"fleets: {PYTHON_WORKERS} pg_claim.Worker (Python) + {NODE_WORKERS} pg-claim Worker (Node.js)"
            f" processes in lease mode, n = {N}, ttl {TTL_S:g} s, {ITEMS} items,"
            f" through PgBouncer (transaction mode, pool {POOL})")

        live = balanced(d, workers)
        log(f"  {N} slots leased by {N} workers after {time.time() - t0:.1f} s; {len(workers) - N} hold none")
        owner = {slot: by_pid[pid_of(r[1])] for slot, r in live.items()}
        py = [w for w in owner.values() if w.lang == "python"]
        js = [w for w in owner.values() if w.lang == "node"]
        check(py and len(js) >= 2, f"holders: {len(py)} Python, {len(js)} Node")
        killed, paused = js[0], [py[0], js[1]]
        for w in [killed] + paused:
            w.wait_event("wrote", 0, 20)

        # SIGKILL one holder
        k_slot = next(s for s, w in owner.items() if w is killed)
        k_token = live[k_slot][2]
        os.kill(killed.pid, signal.SIGKILL)
        t_kill = time.time()
        done_then = d.execute("SELECT count(*) FROM items WHERE done").fetchone()[0]
        log(f"  SIGKILL {killed} (slot {k_slot}) with {done_then} of {ITEMS} items done")

        # SIGSTOP two holders in the middle of a batch
        for w in paused:
            slot, token, at = stop_mid_batch(w)
            w.stop = (slot, token, at)
            log(f"  SIGSTOP {w} (slot {slot}) in the middle of a batch, inside its fenced transaction")

        # workers without a slot take the three slots over once their leases
        # expired and (the stopped ones) the server ended the fenced transactions
        def taken_over():
            h = holders(d)
            slots = [(k_slot, k_token)] + [(w.stop[0], w.stop[1]) for w in paused]
            if all(s in h and h[s][2] != t for s, t in slots):
                return h
            return None
        h = poll(taken_over, 2 * TTL_S + 10, "other workers to take over the killed and the stopped workers' slots")
        k_new = h[k_slot]
        check(pid_of(k_new[1]) != killed.pid and k_new[2] > k_token, f"slot {k_slot} after the kill: {k_new}")
        takeovers = {"SIGKILL": (k_new[3].timestamp() - t_kill, k_new[1])}
        for w in paused:
            new = h[w.stop[0]]
            check(pid_of(new[1]) != w.pid and new[2] > w.stop[1], f"slot {w.stop[0]} after the stop: {new}")
            w.taken = new
            takeovers[f"SIGSTOP {w.lang}"] = (new[3].timestamp() - w.stop[2], new[1])
            check(w.state() == "T", f"{w} is no longer stopped")
        for label, (dt, by) in takeovers.items():
            log(f"  {label}: slot taken over by {by} {dt:.2f} s after the signal")
        for w in paused:
            probe_stale_token(w.stop[0], w.stop[1])
        log("  the stopped workers' tokens, in SQL through the pool: fence raises PC001, lease_valid is"
            " false, a write behind it touches no row")

        # SIGCONT: each resumed worker finishes its batch's work and tries its late write
        for w in paused:
            w.resumed_at = len(w.events)
            os.kill(w.pid, signal.SIGCONT)
        for w in paused:
            e = w.wait_event(("refused", "wrote"), w.resumed_at, 15)
            check(e["event"] == "refused", f"{w}'s late write after the takeover of its slot was ACCEPTED: {e}")
            check(int(e["token"]) == w.stop[1], f"{w}'s refused write used token {e['token']}")
            log(f"  SIGCONT {w}: its late write of {e['items']} items was refused ({e['how']})")

        poll(lambda: d.execute("SELECT NOT EXISTS (SELECT 1 FROM items WHERE NOT done)").fetchone()[0],
             60, "every item to be done")
        t_drain = time.time() - t0
        log(f"  every item done {t_drain:.1f} s after the start")
        for w in workers:
            if w is not killed and w.proc.poll() is not None:
                raise Failure(f"{w} exited by itself with {w.proc.returncode}:"
                              f" {open(w.err_path).read()[-2000:]} {w.events[-3:]}")
    finally:
        servers.stop()
        for w in workers:
            if w.proc.poll() is None:
                os.kill(w.pid, signal.SIGCONT)  # a stopped worker would not act on SIGTERM
                w.proc.terminate()
        deadline = time.monotonic() + 5
        for w in workers:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    # the checks
    (not_done,) = d.execute("SELECT count(*) FROM items WHERE NOT done").fetchone()
    (logged, distinct) = d.execute("SELECT count(*), count(DISTINCT item) FROM processing_log").fetchone()
    (dups,) = d.execute("SELECT count(*) FROM (SELECT item FROM processing_log GROUP BY item"
                        " HAVING count(*) > 1) x").fetchone()
    (missing,) = d.execute("SELECT count(*) FROM items i WHERE NOT EXISTS"
                           " (SELECT 1 FROM processing_log l WHERE l.item = i.id)").fetchone()
    check(not_done == 0 and missing == 0 and dups == 0 and logged == ITEMS and distinct == ITEMS,
          f"exactly once: {logged} log rows for {distinct} items, {dups} duplicated, {missing} missing,"
          f" {not_done} not done")
    for w in paused:
        (late,) = d.execute("SELECT count(*) FROM processing_log WHERE token = %s AND logged_at >= %s",
                            (w.stop[1], w.taken[3])).fetchone()
        accepted = sum(1 for e in w.events[w.resumed_at:]
                       if e["event"] == "wrote" and int(e["token"]) == w.stop[1])
        check(late == 0 and accepted == 0,
              f"{w}: {late} log rows and {accepted} accepted writes of its old token after the takeover")
    errors = [(w.holder, e) for w in workers for e in w.events if e["event"] in ("error", "garbage")]
    check(not errors, f"worker errors: {errors}")
    check(0 < servers.max <= POOL, f"{servers.max} server connections seen for a pool of {POOL}")
    rejected = sum(w.count("refused") + w.count("rejected") for w in workers)
    late_rejected = sum(w.count("refused", w.resumed_at) for w in paused)
    per_lang = {lang: sum(w.count("wrote") for w in workers if w.lang == lang) for lang in ("python", "node")}
    d.close()
    log(f"summary: {ITEMS} items, processed once each by {len(workers)} clients"
        f" over at most {servers.max} server connections (pool {POOL});"
        f" duplicates 0, missing 0; batches written: {per_lang['python']} Python,"
        f" {per_lang['node']} Node; refused late writes: {late_rejected} from the resumed workers,"
        f" {rejected} refused or fenced off in all; takeover after SIGKILL {takeovers['SIGKILL'][0]:.2f} s,"
        f" after SIGSTOP {takeovers['SIGSTOP python'][0]:.2f} s (Python) and"
        f" {takeovers['SIGSTOP node'][0]:.2f} s (Node); drained in {t_drain:.1f} s")


# --------------------------------------------------------------------------
# 3. A busy pool with no fault; a session ended idle in a transaction

BUSY_DB = "pg_claim_pooler_busy"
BUSY_WORKERS = 10
BUSY_WRITE_MS = 300  # each batch's write holds a server connection this long (a statement trigger)
BUSY_ITEM_MS = 30    # the work on a batch of 10, inside its transaction: 0.3 s
BUSY_S = 12


def idle_in_transaction(d):
    """Server processes of BUSY_DB idle in a transaction for 0.8 s or more
    (a batch's work keeps its transaction idle 0.3 s)."""
    return d.execute("SELECT array_agg(pid) FROM pg_stat_activity WHERE datname = %s"
                     " AND state = 'idle in transaction' AND state_change < clock_timestamp() - interval '0.8 s'",
                     (BUSY_DB,)).fetchone()[0]


def busy_pool(workdir):
    """10 library workers in lease mode (5 Python, 5 Node.js) through the
    pool of 4, n = 8, ttl 2 s (claim_leases every ttl / 3), where a batch's
    transaction holds a server connection 0.6 s (0.3 s of work in the
    handler, then a write of 0.3 s): the pool is saturated and statements
    queue in PgBouncer. No fault: once the slots are shared out (8 workers
    with one each), no slot may change hands for BUSY_S seconds: the same
    holder and token of every slot, and no worker reports a lost slot, a
    fenced-off batch or a failed claim. Then a Python holder is stopped
    inside its batch's transaction: the server ends its session (the
    library's idle_in_transaction_session_timeout, the ttl), and once
    resumed the worker reconnects and goes on instead of crashing. Every
    item written is written once."""
    with direct("postgres") as d:
        d.execute(f"DROP DATABASE IF EXISTS {BUSY_DB} WITH (FORCE)")
        d.execute(f"CREATE DATABASE {BUSY_DB}")
    with direct(BUSY_DB) as d:
        d.execute("CREATE EXTENSION pg_claim")
        d.execute("""
            CREATE TABLE items (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
            INSERT INTO items SELECT g FROM generate_series(1, %s) g;
            CREATE INDEX ON items ((slot_of(id, %s)), id);
            CREATE TABLE processing_log (item bigint NOT NULL, worker text NOT NULL,
                                         token bigint NOT NULL, logged_at timestamptz NOT NULL DEFAULT clock_timestamp());
            CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN PERFORM pg_sleep(%s); RETURN NULL; END $$;
            CREATE TRIGGER slow_write AFTER INSERT ON processing_log
                FOR EACH STATEMENT EXECUTE FUNCTION slow_write();
            ANALYZE items;
        """ % (ITEMS, N, BUSY_WRITE_MS / 1000))
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(POOLER_PORT), PGDATABASE=BUSY_DB, PGUSER="postgres",
               FLEET_NAME=NAME, FLEET_N=str(N), FLEET_TTL_S=str(TTL_S),
               FLEET_BATCH=str(BATCH), FLEET_ITEM_MS=str(BUSY_ITEM_MS), FLEET_LIFETIME_S=str(TIME_LIMIT_S))
    env.pop("PGSERVICE", None)
    workers = [Worker("python" if i % 2 == 0 else "node", workdir, env) for i in range(BUSY_WORKERS)]
    d = direct(BUSY_DB)

    def losses(since):
        """What each worker reported since event `since[w]`: slots lost, batches fenced off, failed claims."""
        out = {}
        for w in workers:
            bad = [e for e in w.events[since[w]:]
                   if (e["event"] == "slots" and e.get("lost")) or e["event"] in (
                       "lost", "rejected", "claim_failed", "reconnecting")]
            if bad:
                out[w.holder] = bad[:3]
        return out
    try:
        start = balanced(d, workers)
        since = {w: len(w.events) for w in workers}
        t_start = time.monotonic()
        while time.monotonic() < t_start + BUSY_S:
            now = {s: r for s, r in holders(d).items() if not r[4]}
            moved = {s: (start[s][1:3], now[s][1:3] if s in now else None)
                     for s in start if s not in now or now[s][2] != start[s][2]}
            check(not moved, f"slots changed hands with no fault through a busy pool: {moved}")
            time.sleep(0.2)
        lost = losses(since)
        (written,) = d.execute("SELECT count(*) FROM processing_log").fetchone()
        check(not lost, f"slots lost with no fault through a busy pool: {lost}")
        check(written > 0, "nothing written through the busy pool")
        log(f"busy pool: {BUSY_WORKERS} library workers over a pool of {POOL}, each batch's transaction holding"
            f" a server connection {(BUSY_ITEM_MS * BATCH + BUSY_WRITE_MS) / 1000:g} s, ttl {TTL_S:g} s:"
            f" no slot changed hands in {BUSY_S} s once shared out ({written} items written)")

        # a holder stopped inside its batch's transaction
        by_pid = {w.pid: w for w in workers}
        holding = [by_pid[pid_of(r[1])] for r in holders(d).values() if not r[4]]
        w = next((w for w in holding if w.lang == "python"), None)
        check(w, "no Python worker holds a lease")
        for _ in range(8):
            ev = w.wait_event("fetched", len(w.events), 10)
            # inside the transaction: its work (BUSY_ITEM_MS per item) has begun
            time.sleep(max(0.0, ev["t"] + 0.1 - time.time()))
            os.kill(w.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 2
            while not idle_in_transaction(d) and time.monotonic() < deadline:
                time.sleep(0.05)
            if idle_in_transaction(d):
                break
            os.kill(w.pid, signal.SIGCONT)  # not inside the transaction: the next batch
        else:
            raise Failure(f"could not stop {w} inside its batch's transaction")
        poll(lambda: not idle_in_transaction(d), 10, "the server to end the session idle in a transaction")
        since = len(w.events)
        os.kill(w.pid, signal.SIGCONT)
        ev = w.wait_event(("reconnecting", "error"), since, 15)
        check(ev["event"] == "reconnecting", f"{w} after its session was ended: {ev}")
        refused = w.last(("refused",), since)
        check(refused is not None, f"{w} reconnected without its handler's write failing: {w.events[since:]}")
        # it goes on: its next claim drops the slot (or, if no other worker
        # took it yet, renews it and it writes again); no error
        poll(lambda: w.last(("slots", "wrote", "error"), since), 15,
             f"{w}'s next claim or write after its reconnection (its events: {w.events[since:]})")
        check(w.proc.poll() is None and not w.last(("error",), since),
              f"{w} after its reconnection: {w.events[since:]}")
        check(w.proc.poll() is None, f"{w} exited: {open(w.err_path).read()[-2000:]}")
        log(f"  {w} stopped inside its batch's transaction: the server ended the session"
            f" (idle_in_transaction_session_timeout); resumed, its write failed (\"{refused['how']}\"),"
            " it reconnected and went on")
    finally:
        for x in workers:
            if x.proc.poll() is None:
                os.kill(x.pid, signal.SIGCONT)
                x.proc.terminate()
        for x in workers:
            try:
                x.proc.wait(5)
            except subprocess.TimeoutExpired:
                x.proc.kill()
                x.proc.wait()
    (logged, distinct) = d.execute("SELECT count(*), count(DISTINCT item) FROM processing_log").fetchone()
    (unlogged,) = d.execute("SELECT count(*) FROM items i WHERE done AND NOT EXISTS"
                            " (SELECT 1 FROM processing_log l WHERE l.item = i.id)").fetchone()
    (undone,) = d.execute("SELECT count(*) FROM processing_log l JOIN items i ON i.id = l.item"
                          " WHERE NOT i.done").fetchone()
    check(logged == distinct and unlogged == 0 and undone == 0,
          f"busy pool: {logged} log rows for {distinct} items, {unlogged} done but not logged, {undone} logged not done")
    errors = [(x.holder, e) for x in workers for e in x.events if e["event"] in ("error", "garbage")]
    check(not errors, f"worker errors: {errors}")
    d.close()
    log(f"  {distinct} items written once each")


def main():
    def body(workdir):
        check_docs_excerpts()
        check_pooler()
        with direct("postgres") as d:
            d.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            d.execute(f"CREATE DATABASE {DB}")
        with direct() as d:
            d.execute("CREATE EXTENSION pg_claim")
        claim_slot_through_pooler()
        run_fleets(workdir)
        busy_pool(workdir)
    return run_fleet_test("pooler test", body, TIME_LIMIT_S, [DB, BUSY_DB],
                          stderr_name=lambda f: f"a {f.split('-')[0]} worker")

if __name__ == "__main__":
    sys.exit(main())
