"""A fleet of pg_claim.Worker processes (lease mode) through PgBouncer in
transaction mode, with faults.

Needs a running cluster with pg_claim installed (PGHOST/PGPORT, as
scripts/test sets them), PgBouncer in pool_mode = transaction in front of it
(PGC_POOLER_PORT; scripts/lib.sh pgc_pgbouncer_start), and, for the server
restart, the cluster's data directory and binaries (PGC_DATA, PGC_BIN; the
restart is left out, and says so, without them). The layer `libs-python`
of scripts/test runs it.

In a database of its own (py_fleet), a table of 3,000 items (one of them a
poison item whose handler raises) and a producer adding 200 a second, n = 8,
ttl 2 s, batches of 10 at 10 ms per item, inside the fenced transaction:

1. three workers start (two LISTEN through a direct connection, one polls);
   their shares balance (every slot held, each holder 2 or 3);
2. a fourth joins: balanced again;
3. one is stopped with SIGSTOP for 3 ttl: the others take all its slots
   (its session in a batch is ended by the server after the ttl); resumed,
   it rejoins and the shares balance again;
4. one is killed with SIGKILL: its slots are taken once expired;
5. one leaves (SIGTERM): it exits within 15 s and holds no lease after;
6. the server is restarted (pg_ctl restart -m fast): every worker reports
   the lost connection and goes on;
7. two join; the producer stops; every item gets done, the poison item is
   dead with its 3 attempts recorded;
8. SIGTERM to every worker: each exits (status 0) within 15 s; no live lease.

Then every item but the poison item is in the processing log exactly once,
the poison item never, and no write was accepted for a slot with a token
older than one already written there.
"""
import collections
import os
import signal
import subprocess
import sys
import time

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "clients", "python", "tests")
from harness import (Failure, Producer, WorkerProcess, check, check_processing_log, failure_state,  # noqa: E402
                     fresh_database, log, poll)

DB = "py_fleet"
NAME, N, TTL_S = "fleet", 8, 2.0
ITEMS, PRODUCE_PER_S, MAX_ATTEMPTS = 3000, 200, 3
TIME_LIMIT_S = 240
SETTLE_S = 20
if "PGC_POOLER_PORT" not in os.environ:
    sys.exit("test_python_fleet.py: PGC_POOLER_PORT is not set (scripts/test sets it: pgc_pgbouncer_start)")
POOLER_PORT = int(os.environ["PGC_POOLER_PORT"])
RESTART = bool(os.environ.get("PGC_DATA")) and bool(os.environ.get("PGC_BIN"))


def direct(dbname=DB):
    return psycopg.connect(dbname=dbname, autocommit=True, application_name="py_fleet driver")


def pooled_dsn():
    return f"host=127.0.0.1 port={POOLER_PORT} dbname={DB} user=postgres"


def direct_dsn():
    host, port = os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "5432")
    return f"host={host} port={port} dbname={DB} user={os.environ.get('PGUSER', 'postgres')}"


class Worker(WorkerProcess):
    seq = 0

    def __init__(self, workdir, listen):
        Worker.seq += 1
        self.label = f"w{Worker.seq}{'-listen' if listen else ''}"
        env = dict(os.environ, FLEET_DSN=pooled_dsn(), FLEET_TTL_S=str(TTL_S),
                   FLEET_MAX_ATTEMPTS=str(MAX_ATTEMPTS),
                   PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "clients", "python", "src"),
                                               os.environ.get("PYTHONPATH", "")]))
        env.pop("PGSERVICE", None)
        if listen:
            env["FLEET_NOTIFY_DSN"] = direct_dsn()
        super().__init__([sys.executable, os.path.join(HERE, "fleet_worker.py")], env,
                         os.path.join(workdir, f"{self.label}.err"))
        self.holder = self.wait_event("started", 0, 20)["holder"]

    def __str__(self):
        return self.label

    def stderr(self):
        return open(self.err_path, errors="replace").read()[-3000:]


def leases(d):
    """slot -> (holder, token) of the live leases."""
    return {s: (h, t) for s, h, t in d.execute(
        "SELECT slot, holder, token FROM lease_holders(%s) WHERE NOT expired", (NAME,))}


def balanced(d, live):
    """The live leases when every slot is held by one of `live`, evenly."""
    h = leases(d)
    holders = {w.holder for w in live}
    if sorted(h) != list(range(N)) or any(v[0] not in holders for v in h.values()):
        return None
    per = collections.Counter(v[0] for v in h.values())
    lo, hi = N // len(live), -(-N // len(live))
    if any(not lo <= per.get(x, 0) <= hi for x in holders):
        return None
    return h


def shares(h):
    return sorted(collections.Counter(v[0] for v in h.values()).values(), reverse=True)


def restart_server():
    data, bindir = os.environ["PGC_DATA"], os.environ["PGC_BIN"]
    log_file = os.path.join(os.path.dirname(data), "server-" + os.path.basename(data)[len("data-"):] + ".log")
    subprocess.run(["runuser", "-u", "postgres", "--", "env", "-u", "RUST_BACKTRACE",
                    os.path.join(bindir, "pg_ctl"), "-D", data, "-l", log_file, "-m", "fast", "-w", "-t", "60",
                    "restart"], check=True, stdout=subprocess.DEVNULL)


def retry_db(fn):
    """fn() on a fresh direct connection, through a server restart."""
    def attempt():
        try:
            with direct() as d:
                return fn(d)
        except psycopg.OperationalError:
            return None
    return attempt


def run(workdir):
    fresh_database(DB)
    with direct() as d:
        d.execute(f"""
            CREATE TABLE items (id bigserial PRIMARY KEY, payload text NOT NULL,
                                done boolean NOT NULL DEFAULT false);
            CREATE INDEX ON items ((slot_of(id, {N})), id) WHERE NOT done;
            CREATE TRIGGER items_wake AFTER INSERT ON items
                FOR EACH ROW EXECUTE FUNCTION notify_slot('{NAME}', '{N}', 'id');
            CREATE TABLE processing_log (seq bigserial PRIMARY KEY, item bigint NOT NULL, holder text NOT NULL,
                slot integer NOT NULL, token bigint NOT NULL, logged_at timestamptz DEFAULT clock_timestamp());
            INSERT INTO items (payload) SELECT CASE WHEN g = {ITEMS // 2} THEN 'poison' ELSE 'p' END
                FROM generate_series(1, {ITEMS}) g;
            ANALYZE items;""")
    d = direct()
    (poison,) = d.execute("SELECT id FROM items WHERE payload = 'poison'").fetchone()
    workers, live, stopped = [], [], []
    producer = Producer(direct, "INSERT INTO items (payload) SELECT 'p' FROM generate_series(1, %s)", PRODUCE_PER_S)
    t0 = time.monotonic()

    def start(listen):
        w = Worker(workdir, listen)
        workers.append(w)
        live.append(w)
        return w

    def settle(what):
        t = time.monotonic()
        h = poll(lambda: balanced(d, live), SETTLE_S, f"{what}: the shares of {', '.join(map(str, live))}"
                 " to balance")
        log(f"  {what}: balanced after {time.monotonic() - t:.1f} s, shares {shares(h)}")
        return h

    def terminate(w, what):
        since = len(w.events)
        live.remove(w)
        t = time.monotonic()
        w.proc.send_signal(signal.SIGTERM)
        try:
            rc = w.proc.wait(15)
        except subprocess.TimeoutExpired:
            raise Failure(f"{what}: {w} did not exit within 15 s of SIGTERM") from None
        check(rc == 0, f"{what}: {w} exited with {rc}: {w.stderr()}")
        w.wait_event("exit", since, 5)
        mine = [s for s, (h, _) in leases(d).items() if h == w.holder]
        check(not mine, f"{what}: {w} exited and still holds slots {mine}")
        return time.monotonic() - t

    try:
        log(f"python library fleet: n = {N}, ttl {TTL_S:g} s, through PgBouncer (transaction mode) on port"
            f" {POOLER_PORT}; {ITEMS} items (poison item {poison}) and {PRODUCE_PER_S} more a second")
        # 1, 2
        start(True), start(True), start(False)
        settle("3 workers")
        start(False)
        settle("a fourth joined")

        # 3. SIGSTOP past the ttl
        w = live[1]
        w.wait_event("batch", 0, 20)
        held = [s for s, (h, _) in leases(d).items() if h == w.holder]
        os.kill(w.pid, signal.SIGSTOP)
        stopped.append(w)
        live.remove(w)
        ts = time.monotonic()
        settle(f"SIGSTOP {w} (slots {held})")
        time.sleep(max(0.0, ts + 3 * TTL_S - time.monotonic()))
        check(w.state() == "T", f"{w} is no longer stopped")
        resumed = len(w.events)
        os.kill(w.pid, signal.SIGCONT)
        stopped.remove(w)
        live.append(w)
        settle(f"SIGCONT {w} after {3 * TTL_S:g} s: it rejoined")
        lost = [e for e in w.events[resumed:] if e["event"] in ("slots", "rejected", "reconnecting")]
        check(lost, f"{w} resumed without noticing it lost its slots: {w.events[resumed:][:5]}")

        # 4. SIGKILL
        w = live[0]
        os.kill(w.pid, signal.SIGKILL)
        w.proc.wait()
        live.remove(w)
        settle(f"SIGKILL {w}")

        # 5. a graceful leave
        w = live[-1]
        dt = terminate(w, "leave")
        settle(f"SIGTERM {w}: exited after {dt:.1f} s with its slots given back, then")

        # 6. a server restart
        if RESTART:
            marks = [len(w.events) for w in live]
            restart_server()
            d.close()
            d = poll(lambda: retry_db(lambda c: True)() and direct(), 30, "the server to accept connections")
            for w, m in zip(live, marks):
                w.wait_event("reconnecting", m, 30)
            settle("server restarted (pg_ctl restart -m fast): every worker reconnected, then")
        else:
            log("  server restart: left out (no PGC_DATA/PGC_BIN, or --no-restart)")

        # 7. two join; drain
        start(True), start(False)
        settle("two joined")
        producer.stop()
        poll(lambda: d.execute("SELECT count(*) = 0 FROM items WHERE NOT done AND id <> %s",
                               (poison,)).fetchone()[0], 60, "every item but the poison one to be done")
        poll(lambda: failure_state(d, NAME, poison) == "dead", 30, "the poison item to be dead")
        log(f"  {ITEMS + producer.produced} items done {time.monotonic() - t0:.1f} s after the start")

        # 8. everyone stops
        times = [terminate(w, "the end") for w in list(live)]
        log(f"  SIGTERM to the {len(times)} remaining workers: each exited within {max(times):.1f} s")
        rows = d.execute("SELECT slot, holder FROM lease_holders(%s) WHERE NOT expired", (NAME,)).fetchall()
        check(not rows, f"live leases after every worker left: {rows}")
    finally:
        for w in stopped:
            os.kill(w.pid, signal.SIGCONT)
        producer.stop()
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()

    items = check_processing_log(d, N, skip=poison)
    failure = d.execute("SELECT state, attempts, last_error FROM item_failures(%s) WHERE item = %s",
                        (NAME, str(poison))).fetchone()
    check(failure is not None and failure[0] == "dead" and failure[1] == MAX_ATTEMPTS,
          f"the poison item's failure record: {failure}")
    garbage = [(str(w), e) for w in workers for e in w.events if e["event"] in ("garbage", "leave_failed")]
    check(not garbage, f"worker output: {garbage[:3]}")
    ev = collections.Counter(e["event"] for w in workers for e in w.events)
    log(f"summary: {items} items handled once each by {len(workers)} workers ({ev['batch']} batches,"
        f" {ev['rejected']} refused by the fence, {ev['reconnecting']} reconnections); the poison item dead"
        f" after {failure[1]} attempts ({failure[2]})")
    d.close()


def test_python_fleet(workdir, databases):
    databases.adopt(DB)
    run(workdir)
