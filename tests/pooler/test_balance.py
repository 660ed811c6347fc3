"""Balancing a claim_leases fleet by remaining work (docs/leases.md,
"Balancing") through a real transaction-mode pooler (PgBouncer, the
`pgbouncer` fixture's), in the layer `elastic` of scripts/test after
tests/pooler/test_elastic.py.

Python holders (pg_claim.Worker with balance on: elastic_worker.py with
ELASTIC_BALANCE=1) drain a table whose n = 8 slots are uneven: slots 0 and
1 hold two and a half times the items of each other slot (their customers have more
rows; items are routed by customer). The batches report each slot's
weight with report_backlog: the library's own, the slot's pending rows
ahead of its cursor, counted in windows; a slot the report says is wanted
elsewhere is released after the batch. In turn:

1. three holders start and every one writes;
2. one is stopped with SIGSTOP in the middle of a batch, past the ttl,
   until the others hold all its slots; its token is refused by fence
   (PC001); resumed, its late write fails (the server ended the batch's
   transaction) and none of it lands, and it serves again;
3. one is killed with SIGKILL; its slots are taken once expired;
4. a fourth holder joins; the fleet drains the table.

Checked: every item processed exactly once, by a holder of its slot; each
customer's items written in key order across every hand-over; no write of
an older token after a newer one in a slot; slots moved by weight (released
after being found wanted) during the run; the joiner and every holder left
at the end wrote (no starvation); and the holders left at the end finish
together: their last writes lie within max(4 s, 45% of the drain). (A
heavy slot is 6 s of one holder's serial work, which no balance divides,
and a killed or stopped holder's slots wait out the ttl first: on a loaded
machine the spread of a balanced fleet reached 40% of the drain. With
balance off, the fleet shares by count: in two runs, a holder left at the
end never wrote, and the starvation check failed first.)
"""
import os
import signal
import time

from harness import check, log, poll

from .common import check_pooler, direct, late_write_lost, pool_size, pooler_port, probe_stale_token, stop_mid_batch
from .test_elastic import Worker, leases

DB = "pg_claim_elastic"  # elastic.leases reads this fleet
NAME = "elastic"
N = 8
TTL_S = 2.0
PERIOD_S = 0.5
BATCH = 10
ITEM_MS = 10
# items per customer of slots 0 and 1, of the others: the light slots still
# hold work when the joiner comes (a heavy slot alone, which no move
# divides, would leave it nothing to take)
HEAVY, LIGHT = 100, 40
TIME_LIMIT_S = 150  # the workers' own lifetime


def test_balance_fleet(workdir, databases):
    """The four steps above, then the checks of the processing log."""
    check_pooler(DB)
    databases(DB)
    with direct(DB) as d:
        d.execute("""
            CREATE TABLE items (id bigserial PRIMARY KEY, customer integer NOT NULL,
                done boolean NOT NULL DEFAULT false);
            INSERT INTO items (customer)
            SELECT c FROM generate_series(0, 47) c,
                 LATERAL generate_series(1, CASE WHEN slot_of(c, %(n)s) < 2 THEN %(heavy)s ELSE %(light)s END) k
            ORDER BY k, c;
            CREATE INDEX ON items ((slot_of(customer, %(n)s)), id);
            CREATE TABLE processing_log (seq bigserial PRIMARY KEY, item bigint NOT NULL,
                worker text NOT NULL, slot integer NOT NULL, token bigint NOT NULL,
                logged_at timestamptz NOT NULL DEFAULT clock_timestamp());
            ANALYZE items;
        """ % {"n": N, "heavy": HEAVY, "light": LIGHT})
    d = direct(DB)
    per_slot = dict(d.execute("SELECT slot_of(customer, %s), count(*) FROM items GROUP BY 1", (N,)).fetchall())
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(pooler_port()), PGDATABASE=DB, PGUSER="postgres",
               ELASTIC_NAME=NAME, ELASTIC_N=str(N), ELASTIC_TTL_S=str(TTL_S), ELASTIC_PERIOD_S=str(PERIOD_S),
               ELASTIC_BATCH=str(BATCH), ELASTIC_ITEM_MS=str(ITEM_MS), ELASTIC_LIFETIME_S=str(TIME_LIMIT_S),
               ELASTIC_BALANCE="1")
    env.pop("PGSERVICE", None)
    workers, stopped = [], []

    def start():
        w = Worker("python", f"bal-{len(workers) + 1}", workdir, env)
        workers.append(w)
        return w

    t0 = time.monotonic()
    try:
        log(f"balance by remaining work: claim_leases n = {N}, ttl {TTL_S:g} s, through PgBouncer"
            f" (transaction mode, pool {pool_size()}); items per slot {dict(sorted(per_slot.items()))}")
        # 1. three holders, each writes
        live = [start() for _ in range(3)]
        poll(lambda: len(leases(d)) == N, 15, "every slot to be held")
        for w in live:
            w.wait_event("wrote", 0, 20)

        # 2. SIGSTOP one in the middle of a batch, past the ttl; SIGCONT
        w = live[0]
        slot, token, at = stop_mid_batch(w, ITEM_MS, tries=40)
        stopped.append(w)
        poll(lambda: all(h != w.holder for h, _, _ in leases(d).values()) and len(leases(d)) == N, 15,
             f"the others to hold every slot of the stopped {w}")
        probe_stale_token(slot, token, db=DB, name=NAME, n=N)
        since = len(w.events)
        os.kill(w.pid, signal.SIGCONT)
        stopped.remove(w)
        e = late_write_lost(d, w, since, slot, token, at)
        log(f"  SIGSTOP {w} in a batch of slot {slot} past the ttl: its token is refused by fence (PC001),"
            f" its late write was {e['event']} ({e['how']}) and none of it landed")

        # 3. SIGKILL another
        k = live[1]
        killed = {s: v for s, v in leases(d).items() if v[0] == k.holder}
        os.kill(k.pid, signal.SIGKILL)
        live.remove(k)
        poll(lambda: all(leases(d).get(s, (k.holder,))[0] != k.holder for s in killed), 15,
             f"the slots {sorted(killed)} of the killed {k} to be taken")
        log(f"  SIGKILL {k} (slots {sorted(killed)}): taken over once expired")

        # 4. a joiner; drain
        (left_at_join,) = d.execute("SELECT count(*) FROM items WHERE NOT done").fetchone()
        j = start()
        live.append(j)
        poll(lambda: d.execute("SELECT NOT EXISTS (SELECT 1 FROM items WHERE NOT done)").fetchone()[0],
             90, "every item to be done")
        drain = time.monotonic() - t0
    finally:
        for w in stopped:
            os.kill(w.pid, signal.SIGCONT)
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
            w.proc.wait()

    # the checks
    (items, logged, distinct) = d.execute(
        "SELECT (SELECT count(*) FROM items), count(*), count(DISTINCT item) FROM processing_log").fetchone()
    check(logged == items and distinct == items, f"exactly once: {items} items, {logged} log rows for {distinct}")
    (foreign,) = d.execute("SELECT count(*) FROM processing_log l JOIN items i ON i.id = l.item"
                           " WHERE slot_of(i.customer, %s) <> l.slot", (N,)).fetchone()
    check(foreign == 0, f"{foreign} items written by a holder of another slot")
    (disorder,) = d.execute(
        "SELECT count(*) FROM (SELECT l.item, lag(l.item) OVER (PARTITION BY i.customer ORDER BY l.seq) AS prev"
        " FROM processing_log l JOIN items i ON i.id = l.item) x WHERE item < prev").fetchone()
    check(disorder == 0, f"{disorder} items written before an item of the same customer with a smaller key")
    (older,) = d.execute(
        "SELECT count(*) FROM (SELECT token, max(token) OVER (PARTITION BY slot ORDER BY seq"
        " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS newest_before FROM processing_log) x"
        " WHERE token < newest_before").fetchone()
    check(older == 0, f"{older} writes accepted with a token older than one already written for their slot")
    errors = [(w.holder, e) for w in workers for e in w.events if e["event"] in ("error", "garbage")]
    check(not errors, f"worker errors: {errors[:5]}")
    gave = [e for w in workers for e in w.events if e["event"] == "gave"]
    check(gave, "no slot was released after its holder was told another holder wanted it")
    for w in live:
        check(w.count("wrote") > 0, f"{w} never wrote: starved ({left_at_join} items were left when {j} joined)")
    last = {w.holder: max(e["t"] for e in w.events if e["event"] == "wrote") for w in live}
    spread = max(last.values()) - min(last.values())
    bound = max(4.0, 0.45 * drain)
    d.close()
    check(spread <= bound, f"the holders left at the end finished {spread:.1f} s apart (bound {bound:.1f} s):"
          f" {last}")
    log(f"summary: {items} items once each by {len(workers)} holders in {drain:.1f} s; {len(gave)} slots"
        f" released on request; the {len(live)} holders left finished {spread:.1f} s apart (bound {bound:.1f} s)")

