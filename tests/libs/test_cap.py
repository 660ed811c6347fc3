"""A fleet-wide cap (cap_fleet) on a library fleet: Python and Node.js
workers (lease mode) through PgBouncer in transaction mode drain an ordered
outbox with at most G = 3 of them holding slots at once, while a holder is
killed (SIGKILL), another is paused past its ttl (SIGSTOP, then SIGCONT),
and a worker joins.

Needs a running cluster with pg_claim installed (PGHOST/PGPORT, as
scripts/test sets them) and PgBouncer in pool_mode = transaction in front
of it (PGC_POOLER_PORT). The layer `resize` of scripts/test runs it.

In a database of its own (py_cap), an outbox of 400 customers x 30
messages, routed by customer with the jump mapping; the handler
(resize_worker.py, resize_worker.js) works 2 ms per message and logs each
message in its batch's transaction. The fleet (n = 16) is defined and
capped at 3 before its workers start. A sampler reads lease_holders every
20 ms on a connection of its own for the run's whole length. Then:

1. five workers (three Python, two Node.js) start: three hold slots,
   every slot is served, two wait;
2. a holder is killed: a standby holds slots in its place, still three;
3. a holder is paused for 2.5 ttl and resumed: a standby takes its place,
   and the resumed worker waits as a standby (its late batch cannot write:
   fence);
4. a worker joins: it waits;
5. the outbox drains; SIGTERM stops every worker.

Every message is logged exactly once and per customer in id order; no
sample saw more than 3 holders; more than 3 workers held slots over the
run (the standbys took over). Every wait polls with a deadline.
"""
import os
import signal
import sys
import threading
import time

import psycopg

from harness import Failure, check, fresh_database, log, poll, stop_all
from .outbox import OutboxWorker, check_outbox_log, outbox_tables

DB = "py_cap"
NAME = "capped"
N, G = 16, 3
CUSTOMERS, PER_CUSTOMER = 400, 30
ITEMS = CUSTOMERS * PER_CUSTOMER
TTL_S = 2.0
ITEM_MS = 2
TIME_LIMIT_S = 120
if "PGC_POOLER_PORT" not in os.environ:
    sys.exit("test_cap.py: PGC_POOLER_PORT is not set (scripts/test sets it: pgc_pgbouncer_start)")
POOLER_PORT = int(os.environ["PGC_POOLER_PORT"])


def direct():
    return psycopg.connect(dbname=DB, autocommit=True, application_name="cap driver")


def Worker(workdir, lang):
    return OutboxWorker(workdir, lang, N, db=DB, name=NAME, port=POOLER_PORT, ttl_s=TTL_S, item_ms=ITEM_MS)


class Sampler(threading.Thread):
    """The live holders of the fleet, every 20 ms until stopped: the most
    seen at once, and every holder seen."""

    def __init__(self):
        super().__init__(daemon=True)
        self.most, self.seen, self.samples, self.error = 0, set(), 0, None
        self.stop = threading.Event()

    def run(self):
        try:
            with direct() as c:
                while not self.stop.wait(0.02):
                    hs = {h for (h,) in c.execute("SELECT DISTINCT holder FROM lease_holders(%s) WHERE NOT expired",
                                                  (NAME,))}
                    self.most = max(self.most, len(hs))
                    self.seen |= hs
                    self.samples += 1
        except Exception as e:  # noqa: BLE001 (told by the test)
            self.error = e


def holding(d):
    """The live holders and how many slots are served."""
    rows = d.execute("SELECT holder FROM lease_holders(%s) WHERE NOT expired", (NAME,)).fetchall()
    return {h for (h,) in rows}, len(rows)


def served_by(d, want):
    """True when every slot is served by G holders, `want(holders)` true."""
    hs, slots = holding(d)
    return slots == N and len(hs) == G and want(hs)


def logged(d):
    return d.execute("SELECT count(*) FROM sent_log").fetchone()[0]


def run(workdir):
    fresh_database(DB)
    d = direct()
    outbox_tables(d, CUSTOMERS, PER_CUSTOMER)
    d.execute(f"CREATE INDEX ON outbox ((jump_slot(customer_id::int8, {N})), id) WHERE sent_at IS NULL")
    d.execute("ANALYZE outbox")
    d.execute("SELECT define_fleet(%s, 'outbox', %s, 'sent_at', key => 'id', route => 'customer_id', "
              "method => 'jump')", (NAME, N))
    check(d.execute("SELECT cap_fleet(%s, %s)", (NAME, G)).fetchone()[0] is None, "a new fleet had a cap")
    sampler = Sampler()
    sampler.start()
    workers = []
    t0 = time.monotonic()
    try:
        for lang in ("py", "node", "py", "node", "py"):
            workers.append(Worker(workdir, lang))
        poll(lambda: served_by(d, lambda hs: True), 20, f"every slot served by {G} holders")
        hs, _ = holding(d)
        log(f"  {len(workers)} workers, {G} hold slots: {sorted(hs)}")

        # a holder killed: a standby takes its place
        victim = next(w for w in workers if w.holder in hs)
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait(10)
        poll(lambda: served_by(d, lambda now: victim.holder not in now), 20,
             f"every slot served by {G} holders without {victim}")
        before = hs
        hs, _ = holding(d)
        check(len(hs - before) == 1, f"one standby took over from {victim}: {sorted(before)} -> {sorted(hs)}")
        log(f"  {victim} killed: {sorted(hs - before)} took over ({logged(d)} of {ITEMS} logged)")

        # a holder paused past its ttl: a standby takes its place; resumed, it waits
        paused = next(w for w in workers if w.holder in hs and w.proc.poll() is None)
        os.kill(paused.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        poll(lambda: paused.state() == "T", 5, f"{paused} stopped")
        poll(lambda: served_by(d, lambda now: paused.holder not in now), 20,
             f"every slot served by {G} holders without the paused {paused}")
        poll(lambda: time.monotonic() - stopped_at >= 2.5 * TTL_S, 10, f"a pause of {2.5 * TTL_S:g} s")
        os.kill(paused.pid, signal.SIGCONT)
        since = len(paused.events)
        paused.wait_event("lost", since, 20)
        hs, _ = holding(d)
        check(paused.holder not in hs, f"the resumed {paused} holds slots beside {G} others")
        log(f"  {paused} paused past its ttl and resumed: holders {sorted(hs)} ({logged(d)} logged)")

        # a joiner waits
        joiner = Worker(workdir, "node")
        workers.append(joiner)
        poll(lambda: d.execute("SELECT count(*) FROM pg_claim_lease_members WHERE name = %s AND holder = %s"
                               " AND expires_at > clock_timestamp()", (NAME, joiner.holder)).fetchone()[0] == 1,
             20, f"{joiner} a member of the fleet")
        poll(lambda: logged(d) >= ITEMS, TIME_LIMIT_S - (time.monotonic() - t0), "the drain")
        hs, _ = holding(d)
        check(joiner.holder not in hs, f"the joiner {joiner} holds slots beside {G} others")
        live = [w for w in workers if w is not victim]
        for w in live:
            w.proc.send_signal(signal.SIGTERM)
        for w in live:
            try:
                rc = w.proc.wait(15)
            except Exception as e:  # noqa: BLE001
                raise Failure(f"{w} did not exit within 15 s of SIGTERM") from e
            check(rc == 0, f"{w} exited with {rc}: {open(w.err_path, errors='replace').read()[-2000:]}")
        log(f"  drained in {time.monotonic() - t0:.1f} s")
    finally:
        sampler.stop.set()
        sampler.join(5)
        stop_all(workers, kill=True)
    check(sampler.error is None, f"the sampler failed: {sampler.error}")
    check_outbox_log(d, ITEMS)
    writers = {h for (h,) in d.execute("SELECT DISTINCT holder FROM sent_log")}
    check(sampler.most <= G, f"a sample saw {sampler.most} holders at once, above the cap {G}")
    check(len(sampler.seen) > G and len(writers) > G,
          f"{len(sampler.seen)} workers held slots and {len(writers)} wrote over the run: the standbys did not take over")
    log(f"  {sampler.samples} samples: at most {sampler.most} holders at once (cap {G}); {len(sampler.seen)} held"
        f" slots over the run, {len(writers)} wrote")
    d.close()


def test_cap(workdir, databases):
    databases.adopt(DB)
    run(workdir)
