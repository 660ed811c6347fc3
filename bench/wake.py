"""Wake-up latency and idle cost: two fleets of W pg_claim.Worker (lease
mode through PgBouncer in transaction mode, PGC_POOLER_PORT, one slot each
of n = W) side by side, each serving the example outbox table
(examples/schema.sql) in a database of its own. In bench_wake_notify the table has notify_slot's trigger, and
its workers LISTEN on their slots' channels on a direct connection
(notify_conninfo): they wake on each insert, with a fallback poll every
FALLBACK_S. In bench_wake_poll the table has no trigger and the workers no
LISTEN connection: they poll every second. The two fleets differ only in
that. A producer inserts items one at a time at random gaps into both
tables at the same moments; the handler marks an item sent with
clock_timestamp(). Printed: insert -> processed latency (sent_at -
created_at) p50 / p99 / max per fleet, and the queries each idle fleet sent
per minute through PgBouncer (SHOW STATS of its database: the fetches and
the lease renewals; LISTEN waits send none).

Run by bench/80-wake.sh; knobs in the environment:
  BENCH_WAKE_ITEMS (300 per fleet),
  BENCH_WAKE_GAP_MS (mean gap between inserts, 60), BENCH_WAKE_IDLE_S (60),
  BENCH_WAKE_FALLBACK_S (30, the notify fleet's fallback poll).
"""
import os
import random
import statistics
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clients", "python",
                                "src"))
import pg_claim  # noqa: E402

W = 8  # workers per fleet, = n of examples/schema.sql
ITEMS = int(os.environ.get("BENCH_WAKE_ITEMS", "300"))
GAP_MS = float(os.environ.get("BENCH_WAKE_GAP_MS", "60"))
IDLE_S = float(os.environ.get("BENCH_WAKE_IDLE_S", "60"))
FALLBACK_S = float(os.environ.get("BENCH_WAKE_FALLBACK_S", "30"))
POLL_S = 1.0
BATCH = 50
# fleet -> (its database, the poll interval of its workers)
FLEETS = {"notify": ("bench_wake_notify", FALLBACK_S), "poll": ("bench_wake_poll", POLL_S)}

# examples/schema.sql: the outbox (n = 8) with notify_slot's trigger,
# dropped in the polling fleet's database
SCHEMA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "schema.sql")
POOLER = int(os.environ["PGC_POOLER_PORT"])


def connect(db):
    return psycopg.connect(dbname=db, autocommit=True)


def pooled(db):
    return f"host=127.0.0.1 port={POOLER} dbname={db}"


def direct(db):
    """The LISTEN connection's: the server itself (PGHOST, PGPORT)."""
    return f"dbname={db}"


def create():
    with connect("postgres") as c:
        for db, _ in FLEETS.values():
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {db}")
    for mode, (db, _) in FLEETS.items():
        with connect(db) as c:
            c.execute(open(SCHEMA, encoding="utf-8").read())
            if mode == "poll":
                c.execute("DROP TRIGGER outbox_wake ON outbox")


def mark_sent(tx, rows):
    tx.execute("UPDATE outbox SET sent_at = clock_timestamp() WHERE id = ANY(%s)", ([r["id"] for r in rows],))


def queries():
    """Queries sent so far through PgBouncer to each fleet's database."""
    with psycopg.connect(host="127.0.0.1", port=POOLER, dbname="pgbouncer", autocommit=True) as c:
        cur = psycopg.ClientCursor(c)
        cur.execute("SHOW STATS")
        cols = [d.name for d in cur.description]
        got = {r[cols.index("database")]: int(r[cols.index("total_query_count")]) for r in cur.fetchall()}
    return {mode: got.get(db, 0) for mode, (db, _) in FLEETS.items()}


def held(db):
    with connect(db) as c:
        return c.execute("SELECT count(*) FROM slot_status('mailer', %s) WHERE state = 'lease'", (W,)).fetchone()[0]


def main():
    create()
    workers = [pg_claim.Worker(pooled(db), name="mailer", table="outbox", n=W, pending="sent_at",
                               handler=mark_sent, batch=BATCH, max_slots=1, poll_interval=poll,
                               notify_conninfo=direct(db) if mode == "notify" else None)
               for mode, (db, poll) in FLEETS.items() for _ in range(W)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not all(held(db) == W for db, _ in FLEETS.values()):
        if time.monotonic() > deadline:
            sys.exit("wake: the workers did not all claim a slot")
        time.sleep(0.1)
    try:
        run()
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(10)
        with connect("postgres") as c:
            for db, _ in FLEETS.values():
                c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def run():
    # idle: what each fleet sends with nothing to do
    time.sleep(2)
    before, t0 = queries(), time.monotonic()
    time.sleep(IDLE_S)
    after, elapsed = queries(), time.monotonic() - t0
    idle = {m: (after[m] - before[m]) * 60.0 / elapsed for m in FLEETS}

    # latency: the same insert moments for both fleets
    producers = {m: connect(db) for m, (db, _) in FLEETS.items()}
    rnd = random.Random(42)
    for _ in range(ITEMS):
        for p in producers.values():
            p.execute("INSERT INTO outbox (customer_id, recipient, body) VALUES (1, 'a@example.com', 'x')")
        time.sleep(rnd.expovariate(1000.0 / GAP_MS))
    deadline = time.monotonic() + 60
    while (left := sum(p.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()[0]
                       for p in producers.values())):
        if time.monotonic() > deadline:
            sys.exit(f"wake: {left} items not processed within 60 s")
        time.sleep(0.05)

    print(f"wake-up: {W} pg_claim.Worker (lease mode through PgBouncer, one slot each) per fleet, {ITEMS} items"
          f" inserted one at a time (mean gap {GAP_MS:.0f} ms), the same moments for both fleets")
    print(f"{'fleet':<34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'idle queries/min':>17}")
    lat = {}
    for mode, p in producers.items():
        ms = sorted(float(r[0]) for r in p.execute(
            "SELECT extract(epoch FROM sent_at - created_at) * 1000 FROM outbox").fetchall())
        q = statistics.quantiles(ms, n=100, method="inclusive")
        lat[mode] = (q[49], q[98], ms[-1])
        label = (f"LISTEN/NOTIFY (fallback poll {FALLBACK_S:.0f} s)" if mode == "notify"
                 else f"polling every {POLL_S:.0f} s")
        print(f"{label:<34} {q[49]:8.1f} {q[98]:8.1f} {ms[-1]:8.1f} {idle[mode]:17.1f}")
        p.close()
    print(f"ratio polling / notify: p50 {lat['poll'][0] / lat['notify'][0]:.0f}x, "
          f"p99 {lat['poll'][1] / lat['notify'][1]:.0f}x, "
          + (f"idle queries {idle['poll'] / idle['notify']:.0f}x" if idle["notify"]
             else "idle queries: the notified fleet sent none"))


if __name__ == "__main__":
    main()
