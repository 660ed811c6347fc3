"""An online resize of a library fleet: Python and Node.js workers (lease
mode) through PgBouncer in transaction mode drain an ordered outbox while
the fleet is resized 8 -> 32 -> 12 (resize_fleet), a worker is killed
(SIGKILL) and one joins during each change.

Needs a running cluster with pg_claim installed (PGHOST/PGPORT, as
scripts/test sets them) and PgBouncer in pool_mode = transaction in front
of it (PGC_POOLER_PORT; scripts/lib.sh pgc_pgbouncer_start). The layer
`resize` of scripts/test runs it.

In a database of its own (py_resize), an outbox of 1,000 customers x 50
messages, the customers' messages interleaved in id order, routed by
customer with the jump mapping (my_items(..., route => 'customer_id',
method => 'jump')); the handler (resize_worker.py, resize_worker.js) works
2 ms per message (I/O, in the fenced transaction), marks its batch sent and logs each message in id order in the batch's
transaction (sent_log, its seq from a sequence):

1. two Python and two Node.js workers start with n = 8 and drain a part;
2. a Python worker is killed with SIGKILL, a Node.js worker started with
   n = 8 joins, and resize_fleet('resize', 32) runs, all at once: every
   live worker tells `resized` {8 -> 32}, the joiner too (its first claim
   is refused with PC002), and every slot of 32 is served again;
3. a Node.js worker is killed, a Python worker started with n = 8 joins,
   and resize_fleet('resize', 12) runs: the same, 32 -> 12;
4. the outbox drains; SIGTERM stops every worker (exit 0).

Then: every message is in the log exactly once; per customer the log
(by seq) is in id order; every message logged before the first resize
committed was handled by slot jump_slot(customer, 8), between the two by
jump_slot(customer, 32), after by jump_slot(customer, 12) (no batch of a
dead token wrote after a resize); and the fraction of customers whose slot
changed at each step is within 10% of the jump mapping's expectation:
growing from n to n' moves a key with probability 1 - n/n' (8 -> 32:
0.75), shrinking moves the keys of the slots at or above n' (32 -> 12:
1 - 12/32 = 0.625). Every wait polls with a deadline; the module is
bounded by TIME_LIMIT_S.
"""
import os
import signal
import sys
import time

import psycopg

from harness import Failure, check, fresh_database, log, poll, stop_all  # noqa: E402
from .outbox import OutboxWorker, check_outbox_log, outbox_tables  # noqa: E402

DB = "py_resize"
NAME = "resize"
CUSTOMERS, PER_CUSTOMER = 1000, 50
ITEMS = CUSTOMERS * PER_CUSTOMER
STEPS = (8, 32, 12)
TTL_S = 2.0
ITEM_MS = 2  # the handler's work per message: a drain of about 25 s
TIME_LIMIT_S = 120
if "PGC_POOLER_PORT" not in os.environ:
    sys.exit("test_resize.py: PGC_POOLER_PORT is not set (scripts/test sets it: pgc_pgbouncer_start)")
POOLER_PORT = int(os.environ["PGC_POOLER_PORT"])


def direct(dbname=DB):
    return psycopg.connect(dbname=dbname, autocommit=True, application_name="resize driver")


def Worker(workdir, lang, n):
    return OutboxWorker(workdir, lang, n, db=DB, name=NAME, port=POOLER_PORT, ttl_s=TTL_S, item_ms=ITEM_MS)


def served(d, n, live):
    """The live leases when every slot of n is held by a live worker."""
    h = {s: holder for s, holder in d.execute(
        "SELECT slot, holder FROM lease_holders(%s) WHERE NOT expired", (NAME,))}
    holders = {w.holder for w in live}
    return h if sorted(h) == list(range(n)) and set(h.values()) <= holders else None


def logged(d):
    return d.execute("SELECT count(*) FROM sent_log").fetchone()[0]


def setup():
    fresh_database(DB)
    with direct() as d:
        outbox_tables(d, CUSTOMERS, PER_CUSTOMER)
        for n in STEPS:  # each n's share is read through an index of its own
            d.execute(f"CREATE INDEX ON outbox ((jump_slot(customer_id::int8, {n})), id) WHERE sent_at IS NULL")
        d.execute("ANALYZE outbox")


def change(d, workdir, workers, live, victim, joiner, old_n, n):
    """SIGKILL `victim`, start a worker of `joiner` with the first n, and
    resize the fleet to n, at once. The time the resize committed (every
    batch of the old n ended before it) and the seconds until every slot of
    n was served by a live worker."""
    since = {w: len(w.events) for w in live}
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    live.remove(victim)
    t = time.monotonic()
    old, at = d.execute("SELECT resize_fleet(%s, %s), clock_timestamp()", (NAME, n)).fetchone()
    w = Worker(workdir, joiner, STEPS[0])
    workers.append(w)
    live.append(w)
    check(old == old_n, f"resize_fleet returned {old} as the old n, not {old_n}")
    poll(lambda: served(d, n, live), 30, f"every slot of n = {n} served by {', '.join(map(str, live))}")
    took = time.monotonic() - t
    for x in live:
        e = x.wait_event("resized", since.get(x, 0), 20)
        want_old = STEPS[0] if x is w else old
        check(e.get("old_n", e.get("oldN")) == want_old and e["n"] == n,
              f"{x} told resized {e}, not {want_old} -> {n}")
    log(f"  resize {old} -> {n}: {victim} killed, {w} joined (started with n = {STEPS[0]}); every slot"
        f" served {took:.2f} s after the call; {logged(d)} of {ITEMS} logged")
    return at, took


def checks(d, marks):
    check_outbox_log(d, ITEMS)
    # the phase of each row by the time the resizes committed: the slot of its phase's n
    t1, t2 = marks
    wrong = d.execute("""
        SELECT count(*), min(item) FROM (
            SELECT item, slot, customer_id,
                   CASE WHEN logged_at < %s THEN %s WHEN logged_at < %s THEN %s ELSE %s END AS n
            FROM sent_log) x
        WHERE slot <> jump_slot(customer_id::int8, n)""", (t1, STEPS[0], t2, STEPS[1], STEPS[2])).fetchone()
    check(wrong[0] == 0, f"{wrong[0]} messages handled by a slot not of their phase's n (first: {wrong[1]})")
    # per customer, its slot in each phase (one, by the check above): the fraction that changed
    rows = d.execute("""
        SELECT customer_id, CASE WHEN logged_at < %s THEN 0 WHEN logged_at < %s THEN 1 ELSE 2 END AS phase,
               min(slot), max(slot)
        FROM sent_log GROUP BY 1, 2""", (t1, t2)).fetchall()
    slot = {}
    for c, phase, lo, hi in rows:
        check(lo == hi, f"customer {c} served by slots {lo} and {hi} in phase {phase}")
        slot[(c, phase)] = lo
    for step, (n, n2) in enumerate(zip(STEPS, STEPS[1:])):
        both = [c for c in range(1, CUSTOMERS + 1) if (c, step) in slot and (c, step + 1) in slot]
        check(len(both) >= CUSTOMERS * 0.9, f"{len(both)} customers seen on both sides of {n} -> {n2}")
        moved = sum(1 for c in both if slot[(c, step)] != slot[(c, step + 1)]) / len(both)
        expect = 1 - n / n2 if n2 > n else 1 - n2 / n
        check(abs(moved - expect) <= 0.1 * expect,
              f"{n} -> {n2}: {moved:.3f} of the customers changed slot, expected {expect:.3f} (within 10%)")
        log(f"  {n} -> {n2}: {moved:.3f} of {len(both)} customers changed slot; the jump mapping expects"
            f" {expect:.3f}")


def run(workdir):
    setup()
    d = direct()
    workers, live = [], []
    t0 = time.monotonic()
    try:
        for lang in ("py", "node", "py", "node"):
            w = Worker(workdir, lang, STEPS[0])
            workers.append(w)
            live.append(w)
        poll(lambda: served(d, STEPS[0], live), 20, f"every slot of n = {STEPS[0]} served")
        poll(lambda: logged(d) >= ITEMS // 5, 40, "a fifth of the outbox drained at n = 8")
        log(f"  n = {STEPS[0]}: {logged(d)} logged after {time.monotonic() - t0:.1f} s")
        t1, _ = change(d, workdir, workers, live, live[0], "node", STEPS[0], STEPS[1])
        poll(lambda: logged(d) >= ITEMS * 3 // 5, 40, "three fifths drained")
        victim = next(w for w in live if w.lang == "node")
        t2, _ = change(d, workdir, workers, live, victim, "py", STEPS[1], STEPS[2])
        poll(lambda: logged(d) >= ITEMS, TIME_LIMIT_S - (time.monotonic() - t0), "the drain")
        for w in live:
            w.proc.send_signal(signal.SIGTERM)
        for w in live:
            try:
                rc = w.proc.wait(15)
            except Exception as e:  # noqa: BLE001
                raise Failure(f"{w} did not exit within 15 s of SIGTERM") from e
            check(rc == 0, f"{w} exited with {rc}: {open(w.err_path, errors='replace').read()[-2000:]}")
        log(f"  drained in {time.monotonic() - t0:.1f} s")
        checks(d, (t1, t2))
        for w in workers:
            reasons = {e["reason"] for e in w.events if e["event"] == "lost"}
            # a batch fenced because balance moved the slot, or because the lease
            # lapsed on a loaded machine and another holder took it, tells `taken`;
            # a worker never loses its connection through the pooler here
            allowed = {"resized", "given back", "released", "taken", "expired"}
            check(reasons <= allowed, f"{w} lost slots as {sorted(reasons)}")
            check(not any(e["event"] == "stopped" and e.get("error") for e in w.events), f"{w} stopped with an error")
    finally:
        stop_all(workers, kill=True)
        d.close()


def test_resize(workdir, databases):
    databases.adopt(DB)
    run(workdir)
