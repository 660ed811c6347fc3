"""Wake-up latency and idle cost: two fleets of W claim_slot workers side by
side, one waking on notify_slot's per-slot NOTIFY (LISTEN, with a fallback
poll), one polling every second. A producer inserts items one at a time at
random gaps into both fleets' tables at the same moments; each worker marks
an item sent with clock_timestamp(). Printed: insert -> processed latency
(sent_at - created_at) p50 / p99 / max per fleet, and the queries each idle
fleet sent per minute (counted by the clients; LISTEN waits send none).

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

W = 8  # workers per fleet, = n of the tables' slot_of index (bench/80-wake.sh)
ITEMS = int(os.environ.get("BENCH_WAKE_ITEMS", "300"))
GAP_MS = float(os.environ.get("BENCH_WAKE_GAP_MS", "60"))
IDLE_S = float(os.environ.get("BENCH_WAKE_IDLE_S", "60"))
FALLBACK_S = float(os.environ.get("BENCH_WAKE_FALLBACK_S", "30"))
POLL_S = 1.0
BATCH = 50
STOP = threading.Event()


def drain(conn, table, name, counter):
    """Mark this slot's pending items sent, a batch per statement, until a
    batch comes back short."""
    while True:
        cur = conn.execute(
            f"""UPDATE {table} SET sent_at = clock_timestamp()
                WHERE id IN (SELECT id FROM {table}
                             WHERE slot_of(id, {W}) = my_slot(%s) AND sent_at IS NULL
                             ORDER BY id LIMIT {BATCH})""", (name,))
        counter[0] += 1
        if cur.rowcount < BATCH:
            return


def worker(mode, table, name, counter, ready):
    conn = psycopg.connect(autocommit=True, application_name=f"bench_wake_{mode}")
    slot = None
    while slot is None:
        slot = conn.execute("SELECT claim_slot(%s, %s, '10 s')", (name, W)).fetchone()[0]
    if mode == "notify":
        channel = conn.execute("SELECT slot_channel(%s, %s)", (name, slot)).fetchone()[0]
        conn.execute(f"LISTEN {channel}")
    ready.release()
    while not STOP.is_set():
        drain(conn, table, name, counter)
        if mode == "poll":
            STOP.wait(POLL_S)
            continue
        deadline = time.monotonic() + FALLBACK_S
        woken = False
        while not woken and not STOP.is_set() and (left := deadline - time.monotonic()) > 0:
            for _ in conn.notifies(timeout=min(left, 0.5), stop_after=1):
                woken = True
    conn.close()


def main():
    admin = psycopg.connect(autocommit=True)
    fleets = {"notify": ("bench.wake_notify", "bench_wake_notify"),
              "poll": ("bench.wake_poll", "bench_wake_poll")}
    counters = {m: [[0] for _ in range(W)] for m in fleets}
    ready = threading.Semaphore(0)
    threads = []
    for mode, (table, name) in fleets.items():
        for i in range(W):
            t = threading.Thread(target=worker, args=(mode, table, name, counters[mode][i], ready),
                                 daemon=True)
            t.start()
            threads.append(t)
    for _ in range(2 * W):
        if not ready.acquire(timeout=60):
            sys.exit("wake: the workers did not all claim a slot")

    # idle: what each fleet sends with nothing to do
    time.sleep(2)
    before = {m: sum(c[0] for c in counters[m]) for m in fleets}
    t0 = time.monotonic()
    time.sleep(IDLE_S)
    elapsed = time.monotonic() - t0
    idle = {m: (sum(c[0] for c in counters[m]) - before[m]) * 60.0 / elapsed for m in fleets}

    # latency: the same insert moments for both fleets
    rnd = random.Random(42)
    for _ in range(ITEMS):
        for table, _name in fleets.values():
            admin.execute(f"INSERT INTO {table} (customer_id, recipient, body) VALUES (1, 'a@example.com', 'x')")
        time.sleep(rnd.expovariate(1000.0 / GAP_MS))
    deadline = time.monotonic() + 60
    while True:
        left = admin.execute(
            "SELECT (SELECT count(*) FROM bench.wake_notify WHERE sent_at IS NULL)"
            " + (SELECT count(*) FROM bench.wake_poll WHERE sent_at IS NULL)").fetchone()[0]
        if left == 0:
            break
        if time.monotonic() > deadline:
            sys.exit(f"wake: {left} items not processed within 60 s")
        time.sleep(0.05)
    STOP.set()

    print(f"wake-up: {W} claim_slot workers per fleet, {ITEMS} items inserted one at a time "
          f"(mean gap {GAP_MS:.0f} ms), the same moments for both fleets")
    print(f"{'fleet':<34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'idle queries/min':>17}")
    lat = {}
    for mode, (table, _name) in fleets.items():
        ms = [r[0] for r in admin.execute(
            f"SELECT extract(epoch FROM sent_at - created_at) * 1000 FROM {table}").fetchall()]
        ms = sorted(float(x) for x in ms)
        q = statistics.quantiles(ms, n=100, method="inclusive")
        lat[mode] = (q[49], q[98], ms[-1])
        label = (f"LISTEN/NOTIFY (fallback poll {FALLBACK_S:.0f} s)" if mode == "notify"
                 else f"polling every {POLL_S:.0f} s")
        print(f"{label:<34} {q[49]:8.1f} {q[98]:8.1f} {ms[-1]:8.1f} {idle[mode]:17.1f}")
    print(f"ratio polling / notify: p50 {lat['poll'][0] / lat['notify'][0]:.0f}x, "
          f"p99 {lat['poll'][1] / lat['notify'][1]:.0f}x, "
          f"idle queries {idle['poll'] / max(idle['notify'], 1e-9):.0f}x")


if __name__ == "__main__":
    main()
