"""pg_claim through a real transaction-mode pooler (PgBouncer).

Needs a running cluster with pg_claim installed (PGHOST/PGPORT, as
scripts/test sets them) and PgBouncer in pool_mode = transaction in front of
it (PGC_POOLER_PORT, PGC_POOLER_POOL: scripts/lib.sh pgc_pgbouncer_start).

1. claim_slot through the pooler: with every server connection of the pool
   pinned but one, the test chooses which server connection runs each
   statement, and checks what docs/claiming.md ("Connection poolers") says:
   the same client's next statement sees no slot, another client inherits
   the slot, and the claim outlives its clients as long as the pooler keeps
   the server connection. Leases through the same pool, for contrast.
2. Lease fleets of the worker libraries: 6 pg_claim.Worker (clients/python,
   psycopg 3, fleet.py) and 6 pg-claim Worker (clients/node, node-postgres,
   fleet.js) processes in lease mode, n = 8 slots (12 workers: 8 hold one
   slot each, 4 hold none), ttl 2 s, through the pool, drain 3,000 items.
   One holder is killed with SIGKILL; two holders (one per language) are
   stopped with SIGSTOP inside a batch's fenced transaction for longer than
   the ttl, until the server ended their sessions and other workers took
   their slots, and then resumed with SIGCONT: each must try its late write
   and have it refused. The stale tokens are then probed in SQL: fence
   raises PC001, lease_valid is false and a write behind it touches no row.
   Every item is processed exactly once (the processing log), no accepted
   write of a stale token after its takeover, no more server connections
   than the pool.
3. A busy pool with no fault: 10 library workers (5 + 5) over the pool,
   each batch's transaction holding a server connection 0.6 s: once the
   slots are shared out, no slot changes hands. A holder stopped inside its
   batch's transaction has its session ended by the server (the library's
   idle_in_transaction_session_timeout); resumed, it reconnects.

Every wait polls with a deadline; the whole run is bounded by an alarm, and
no worker outlives it (they also exit by themselves when the driver is gone).
Exits non-zero on any failed check.
"""
import os
import signal
import time

from harness import Failure, check, log, poll, stop_all

from .common import (BATCH, DB, ITEM_MS, ITEMS, N, NAME, NODE_WORKERS, PYTHON_WORKERS, TTL_S, server_connections,
                     Worker, balanced, direct, holders, pid_of, pool_size, pooler_port, probe_stale_token,
                     stop_mid_batch)

TIME_LIMIT_S = 170


def test_lease_fleets_every_item_once(workdir):
    with direct() as d:
        d.execute("""
            DROP TABLE IF EXISTS items, processing_log;
            CREATE TABLE items (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
            INSERT INTO items SELECT g FROM generate_series(1, %s) g;
            CREATE INDEX ON items ((slot_of(id, %s)), id);
            CREATE TABLE processing_log (item bigint NOT NULL, worker text NOT NULL,
                                         token bigint NOT NULL, logged_at timestamptz NOT NULL DEFAULT clock_timestamp());
            ANALYZE items;
        """ % (ITEMS, N))
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(pooler_port()), PGDATABASE=DB, PGUSER="postgres",
               FLEET_NAME=NAME, FLEET_N=str(N), FLEET_TTL_S=str(TTL_S),
               FLEET_BATCH=str(BATCH), FLEET_ITEM_MS=str(ITEM_MS), FLEET_LIFETIME_S=str(TIME_LIMIT_S))
    env.pop("PGSERVICE", None)
    workers = []
    servers = server_connections(DB)
    d = direct()
    try:
        t0 = time.time()
        for i in range(PYTHON_WORKERS + NODE_WORKERS):
            workers.append(Worker("python" if i % 2 == 0 else "node", workdir, env))
        by_pid = {w.pid: w for w in workers}
        log(f"fleets: {PYTHON_WORKERS} pg_claim.Worker (Python) + {NODE_WORKERS} pg-claim Worker (Node.js)"
            f" processes in lease mode, n = {N}, ttl {TTL_S:g} s, {ITEMS} items,"
            f" through PgBouncer (transaction mode, pool {pool_size()})")

        live = balanced(d, workers)
        log(f"  {N} slots leased by {N} workers after {time.time() - t0:.1f} s; {len(workers) - N} hold none")
        owner = {slot: by_pid[pid_of(r[1])] for slot, r in live.items()}
        py = [w for w in owner.values() if w.lang == "python"]
        js = [w for w in owner.values() if w.lang == "node"]
        check(py and len(js) >= 2, f"holders: {len(py)} Python, {len(js)} Node")
        killed, paused = js[0], [py[0], js[1]]
        for w in [killed] + paused:
            w.wait_event("wrote", 0, 20)

        # SIGKILL one holder
        k_slot = next(s for s, w in owner.items() if w is killed)
        k_token = live[k_slot][2]
        os.kill(killed.pid, signal.SIGKILL)
        t_kill = time.time()
        done_then = d.execute("SELECT count(*) FROM items WHERE done").fetchone()[0]
        log(f"  SIGKILL {killed} (slot {k_slot}) with {done_then} of {ITEMS} items done")

        # SIGSTOP two holders in the middle of a batch
        for w in paused:
            slot, token, at = stop_mid_batch(w)
            w.stop = (slot, token, at)
            log(f"  SIGSTOP {w} (slot {slot}) in the middle of a batch, inside its fenced transaction")

        # workers without a slot take the three slots over once their leases
        # expired and (the stopped ones) the server ended the fenced transactions
        def taken_over():
            h = holders(d)
            slots = [(k_slot, k_token)] + [(w.stop[0], w.stop[1]) for w in paused]
            if all(s in h and h[s][2] != t for s, t in slots):
                return h
            return None
        h = poll(taken_over, 2 * TTL_S + 10, "other workers to take over the killed and the stopped workers' slots")
        k_new = h[k_slot]
        check(pid_of(k_new[1]) != killed.pid and k_new[2] > k_token, f"slot {k_slot} after the kill: {k_new}")
        takeovers = {"SIGKILL": (k_new[3].timestamp() - t_kill, k_new[1])}
        for w in paused:
            new = h[w.stop[0]]
            check(pid_of(new[1]) != w.pid and new[2] > w.stop[1], f"slot {w.stop[0]} after the stop: {new}")
            w.taken = new
            takeovers[f"SIGSTOP {w.lang}"] = (new[3].timestamp() - w.stop[2], new[1])
            check(w.state() == "T", f"{w} is no longer stopped")
        for label, (dt, by) in takeovers.items():
            log(f"  {label}: slot taken over by {by} {dt:.2f} s after the signal")
        for w in paused:
            probe_stale_token(w.stop[0], w.stop[1])
        log("  the stopped workers' tokens, in SQL through the pool: fence raises PC001, lease_valid is"
            " false, a write behind it touches no row")

        # SIGCONT: each resumed worker finishes its batch's work and tries its late write
        for w in paused:
            w.resumed_at = len(w.events)
            os.kill(w.pid, signal.SIGCONT)
        for w in paused:
            e = w.wait_event(("refused", "wrote"), w.resumed_at, 15)
            check(e["event"] == "refused", f"{w}'s late write after the takeover of its slot was ACCEPTED: {e}")
            check(int(e["token"]) == w.stop[1], f"{w}'s refused write used token {e['token']}")
            log(f"  SIGCONT {w}: its late write of {e['items']} items was refused ({e['how']})")

        poll(lambda: d.execute("SELECT NOT EXISTS (SELECT 1 FROM items WHERE NOT done)").fetchone()[0],
             60, "every item to be done")
        t_drain = time.time() - t0
        log(f"  every item done {t_drain:.1f} s after the start")
        for w in workers:
            if w is not killed and w.proc.poll() is not None:
                raise Failure(f"{w} exited by itself with {w.proc.returncode}:"
                              f" {open(w.err_path).read()[-2000:]} {w.events[-3:]}")
    finally:
        servers.stop()
        stop_all(workers)

    # the checks
    (not_done,) = d.execute("SELECT count(*) FROM items WHERE NOT done").fetchone()
    (logged, distinct) = d.execute("SELECT count(*), count(DISTINCT item) FROM processing_log").fetchone()
    (dups,) = d.execute("SELECT count(*) FROM (SELECT item FROM processing_log GROUP BY item"
                        " HAVING count(*) > 1) x").fetchone()
    (missing,) = d.execute("SELECT count(*) FROM items i WHERE NOT EXISTS"
                           " (SELECT 1 FROM processing_log l WHERE l.item = i.id)").fetchone()
    check(not_done == 0 and missing == 0 and dups == 0 and logged == ITEMS and distinct == ITEMS,
          f"exactly once: {logged} log rows for {distinct} items, {dups} duplicated, {missing} missing,"
          f" {not_done} not done")
    for w in paused:
        (late,) = d.execute("SELECT count(*) FROM processing_log WHERE token = %s AND logged_at >= %s",
                            (w.stop[1], w.taken[3])).fetchone()
        accepted = sum(1 for e in w.events[w.resumed_at:]
                       if e["event"] == "wrote" and int(e["token"]) == w.stop[1])
        check(late == 0 and accepted == 0,
              f"{w}: {late} log rows and {accepted} accepted writes of its old token after the takeover")
    errors = [(w.holder, e) for w in workers for e in w.events if e["event"] in ("error", "garbage")]
    check(not errors, f"worker errors: {errors}")
    check(0 < servers.max <= pool_size(), f"{servers.max} server connections seen for a pool of {pool_size()}")
    rejected = sum(w.count("refused") + w.count("rejected") for w in workers)
    late_rejected = sum(w.count("refused", w.resumed_at) for w in paused)
    per_lang = {lang: sum(w.count("wrote") for w in workers if w.lang == lang) for lang in ("python", "node")}
    d.close()
    log(f"summary: {ITEMS} items, processed once each by {len(workers)} clients"
        f" over at most {servers.max} server connections (pool {pool_size()});"
        f" duplicates 0, missing 0; batches written: {per_lang['python']} Python,"
        f" {per_lang['node']} Node; refused late writes: {late_rejected} from the resumed workers,"
        f" {rejected} refused or fenced off in all; takeover after SIGKILL {takeovers['SIGKILL'][0]:.2f} s,"
        f" after SIGSTOP {takeovers['SIGSTOP python'][0]:.2f} s (Python) and"
        f" {takeovers['SIGSTOP node'][0]:.2f} s (Node); drained in {t_drain:.1f} s")


# --------------------------------------------------------------------------
# 3. A busy pool with no fault; a session ended idle in a transaction

BUSY_DB = "pg_claim_pooler_busy"
BUSY_WORKERS = 10
BUSY_WRITE_MS = 300  # each batch's write holds a server connection this long (a statement trigger)
BUSY_ITEM_MS = 30    # the work on a batch of 10, inside its transaction: 0.3 s
BUSY_S = 12
# the lease ttl of the busy fleet: a renewal queued in the saturated pool
# (about 1.2 s: 8 holders x 0.6 s over 4 connections) stays well inside it
BUSY_TTL_S = 4.0


def idle_in_transaction(d):
    """Server processes of BUSY_DB idle in a transaction for 0.8 s or more
    (a batch's work keeps its transaction idle 0.3 s)."""
    return d.execute("SELECT array_agg(pid) FROM pg_stat_activity WHERE datname = %s"
                     " AND state = 'idle in transaction' AND state_change < clock_timestamp() - interval '0.8 s'",
                     (BUSY_DB,)).fetchone()[0]


def test_busy_pool_no_slot_changes_hands(workdir, databases):
    """10 library workers in lease mode (5 Python, 5 Node.js) through the
    pool of 4, n = 8, ttl 4 s (claim_leases every ttl / 3), where a batch's
    transaction holds a server connection 0.6 s (0.3 s of work in the
    handler, then a write of 0.3 s): the pool is saturated and statements
    queue in PgBouncer. No fault: once the slots are shared out (8 workers
    with one each), no slot may change hands for BUSY_S seconds: the same
    holder and token of every slot, and no worker reports a lost slot, a
    fenced-off batch or a failed claim. Then a Python holder is stopped
    inside its batch's transaction: the server ends its session (the
    library's idle_in_transaction_session_timeout, the ttl), and once
    resumed the worker reconnects and goes on instead of crashing. Every
    item written is written once."""
    databases(BUSY_DB)
    with direct(BUSY_DB) as d:
        d.execute("""
            CREATE TABLE items (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
            INSERT INTO items SELECT g FROM generate_series(1, %s) g;
            CREATE INDEX ON items ((slot_of(id, %s)), id);
            CREATE TABLE processing_log (item bigint NOT NULL, worker text NOT NULL,
                                         token bigint NOT NULL, logged_at timestamptz NOT NULL DEFAULT clock_timestamp());
            CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN PERFORM pg_sleep(%s); RETURN NULL; END $$;
            CREATE TRIGGER slow_write AFTER INSERT ON processing_log
                FOR EACH STATEMENT EXECUTE FUNCTION slow_write();
            ANALYZE items;
        """ % (ITEMS, N, BUSY_WRITE_MS / 1000))
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(pooler_port()), PGDATABASE=BUSY_DB, PGUSER="postgres",
               FLEET_NAME=NAME, FLEET_N=str(N), FLEET_TTL_S=str(BUSY_TTL_S),
               FLEET_BATCH=str(BATCH), FLEET_ITEM_MS=str(BUSY_ITEM_MS), FLEET_LIFETIME_S=str(TIME_LIMIT_S),
               # balance moves slots on purpose when the counted weights differ; here
               # only the pool is under test: shares by count, so no move is expected
               FLEET_BALANCE="0")
    env.pop("PGSERVICE", None)
    workers = [Worker("python" if i % 2 == 0 else "node", workdir, env) for i in range(BUSY_WORKERS)]
    d = direct(BUSY_DB)

    def losses(since):
        """What each worker reported since event `since[w]`: slots lost, batches fenced off, failed claims."""
        out = {}
        for w in workers:
            bad = [e for e in w.events[since[w]:]
                   if (e["event"] == "slots" and e.get("lost")) or e["event"] in (
                       "lost", "rejected", "claim_failed", "reconnecting")]
            if bad:
                out[w.holder] = bad[:3]
        return out
    try:
        start = balanced(d, workers)
        since = {w: len(w.events) for w in workers}
        t_start = time.monotonic()
        while time.monotonic() < t_start + BUSY_S:
            now = {s: r for s, r in holders(d).items() if not r[4]}
            moved = {s: (start[s][1:3], now[s][1:3] if s in now else None)
                     for s in start if s not in now or now[s][2] != start[s][2]}
            check(not moved, f"slots changed hands with no fault through a busy pool: {moved}")
            time.sleep(0.2)
        lost = losses(since)
        (written,) = d.execute("SELECT count(*) FROM processing_log").fetchone()
        check(not lost, f"slots lost with no fault through a busy pool: {lost}")
        check(written > 0, "nothing written through the busy pool")
        log(f"busy pool: {BUSY_WORKERS} library workers over a pool of {pool_size()}, each batch's transaction holding"
            f" a server connection {(BUSY_ITEM_MS * BATCH + BUSY_WRITE_MS) / 1000:g} s, ttl {BUSY_TTL_S:g} s:"
            f" no slot changed hands in {BUSY_S} s once shared out ({written} items written)")

        # a holder stopped inside its batch's transaction
        by_pid = {w.pid: w for w in workers}
        holding = [by_pid[pid_of(r[1])] for r in holders(d).values() if not r[4]]
        w = next((w for w in holding if w.lang == "python"), None)
        check(w, "no Python worker holds a lease")
        for _ in range(8):
            ev = w.wait_event("fetched", len(w.events), 10)
            # inside the transaction: its work (BUSY_ITEM_MS per item) has begun
            time.sleep(max(0.0, ev["t"] + 0.1 - time.time()))
            os.kill(w.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 2
            while not idle_in_transaction(d) and time.monotonic() < deadline:
                time.sleep(0.05)
            if idle_in_transaction(d):
                break
            os.kill(w.pid, signal.SIGCONT)  # not inside the transaction: the next batch
        else:
            raise Failure(f"could not stop {w} inside its batch's transaction")
        poll(lambda: not idle_in_transaction(d), 10, "the server to end the session idle in a transaction")
        since = len(w.events)
        os.kill(w.pid, signal.SIGCONT)
        ev = w.wait_event(("reconnecting", "error"), since, 15)
        check(ev["event"] == "reconnecting", f"{w} after its session was ended: {ev}")
        refused = w.last(("refused",), since)
        check(refused is not None, f"{w} reconnected without its handler's write failing: {w.events[since:]}")
        # it goes on: its next claim drops the slot (or, if no other worker
        # took it yet, renews it and it writes again); no error
        poll(lambda: w.last(("slots", "wrote", "error"), since), 15,
             f"{w}'s next claim or write after its reconnection (its events: {w.events[since:]})")
        check(w.proc.poll() is None and not w.last(("error",), since),
              f"{w} after its reconnection: {w.events[since:]}")
        check(w.proc.poll() is None, f"{w} exited: {open(w.err_path).read()[-2000:]}")
        log(f"  {w} stopped inside its batch's transaction: the server ended the session"
            f" (idle_in_transaction_session_timeout); resumed, its write failed (\"{refused['how']}\"),"
            " it reconnected and went on")
    finally:
        stop_all(workers)
    (logged, distinct) = d.execute("SELECT count(*), count(DISTINCT item) FROM processing_log").fetchone()
    (unlogged,) = d.execute("SELECT count(*) FROM items i WHERE done AND NOT EXISTS"
                            " (SELECT 1 FROM processing_log l WHERE l.item = i.id)").fetchone()
    (undone,) = d.execute("SELECT count(*) FROM processing_log l JOIN items i ON i.id = l.item"
                          " WHERE NOT i.done").fetchone()
    check(logged == distinct and unlogged == 0 and undone == 0,
          f"busy pool: {logged} log rows for {distinct} items, {unlogged} done but not logged, {undone} logged not done")
    errors = [(x.holder, e) for x in workers for e in x.events if e["event"] in ("error", "garbage")]
    check(not errors, f"worker errors: {errors}")
    d.close()
    log(f"  {distinct} items written once each")
