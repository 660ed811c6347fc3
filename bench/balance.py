#!/usr/bin/env python3
"""Balance: how evenly a fleet finishes, pg_claim.Worker in lease mode
against a FOR UPDATE SKIP LOCKED queue with the same handler, rows, workers
and pooler (PgBouncer in transaction mode), every scheme in one run, side by
side (bench/76-balance.sh, `scripts/bench balance`).

    bench/balance.py [--quick] [--scenario NAME]... [--scheme S]... [--repeat K] [--out-dir DIR] [--svg FILE]
    bench/balance.py --plot DIR/balance.json [--svg FILE]    (the plot again)

Needs PGHOST/PGPORT/PGUSER of a server where pg_claim can be created and
PGC_POOLER_PORT of PgBouncer in transaction mode in front of it
(scripts/lib.sh pgc_pgbouncer_start). Each worker is a process
(bench/balance_worker.py); each run has a table of its own, made with every
row done, the first workers started, and once they are ready (lease: every
slot held, shares even; queue: a first query done) one commit makes every
row pending: the clock starts there. The timeline then starts, kills
(SIGKILL), pauses (SIGSTOP, resumed with SIGCONT) and stops (SIGTERM: the
worker leaves) workers at fixed times, the same for both schemes.

Scenarios (n slots, W workers at most, batches of 50):
  a       a 200,000-row outbox keyed by id, n = 8, 2 ms per row: 3 workers,
          3 more at 10 s, one killed at 20 s, one paused at 25 s for 2 ttl,
          2 leaving at 40 s;
  b0, b2  uniform keys, W = 8 on n = 64: 6 workers, 2 join at 10 s, 2 leave
          at 30 s; 0 ms per row (1,000,000 rows) and 2 ms (200,000);
  c0, c2  skewed: one customer has 30% of the rows, routed by customer
          (route => 'customer'), the same fleet;
  d0, d2  Zipf-distributed customers (s = 1 over 1,000), routed by customer;
  e       no joins: uniform keys, 0 ms, W = 32 on n = 64 (items/s);
  h       hand-over at scale: uniform keys, 2 ms per row, 32 workers on
          n = 1024 (1,000,000 rows), one more joining every 7 s and leaving
          4 s later (lease schemes only: the queue has no hand-over).
--scenario takes a name (a, b0, ...) or a letter (b: b0 and b2); --scheme
queue, count or lease runs only those schemes (a trial of one change).
--quick: fewer rows and a shorter timeline (a few minutes on 2 cores).
--repeat K: each scenario's schemes K times in a row, the order reversed
every other round (so that neither scheme always runs first on a machine
whose speed drifts); the ratios pair the runs of one round, and the
balancing planner's items/s against the count planner's is given per round
with the median of the rounds.

Reported per run (bench/balance_report.py): makespan (release to the last
row done) and its ratio to the queue's; items/s; the idle tail (from the
first worker still running with nothing left to do, its last row, to the
end); hand-overs (a change of the worker writing a slot's rows, in done_at
order) and the rows moved per hand-over (the slot's rows done after it);
the hand-over latency (from a joiner's first claim_leases call to the first
sample, every 0.1 s, where it holds its share: floor(n/H) slots by count, H
the live holders; by weight, slots whose reported weights reach 0.9 of the
live holders' mean); the lower bound one slot's serial work sets (its rows x the
handler's time per row) and the ratio to it; the CPU seconds the worker
processes and the server's processes used from the release to the last
row, and per 1,000 rows (on a machine that the run keeps busy, a steadier
figure of what a scheme costs than its items/s, which the machine's other
load moves from run to run). Every row must be done exactly
once (times = 1): otherwise the run fails, loudly, and the exit status is 1.
A text table on stdout and in DIR/balance.txt, DIR/balance.json, and FILE (default
DIR/balance-a.svg): rows done over time per worker in scenario a.
"""
import argparse
import datetime
import io
import json
import os
import random
import signal
import sys
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
sys.path.insert(0, HERE)
import balance_report as report  # noqa: E402
from fleet_driver import Failure, WorkerProcess, fresh_database  # noqa: E402

DB = "pg_claim_balance"
WORKER = os.path.join(HERE, "balance_worker.py")
TTL_S = 5.0
BATCH = 50
CUSTOMERS = 1000
SAMPLE_S = 0.1


class Spec:
    """One scenario: its rows, slots, routing, handler, first workers and
    timeline [(seconds after the release, action, worker label)]."""

    def __init__(self, name, title, rows, n, keys, handler_ms, start, timeline=(), route=None):
        self.name, self.title, self.rows, self.n, self.keys = name, title, rows, n, keys
        self.handler_ms, self.start, self.route = handler_ms, start, route
        self.timeline = sorted(timeline)


def labels(a, b):
    return [f"w{i}" for i in range(a, b)]


def scenarios(quick):
    """Every scenario, in the order they run."""
    out = []
    if quick:
        rows_a, t_a = 40_000, dict(join=4, kill=7, stop=8, cont=8 + 1.6 * TTL_S, leave=12)
    else:
        rows_a, t_a = 200_000, dict(join=10, kill=20, stop=25, cont=25 + 2 * TTL_S, leave=40)
    out.append(Spec("a", "outbox, n = 8, 3 workers, 3 join, 1 killed, 1 paused past its ttl, 2 leave",
                    rows_a, 8, "uniform", 2, labels(0, 3),
                    [(t_a["join"], "join", w) for w in labels(3, 6)]
                    + [(t_a["kill"], "kill", "w1"), (t_a["stop"], "stop", "w2"), (t_a["cont"], "cont", "w2")]
                    + [(t_a["leave"], "leave", w) for w in ("w3", "w4")]))
    for letter, keys, route, what in (("b", "uniform", None, "uniform keys"),
                                      ("c", "skew", "customer", "one customer 30% of the rows, by customer"),
                                      ("d", "zipf", "customer", "Zipf customers, by customer")):
        for ms in (0, 2):
            join, leave = (3, 7) if quick else (10, 30)
            rows = (40_000 if quick else 200_000) if ms else (200_000 if quick else 1_000_000)
            out.append(Spec(f"{letter}{ms}", f"{what}, W = 8 on n = 64 (6, 2 join, 2 leave), {ms} ms/row",
                            rows, 64, keys, ms, labels(0, 6),
                            [(join, "join", w) for w in labels(6, 8)]
                            + [(leave, "leave", w) for w in labels(0, 2)], route=route))
    out.append(Spec("e", "no joins: uniform keys, 0 ms/row, W = 32 on n = 64 (items/s)",
                    100_000 if quick else 1_000_000, 64, "uniform", 0, labels(0, 32)))
    # hand-over at scale: one joiner at a time into 32 holders of n = 1024,
    # each leaving again before the next joins
    joins = (4, 10, 16) if quick else (5, 12, 19, 26, 33, 40, 47, 54)
    out.append(Spec("h", "hand-over at scale: uniform keys, 2 ms/row, 32 holders of n = 1024, one joiner at a time",
                    300_000 if quick else 1_000_000, 1024, "uniform", 2, labels(0, 32),
                    [(t, "join", f"w{32 + i}") for i, t in enumerate(joins)]
                    + [(t + 4, "leave", f"w{32 + i}") for i, t in enumerate(joins)]))
    return out


def customers(keys, rows, seed=42):
    """The customer of each row: spread evenly, or one customer with 30% of
    the rows, or Zipf (s = 1) over CUSTOMERS customers."""
    rnd = random.Random(seed)
    if keys == "uniform":
        return [i % CUSTOMERS + 1 for i in range(rows)]
    if keys == "skew":
        return [1 if rnd.random() < 0.3 else rnd.randint(2, CUSTOMERS) for _ in range(rows)]
    weights = [1.0 / k for k in range(1, CUSTOMERS + 1)]
    return rnd.choices(range(1, CUSTOMERS + 1), weights=weights, k=rows)


def direct(dbname=DB):
    return psycopg.connect(dbname=dbname, autocommit=True, application_name="balance driver")



def make_table(spec, cust):
    """The run's table, every row done (done_at set, times 0): the index of
    each scheme, the slot of each row (slot_of of its key or customer, as
    my_items maps it) for the report."""
    mapped = spec.route or "id"
    with direct() as d:
        d.execute("DROP TABLE IF EXISTS items")
        d.execute("CREATE TABLE items (id bigint PRIMARY KEY, customer bigint NOT NULL, slot int NOT NULL,"
                  " done_at timestamptz, done_by text, times int NOT NULL DEFAULT 0)")
        buf = io.StringIO()
        for i, c in enumerate(cust, 1):
            # slot_of of a bigint is its non-negative remainder (checked below)
            buf.write(f"{i}\t{c}\t{(c if spec.route else i) % spec.n}\tepoch\n")
        with d.cursor().copy("COPY items (id, customer, slot, done_at) FROM STDIN") as cp:
            cp.write(buf.getvalue())
        (wrong,) = d.execute(f"SELECT count(*) FROM items WHERE slot <> slot_of({mapped}, {spec.n})").fetchone()
        if wrong:
            raise Failure(f"{wrong} rows have another slot than slot_of({mapped}, {spec.n})")
        d.execute(f"CREATE INDEX ON items ((slot_of({mapped}, {spec.n})), id) WHERE done_at IS NULL")
        d.execute("CREATE INDEX ON items (id) WHERE done_at IS NULL")
        d.execute("VACUUM ANALYZE items")


def proc_cpu_s(pid):
    """A process's CPU seconds so far (utime + stime), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Run:
    """One scheme on one scenario: its worker processes, the timeline, the
    samples of lease_holders, and the checks at the end."""

    def __init__(self, spec, scheme, pooler_port, workdir, time_limit_s, seq):
        self.spec, self.scheme, self.workdir, self.time_limit_s = spec, scheme, workdir, time_limit_s
        self.name = f"balance_{spec.name}_{scheme}_{seq}"
        self.dsn = f"host=127.0.0.1 port={pooler_port} dbname={DB} user={os.environ.get('PGUSER', 'postgres')}"
        self.procs = {}      # label -> WorkerProcess
        self.gone = set()    # killed or left: not running at the end
        self.applied = []    # (seconds after the release, action, label)
        self.samples = []    # (epoch, {holder: live slots})
        self.slots = []      # (epoch, {slot: live holder}), the lease schemes
        self.t0 = None
        self.cpu_at_release = self.cpu_at_end = None  # Run.cpu
        self.functions = None  # Run.function_times
        self.tracked = False   # track_functions is on: the functions' times and calls are read
        self.claim_calls = []  # (seconds after the release, claim_leases calls so far), when tracked

    def spawn(self, label):
        env = dict(os.environ, BAL_SCHEME=self.scheme, BAL_LABEL=label, BAL_DSN=self.dsn,
                   BAL_NAME=self.name, BAL_N=str(self.spec.n), BAL_ROUTE=self.spec.route or "",
                   BAL_BATCH=str(BATCH), BAL_HANDLER_MS=str(self.spec.handler_ms), BAL_TTL_S=str(TTL_S),
                   BAL_LIFETIME_S=str(self.time_limit_s + 120))
        err = os.path.join(self.workdir, f"{self.name}-{label}.err")
        self.procs[label] = WorkerProcess([sys.executable, WORKER], env, err)

    def holders(self, d):
        rows = d.execute("SELECT holder, count(*) FROM lease_holders(%s) WHERE NOT expired GROUP BY holder",
                         (self.name,)).fetchall()
        return {h: c for h, c in rows}

    def held_slots(self, d):
        """slot -> its live holder."""
        return dict(d.execute("SELECT slot, holder FROM lease_holders(%s) WHERE NOT expired", (self.name,)).fetchall())

    def wait_ready(self, d, timeout=90):
        """Lease: every slot held by the first workers, floor(n/H) or
        ceil(n/H) each; queue: each has run its first query."""
        deadline = time.monotonic() + timeout
        n, first = self.spec.n, set(self.spec.start)
        while time.monotonic() < deadline:
            self.check_alive()
            if self.scheme != "queue":
                h = self.holders(d)
                if set(h) == first and sum(h.values()) == n and \
                        all(n // len(first) <= c <= -(-n // len(first)) for c in h.values()):
                    return
            elif all(p.count("ready") for p in self.procs.values()):
                return
            time.sleep(0.05)
        raise Failure(f"{self.name}: the first {len(first)} workers were not ready within {timeout} s")

    def check_alive(self):
        for label, p in self.procs.items():
            if label in self.gone:
                continue
            e = p.last(("error",))
            if e is not None or p.proc.poll() is not None:
                raise Failure(f"{self.name}: worker {label} ended: {e['error'] if e else p.proc.returncode}")

    def act(self, action, label):
        if action == "join":
            self.spawn(label)
            return
        p = self.procs[label]
        sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT, "leave": signal.SIGTERM}
        os.kill(p.pid, sig[action])
        if action in ("kill", "leave"):
            self.gone.add(label)

    def execute(self):
        """The run, from the first workers to the last row done; the
        workers are ended whatever happens."""
        try:
            for label in self.spec.start:
                self.spawn(label)
            with direct() as d:
                self.wait_ready(d)
                with d.transaction():
                    d.execute("UPDATE items SET done_at = NULL")
                    d.execute("ANALYZE items")
                self.t0 = time.time()
                self.cpu_at_release = self.cpu(d)
                self.tracked = d.execute("SELECT current_setting('track_functions') <> 'none'").fetchone()[0]
                if self.tracked:
                    d.execute("SELECT pg_stat_reset()")
                self.follow(d)
                self.cpu_at_end = self.cpu(d)
                if self.tracked:
                    self.functions = self.function_times()
        finally:
            self.end_workers()

    def follow(self, d):
        todo = list(self.spec.timeline)
        deadline = self.t0 + self.time_limit_s
        next_count = 0.0
        while True:
            now = time.time()
            while todo and now - self.t0 >= todo[0][0]:
                at, action, label = todo.pop(0)
                self.act(action, label)
                self.applied.append((round(now - self.t0, 2), action, label))
            self.check_alive()
            # both schemes (the queue has none): the same load on the server
            self.samples.append((time.time(), self.holders(d)))
            if self.scheme != "queue":  # both lease schemes: the same sampling load
                self.slots.append((time.time(), self.held_slots(d)))
            if now >= next_count:
                if self.tracked:  # the claims so far (the backends send their counts about every second)
                    d.execute("SELECT pg_stat_clear_snapshot()")
                    self.claim_calls.append((round(now - self.t0, 1), d.execute(
                        "SELECT coalesce(sum(calls), 0)::int FROM pg_stat_user_functions"
                        " WHERE funcname = 'pg_claim_leases_claim'").fetchone()[0]))
                left = d.execute("SELECT count(*) FROM items WHERE done_at IS NULL").fetchone()[0]
                if left == 0:
                    # the paused worker resumes before the end in every timeline
                    return
                next_count = now + 0.5
            if now > deadline:
                raise Failure(f"{self.name}: {left} rows not done within the time limit of"
                              f" {self.time_limit_s} s")
            time.sleep(max(0.0, SAMPLE_S - (time.time() - now)))

    def end_workers(self):
        """SIGCONT and SIGTERM to every worker still there; SIGKILL to those
        not gone within 10 s."""
        live = [p for p in self.procs.values() if p.proc.poll() is None]
        for p in live:
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in live:
            try:
                p.proc.wait(max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - not gone in time: killed
                p.proc.kill()
                p.proc.wait()

    def cpu(self, d):
        """CPU seconds used so far (user + system, from /proc): each live
        worker process's, and each server process's (the backends of
        pg_stat_activity: PgBouncer's server connections, which it keeps,
        and the server's own processes)."""
        pids = [p for (p,) in d.execute("SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()")]
        return {"workers": {label: proc_cpu_s(p.pid) for label, p in self.procs.items() if p.proc.poll() is None},
                "server": {pid: proc_cpu_s(pid) for pid in pids}}

    def function_times(self):
        """With track_functions set (BENCH_SERVER_CONF="track_functions = all"):
        the server time of each function called since the release, the
        busiest first, read on a new connection once the workers' backends
        have sent their counts (at most a second apart while they run)."""
        time.sleep(1.5)
        with direct() as d:
            d.execute("SELECT pg_stat_clear_snapshot()")
            return [{"function": f, "calls": c, "total_ms": round(t, 1), "self_ms": round(st, 1)}
                    for f, c, t, st in d.execute(
                        "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
                        " ORDER BY self_time DESC LIMIT 12")]

    def started(self, label):
        """When the worker made its first call (its "started" event)."""
        e = self.procs[label].last(("started",))
        return e["t"] if e else None

    def kill_all(self):
        for p in self.procs.values():
            if p.proc.poll() is None:
                p.proc.kill()


def run_case(spec, scheme, args, seq, cust):
    make_table(spec, cust)
    run = Run(spec, scheme, args.pooler_port, args.workdir, args.time_limit, seq)
    ACTIVE.append(run)
    result = {"scenario": spec.name, "scheme": scheme, "title": spec.title, "rows": spec.rows, "n": spec.n,
              "handler_ms": spec.handler_ms, "first_workers": len(spec.start),
              "workers": len(spec.start) + sum(1 for _, a, _l in spec.timeline if a == "join")}
    try:
        run.execute()
        with direct() as d:
            result.update(report.measure(d, run, TTL_S))
    except Failure as e:
        result["error"] = str(e)
    finally:
        ACTIVE.remove(run)
    result["timeline"] = run.applied
    return result


def plot(meta, results, path):
    a = [r for r in results if r["scenario"] == "a" and r.get("round", 1) == 1 and "series" in r]
    if a:
        with open(path, "w") as f:
            f.write(report.svg(a, meta))
        print(f"balance: plot of scenario a in {path}", file=sys.stderr)
    return 0


ACTIVE = []  # the runs going on: their workers are killed on any exit


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rows and a shorter timeline")
    ap.add_argument("--scenario", action="append", default=[], help="a, b0, b2, c0, c2, d0, d2, e, h or a letter")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "target", "bench"))
    ap.add_argument("--svg", default=None, help="the plot of scenario a (default OUT_DIR/balance-a.svg)")
    ap.add_argument("--scheme", action="append", default=[], choices=("queue", "count", "lease"),
                    help="run only this scheme (repeatable; default all three)")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per run (120 quick, 600 full)")
    ap.add_argument("--repeat", type=int, default=1, metavar="K",
                    help="run each scenario's schemes K times, the order reversed every other round")
    ap.add_argument("--plot", metavar="JSON", help="only draw the plot of scenario a again from a balance.json")
    ap.add_argument("--pooler-port", type=int, default=int(os.environ.get("PGC_POOLER_PORT", "0")))
    args = ap.parse_args()
    if args.plot:
        with open(args.plot) as f:
            saved = json.load(f)
        return plot(saved["meta"], saved["runs"], args.svg or os.path.join(os.path.dirname(args.plot), "balance-a.svg"))
    if not args.pooler_port:
        sys.exit("balance: PgBouncer's port is needed (--pooler-port or PGC_POOLER_PORT)")
    if args.repeat < 1:
        sys.exit(f"balance: --repeat must be at least 1, got {args.repeat}")
    args.time_limit = args.time_limit or (120.0 if args.quick else 600.0)
    specs = [s for s in scenarios(args.quick)
             if not args.scenario or s.name in args.scenario or s.name[0] in args.scenario]
    if not specs:
        sys.exit(f"balance: no scenario named {', '.join(args.scenario)} (a, b0, b2, c0, c2, d0, d2, e, h)")
    os.makedirs(args.out_dir, exist_ok=True)
    args.workdir = os.path.join(args.out_dir, "balance-logs")
    os.makedirs(args.workdir, exist_ok=True)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()[1]
    results = []
    try:
        fresh_database(DB)
        with direct() as d:
            version = d.execute("SHOW server_version").fetchone()[0]
        for i, spec in enumerate(specs):
            cust = customers(spec.keys, spec.rows)
            order = ("queue", "count", "lease") if i % 2 == 0 else ("lease", "count", "queue")
            if spec.name == "h":  # a hand-over figure: the queue has none
                order = tuple(o for o in order if o != "queue")
            order = tuple(o for o in order if not args.scheme or o in args.scheme)
            for j in range(args.repeat):
                for scheme in (order if j % 2 == 0 else order[::-1]):
                    print(f"balance: {spec.name} {scheme} ({spec.rows} rows"
                          + (f", round {j + 1} of {args.repeat})" if args.repeat > 1 else ")"), file=sys.stderr, flush=True)
                    results.append(dict(run_case(spec, scheme, args, i * args.repeat + j, cust), round=j + 1))
    finally:
        for run in ACTIVE:
            run.kill_all()
    command = os.environ.get("BENCH_COMMAND") or " ".join(["bench/balance.py"] + sys.argv[1:])
    meta = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "cores": os.cpu_count(), "postgresql": version,
            "command": command, "quick": args.quick, "repeat": args.repeat, "ttl_s": TTL_S, "batch": BATCH,
            "pool": int(os.environ.get("PGC_POOLER_POOL", "0")) or None,
            "planner": "lease: shares by remaining work (balance=True, the default); count: balance=False",
            "load_avg_5min": [round(load_before, 1), round(os.getloadavg()[1], 1)],
            "seconds": round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds())}
    report.ratios(results)
    text = report.table(meta, results)
    print(text)
    with open(os.path.join(args.out_dir, "balance.json"), "w") as f:
        json.dump({"meta": meta, "runs": results}, f, indent=1)
    with open(os.path.join(args.out_dir, "balance.txt"), "w") as f:
        f.write(text + "\n")
    plot(meta, results, args.svg or os.path.join(args.out_dir, "balance-a.svg"))
    bad = [r for r in results if "error" in r or not r.get("exactly_once", False)]
    for r in bad:
        print(f"balance FAILED: {r['scenario']} {r['scheme']}: {r.get('error') or r.get('once_error')}",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the workers are ended (main's finally)
        sys.exit(f"balance: interrupted ({e}); every worker ended")
