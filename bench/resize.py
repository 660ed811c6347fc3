#!/usr/bin/env python3
"""Resize: a fleet of W = 32 pg_claim.Worker processes (lease mode) through
PgBouncer in transaction mode drains an outbox routed by customer (jump)
on n = 8, and resize_fleet takes it to n = 32 mid-run (bench/79-resize.sh,
`scripts/bench resize`).

    bench/resize.py [--quick] [--workers W] [--out-dir DIR]

Needs PGHOST/PGPORT/PGUSER of a server where pg_claim can be created and
PGC_POOLER_PORT of PgBouncer in transaction mode in front of it. Each
worker is a process (tests/libs/resize_worker.py: ITEM_MS of I/O per row in
the fenced transaction, each row logged with its slot and the time in the
batch's transaction). With n = 8 only 8 of the 32 workers hold a slot; the
resize gives each its own. The rows are made done, the workers started,
and once every slot of 8 is held one commit makes every row pending: the
clock starts there; the resize is called at RESIZE_AT_S.

Reported: items/s before the resize (from 2 s after the start to the
call) and after it (from the moment every slot of 32 has written a row to
the end of the drain, or the last second before it), the time from the call
to every slot of 32 being held (lease_holders, sampled every 50 ms) and to
every one of them having committed a batch (the log), the per-second
series of rows done, and the dip: the slowest second from the call to
every slot serving, against the rate before, and the pause: the longest
time without a committed row around the call (a resize waits for the
batches in flight; then every worker claims again). Every row must be
logged exactly once, else the run fails (exit 1). A text table on stdout
and in DIR/resize.txt, and DIR/resize.json.
"""
import argparse
import json
import os
import signal
import sys
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
from fleet_driver import Failure, WorkerProcess, check, fresh_database, poll, run_main  # noqa: E402

DB = "pg_claim_resize"
NAME = "resize"
WORKER = os.path.join(ROOT, "tests", "libs", "resize_worker.py")
N0, N1 = 8, 32
ITEM_MS = 5
TTL_S = 5.0
CUSTOMERS = 1000


def direct(dbname=DB):
    return psycopg.connect(dbname=dbname, autocommit=True, application_name="resize bench driver")


class Worker(WorkerProcess):
    def __init__(self, i, workdir, balance):
        self.label = f"w{i}"
        env = dict(os.environ, RESIZE_N=str(N0), RESIZE_TTL_S=str(TTL_S), RESIZE_NAME=NAME,
                   RESIZE_ITEM_MS=str(ITEM_MS), RESIZE_BALANCE="1" if balance else "0",
                   RESIZE_DSN=f"host=127.0.0.1 port={os.environ['PGC_POOLER_PORT']} dbname={DB} user=postgres",
                   PYTHONPATH=os.path.join(ROOT, "clients", "python", "src"))
        super().__init__([sys.executable, WORKER], env, os.path.join(workdir, f"{self.label}.err"))

    def __str__(self):
        return self.label


def setup(rows):
    fresh_database(DB)
    with direct() as d:
        d.execute("""
            CREATE TABLE outbox (id bigint PRIMARY KEY, customer_id integer NOT NULL, body text NOT NULL,
                                 sent_at timestamptz);
            CREATE TABLE sent_log (seq bigserial PRIMARY KEY, item bigint NOT NULL, customer_id integer NOT NULL,
                                   slot integer NOT NULL, token bigint NOT NULL, holder text NOT NULL,
                                   logged_at timestamptz NOT NULL DEFAULT clock_timestamp());""")
        # made done: nothing to do until the release
        d.execute("INSERT INTO outbox SELECT g, 1 + g %% %s, 'm', now() FROM generate_series(1, %s) g",
                  (CUSTOMERS, rows))
        for n in (N0, N1):
            d.execute(f"CREATE INDEX ON outbox ((jump_slot(customer_id::int8, {n})), id) WHERE sent_at IS NULL")
        d.execute("ANALYZE outbox")


def holders(d):
    return {s: h for s, h in d.execute("SELECT slot, holder FROM lease_holders(%s) WHERE NOT expired", (NAME,))}


def measure(args, workdir):
    rows = args.rows or (40_000 if args.quick else 100_000)
    resize_at = args.resize_at or (5.0 if args.quick else 8.0)
    setup(rows)
    d = direct()
    workers = [Worker(i + 1, workdir, not args.no_balance) for i in range(args.workers)]
    try:
        poll(lambda: len(holders(d)) == N0, 60, f"every slot of {N0} held")
        d.execute("UPDATE outbox SET sent_at = NULL")  # the release: the clock starts
        (t0,) = d.execute("SELECT clock_timestamp()").fetchone()
        start = time.monotonic()
        while time.monotonic() - start < resize_at:
            time.sleep(0.05)
        called = time.monotonic()
        old, t_call = d.execute("SELECT resize_fleet(%s, %s), clock_timestamp()", (NAME, N1)).fetchone()
        check(old == N0, f"resize_fleet returned {old}")
        held_s = None
        deadline = called + 120
        while time.monotonic() < deadline:
            h = holders(d)
            if held_s is None and sorted(h) == list(range(N1)):
                held_s = time.monotonic() - called
            (left,) = d.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()
            if left == 0:
                break
            time.sleep(0.05)
        check(left == 0, f"{left} rows left 120 s after the resize")
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.proc.wait(20)
            except Exception:  # noqa: BLE001
                w.proc.kill()
    total, distinct = d.execute("SELECT count(*), count(DISTINCT item) FROM sent_log").fetchone()
    check(total == rows and distinct == rows, f"every row logged once: {total} rows, {distinct} distinct of {rows}")
    # seconds from the call: each slot of 32's first row after it, the per-second series
    (serving_s,) = d.execute("""
        SELECT extract(epoch FROM max(first) - %s) FROM (
            SELECT slot, min(logged_at) AS first FROM sent_log WHERE logged_at > %s GROUP BY slot) x""",
                             (t_call, t_call)).fetchone()
    (slots_after,) = d.execute("SELECT count(DISTINCT slot) FROM sent_log WHERE logged_at > %s", (t_call,)).fetchone()
    check(slots_after == N1, f"{slots_after} slots wrote after the resize, not {N1}")
    series = [(int(s), k) for s, k in d.execute("""
        SELECT floor(extract(epoch FROM logged_at - %s))::int AS s, count(*) FROM sent_log GROUP BY 1 ORDER BY 1""",
                                                 (t0,))]
    call_s = (t_call - t0).total_seconds()
    (end_s,) = d.execute("SELECT extract(epoch FROM max(logged_at) - %s) FROM sent_log", (t0,)).fetchone()
    end_s, serving_s = float(end_s), float(serving_s)

    def rate(a, b):
        (k,) = d.execute("SELECT count(*) FROM sent_log WHERE logged_at >= %s + make_interval(secs => %s)"
                         " AND logged_at < %s + make_interval(secs => %s)", (t0, a, t0, b)).fetchone()
        return k / (b - a) if b > a else float("nan")
    before = rate(2.0, call_s)
    after_from = call_s + serving_s
    after_to = min(end_s, after_from + 10.0) if end_s - after_from > 2 else end_s
    after = rate(after_from, max(after_to - 1.0, after_from + 0.5))
    window = [k for s, k in series if int(call_s) <= s <= call_s + serving_s]  # the call's second on
    dip = min(window) if window else None
    # the pause: the longest time without a committed row from 1 s before the call
    # to 1 s after every slot served (a resize waits for the batches in flight, then
    # every worker claims again)
    (pause_s,) = d.execute("""
        SELECT coalesce(max(gap), 0) FROM (
            SELECT extract(epoch FROM logged_at - lag(logged_at) OVER (ORDER BY logged_at)) AS gap
            FROM sent_log WHERE logged_at BETWEEN %s - interval '1 second'
                                    AND %s + make_interval(secs => %s + 1)) x""",
                           (t_call, t_call, serving_s)).fetchone()
    d.close()
    return {"rows": rows, "workers": args.workers, "balance": not args.no_balance, "n": [N0, N1], "item_ms": ITEM_MS, "ttl_s": TTL_S,
            "resize_at_s": round(call_s, 2), "before_items_s": round(before), "after_items_s": round(after),
            "speedup": round(after / before, 2), "all_held_s": round(held_s, 2) if held_s is not None else None,
            "all_serving_s": round(serving_s, 2), "dip_items_per_s": dip,
            "dip_ratio": round(dip / before, 2) if dip is not None and before else None,
            "pause_s": round(float(pause_s), 3),
            "end_s": round(end_s, 2), "series": series}


def text(r, command):
    lines = [f"resize: W = {r['workers']} Python workers through PgBouncer (transaction mode), {r['rows']:,} rows"
             f" routed by customer (jump), {r['item_ms']} ms per row, ttl {r['ttl_s']:g} s,"
             f" balance {'on' if r['balance'] else 'off'};"
             f" resize_fleet {r['n'][0]} -> {r['n'][1]} at {r['resize_at_s']} s",
             f"command: {command}",
             f"  items/s before (n = {r['n'][0]}): {r['before_items_s']:,}",
             f"  items/s after  (n = {r['n'][1]}): {r['after_items_s']:,}  ({r['speedup']}x)",
             f"  from the call to every slot of {r['n'][1]} held: {r['all_held_s']} s;"
             f" to every slot having committed a batch: {r['all_serving_s']} s",
             f"  dip: the slowest second of the switch {r['dip_items_per_s']} rows ({r['dip_ratio']} of the rate before);"
             f" the longest time without a committed row around it {r['pause_s']} s",
             f"  drained at {r['end_s']} s; every row once",
             "  rows per second from the release (s: rows): "
             + ", ".join(f"{s}: {k}" for s, k in r["series"])]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--rows", type=int, default=0)
    p.add_argument("--no-balance", action="store_true", help="the workers' balance option off")
    p.add_argument("--resize-at", type=float, default=0.0)
    p.add_argument("--out-dir", default=os.path.join(ROOT, "target", "bench"))
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    workdir = os.path.join(args.out_dir, "resize-workers")
    os.makedirs(workdir, exist_ok=True)
    r = measure(args, workdir)
    out = text(r, os.environ.get("BENCH_COMMAND", "bench/resize.py " + " ".join(sys.argv[1:])))
    print(out)
    with open(os.path.join(args.out_dir, "resize.txt"), "w") as f:
        f.write(out + "\n")
    with open(os.path.join(args.out_dir, "resize.json"), "w") as f:
        json.dump(r, f, indent=1)


if __name__ == "__main__":
    run_main("resize", main)
