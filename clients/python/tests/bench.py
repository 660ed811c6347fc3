#!/usr/bin/env python3
"""Throughput of pg_claim.Worker (lease mode) next to a plain FOR UPDATE SKIP
LOCKED loop with the same handler, both through a pooler (PgBouncer in
transaction mode, PGC_POOLER_PORT) in front of the server (PGHOST/PGPORT).

    PGC_POOLER_PORT=6432 python3 clients/python/tests/bench.py [--items 50000] [--workers 4 8] [--io-ms 0 10] [--rounds 3] [--failures 0] [--stale-stats]
    PGC_POOLER_PORT=6432 python3 clients/python/tests/bench.py --batch 10 --n 64 --workers 16 --io-ms 0 --row-ms 0 1
    python3 clients/python/tests/bench.py --fetch-calls 500 --rounds 5 --failures 1000

Each run starts W workers (threads, each with its own connections) on a
table whose rows are all done; once the library's workers hold balanced
shares, one UPDATE makes `--items` rows to do, and the clock runs from its
commit until every row is done again, in batches of `--batch` (50); the handler sleeps
`--io-ms` per batch (an I/O-bound handler: a call to another service) plus `--row-ms`
per row of the batch (work per row), and marks the batch done, inside the batch's
transaction in both loops. Each case runs
`--rounds` times each way, alternating which way goes first, so that the
noise of a shared machine hits both; prints the median items/s of each way
and the ratio of the medians (with the lowest and highest ratio of a
round), and the machine's load average when the case ended. Then, for each
way, where a batch's time went (medians of the rounds, per batch of
`--batch` items): the round trips through the pooler and the time each
waited for a server connection (PgBouncer's SHOW STATS), the client's CPU
time (this process, every thread), and, where the server loads
pg_stat_statements, the server's execution time. --failures N
keeps N dead failure records of the name (keys not in the table) during the
runs.

--fetch-calls C times the Worker's fetch statement alone instead (no pooler,
no workers): with no failure record, with --failures dead records, and a
join with every record of the name for comparison (fetch_cost).
"""
import argparse
import os
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
import pg_claim  # noqa: E402

DB = "py_bench"
BATCH = 50  # --batch


def direct(dbname=DB):
    return psycopg.connect(dbname=dbname, autocommit=True)


def pooled_dsn(port):
    return f"host=127.0.0.1 port={port} dbname={DB} user=postgres"


def fresh(items, n):
    """The table with every row done (the workers find nothing yet)."""
    with direct() as d:
        d.execute("DROP TABLE IF EXISTS jobs")
        d.execute("CREATE TABLE jobs (id bigint PRIMARY KEY, payload text, done boolean NOT NULL DEFAULT false)")
        d.execute(f"CREATE INDEX ON jobs ((slot_of(id, {n})), id) WHERE NOT done")
        d.execute("CREATE INDEX ON jobs (id) WHERE NOT done")
        d.execute("INSERT INTO jobs SELECT g, 'x', true FROM generate_series(1, %s) g", (items,))
        d.execute("VACUUM ANALYZE jobs")


STALE = False  # --stale-stats


def release():
    """Every row to do, in one commit, with the statistics of the table as it
    is then (ANALYZE in the same transaction: without it, --stale-stats, the
    planner still sees the table of fresh(), every row done, and may plan
    either loop's query on the other's index); the time of the commit."""
    with direct() as d:
        with d.transaction():
            d.execute("UPDATE jobs SET done = false")
            if not STALE:
                d.execute("ANALYZE jobs")
    return time.monotonic()


def remaining():
    with direct() as d:
        return d.execute("SELECT count(*) FROM jobs WHERE NOT done").fetchone()[0]


def handler(io_s, row_s=0.0):
    def handle(tx, rows):
        if io_s or row_s:
            time.sleep(io_s + row_s * len(rows))
        tx.execute("UPDATE jobs SET done = true WHERE id = ANY(%s)", ([r["id"] for r in rows],))
    return handle


class Probe:
    """Where the time of a timed run went: the pooler's round trips and
    waits for a server connection (SHOW STATS of the database), this
    process's CPU time (every thread), and the server's execution time
    (pg_stat_statements, where the server loads it)."""

    def __init__(self, port):
        self.port = port
        with direct() as d:
            try:
                d.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                d.execute("SELECT count(*) FROM pg_stat_statements")
                self.statements = True
            except psycopg.Error:
                self.statements = False

    def _pooler(self):
        with psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer", user="postgres",
                             autocommit=True) as c:
            cur = psycopg.ClientCursor(c, row_factory=psycopg.rows.dict_row)
            for r in cur.execute("SHOW STATS").fetchall():
                if r["database"] == DB:
                    return int(r["total_query_count"]), int(r["total_wait_time"])
        return 0, 0

    def _server(self):
        """The server's execution and planning ms (planning: 0 unless pg_stat_statements.track_planning)."""
        if not self.statements:
            return 0.0, 0.0
        with direct() as d:
            return d.execute("SELECT coalesce(sum(total_exec_time), 0)::float8, coalesce(sum(total_plan_time), 0)::float8"
                             " FROM pg_stat_statements"
                              " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                             " AND query !~* 'pg_stat_statements|count\\(\\*\\) FROM jobs'").fetchone()

    def start(self):
        if self.statements:
            with direct() as d:
                d.execute("SELECT pg_stat_statements_reset()")
        self.q0, self.w0 = self._pooler()
        self.cpu0 = time.process_time()

    def stop(self, batches):
        """Per batch: (round trips, ms waited for a server connection, client CPU ms, server ms or None,
        of it planning)."""
        cpu = time.process_time() - self.cpu0
        q, w = self._pooler()
        run, plan = self._server()
        return ((q - self.q0) / batches, (w - self.w0) / 1000 / batches, cpu * 1000 / batches,
                (run + plan) / batches if self.statements else None, plan / batches)


def drain(probe, items):
    """Makes the rows pending and waits until they are done: (seconds, the probe's figures)."""
    probe.start()
    t0 = release()
    while remaining():
        time.sleep(0.05)
    dt = time.monotonic() - t0
    return dt, probe.stop(items / BATCH)


def run_library(port, workers, n, handle, timed):
    ws = [pg_claim.Worker(pooled_dsn(port), name="bench", table="jobs", n=n, pending="done", batch=BATCH,
                          ttl="6 seconds", handler=handle, poll_interval=0.2) for _ in range(workers)]
    threads = [threading.Thread(target=w.run) for w in ws]
    for t in threads:
        t.start()
    with direct() as d:  # started and balanced (every slot held, shares within one) before the clock starts
        while True:
            per = [c for (c,) in d.execute("SELECT count(*) FROM lease_holders('bench') WHERE NOT expired"
                                           " GROUP BY holder")]
            if sum(per) == n and len(per) == min(workers, n) and max(per) - min(per) <= 1:
                break
            time.sleep(0.1)
    got = timed()
    for w in ws:
        w.stop()
    for t in threads:
        t.join()
    return got


def run_skip_locked(port, workers, handle, timed):
    stop = threading.Event()

    def loop():
        with psycopg.connect(pooled_dsn(port), autocommit=True, prepare_threshold=None) as conn:
            while not stop.is_set():
                with conn.transaction():
                    rows = conn.cursor(row_factory=psycopg.rows.dict_row).execute(
                        "SELECT * FROM jobs WHERE NOT done ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                        (BATCH,)).fetchall()
                    if rows:
                        handle(conn, rows)
                if not rows:
                    stop.wait(0.2)
    threads = [threading.Thread(target=loop) for _ in range(workers)]
    for t in threads:
        t.start()
    time.sleep(1)
    got = timed()
    stop.set()
    for t in threads:
        t.join()
    return got


def fetch_cost(n, failures, calls, rounds):
    """The Worker's fetch alone, on one connection: its statement (as the
    Worker builds it) for a batch of 50 pending rows with no failure record
    of the name, the same with `failures` dead records of keys not in the
    table, and, with those records, a fetch that joins every record of the
    name (item_failures(name)). Each round times `calls` executions of each
    (slots taken in turn), in an order that turns each round; prints the
    median time per call and two ratios."""
    fresh(50000, n)
    with direct() as d:
        d.execute("UPDATE jobs SET done = false")
        d.execute("VACUUM ANALYZE jobs")
        d.execute("SELECT count(record_failure('bench_dead', 'gone-' || g, 'an error', 1))"
                  " FROM generate_series(1, %s) g", (failures,))
        d.execute("ANALYZE pg_claim_failures")
        w = pg_claim.Worker(f"dbname={DB}", name="bench", table="jobs", n=n, pending="done", batch=BATCH,
                            handler=lambda tx, rows: None)
        w._read_table(d)  # builds the Worker's fetch statement
        whole = ("SELECT t.*, t.id::text AS k, f.state, extract(epoch FROM f.retry_at - clock_timestamp())::float8"
                 " FROM my_items(NULL::jobs, %(slot)s, %(n)s, key => 'id', after => %(after)s::text,"
                 " batch => %(batch)s, pending => 'done') t LEFT JOIN item_failures(%(name)s) f"
                 " ON f.item = t.id::text ORDER BY t.id")
        ways = {"keyed, no records": (w._fetch, "bench"),
                f"keyed, {failures} dead records": (w._fetch, "bench_dead"),
                f"whole listing, {failures} dead records": (whole, "bench_dead")}
        got = {k: [] for k in ways}
        cur = psycopg.ClientCursor(d)
        names = list(ways)
        for r in range(rounds):
            for k in names[r % 3:] + names[:r % 3]:
                q, name = ways[k]
                t0 = time.perf_counter()
                for i in range(calls):
                    params = w._params(i % n, None)
                    params["name"] = name
                    cur.execute(q, params)
                    assert len(cur.fetchall()) == BATCH
                got[k].append((time.perf_counter() - t0) / calls * 1000)
    m = {k: median(v) for k, v in got.items()}
    print(f"the Worker's fetch alone, batches of {BATCH} of 50,000 pending rows, n = {n}; {rounds} rounds of"
          f" {calls} calls each way; medians; load average (1 min) at the end {os.getloadavg()[0]:.1f}")
    for k in names:
        print(f"  {k}: {m[k]:.3f} ms per fetch")
    print(f"ratio: keyed fetch, {failures} dead records / no records = {m[names[1]] / m[names[0]]:.2f}x")
    print(f"ratio: whole-listing join / keyed fetch, {failures} dead records = {m[names[2]] / m[names[1]]:.2f}x")


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=50000)
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--io-ms", type=float, nargs="+", default=[0.0, 10.0])
    ap.add_argument("--row-ms", type=float, nargs="+", default=[0.0],
                    help="the handler's work per row of the batch (a sleep), in addition to --io-ms")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--failures", type=int, default=0,
                    help="dead failure records of the name (of keys not in the table) kept during the runs")
    ap.add_argument("--fetch-calls", type=int, default=0,
                    help="instead: time the Worker's fetch alone, this many calls a round (with --failures)")
    ap.add_argument("--stale-stats", action="store_true",
                    help="no ANALYZE with the rows made pending: the statistics say none is")
    a = ap.parse_args()
    global STALE, BATCH
    STALE, BATCH = a.stale_stats, a.batch
    with direct("postgres") as d:
        d.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        d.execute(f"CREATE DATABASE {DB}")
    if a.fetch_calls:
        with direct() as d:
            d.execute("CREATE EXTENSION pg_claim")
        fetch_cost(a.n, a.failures or 1000, a.fetch_calls, a.rounds)
        with direct("postgres") as d:
            d.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        return
    port = int(os.environ["PGC_POOLER_PORT"])
    with direct() as d:
        d.execute("CREATE EXTENSION pg_claim")
        if a.failures:  # kept during the runs; the Worker's fetch reads only its batch's own records
            d.execute("SELECT count(record_failure('bench', 'gone-' || g, 'an error', 1))"
                      " FROM generate_series(1, %s) g", (a.failures,))
    probe = Probe(port)
    print(f"{a.items} items, batches of {BATCH}, n = {a.n}, through PgBouncer (transaction mode) on port {port};"
          f" {a.rounds} rounds each way, alternating; medians{'; stale statistics' if STALE else ''}"
          f"{f'; {a.failures} dead failure records of the name' if a.failures else ''}")
    print("| handler | workers | pg_claim.Worker (lease) | SKIP LOCKED loop | ratio (lowest, highest round)"
          " | load average (1 min) after the case |")
    print("|---|---|---|---|---|---|")
    ways = {"lib": lambda w, h, t: run_library(port, w, a.n, h, t),
            "queue": lambda w, h, t: run_skip_locked(port, w, h, t)}
    spent = []
    for io_ms in a.io_ms:
        for row_ms in a.row_ms:
            for w in a.workers:
                got = {"lib": [], "queue": []}
                diag = {"lib": [], "queue": []}
                for r in range(a.rounds):
                    for way in (("lib", "queue") if r % 2 == 0 else ("queue", "lib")):
                        fresh(a.items, a.n)
                        dt, d = ways[way](w, handler(io_ms / 1000, row_ms / 1000), lambda: drain(probe, a.items))
                        got[way].append(a.items / dt)
                        diag[way].append(d)
                ratios = [x / y for x, y in zip(got["lib"], got["queue"])]
                lib, q = median(got["lib"]), median(got["queue"])
                what = " + ".join([f"{io_ms:g} ms per batch"] * bool(io_ms) + [f"{row_ms:g} ms per row"] * bool(row_ms))
                print(f"| {what or '0 ms'} | {w} | {lib:,.0f} items/s | {q:,.0f} items/s | {lib / q:.2f}x"
                      f" ({min(ratios):.2f}x, {max(ratios):.2f}x) | {os.getloadavg()[0]:.1f} |", flush=True)
                spent.append((what or "0 ms", w, diag))
    print()
    print(f"where a batch's time went (per batch of {BATCH} items, medians of the rounds): round trips through"
          " the pooler, ms waited for a server connection, client CPU ms (every thread of this process),"
          f" server ms{'' if probe.statements else ' (not measured: no pg_stat_statements)'}"
          " (execution, and planning where pg_stat_statements.track_planning is on)")
    print("| handler | workers | way | round trips | pool wait | client CPU | server time |")
    print("|---|---|---|---|---|---|---|")
    for what, w, diag in spent:
        for way, label in (("lib", "pg_claim.Worker"), ("queue", "SKIP LOCKED loop")):
            cols = [median([d[i] for d in diag[way]]) for i in range(3)]
            plan = median([d[4] for d in diag[way]])
            srv = "-" if not probe.statements else f"{median([d[3] for d in diag[way]]):.3f} ms" + (
                f" (planning {plan:.3f} ms)" if plan else "")
            print(f"| {what} | {w} | {label} | {cols[0]:.2f} | {cols[1]:.3f} ms | {cols[2]:.3f} ms | {srv} |")
    with direct("postgres") as d:
        d.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
