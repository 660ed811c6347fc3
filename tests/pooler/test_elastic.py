"""Elastic lease fleets (claim_leases) through a real transaction-mode pooler
(PgBouncer, the `pgbouncer` fixture's), the layer `elastic` of scripts/test.

Python (pg_claim.Worker, elastic_worker.py) and Node.js (pg-claim's Worker,
elastic_worker.js) workers, the worker libraries in lease mode with balance
off, hold the n = 8 slots of one name, fewer workers than slots all along:
each calls claim_leases every 0.5 s (ttl 2 s) through the pool, and works on
the slots it holds, each batch in a transaction that passed fence() first.
A producer adds items while the fleet drains them. In turn:

1. two holders (one per language) share the 8 slots 4/4;
2. a Python holder joins (3/3/2), then a Node holder (2/2/2/2): each join
   moves at most ceil(n/H) slots to another holder (the holders before and
   after, from lease_holders), and once balanced the leases stay put;
3. a Python and a Node holder are stopped with SIGSTOP in the middle of a
   batch, past their ttl, until the two others hold all 8 slots (4/4), none
   taken before its lease expired (the server ends the stopped batch's
   transaction, idle_in_transaction_session_timeout = ttl, so its fence no
   longer holds the slot); the stopped holders' tokens are stale: fence
   raises PC001 on them, lease_valid is false and a write behind it touches
   no row; resumed with SIGCONT, each tries its late write, which fails with
   its session (or the fence, PC001), and none of it lands; they join again
   (2/2/2/2);
4. a holder leaves gracefully (SIGTERM: claim_leases(..., max => 0)): its
   slots are given back at once (no lease of it left, no ttl to wait) and
   the other three take them (3/3/2);
5. a holder is killed with SIGKILL: its slots change hands only once their
   leases expired (4/4 between the two left);
6. two holders join at once (2/2/2/2); the producer stops, the fleet drains
   the table, and every worker leaves: no lease is left.

Balance means every slot held by an unexpired lease of one of the live
holders, each holding floor(n/H) or ceil(n/H) slots; every wait for it polls
lease_holders with a deadline. Then the processing log is checked: every
item processed exactly once, each by a holder of its slot (the items' slot
is their customer's: my_items(..., route => 'customer')); each customer's
items written in key order, across every hand-over; for each slot, no
write accepted with a token older than one already written (the log's
sequence numbers are taken inside the fenced transaction); no more server
connections than the pool (PgBouncer's count); the workers of both
languages name their connections alike (`pg_claim elastic`); no worker
error.
"""
import collections
import math
import os
import signal
import subprocess
import sys
import threading
import time

from harness import Failure, Producer, WorkerProcess, check, log, poll, stop_all

from .common import (HERE, server_connections, check_pooler, direct, late_write_lost, pool_size, pooler_port,
                     probe_stale_token, stop_mid_batch)

DB = "pg_claim_elastic"
NAME = "elastic"
N = 8
TTL_S = 2.0
PERIOD_S = 0.5  # each worker calls claim_leases every ttl/4
BATCH = 10
ITEM_MS = 20  # a full batch is 200 ms of "work"
INITIAL_ITEMS = 1500
PRODUCE_PER_S = 100
SETTLE_S = 15  # the deadline for a balance after a join or a leave (and a ttl after a loss)
STABLE_S = 3 * PERIOD_S  # once balanced, nothing moves for this long
TIME_LIMIT_S = 150


class Worker(WorkerProcess):
    def __init__(self, lang, holder, workdir, env):
        cmd = ([sys.executable, os.path.join(HERE, "elastic_worker.py")] if lang == "python"
               else ["node", os.path.join(HERE, "elastic_worker.js")])
        self.lang, self.holder = lang, holder
        super().__init__(cmd, dict(env, ELASTIC_HOLDER=holder), os.path.join(workdir, f"{holder}.err"))

    def __str__(self):
        return self.holder


def leases(d):
    """{slot: (holder, token, expires_at)} of the unexpired leases."""
    return {r[0]: (r[1], r[2], r[3]) for r in d.execute(
        "SELECT slot, holder, token, expires_at FROM lease_holders(%s) WHERE NOT expired", (NAME,)).fetchall()}


def shares(h):
    """'holder: k' for each holder of the leases h, in the order of the holders' names."""
    c = collections.Counter(holder for holder, _, _ in h.values())
    return ", ".join(f"{holder} {k}" for holder, k in sorted(c.items()))


def balanced(d, holders):
    """The leases when every slot is held by one of `holders`, each holding
    floor(n/H) or ceil(n/H) slots; else None."""
    h = leases(d)
    c = collections.Counter(holder for holder, _, _ in h.values())
    if len(h) == N and set(c) == {w.holder for w in holders} and max(c.values()) - min(c.values()) <= 1:
        return h
    return None


class History:
    """Every change of a slot's holder or token, as lease_holders shows them
    (sampled every 50 ms by a thread); a token going back is a failure."""

    def __init__(self):
        self.changes = []  # (time.monotonic(), slot, previous holder, holder, token)
        self.backwards = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        last = {}
        with direct(DB) as m:
            while not self._stop.is_set():
                rows = m.execute("SELECT slot, holder, token FROM lease_holders(%s) WHERE NOT expired",
                                 (NAME,)).fetchall()
                now = time.monotonic()
                seen = {slot: (holder, token) for slot, holder, token in rows}
                for slot in set(last) | set(seen):
                    prev, cur = last.get(slot, (None, None)), seen.get(slot, (None, None))
                    if prev != cur:
                        if cur[1] is not None and prev[1] is not None and cur[1] < prev[1]:
                            self.backwards.append((slot, prev, cur))
                        if cur[1] is not None or prev[1] is not None:
                            self.changes.append((now, slot, prev[0], cur[0], cur[1]))
                last = {s: v for s, v in seen.items()}
                self._stop.wait(0.05)

    def handovers(self, since):
        """Slots taken by a holder other than the slot's previous one, since `since`."""
        return sum(1 for t, _, prev, cur, _ in self.changes if t >= since and cur is not None and cur != prev)

    def stop(self):
        self._stop.set()
        self._thread.join(5)


class Fleet:
    def __init__(self, workdir, d, history):
        self.workdir, self.d, self.history = workdir, d, history
        self.env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(pooler_port()), PGDATABASE=DB,
                        PGUSER="postgres", ELASTIC_NAME=NAME, ELASTIC_N=str(N), ELASTIC_TTL_S=str(TTL_S),
                        ELASTIC_PERIOD_S=str(PERIOD_S), ELASTIC_BATCH=str(BATCH),
                        ELASTIC_ITEM_MS=str(ITEM_MS), ELASTIC_LIFETIME_S=str(TIME_LIMIT_S))
        self.env.pop("PGSERVICE", None)
        self.workers = []  # every worker started
        self.live = []     # the holders expected to share the slots
        self.count = collections.Counter()

    def start(self, lang):
        self.count[lang] += 1
        w = Worker(lang, f"{'py' if lang == 'python' else 'js'}-{self.count[lang]}", self.workdir, self.env)
        self.workers.append(w)
        self.live.append(w)
        return w

    def settle(self, what):
        """Poll until the live holders are balanced; (leases, seconds)."""
        t0 = time.monotonic()
        h = poll(lambda: balanced(self.d, self.live), SETTLE_S,
                 f"{what}: the shares of {', '.join(map(str, self.live))} to balance")
        return h, time.monotonic() - t0

    def stable(self, h, what):
        """Once balanced, no lease changes holder or token for STABLE_S."""
        end = time.monotonic() + STABLE_S
        while time.monotonic() < end:
            now = leases(self.d)
            moved = {s: (h[s][:2], now.get(s, (None, None))[:2]) for s in h if now.get(s, (None, None))[:2] != h[s][:2]}
            check(not moved, f"{what}: balanced, then leases moved within {STABLE_S:g} s: {moved}")
            time.sleep(0.1)

    def join(self, *langs):
        """Start holders of `langs` at once; wait for the balance; the movement is checked."""
        before = balanced(self.d, self.live)
        check(before, "the fleet is not balanced before a join")
        since = time.monotonic()
        joiners = [self.start(lang) for lang in langs]
        what = f"join of {', '.join(map(str, joiners))}"
        after, dt = self.settle(what)
        moved = sorted(s for s in range(N) if before[s][0] != after[s][0])
        bound = len(joiners) * math.ceil(N / len(self.live))
        check(len(moved) <= bound, f"{what}: {len(moved)} slots changed holder (bound {bound}): {before} -> {after}")
        self.stable(after, what)
        log(f"  {what}: balanced after {dt:.1f} s ({shares(after)}); {len(moved)} slots changed holder"
            f" (at most {bound}), {self.history.handovers(since)} hand-overs on the way")
        return after

    def errors(self):
        return [(w.holder, e) for w in self.workers for e in w.events if e["event"] in ("error", "garbage")]

    def stop_all(self):
        stop_all(self.workers, kill=True)


def leave(fleet, w, what):
    """SIGTERM w: it finishes its batch and gives its slots back (max => 0), at once."""
    fleet.live.remove(w)
    since = len(w.events)
    os.kill(w.pid, signal.SIGTERM)
    ev = w.wait_event(("left", "error"), since, 10)
    check(ev["event"] == "left", f"{w} on SIGTERM: {ev}")
    mine = [s for s, (holder, _, _) in leases(fleet.d).items() if holder == w.holder]
    check(not mine, f"{what}: {w} left, and still holds slots {mine}")
    try:
        rc = w.proc.wait(10)
    except subprocess.TimeoutExpired:
        raise Failure(f"{w} did not exit after leaving") from None
    check(rc == 0, f"{w} exited with {rc} after leaving: {open(w.err_path).read()[-2000:]}")


def test_elastic_fleet(workdir, databases):
    """The six steps above, then the checks of the processing log."""
    check_pooler(DB)
    databases(DB)
    with direct(DB) as d:
        d.execute("""
            CREATE TABLE items (id bigserial PRIMARY KEY, customer integer NOT NULL,
                done boolean NOT NULL DEFAULT false);
            INSERT INTO items (customer) SELECT g %% 97 FROM generate_series(1, %s) g;
            CREATE INDEX ON items ((slot_of(customer, %s)), id);
            CREATE TABLE processing_log (seq bigserial PRIMARY KEY, item bigint NOT NULL,
                worker text NOT NULL, slot integer NOT NULL, token bigint NOT NULL,
                logged_at timestamptz NOT NULL DEFAULT clock_timestamp());
            ANALYZE items;
        """ % (INITIAL_ITEMS, N))
    d = direct(DB)
    servers = server_connections(DB)
    history = History()
    producer = Producer(lambda: direct(DB), "INSERT INTO items (customer) SELECT (random() * 96)::int FROM generate_series(1, %s)",
                        PRODUCE_PER_S)
    fleet = Fleet(workdir, d, history)
    stopped = []
    t0 = time.monotonic()
    try:
        log(f"elastic fleets: claim_leases n = {N}, ttl {TTL_S:g} s, called every {PERIOD_S:g} s, through"
            f" PgBouncer (transaction mode, pool {pool_size()}); {INITIAL_ITEMS} items and {PRODUCE_PER_S} more a second")
        # 1. two holders
        fleet.start("python")
        fleet.start("node")
        h, dt = fleet.settle("start")
        fleet.stable(h, "start")
        log(f"  2 holders: balanced after {dt:.1f} s ({shares(h)})")

        # 2. joins, one at a time
        fleet.join("python")
        h = fleet.join("node")

        # 3. SIGSTOP a Python and a Node holder in the middle of a batch, past the ttl
        paused = [next(w for w in fleet.live if w.lang == lang) for lang in ("python", "node")]
        for w in paused:
            w.wait_event("wrote", 0, 20)
        for w in paused:
            slot, token, at = stop_mid_batch(w, ITEM_MS, tries=30)
            held = {s: v for s, v in leases(d).items() if v[0] == w.holder}
            check(held.get(slot, (None, None))[1] == token,
                  f"{w} stopped in a batch of slot {slot} token {token}, holding {held}")
            w.stop = (slot, token, at, held)
            fleet.live.remove(w)
            stopped.append(w)
            log(f"  SIGSTOP {w} in the middle of a batch of slot {slot} (holding {sorted(held)})")
        h, dt = fleet.settle("SIGSTOP")
        for w in paused:
            for s, (_, token, expires) in w.stop[3].items():
                (acquired,) = d.execute("SELECT acquired_at FROM lease_holders(%s) WHERE slot = %s",
                                        (NAME, s)).fetchone()
                check(h[s][1] > token and acquired >= expires,
                      f"slot {s} of the stopped {w}: taken with token {h[s][1]} at {acquired},"
                      f" its lease (token {token}) expired at {expires}")
            check(w.state() == "T", f"{w} is no longer stopped")
        log(f"  the two others hold every slot ({shares(h)}) {time.time() - paused[0].stop[2]:.1f} s"
            " after the first SIGSTOP; no slot taken before its lease expired")
        for w in paused:
            probe_stale_token(w.stop[0], w.stop[1], db=DB, name=NAME, n=N)
        log("  the stopped holders' tokens, in SQL through the pool: fence raises PC001, lease_valid is"
            " false, a write behind it touches no row")
        for w in paused:
            w.resumed_at = len(w.events)
            os.kill(w.pid, signal.SIGCONT)
            stopped.remove(w)
        for w in paused:
            e = late_write_lost(d, w, w.resumed_at, w.stop[0], w.stop[1], w.stop[2])
            log(f"  SIGCONT {w}: its late write of {e['items']} items to slot {e['slot']} was {e['event']}"
                f" ({e['how']}); none of it landed")
            fleet.live.append(w)
        h, dt = fleet.settle("rejoin after SIGCONT")
        fleet.stable(h, "rejoin after SIGCONT")
        log(f"  the resumed holders joined again: balanced after {dt:.1f} s ({shares(h)})")

        # 4. a graceful leave
        w = next(w for w in fleet.live if w.lang == "python")
        before = h
        gave = sorted(s for s, v in before.items() if v[0] == w.holder)
        leave(fleet, w, "leave")
        h, dt = fleet.settle("leave")
        fleet.stable(h, "leave")
        others = [s for s in before if s not in gave and before[s][0] != h[s][0]]
        log(f"  SIGTERM {w}: it gave back slots {gave} at once (claim_leases max => 0: no lease of it"
            f" left); balanced {dt:.1f} s after it left ({shares(h)}); {len(others)} other slots changed holder")

        # 5. SIGKILL
        w = next(w for w in fleet.live if w.lang == "node")
        killed = {s: v for s, v in leases(d).items() if v[0] == w.holder}
        os.kill(w.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        fleet.live.remove(w)
        h, _ = fleet.settle("SIGKILL")
        for s, (_, token, expires) in killed.items():
            (acquired,) = d.execute("SELECT acquired_at FROM lease_holders(%s) WHERE slot = %s",
                                    (NAME, s)).fetchone()
            check(h[s][1] > token and acquired >= expires,
                  f"slot {s} of the killed {w}: taken at {acquired}, its lease expired at {expires}")
        fleet.stable(h, "SIGKILL")
        log(f"  SIGKILL {w} (slots {sorted(killed)}): taken over once expired, balanced"
            f" {time.monotonic() - t_kill:.1f} s after the kill ({shares(h)})")

        # 6. two join at once; drain; everyone leaves
        fleet.join("python", "node")
        producer.stop()
        poll(lambda: d.execute("SELECT NOT EXISTS (SELECT 1 FROM items WHERE NOT done)").fetchone()[0],
             60, "every item to be done")
        t_drain = time.monotonic() - t0
        log(f"  {INITIAL_ITEMS + producer.produced} items done {t_drain:.1f} s after the start")
        for w in list(fleet.live):
            leave(fleet, w, "the end")
        rows = d.execute("SELECT slot, holder FROM lease_holders(%s) WHERE NOT expired", (NAME,)).fetchall()
        check(not rows, f"leases left after every worker left: {rows}")
        log("  every worker left: no lease left (lease_holders shows every slot expired)")
        for w in fleet.workers:
            if w.proc.poll() is not None and w.proc.returncode not in (0, -signal.SIGKILL):
                raise Failure(f"{w} exited with {w.proc.returncode}: {open(w.err_path).read()[-2000:]}")
    finally:
        for w in stopped:
            os.kill(w.pid, signal.SIGCONT)
        producer.stop()
        fleet.stop_all()
        history.stop()
        servers.stop()

    # the checks
    (items, not_done) = d.execute("SELECT count(*), count(*) FILTER (WHERE NOT done) FROM items").fetchone()
    (logged, distinct) = d.execute("SELECT count(*), count(DISTINCT item) FROM processing_log").fetchone()
    (missing,) = d.execute("SELECT count(*) FROM items i WHERE NOT EXISTS"
                           " (SELECT 1 FROM processing_log l WHERE l.item = i.id)").fetchone()
    check(not_done == 0 and missing == 0 and logged == items and distinct == items,
          f"exactly once: {items} items, {logged} log rows for {distinct} items, {missing} missing,"
          f" {not_done} not done")
    (foreign,) = d.execute("SELECT count(*) FROM processing_log l JOIN items i ON i.id = l.item"
                           " WHERE slot_of(i.customer, %s) <> l.slot", (N,)).fetchone()
    check(foreign == 0, f"{foreign} items written by a holder of another slot")
    # per-key order across hand-overs: each customer's items were written in
    # key order, whichever holders wrote them
    (disorder,) = d.execute(
        "SELECT count(*) FROM (SELECT l.item, lag(l.item) OVER (PARTITION BY i.customer ORDER BY l.seq) AS prev"
        " FROM processing_log l JOIN items i ON i.id = l.item) x WHERE item < prev").fetchone()
    check(disorder == 0, f"{disorder} items written before an item of the same customer with a smaller key")
    (older,) = d.execute(
        "SELECT count(*) FROM (SELECT token, max(token) OVER (PARTITION BY slot ORDER BY seq"
        " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS newest_before FROM processing_log) x"
        " WHERE token < newest_before").fetchone()
    check(older == 0, f"{older} writes accepted with a token older than one already written for their slot")
    check(not history.backwards, f"a slot's token went back: {history.backwards[:3]}")
    errors = fleet.errors()
    check(not errors, f"worker errors: {errors[:5]}")
    check(0 < servers.max <= pool_size(), f"{servers.max} server connections seen for a pool of {pool_size()}")
    # both libraries name their connections alike ('' before a client's first use)
    check(servers.apps - {""} == {f"pg_claim {NAME}"},
          f"the workers' connections are named {sorted(servers.apps)}, not pg_claim {NAME} in both languages")
    (tokens,) = d.execute("SELECT count(DISTINCT token) FROM processing_log").fetchone()
    per_lang = {lang: sum(w.count("wrote") for w in fleet.workers if w.lang == lang) for lang in ("python", "node")}
    rejected = [e for w in fleet.workers for e in w.events if e["event"] in ("rejected", "refused")]
    given_back = given_back_in_flight(fleet.workers)
    d.close()
    log(f"summary: {items} items processed once each by {len(fleet.workers)} holders over at most"
        f" {servers.max} server connections (pool {pool_size()}); batches written: {per_lang['python']} Python,"
        f" {per_lang['node']} Node, with {tokens} tokens; no write of an older token after a newer one"
        f" in any slot, each customer's items in key order; {len(rejected)} writes refused or rejected by fence ({len(given_back)} of them batches"
        f" of {sum(e.get('items', 0) for e in given_back)} items in all whose slot a rebalance moved while they"
        f" were worked on); {history.handovers(0)} hand-overs in all")


def given_back_in_flight(workers):
    """The refused or rejected writes of batches whose slot the worker's
    claim_leases gave back between the batch's fetch and its write, the
    stopped workers' late writes apart: the cost of a rebalance (none when,
    as in the libraries, the batch's fenced transaction holds the slot from
    before its fetch to its write). A "rejected" event (the library's: the
    fence refused the token) names the slot and token, not the items."""
    out = []
    for w in workers:
        late = getattr(w, "stop", (None, None))[1]
        fetched = {}  # slot -> [token of the batch in progress, whether a call gave the slot back since]
        for e in w.events:
            if e["event"] == "fetched":
                fetched[e["slot"]] = [e["token"], False]
            elif e["event"] == "lost" and fetched.get(e["slot"], [None])[0] == e["token"]:
                fetched[e["slot"]][1] = True
            elif e["event"] in ("rejected", "refused") and int(e["token"]) != late and fetched.get(e["slot"], [None, False])[1]:
                out.append(e)
    return out
