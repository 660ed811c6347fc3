"""Cancels, timeouts and the lock table: nothing half-made left behind
(tests/faults, before the fleet starts)."""
import collections
import threading
import time

import psycopg

from harness import check, expect_error, poll


# --------------------------------------------------------------------------
# Cancels, timeouts and the lock table: nothing half-made left behind

def advisory_locks(c, pid):
    return c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
                     (pid,)).fetchone()[0]


def cancels_and_timeouts(cluster):
    results = []
    with cluster.connect() as obs, cluster.connect() as holder, cluster.connect() as victim:
        vpid = victim.info.backend_pid

        def cancel_soon(pid, waiting_for):
            def go():
                poll(lambda: obs.execute("SELECT wait_event_type IS NOT NULL AND state = 'active'"
                                         " FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0],
                     10, waiting_for, interval=0.01)
                obs.execute("SELECT pg_cancel_backend(%s)", (pid,))
            t = threading.Thread(target=go)
            t.start()
            return t

        # claim_slot: a standby waiting for a held slot
        check(holder.execute("SELECT claim_slot('cx', 1)").fetchone()[0] == 0, "holder's claim_slot")
        for how in ("pg_cancel_backend", "statement_timeout"):
            if how == "statement_timeout":
                victim.execute("SET statement_timeout = '300ms'")
                t = None
            else:
                t = cancel_soon(vpid, "claim_slot to wait")
            expect_error(victim, "SELECT claim_slot('cx', 1, '30 s')", "57014", f"claim_slot, {how}")
            if t:
                t.join()
            victim.execute("RESET statement_timeout")
            check(advisory_locks(obs, vpid) == 0, f"claim_slot cancelled ({how}) left advisory locks")
            check(victim.execute("SELECT my_slot('cx')").fetchone()[0] is None, "my_slot after cancel")
            results.append(f"claim_slot waiting, {how}: 57014, no lock left")
        holder.execute("SELECT release_slot('cx')")
        check(victim.execute("SELECT claim_slot('cx', 1)").fetchone()[0] == 0, "claim after the cancels")
        victim.execute("SELECT release_slot('cx')")

        # claim_lease: waiting for the name's lease mutex held by an open transaction
        holder.execute("BEGIN")
        check(holder.execute("SELECT slot FROM claim_lease('lx', 1, 'h')").fetchone() == (0,), "h's lease")
        for how in ("pg_cancel_backend", "statement_timeout"):
            t = None
            if how == "statement_timeout":
                victim.execute("SET statement_timeout = '300ms'")
            else:
                t = cancel_soon(vpid, "claim_lease to wait")
            expect_error(victim, "SELECT * FROM claim_lease('lx', 2, 'v')", "57014", f"claim_lease, {how}")
            if t:
                t.join()
            victim.execute("RESET statement_timeout")
            check(advisory_locks(obs, vpid) == 0, f"claim_lease cancelled ({how}) left a lock")
            results.append(f"claim_lease waiting, {how}: 57014, no row, no lock left")
        holder.execute("COMMIT")
        rows = obs.execute("SELECT slot, holder FROM lease_holders('lx')").fetchall()
        check(rows == [(0, "h")], f"lease rows after the cancelled claims: {rows}")

        # my_items: waiting for a table lock
        obs.execute("CREATE TABLE IF NOT EXISTS cancel_items (id bigint PRIMARY KEY)")
        obs.execute("INSERT INTO cancel_items SELECT generate_series(1, 100) ON CONFLICT DO NOTHING")
        for how in ("pg_cancel_backend", "statement_timeout"):
            holder.execute("BEGIN")
            holder.execute("LOCK TABLE cancel_items IN ACCESS EXCLUSIVE MODE")
            t = None
            if how == "statement_timeout":
                victim.execute("SET statement_timeout = '300ms'")
            else:
                t = cancel_soon(vpid, "my_items to wait")
            expect_error(victim, "SELECT count(*) FROM my_items(NULL::cancel_items, 0, 4)", "57014",
                         f"my_items, {how}")
            if t:
                t.join()
            victim.execute("RESET statement_timeout")
            holder.execute("COMMIT")
            (k,) = victim.execute("SELECT count(*) FROM my_items(NULL::cancel_items, 0, 4)").fetchone()
            check(k == 25, f"my_items after the cancel: {k} rows")
            check(advisory_locks(obs, vpid) == 0, "my_items cancelled left a lock")
            results.append(f"my_items waiting for a lock, {how}: 57014, the next call works")

        # claim_partitions(name, 4096) takes 4096 locks in a few ms; a cancel or a
        # timeout lands at some point of it or after it. Whatever it was, the
        # session holds exactly the partitions my_partitions reports: all of them
        # (the call finished before the interrupt was noticed) or none.
        victim.execute("SET pg_claim.max_locks_per_session = 1048576")
        for how in ("pg_cancel_backend", "statement_timeout"):
            outcomes = collections.Counter()
            for attempt in range(40):
                t = None
                if how == "statement_timeout":
                    victim.execute("SELECT set_config('statement_timeout', %s, false)",
                                   (f"{1 + attempt % 4}ms",))
                else:
                    t = threading.Timer(0.00025 * attempt,
                                        lambda: obs.execute("SELECT pg_cancel_backend(%s)", (vpid,)))
                    t.start()
                err = None
                try:
                    victim.execute("SELECT claim_partitions('px', 4096)")
                except psycopg.Error as e:
                    check(e.sqlstate == "57014", f"claim_partitions, {how}: {e.sqlstate} {e}")
                    err = e
                if t:
                    t.join()
                victim.execute("RESET statement_timeout")
                held = obs.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
                                   " AND objid::bigint >= x'30000000'::bigint", (vpid,)).fetchone()[0]
                mine = victim.execute("SELECT cardinality(my_partitions('px'))").fetchone()[0]
                check(held == mine and held in (0, 4096),
                      f"claim_partitions, {how}: {held} partition locks held, my_partitions {mine}")
                outcomes[("57014" if err else "ok", held)] += 1
                victim.execute("SELECT group_leave('px')")
                check(advisory_locks(obs, vpid) == 0, f"after group_leave: locks left ({how})")
            check(any(k[0] == "57014" for k in outcomes), f"claim_partitions, {how}: never interrupted: {outcomes}")
            results.append(f"claim_partitions('px', 4096), {how}, 40 times: "
                           + ", ".join(f"{k[0]} holding {k[1]}: {v}" for k, v in sorted(outcomes.items()))
                           + "; always exactly what my_partitions reports")
        victim.execute("RESET pg_claim.max_locks_per_session")

    # without idle_in_transaction_session_timeout: a lease holder idle (or frozen)
    # inside its fenced transaction keeps its expired lease from changing hands
    with cluster.connect() as h, cluster.connect() as standby:
        (_, token) = h.execute("SELECT slot, token FROM claim_lease('iz', 1, 'h', '500 ms')").fetchone()
        h.execute("BEGIN")
        h.execute("SELECT fence('iz', 0, %s)", (token,))
        t0 = time.monotonic()
        while time.monotonic() < t0 + 3:
            expired, got = standby.execute(
                "SELECT (SELECT expired FROM lease_holders('iz')),"
                " (SELECT token FROM claim_lease('iz', 1, 's', '500 ms'))").fetchone()
            check(got is None, f"a standby took the lease of a holder inside its fenced transaction: {got}")
            time.sleep(0.1)
        check(expired, "the lease did not expire")
        h.execute("COMMIT")
        got = standby.execute("SELECT token FROM claim_lease('iz', 1, 's', '500 ms')").fetchone()
        check(got and got[0] > token, f"the standby's claim after the commit: {got}")
        results.append("without idle_in_transaction_session_timeout: a lease holder idle inside its fenced"
                       " transaction kept its expired lease (ttl 0.5 s) from every standby for 3 s, until it"
                       " committed; then the standby took it with a greater token")

    # idle_in_transaction_session_timeout on a holder, in each mode
    with cluster.connect() as obs:
        for m in ("session", "lease"):
            c = cluster.connect()
            if m == "session":
                c.execute("SELECT claim_slot('ix', 1)")
                (token,) = c.execute("SELECT my_token('ix')").fetchone()
                name = "ix"
            else:
                (_, token) = c.execute("SELECT slot, token FROM claim_lease('il', 1, 'h')").fetchone()
                name = "il"
            c.execute("SET idle_in_transaction_session_timeout = '300ms'")
            c.execute("BEGIN")
            c.execute("SELECT fence(%s, 0, %s)", (name, token))
            pid = c.info.backend_pid
            poll(lambda: obs.execute("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s",
                                     (pid,)).fetchone()[0], 20, "the idle-in-transaction holder to end")
            c.close()
            with cluster.connect() as n2:
                if m == "session":
                    # the slot is free and the new holder's my_token does not wait for a fenced transaction
                    n2.execute("SET lock_timeout = '2s'")
                    check(n2.execute("SELECT claim_slot('ix', 1)").fetchone()[0] == 0, "slot after the timeout")
                    (t2,) = n2.execute("SELECT my_token('ix')").fetchone()
                    check(t2 > token, f"new token {t2} not above {token}")
                    n2.execute("SELECT release_slot('ix')")
                    results.append("idle_in_transaction_session_timeout on a fenced session holder: session ends,"
                                   " slot free, next my_token greater, no lock left")
                else:
                    n2.execute("SET lock_timeout = '2s'")
                    # the lease stays until its TTL; its holder renews it from a new connection
                    check(n2.execute("SELECT renew_lease('il', 0, %s, '1 s') IS NOT NULL", (token,)).fetchone()[0],
                          "renewal after the timeout")
                    check(n2.execute("SELECT lease_valid('il', 0, %s)", (token,)).fetchone()[0], "token valid")
                    results.append("idle_in_transaction_session_timeout on a fenced lease holder: session ends,"
                                   " the lease row is intact and renewable, its fence lock is gone")
    return results


def lock_table_exhausted(cluster):
    results = []
    with cluster.connect() as obs, cluster.connect() as hog, cluster.connect() as other:
        (per_xact, conns) = obs.execute("SELECT current_setting('max_locks_per_transaction')::int,"
                                        " current_setting('max_connections')::int").fetchone()
        hpid = hog.info.backend_pid
        hog.execute("SET pg_claim.max_locks_per_session = 1048576")
        other.execute("SELECT claim_slot('bystander', 1)")
        # many groups, the largest n first: claim_partitions until the lock table is
        # full; each refused call must leave none of its locks behind
        groups, refused, err = [], collections.Counter(), None
        for p in (4096, 1024, 256, 64, 16):
            while True:
                name = f"huge{len(groups) + sum(refused.values())}"
                try:
                    hog.execute("SELECT claim_partitions(%s, %s)", (name, p))
                    groups.append(p)
                except psycopg.Error as ex:
                    check(ex.sqlstate == "53200" and ex.diag.message_hint,
                          f"claim_partitions({name}, {p}) on a full lock table: {ex.sqlstate} {ex}")
                    err = ex
                    refused[p] += 1
                    held = obs.execute(
                        "SELECT count(*) FILTER (WHERE objid::bigint >= x'30000000'::bigint) FROM pg_locks"
                        " WHERE locktype = 'advisory' AND pid = %s", (hpid,)).fetchone()[0]
                    check(held == sum(groups), f"{held} partition locks held for groups of {sum(groups)}"
                          f" partitions: the refused call of {p} left some")
                    check(hog.execute("SELECT cardinality(my_partitions(%s))", (name,)).fetchone()[0] == 0,
                          "the refused group's partitions")
                    hog.execute("SELECT group_leave(%s)", (name,))
                    break
        # then claim_slot on new names: refused at once, 3 locks per held slot
        before = advisory_locks(obs, hpid)
        held_slots, slot_err = 0, None
        for i in range(2000):
            try:
                hog.execute("SELECT claim_slot(%s, 1)", (f"many{i}",))
                held_slots += 1
            except psycopg.Error as ex:
                slot_err = ex
                break
        check(slot_err is not None and slot_err.sqlstate == "53200" and slot_err.diag.message_hint,
              f"claim_slot on a full lock table: {slot_err!r}")
        locks = advisory_locks(obs, hpid)
        check(locks == before + 3 * held_slots, f"{locks} advisory locks for {held_slots} more slots (3 each)")
        check(hog.execute("SELECT my_slot(%s)", (f"many{held_slots}",)).fetchone()[0] is None,
              "the refused claim_slot's slot")
        # other sessions: the bystander still holds its slot, and works once the hog lets go
        check(other.execute("SELECT my_slot('bystander')").fetchone()[0] == 0, "bystander lost its slot")
        hog.execute("SELECT pg_advisory_unlock_all()")
        check(advisory_locks(obs, hpid) == 0, "locks after unlock_all")
        check(other.execute("SELECT claim_slot('bystander2', 2)").fetchone()[0] == 0, "bystander's next claim")
        check(other.execute("SELECT count(*) FROM pg_class").fetchone()[0] > 0, "bystander's query")
        results.append(f"lock table of max_locks_per_transaction = {per_xact} x max_connections = {conns}:"
                       f" claim_partitions filled it with {len(groups)} groups ({sum(groups)} partitions);"
                       f" {sum(refused.values())} refused calls (53200, {err.diag.message_primary}) left none"
                       f" of their locks; claim_slot then: {held_slots} more, the next refused (53200),"
                       " exactly 3 locks per held slot; the other session kept its slot and worked")
    return results
