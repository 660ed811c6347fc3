"""The faults the fleet meets (tests/faults): each returns (what happened,
seconds until the share moved)."""
import os
import random
import signal
import time

import psycopg

from harness import Failure, check, poll

from . import cluster as servers
from .cluster import CLIENT_RECOMMENDED, IDLE_IN_TX_S, MODES, RECOMMENDED, TTL_S, WORKER_OPTIONS, log
from .fleet import ALL_SLOTS, session_pid


# --------------------------------------------------------------------------
# The faults. Each returns (what happened, seconds until the share moved).

def check_new_tokens(fleet, t0, what):
    """Tokens first seen after t0 (newly issued: a lease holder that reclaims its
    unexpired lease keeps its token) are greater than every token seen before.
    A session holder's new token is written at its first fenced batch, which
    can come after the fleet holds every slot again, and the holder history
    records it at its next poll: the new tokens are waited for (15 s)."""
    before = {tok for h in fleet.history.values() for (t, _, tok) in h if t <= t0}

    def issued():
        return {tok for h in list(fleet.history.values()) for (t, _, tok) in list(h) if t > t0} - before
    try:
        new = poll(issued, 15, f"tokens issued after the {what}")
    except Failure:
        new = set()
    check(new and min(new) > max(before, default=0),
          f"tokens issued after the {what}: {sorted(new)[:3]}, not all above {max(before, default=0)}")


def fault_restart(fleet, rng=None):
    """pg_ctl stop -m immediate mid-drain, then start: crash recovery."""
    t0 = time.time()
    fleet.cluster.primary.pg_ctl("-m", "immediate", "stop")
    fleet.cluster.primary.pg_ctl("start")
    moved = fleet.moved_since(t0, ALL_SLOTS)
    fleet.wait_full()
    check_new_tokens(fleet, t0, "restart")
    return "server stopped (immediate) and started: every session ends; workers reconnect, claim, finish", moved


def fault_backend_kill(fleet, rng=None):
    """SIGKILL one holder's backend: the postmaster resets every session."""
    slot = (rng or random).choice(sorted(fleet.holders("session")))
    pid = poll(lambda: session_pid(slot), 10, f"a backend to hold session slot {slot}")
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    moved = fleet.moved_since(t0, ALL_SLOTS)
    fleet.wait_full()
    check_new_tokens(fleet, t0, "reset")
    return f"SIGKILL of backend {pid}: the postmaster resets all sessions; the same recovery", moved


def fault_failover(fleet, rng=None):
    """A streaming replica promoted; the fleet moves to it."""
    standby = fleet.cluster.make_standby()
    t0 = time.time()
    fleet.cluster.failover(standby)
    moved = fleet.moved_since(t0, ALL_SLOTS)
    fleet.wait_full()
    # every token seen before the failover: valid on the new primary only if current
    seen = {(name, slot, tok) for (name, slot), h in fleet.history.items() for (t, _, tok) in h if t < t0}
    with fleet.cluster.connect() as c:
        # items_MODE -> fleet_MODE
        logged = c.execute("SELECT DISTINCT 'fleet_' || substr(tbl, 7), slot, token FROM processing_log"
                           " WHERE logged_at < to_timestamp(%s)", (t0,)).fetchall()
        seen |= set(logged)
        bad = []
        for name, slot, tok in seen:
            # a lease: current while live (lease_holders); a session record:
            # current until the slot's next holder calls my_token, even after
            # its session ended (docs/leases.md, my_token), so the record
            # itself, which lease_holders shows only while its session lives
            current = ("SELECT token FROM pg_claim_leases WHERE name = %s AND slot = %s AND session"
                       if name == "fleet_session" else "SELECT token FROM lease_holders(%s) WHERE slot = %s")
            valid, current = c.execute(f"SELECT lease_valid(%s, %s, %s), ({current})",
                                       (name, slot, tok, name, slot)).fetchone()
            if valid and tok != current:
                bad.append((name, slot, tok, current))
    check(not bad, f"old tokens valid on the new primary: {bad[:5]}")
    check_new_tokens(fleet, t0, "failover")
    return (f"primary stopped, replica promoted; {len(seen)} tokens of the old primary checked,"
            " none valid unless current"), moved


def freeze(fleet, rng, mode, where):
    """SIGSTOP a holder of `mode` whose backend then is `where` ('idle', 'idle in
    transaction' after its fence, None: either). (worker, slot, token, backend
    pid, state, t0)."""
    deadline = time.monotonic() + 40
    with fleet.cluster.connect() as c:
        while time.monotonic() < deadline:
            slot, w = rng.choice(sorted(fleet.holders(mode).items()))
            # session: the server's view, the pid of w's session holding the slot
            token, pid = w.claims().get(slot, (None, None))
            if pid is None:
                time.sleep(0.05)
                continue
            t0 = time.time()
            os.kill(w.pid, signal.SIGSTOP)

            def settled():
                r = c.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                return ("gone", "") if r is None else (r if r[0] != "active" else None)
            state, query = poll(settled, 10, f"the frozen {mode} worker's backend to settle", interval=0.005)
            # inside the transaction: the library opens it with the fence in
            # one message, so a transaction idle is always past its fence
            fenced = state == "idle in transaction"
            # session: the slot may have moved (a rebalance of claim_slots,
            # after a reset) between the look-up and the freeze; the frozen
            # worker's session must still hold it
            moved = mode == "session" and w.claims().get(slot, (None, None))[1] != pid
            if (state == "idle" or fenced) and where in (None, state) and not moved:
                if mode != "elastic":
                    return w, slot, token, pid, state, t0
                # an elastic holder holds several slots: the slot of its batch in
                # progress (the one its transaction fenced), if it has one
                ev = w.last(("fetched", "wrote", "refused", "rejected"))
                if ev and ev["event"] == "fetched" and w.claims().get(ev["slot"], (None,))[0] == ev["token"]:
                    return w, ev["slot"], ev["token"], pid, state, t0
                if not fenced:
                    return w, slot, token, pid, state, t0
            os.kill(w.pid, signal.SIGCONT)
            time.sleep(rng.uniform(0, 0.03))
    raise Failure(f"could not freeze a {mode} holder {where} within 40 s")


def fault_sigstop(fleet, rng=None, mode=None, where=None):
    """A holder frozen with SIGSTOP (idle, or inside its fenced transaction), then resumed."""
    rng = rng or random
    mode = mode or rng.choice(MODES)
    w, slot, token, pid, state, t0 = freeze(fleet, rng, mode, where)
    since = len(w.events)
    name, tbl = f"fleet_{mode}", f"items_{mode}"

    def holder():
        with fleet.cluster.connect() as c:
            if mode == "session":
                r = c.execute("SELECT pid FROM slot_holders(%s) WHERE slot = %s", (name, slot)).fetchone()
                return r and r[0]
            r = c.execute("SELECT holder, token FROM lease_holders(%s) WHERE slot = %s AND NOT expired",
                          (name, slot)).fetchone()
            return r and r[1]
    mine = pid if mode == "session" else token
    if mode == "session" and state == "idle":
        # the backend is idle, not dead: the slot stays with the frozen worker
        deadline = t0 + 2 * TTL_S
        while time.time() < deadline:
            h = holder()
            check(h == pid, f"session slot {slot} of the frozen worker: holder {h}")
            time.sleep(0.2)
        tc = time.time()
        os.kill(w.pid, signal.SIGCONT)
        moved = fleet.moved_since(tc, {(tbl, slot)})
        check(slot in w.claims() and holder() == pid, f"{w} lost its session slot while frozen")
        return (f"session, frozen idle: slot {slot} kept through {2 * TTL_S:g} s; the same worker"
                f" writes again {moved:.2f} s after SIGCONT"), moved
    # anything else: the claim moves to a standby, after the lease's TTL or
    # after idle_in_transaction_session_timeout ends the frozen transaction
    poll(lambda: (lambda h: h is not None and h != mine)(holder()), IDLE_IN_TX_S + TTL_S + 20,
         f"a standby to take {mode} slot {slot} over from a worker frozen {state}")
    moved = fleet.moved_since(t0, {(tbl, slot)})
    os.kill(w.pid, signal.SIGCONT)
    try:
        # its session ended (its write refused, a reconnection), its next
        # batch's fence refused the token, or its next claim without the slot
        # (an elastic worker may keep its other slots) (frozen inside the
        # transaction: its late write, or its commit, must fail)
        e = w.wait_for(lambda e: e["event"] in ("refused", "reconnecting")
                       or (state == "idle" and e["event"] == "rejected")
                       or (state == "idle" and e["event"] == "held" and slot in e["lost"]),
                       since, 30, f"the loss of slot {slot}")
    except Failure as f:
        raise Failure(f"{f}; its last events: {w.events[-4:]}") from None
    # (session mode: the token of the refused write is the claim's my_token)
    check(e["event"] not in ("refused", "rejected")
          or (e["slot"] == slot and (mode == "session" or e["token"] == token)), f"{w}: {e}")
    why = {"refused": f"its late write failed ({e.get('error')})",
           "rejected": "its next batch's fence refused the token",
           "reconnecting": f"its session was ended ({e.get('error')})"}.get(
               e["event"], "its next claim_leases call returned the slot no more")
    return f"{mode}, frozen {state}: slot {slot} taken over {moved:.2f} s after SIGSTOP; resumed: {why}", moved


def fault_worker_kill(fleet, rng=None):
    """SIGKILL of a holder process (not its backend): its slot is free at once (session) or after TTL."""
    rng = rng or random
    m = rng.choice(MODES)
    slot, w = rng.choice(sorted(fleet.holders(m).items()))
    t0 = time.time()
    os.kill(w.pid, signal.SIGKILL)
    moved = fleet.moved_since(t0, {(f"items_{m}", slot)})
    fleet.workers.remove(w)
    fleet.add(m)  # a replacement keeps the fleet's size
    return f"{m} worker SIGKILLed holding slot {slot}", moved


def fault_cancel(fleet, rng=None):
    """pg_cancel_backend of a random worker's backend: its statement fails, the worker reconnects."""
    rng = rng or random
    m = rng.choice(MODES)
    slot, w = rng.choice(sorted(fleet.holders(m).items()))
    pid = session_pid(slot) if m == "session" else w.claims().get(slot, (None, None))[1]
    t0 = time.time()
    with fleet.cluster.connect() as c:
        c.execute("SELECT pg_cancel_backend(%s)", (pid,))
    moved = fleet.moved_since(t0, {(f"items_{m}", slot)})
    return f"pg_cancel_backend of a {m} holder's backend", moved


# --------------------------------------------------------------------------
# The silent partition, with the defaults and with the recommended settings

def start_partition_workers(fleet):
    """Workers behind the proxy, started before the rest of the fleet so they hold slots."""
    conninfo = {"defaults": servers.NET.dsn(f"options='{WORKER_OPTIONS}'"),
                "recommended": servers.NET.dsn(CLIENT_RECOMMENDED + f" options='{WORKER_OPTIONS} "
                                       + " ".join(f"-c {k}={v}" for k, v in RECOMMENDED.items()) + "'")}
    ws = {
        # short batches: the session workers spend most of their time idle, outside a transaction
        "session/defaults": fleet.add("session", conninfo["defaults"]),
        "session/recommended": fleet.add("session", conninfo["recommended"]),
        # a slow batch (inside its fenced transaction): the partition cuts it
        # in the middle, so its write is late (the library gives it up, its
        # waits being bounded by the ttl, or the heal delivers it)
        "lease/defaults": fleet.add("lease", conninfo["defaults"], item_ms=40),
    }
    for w in ws.values():
        w.wait_for(lambda e: e["event"] == "held" and e["slots"], 0, 30, "a claim")
    return ws


def fault_partition(fleet, ws, out):
    sd, sr, ld = ws["session/defaults"], ws["session/recommended"], ws["lease/defaults"]
    for w in (sd, sr, ld):
        check(w.claim() is not None, f"{w} behind the proxy holds no claim")
    (sd_slot, _, _), (sr_slot, _, _) = sd.claim(), sr.claim()
    sd_pid, sr_pid = session_pid(sd_slot), session_pid(sr_slot)
    check(sd_pid and sr_pid, f"session slots {sd_slot} and {sr_slot} have no holding backend")
    # cut the lease worker's batch in the middle, at a moment when both session
    # workers' backends are idle (not inside a transaction, which
    # idle_in_transaction_session_timeout would end first)
    with fleet.cluster.connect() as c:
        for attempt in range(40):
            since = len(ld.events)
            # the batch the cut is in: its slot and token (a loaded machine
            # may have moved the worker's lease since its claim was read)
            cut = ld.wait_event(("fetched",), since, 20)
            ld_since = len(ld.events)
            t0 = time.time()
            servers.NET.partition()

            def settled():
                r = c.execute("SELECT array_agg(state) FILTER (WHERE state <> 'idle'),"
                              " bool_or(state = 'active') FROM pg_stat_activity WHERE pid IN (%s, %s)",
                              (sd_pid, sr_pid)).fetchone()
                return r if not r[1] else None
            busy, _ = poll(settled, 10, "the cut backends to settle", interval=0.005)
            if not busy:
                break
            servers.NET.heal()  # one of them was inside a transaction: again
            time.sleep(0.5)
        else:
            raise Failure("could not cut the session workers while idle")
    ld_slot, ld_token = cut["slot"], cut["token"]
    log(f"  partition at t = 0: proxy silent and link down (session slots {sd_slot} with the defaults,"
        f" {sr_slot} with the recommended settings, both idle; lease slot {ld_slot} in the middle of a batch)")
    def lease_taken():
        with fleet.cluster.connect() as c:
            r = c.execute("SELECT holder, token FROM lease_holders('fleet_lease') WHERE slot = %s"
                          " AND NOT expired", (ld_slot,)).fetchone()
        return r if r and r[1] != ld_token else None
    poll(lease_taken, TTL_S + 20, "a standby to take the partitioned lease over")
    lease_moved = fleet.moved_since(t0, {("items_lease", ld_slot)})
    log(f"  lease (ttl {TTL_S:g} s): taken over by a standby, share moving {lease_moved:.2f} s after the cut")

    def freed(pid, slot):
        with fleet.cluster.connect() as c:
            r = c.execute("SELECT pid FROM slot_holders('fleet_session') WHERE slot = %s", (slot,)).fetchone()
        return r is None or r[0] != pid
    poll(lambda: freed(sr_pid, sr_slot), 60, "the server to free the slot of the partitioned worker"
         " with the recommended keepalive settings")
    sr_freed = time.time() - t0
    sr_moved = fleet.moved_since(t0, {("items_session", sr_slot)})
    held = not freed(sd_pid, sd_slot)
    held_for = time.time() - t0
    check(held, "the slot of the partitioned session worker with the default settings was freed"
          f" within {held_for:.1f} s")
    log(f"  session, recommended settings: the server ended the session and freed slot {sr_slot}"
        f" {sr_freed:.1f} s after the cut; share moving {sr_moved:.1f} s after it")
    log(f"  session, defaults: slot {sd_slot} still held by the cut session {held_for:.1f} s after the cut"
        " (the kernel's keepalive default: 2 hours idle)")
    th = time.time()
    servers.NET.heal()
    e = ld.wait_event(("refused", "wrote"), ld_since, 60)
    check(e["event"] == "refused" and e["token"] == ld_token,
          f"the partitioned lease worker's late write was not refused: {e}, {ld.events[ld_since:]}")
    # the library bounds each reply by the ttl (a deadline, tcp_user_timeout):
    # its write fails during the partition already, or at the heal
    check(e["t"] > t0, f"the partitioned lease worker's write was refused {t0 - e['t']:.2f} s before the cut")
    with fleet.cluster.connect() as c:
        try:
            with c.transaction():
                c.execute("SELECT fence('fleet_lease', %s, %s)", (ld_slot, ld_token))
            raise Failure(f"fence passed the partitioned lease worker's token {ld_token}")
        except psycopg.Error as ex:
            check(ex.sqlstate == "PC001", f"fence on the partitioned worker's token: {ex.sqlstate} {ex}")
    log(f"  the lease worker's late write of {e['items']} items refused {e['t'] - t0:.2f} s after the cut"
        f" ({e['error']}); after the heal its token fails fence (PC001)")
    # the default-settings session worker is still the holder: its writes go on
    moved_sd = fleet.moved_since(th, {("items_session", sd_slot)})
    check(sd.claim() is not None and sd.claim()[0] == sd_slot, f"{sd} no longer holds slot {sd_slot}")
    log(f"  heal: the default-settings session worker, still the holder, writes again"
        f" {moved_sd:.2f} s after the heal")
    out["partition, lease (ttl 3 s)"] = ("lease expires; a standby takes over; the late write fails"
                                          " (the library's reply deadline, or its ended session)", lease_moved)
    out["partition, session, recommended keepalives"] = (
        "server ends the session after tcp_user_timeout/keepalives; a standby takes the slot", sr_moved)
    out["partition, session, defaults"] = (
        f"slot kept by the cut session ({held_for:.0f} s and more, up to ~2 h of kernel keepalive);"
        " it works again after the heal", None)
