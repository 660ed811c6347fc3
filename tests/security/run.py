#!/usr/bin/env python3
"""The promises of docs/security.md, each checked by playing the attacker.

Against a running cluster (PGHOST/PGPORT/PGUSER as scripts/lib.sh sets them,
a superuser; or PGC_SECURITY_DSN, a keyword/value connection string to a
maintenance database). Works in its own database, pg_claim_security, owned
by the role sec_owner (not a superuser), which installs pg_claim itself (the
trusted install), and with the roles below, all dropped and created again
at every run: one run at a time per cluster.

    sec_owner      owns the database, installed the extension
    sec_fleet      NOLOGIN; the fleet's common role (docs/security.md)
    sec_worker_a   LOGIN, member of sec_fleet
    sec_worker_b   LOGIN, member of sec_fleet
    sec_other      LOGIN, another role that can connect (a member of nothing)
    sec_attacker   LOGIN, owns schema att, which is first in a superuser's
                   search_path in one test

Each test is a function named after the promise it checks (test_<promise>);
its docstring is the promise as docs/security.md states it. Every test runs,
failed or not, and the run ends with one line: how many passed and which
failed. Waiting is polling with a deadline, never a fixed sleep.

    python3 tests/security/run.py              # every test
    python3 tests/security/run.py -k lease     # the tests whose name contains "lease"

With PGC_SECURITY_PORTABLE=FILE, sec_owner installs the portable edition
(docs/portable.md) from FILE into the schema public instead of the
extension (the layer `portable` runs it so, on a server without pg_claim's
files): the tests of NOT_PORTABLE, promises that do not apply to it, are
left out by name, each with its reason, and those of PORTABLE_ONLY run.
"""
import argparse
import os
import sys
import time
import traceback
import zlib

import psycopg
from psycopg import sql

from common import (ADMIN, COLLIDE, DB, PORTABLE, ROLES, Failure, as_fleet, check,  # noqa: F401
                    connect, expect_error, lease_of, one, poll)
import balance
import fleet_views

# The promises of docs/security.md that do not apply to the portable
# edition (docs/portable.md, "Security"), and why.
NOT_PORTABLE = {
    "test_colliding_name_refused_by_group_join":
        "the portable edition has no dynamic groups (group_join, claim_partitions)",
    "test_owner_plants_in_extension_schema_never_run":
        "the installing role owns every function of the portable edition and so may replace any of them; "
        "no function runs with rights it does not have, so a plant of its own gains it nothing",
}
# The promises only the portable edition makes (its SECURITY DEFINER
# functions callable by every role).
PORTABLE_ONLY = {"test_portable_definer_functions_act_for_the_session_role",
                 "test_portable_internal_functions_closed"}
# The functions of the dynamic groups, which the portable edition leaves out.
GROUPS = ("group_join(", "claim_partitions(")


# ---------------------------------------------------------------------------
# Set-up


def setup():
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.add_notice_handler(lambda d: None)
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        for r in ROLES:
            c.execute(f"DROP ROLE IF EXISTS {r}")
        c.execute("CREATE ROLE sec_owner LOGIN")
        c.execute("CREATE ROLE sec_fleet NOLOGIN")
        c.execute("CREATE ROLE sec_worker_a LOGIN IN ROLE sec_fleet")
        c.execute("CREATE ROLE sec_worker_b LOGIN IN ROLE sec_fleet")
        c.execute("CREATE ROLE sec_other LOGIN")
        c.execute("CREATE ROLE sec_attacker LOGIN")
        c.execute("CREATE ROLE sec_monitor LOGIN IN ROLE pg_monitor")
        c.execute("CREATE ROLE sec_reader LOGIN")
        c.execute(f"CREATE DATABASE {DB} OWNER sec_owner")
    with connect("sec_owner") as c:
        if PORTABLE:
            c.execute("SET search_path = public")
            with open(PORTABLE, encoding="utf-8") as f:
                c.execute(f.read())
            c.execute("RESET search_path")
            owner = one(c, "SELECT proowner::regrole::text FROM pg_proc "
                           "WHERE proname = 'pg_claim_portable_version'")[0]
            super_ = one(c, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0]
            check(owner == "sec_owner" and not super_, f"the portable edition belongs to {owner}, not sec_owner")
        else:
            c.execute("CREATE EXTENSION pg_claim")
            owner = one(c, "SELECT extowner::regrole::text FROM pg_extension WHERE extname = 'pg_claim'")[0]
            check(owner == "sec_owner", f"the extension belongs to {owner}, not sec_owner")
        c.execute("CREATE TABLE public.jobs (id varchar(20) PRIMARY KEY, v integer)")
        c.execute("INSERT INTO public.jobs SELECT 'job' || g, g FROM generate_series(1, 40) g")
        c.execute("GRANT SELECT, INSERT ON public.jobs TO PUBLIC")
    with connect() as c:
        c.execute("CREATE SCHEMA att AUTHORIZATION sec_attacker")


def teardown():
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        for r in ROLES:
            c.execute(f"DROP ROLE IF EXISTS {r}")


# ---------------------------------------------------------------------------
# Leases belong to roles (docs/security.md "Leases")


def test_other_role_cannot_read_lease_token():
    """Another role sees a lease's slot and expiry in lease_holders and
    slot_status, but not its holder or token."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, holder = lease_of(a, "sec_read", 2)
    rows = o.execute("SELECT slot, holder, token FROM lease_holders('sec_read')").fetchall()
    check(rows, "lease_holders shows another role no row at all (it should show the slot)")
    check(all(r[1] is None and r[2] is None for r in rows),
          f"lease_holders shows another role the holder and token: {rows}")
    rows = o.execute("SELECT slot, state, holder, token FROM slot_status('sec_read', 2)").fetchall()
    check(all(r[3] is None and (r[2] is None or r[2] != holder) for r in rows),
          f"slot_status shows another role the holder and token: {rows}")
    # a session claim's token (my_token) likewise
    s = as_fleet("sec_worker_a")
    check(one(s, "SELECT claim_slot('sec_read_s', 2)")[0] is not None, "claim_slot got no slot")
    stoken = one(s, "SELECT my_token('sec_read_s')")[0]
    rows = o.execute("SELECT slot, state, token FROM slot_status('sec_read_s', 2) WHERE token IS NOT NULL").fetchall()
    check(not rows, f"slot_status shows another role the token {stoken} of a session claim: {rows}")
    s.close()
    # the fleet's own members do see them
    b = as_fleet("sec_worker_b")
    rows = b.execute("SELECT holder, token FROM lease_holders('sec_read') WHERE slot = %s", (slot,)).fetchall()
    check(rows == [(holder, token)], f"a member of the fleet role does not see the fleet's lease: {rows}")


def test_other_role_cannot_renew_with_stolen_token():
    """renew_lease with another role's slot and current token extends
    nothing (NULL)."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, _ = lease_of(a, "sec_renew", 1, ttl="10 seconds")
    before = one(a, "SELECT expires_at FROM lease_holders('sec_renew') WHERE slot = %s", (slot,))[0]
    r = one(o, "SELECT renew_lease('sec_renew', %s, %s, '1 day')", (slot, token))[0]
    check(r is None, f"another role renewed the lease with the stolen token until {r}")
    after = one(a, "SELECT expires_at FROM lease_holders('sec_renew') WHERE slot = %s", (slot,))[0]
    check(after == before, f"the lease's expiry moved from {before} to {after}")


def test_other_role_cannot_release_with_stolen_token():
    """release_lease with another role's current token releases nothing
    (false)."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, holder = lease_of(a, "sec_release", 1)
    r = one(o, "SELECT release_lease('sec_release', %s, %s)", (slot, token))[0]
    check(r is False, f"release_lease by another role with the stolen token returned {r}")
    rows = a.execute("SELECT holder, token FROM lease_holders('sec_release') WHERE slot = %s", (slot,)).fetchall()
    check(rows == [(holder, token)], f"the lease changed after another role's release: {rows}")


def test_other_role_cannot_fence_with_stolen_token():
    """fence with another role's current token raises PC001, as with a
    wrong token; lease_valid is false."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, _ = lease_of(a, "sec_fence", 1)
    expect_error(o, "SELECT fence('sec_fence', %s, %s)", "PC001", "fence by another role with the stolen token",
                 (slot, token))
    r = one(o, "SELECT lease_valid('sec_fence', %s, %s)", (slot, token))[0]
    check(r is False, f"lease_valid by another role with the stolen token returned {r}")
    # the owner's fleet still passes
    a.execute("SELECT fence('sec_fence', %s, %s)", (slot, token))


def test_other_role_cannot_claim_live_lease_of_another_fleet():
    """While a lease of a name is live, a role without the privileges of its
    owner role cannot claim the name (42501, naming the role), not even with
    the fleet's holder text."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, holder = lease_of(a, "sec_steal", 2)
    e = expect_error(o, "SELECT * FROM claim_lease('sec_steal', 2, 'intruder')", "42501",
                     "claim_lease of a name another role leases")
    check("sec_fleet" in (e.diag.message_primary or "") + (e.diag.message_detail or ""),
          f"the refusal does not name the owner role sec_fleet: {e.diag.message_primary}")
    expect_error(o, "SELECT * FROM claim_lease('sec_steal', 2, %s)", "42501",
                 "claim_lease with the other fleet's holder text", (holder,))
    rows = a.execute("SELECT holder, token FROM lease_holders('sec_steal') WHERE slot = %s", (slot,)).fetchall()
    check(rows == [(holder, token)], f"the fleet's lease changed: {rows}")


def test_other_role_cannot_join_or_shrink_another_fleet():
    """While a claim_leases fleet of a name is live, a role without the
    privileges of its owner role cannot join it (42501, naming the role),
    not even with a member's holder text, and cannot make a member give its
    slots back (max => 0 with the member's holder text); the fleet's leases
    and tokens are unchanged."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    holder = f"h:{a.info.backend_pid}:elastic"
    held = a.execute("SELECT slot, token FROM claim_leases('sec_elastic', 4, %s)", (holder,)).fetchall()
    check(len(held) == 4, f"the only member of the fleet holds {len(held)} of 4 slots")
    e = expect_error(o, "SELECT * FROM claim_leases('sec_elastic', 4, 'intruder')", "42501",
                     "claim_leases joining another role's fleet")
    check("sec_fleet" in (e.diag.message_primary or ""),
          f"the refusal does not name the owner role sec_fleet: {e.diag.message_primary}")
    expect_error(o, "SELECT * FROM claim_leases('sec_elastic', 4, %s, max => 0)", "42501",
                 "claim_leases with a member's holder text and max => 0", (holder,))
    expect_error(o, "SELECT * FROM claim_lease('sec_elastic', 4, 'intruder')", "42501",
                 "claim_lease of a name a claim_leases fleet of another role leases")
    after = a.execute("SELECT slot, token FROM lease_holders('sec_elastic') WHERE NOT expired ORDER BY slot").fetchall()
    check(after == held, f"the fleet's leases changed: {held} -> {after}")


def test_expired_lease_can_be_taken_by_another_role():
    """An expired (or released) slot can be taken by any role allowed to
    claim."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    lease_of(a, "sec_expired", 1, ttl="200 milliseconds")

    def take():
        try:
            return one(o, "SELECT slot FROM claim_lease('sec_expired', 1, 'other:1')")
        except psycopg.errors.InsufficientPrivilege:
            return None
    poll(take, 10, "another role to take the expired lease")


def test_fleet_shares_name_through_common_role():
    """Workers that log in as different roles share a name through a common
    role: as sec_fleet, worker b sees, renews and fences worker a's lease."""
    with psycopg.connect(ADMIN + f" dbname={DB}", autocommit=True) as c:
        c.execute("ALTER ROLE sec_worker_a IN DATABASE pg_claim_security SET role = 'sec_fleet'")
        c.execute("ALTER ROLE sec_worker_b IN DATABASE pg_claim_security SET role = 'sec_fleet'")
    try:
        a, b = connect("sec_worker_a"), connect("sec_worker_b")
        check(one(a, "SELECT current_user")[0] == "sec_fleet", "ALTER ROLE ... SET role did not apply at login")
        slot, token, _ = lease_of(a, "sec_shared", 2)
        s2, t2, _ = lease_of(b, "sec_shared", 2)
        check(s2 != slot, f"both workers got slot {slot}")
        r = one(b, "SELECT renew_lease('sec_shared', %s, %s)", (slot, token))[0]
        check(r is not None, "a worker of the same fleet role could not renew the fleet's lease")
        b.execute("SELECT fence('sec_shared', %s, %s)", (slot, token))
    finally:
        with psycopg.connect(ADMIN + f" dbname={DB}", autocommit=True) as c:
            c.execute("ALTER ROLE sec_worker_a IN DATABASE pg_claim_security RESET role")
            c.execute("ALTER ROLE sec_worker_b IN DATABASE pg_claim_security RESET role")


# ---------------------------------------------------------------------------
# The installing owner


CLAIMING = [
    # (function, a call as the third role, or None)
    ("claim_slot(text, integer)", "SELECT claim_slot('sec_rv', 2)"),
    ("claim_slot(text, integer, interval)", "SELECT claim_slot('sec_rv', 2, '0 s')"),
    ("claim_slots(text, integer, integer)", "SELECT claim_slots('sec_rv', 2, 1)"),
    ("claim_lease(text, integer, text, interval)", "SELECT * FROM claim_lease('sec_rv2', 2, 'x')"),
    ("claim_leases(text, integer, text, integer, interval)", "SELECT * FROM claim_leases('sec_rv4', 2, 'x')"),
    ("renew_lease(text, integer, bigint, interval)", "SELECT renew_lease('sec_rv2', 0, 1)"),
    ("release_lease(text, integer, bigint)", "SELECT release_lease('sec_rv2', 0, 1)"),
    ("lease_holders(text)", "SELECT * FROM lease_holders('sec_rv2')"),
    ("my_token(text)", "SELECT my_token('sec_rv')"),
    ("group_join(text)", "SELECT group_join('sec_rv3')"),
    ("claim_partitions(text, integer)", "SELECT claim_partitions('sec_rv3', 4)"),
]


def test_owner_revoke_execute_takes_effect():
    """The installing owner's REVOKE EXECUTE ... FROM PUBLIC on the claiming
    functions takes effect (no warning): another role then gets 42501; a
    role the owner grants EXECUTE to can claim."""
    own = connect("sec_owner")
    warnings = []
    own.add_notice_handler(lambda d: warnings.append(d.message_primary))
    claiming = [(fn, stmt) for fn, stmt in CLAIMING if not (PORTABLE and fn.startswith(GROUPS))]
    try:
        for fn, _ in claiming:
            own.execute(f"REVOKE EXECUTE ON FUNCTION {fn} FROM PUBLIC")
        own.execute("GRANT EXECUTE ON FUNCTION claim_slot(text, integer) TO sec_worker_a")
        check(not warnings, f"REVOKE by the installing owner warned: {warnings[:2]}")
        o = connect("sec_other")
        missed = []
        for fn, stmt in claiming:
            try:
                o.execute(stmt).fetchall()
                missed.append(f"{fn}: a result")
            except psycopg.errors.InsufficientPrivilege:
                pass
            except psycopg.Error as e:
                missed.append(f"{fn}: {e.diag.sqlstate} {e.diag.message_primary}")
            o.execute("SELECT pg_advisory_unlock_all()")
        check(not missed, "after the owner's REVOKE, another role still calls: " + "; ".join(missed))
        w = connect("sec_worker_a")
        check(one(w, "SELECT claim_slot('sec_rv', 2)")[0] is not None, "the granted role cannot claim")
    finally:
        for fn, _ in claiming:
            own.execute(f"GRANT EXECUTE ON FUNCTION {fn} TO PUBLIC")


# Helper names the extension's code calls or may call (the helpers 0.3.0's
# functions reached through inexact calls, and the internal functions of the
# lease functions and the name registry), each planted in att with argument
# types that match a non-exact call better than the real function.
SEARCH_PATH_PLANTS = [
    "lease_check(text, integer, integer, interval)",
    "lease_check(text, integer, bigint, interval)",
    "next_token(text)",
    "next_token(bigint)",
    "next_token(integer)",
    "crc32(character varying)",
    "crc32(name)",
    "crc32(text)",
    "slot_of(character varying, integer)",
    "slot_of(character, integer)",
    "slot_of(text, integer)",
    "jump_slot(character varying, integer)",
    "my_slot(text)",
    "my_slot(character varying)",
    "lease_valid(text, integer, bigint)",
    "lease_holders(text)",
    "slot_counts_query(regclass, integer, text, text, text)",
    "slot_counts_query(oid, integer, text, text, text)",
    "my_items_query(regclass, integer, integer, text, text, text, integer, text[], text, text)",
    "slot_channel(text, integer)",
    "pg_claim_register_name(text)",
    "pg_claim_leased(text)",
    "slot_backlog_query(regclass, integer, text, text, text, text, text)",
    "slot_backlog_query(oid, integer, text, text, text, text, text)",
    "pg_claim_fleet_failures_query(oid, integer, text, text, text)",
    "pg_claim_fleet_may_change(oid, oid)",
    "item_failures(text)",
    "slot_status(text, integer)",
]


def plant_sql(schema, sig, role):
    """A planted function: records that it ran, then tries to make role a
    superuser."""
    return (f"CREATE FUNCTION {schema}.{sig} RETURNS integer LANGUAGE plpgsql AS $pl$ BEGIN "
            f"INSERT INTO {schema}.ran VALUES ({sql.Literal(sig).as_string(None)}, current_user); "
            f"BEGIN ALTER ROLE {role} SUPERUSER; EXCEPTION WHEN OTHERS THEN NULL; END; "
            f"RETURN 0; END $pl$")


def test_superuser_search_path_plants_never_run():
    """A role that can create in a schema earlier in a superuser's
    search_path plants look-alikes of the extension's helpers there; the
    extension's functions, called by the superuser (schema-qualified: its own
    unqualified call would resolve through its search_path, PostgreSQL's
    rule), never run them, and the role gains nothing."""
    plant_all(connect("sec_attacker"), "att", SEARCH_PATH_PLANTS)
    su = connect()
    su.execute("SET search_path = att, public")
    try:
        one(su, "SELECT slot FROM public.claim_lease('sec_su', 2, 'su:1')")
        su.execute("SELECT * FROM public.claim_leases('sec_su_e', 2, 'su:2')").fetchall()
        slot, token = one(su, "SELECT slot, token FROM public.lease_holders('sec_su') WHERE holder = 'su:1'")
        one(su, "SELECT public.renew_lease('sec_su', %s, %s)", (slot, token))
        su.execute("SELECT public.fence('sec_su', %s, %s)", (slot, token))
        one(su, "SELECT public.release_lease('sec_su', %s, %s)", (slot, token))
        one(su, "SELECT public.claim_slot('sec_su_s', 2)")
        one(su, "SELECT public.my_token('sec_su_s')")
        su.execute("SELECT * FROM public.slot_status('sec_su_s', 2)").fetchall()
        su.execute("SELECT * FROM public.slot_counts('public.jobs', 4)").fetchall()
        su.execute("SELECT * FROM public.slot_skew('public.jobs', 4)").fetchall()
        su.execute("SELECT * FROM public.my_items(NULL::public.jobs, 0, 4)").fetchall()
        su.execute("SELECT public.my_items_query('public.jobs'::regtype::oid, 0, 4)").fetchall()
        su.execute("SELECT public.slot_channel('sec_su', 1)").fetchall()
        su.execute("CREATE TRIGGER jobs_notify AFTER INSERT ON public.jobs FOR EACH ROW "
                   "EXECUTE FUNCTION public.notify_slot('sec_su', '4', 'id')")
        su.execute("INSERT INTO public.jobs VALUES ('su-job', 0)")
        su.execute("SELECT public.record_failure('sec_su', 'item-1', 'boom')")
        su.execute("SELECT * FROM public.failing_items('sec_su')").fetchall()
        su.execute("SELECT * FROM public.item_failures('sec_su', 'item-1', 'item-2')").fetchall()
        if not PORTABLE:
            su.execute("SELECT public.group_join('sec_su_g')")
            su.execute("SELECT public.claim_partitions('sec_su_g', 4)")
        su.execute("SELECT * FROM public.slot_backlog('public.jobs', 4, 'v')").fetchall()
        su.execute("SELECT public.define_fleet('sec_su_f', 'public.jobs', 4, 'v')")
        su.execute("SELECT * FROM public.fleet_slots").fetchall()
        su.execute("SELECT * FROM public.fleets").fetchall()
        su.execute("SELECT public.drop_fleet('sec_su_f')")
    except psycopg.Error as e:
        raise Failure(f"a superuser's call failed with {e.diag.sqlstate}: {e.diag.message_primary}")
    finally:
        su.execute("DROP TRIGGER IF EXISTS jobs_notify ON public.jobs")
        su.execute("SELECT pg_advisory_unlock_all()")
        ran = su.execute("SELECT sig, cur FROM att.ran").fetchall()
        sup = one(su, "SELECT rolsuper FROM pg_roles WHERE rolname = 'sec_attacker'")[0]
        su.execute("ALTER ROLE sec_attacker NOSUPERUSER")
        su.close()
    check(not sup, f"sec_attacker became a SUPERUSER through a planted function (ran: {ran[:5]})")
    check(not ran, f"planted functions ran in the superuser's calls: {sorted(set(ran))[:8]}")


def plant_all(conn, schema, sigs):
    """Plants sigs into schema as conn's role, with a table the planted
    functions record into."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.ran (sig text, cur text)")
    conn.execute(f"GRANT INSERT, SELECT ON {schema}.ran TO PUBLIC")
    conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC")
    for sig in sigs:
        try:
            conn.execute(plant_sql(schema, sig, conn.info.user))
        except psycopg.errors.DuplicateFunction:
            pass


def test_owner_plants_in_extension_schema_never_run():
    """The installing owner plants, in the extension's own schema, the
    look-alikes that captured 0.3.0's calls (lease_check, next_token, slot_of on varchar and
    character, slot_counts_query on regclass); its own calls of claim_lease,
    my_token (SECURITY DEFINER, run as the bootstrap superuser), slot_counts,
    my_items and notify_slot never run them, the owner does not become a
    superuser, and shares on a varchar key are crc32(key::text) % n."""
    own = connect("sec_owner")
    plant_all(own, "public", ["lease_check(text, integer, integer, interval)", "next_token(text)",
                              "slot_of(character varying, integer)", "slot_of(character, integer)",
                              "slot_counts_query(regclass, integer, text, text, text)", "crc32(character varying)"])
    own.execute("DELETE FROM public.ran")
    problems = []
    n = 4
    try:
        for stmt in ("SELECT * FROM claim_lease('sec_own', 2, 'own:1')",
                     "SELECT * FROM claim_leases('sec_own_e', 2, 'own:2')",
                     "SELECT claim_slot('sec_own_s', 2)", "SELECT my_token('sec_own_s')",
                     "SELECT * FROM slot_status('sec_own_s', 2)"):
            try:
                own.execute(stmt).fetchall()
            except psycopg.Error as e:
                problems.append(f"{stmt}: {e.diag.sqlstate} {e.diag.message_primary}")
        keys = [r[0] for r in own.execute("SELECT id::text FROM public.jobs").fetchall()]
        want = {s: sorted(k for k in keys if zlib.crc32(k.encode()) % n == s) for s in range(n)}
        try:
            counts = dict(own.execute("SELECT slot, items FROM slot_counts('public.jobs', %s)", (n,)).fetchall())
            if counts != {s: len(v) for s, v in want.items()}:
                problems.append(f"slot_counts gave {counts}, crc32 gives { {s: len(v) for s, v in want.items()} }")
        except psycopg.Error as e:
            problems.append(f"slot_counts: {e.diag.sqlstate} {e.diag.message_primary}")
        for s in range(n):
            try:
                got = sorted(r[0] for r in own.execute("SELECT id::text FROM my_items(NULL::public.jobs, %s, %s)", (s, n)))
            except psycopg.Error as e:
                problems.append(f"my_items: {e.diag.sqlstate} {e.diag.message_primary}")
                break
            if got != want[s]:
                problems.append(f"my_items slot {s} of {n} gave {len(got)} rows, crc32 gives {len(want[s])}")
        own.execute("CREATE TRIGGER jobs_notify_own AFTER INSERT ON public.jobs FOR EACH ROW "
                    "EXECUTE FUNCTION notify_slot('sec_own', '4', 'id')")
        try:
            own.execute("INSERT INTO public.jobs VALUES ('own-job', 0)")
        except psycopg.Error as e:
            problems.append(f"INSERT with notify_slot: {e.diag.sqlstate} {e.diag.message_primary}")
    finally:
        own.execute("SELECT pg_advisory_unlock_all()")
        own.execute("DROP TRIGGER IF EXISTS jobs_notify_own ON public.jobs")
        own.execute("DELETE FROM public.jobs WHERE id = 'own-job'")
        ran = own.execute("SELECT sig, cur FROM public.ran").fetchall()
        with connect() as su:
            sup = one(su, "SELECT rolsuper FROM pg_roles WHERE rolname = 'sec_owner'")[0]
            su.execute("ALTER ROLE sec_owner NOSUPERUSER")
        for sig in ["lease_check(text, integer, integer, interval)", "next_token(text)",
                    "slot_of(character varying, integer)", "slot_of(character, integer)",
                    "slot_counts_query(regclass, integer, text, text, text)", "crc32(character varying)"]:
            own.execute(f"DROP FUNCTION IF EXISTS public.{sig}")
    check(not sup, f"sec_owner became a SUPERUSER through its planted functions (ran: {sorted(set(ran))[:5]})")
    check(not ran, f"planted functions ran: {sorted(set(ran))[:8]}")
    check(not problems, "; ".join(problems))


def test_shares_on_varchar_key_match_crc32_with_plants():
    """With look-alikes of slot_of for varchar and character in a schema
    earlier in a worker's search_path, my_items and slot_counts on a
    varchar key still give crc32(key::text) % n."""
    plant_all(connect("sec_attacker"), "att",
              ["slot_of(character varying, integer)", "slot_of(character, integer)", "crc32(character varying)"])
    w = connect("sec_worker_a")
    w.execute("SET search_path = att, public")
    n = 4
    keys = [r[0] for r in w.execute("SELECT id::text FROM public.jobs").fetchall()]
    want = {s: sorted(k for k in keys if zlib.crc32(k.encode()) % n == s) for s in range(n)}
    counts = dict(w.execute("SELECT slot, items FROM public.slot_counts('public.jobs', %s)", (n,)).fetchall())
    check(counts == {s: len(v) for s, v in want.items()}, f"slot_counts gave {counts}, crc32 gives "
          f"{ {s: len(v) for s, v in want.items()} }")
    for s in range(n):
        got = sorted(r[0] for r in w.execute("SELECT id::text FROM public.my_items(NULL::public.jobs, %s, %s)", (s, n)).fetchall())
        check(got == want[s], f"my_items slot {s} of {n} gave {len(got)} rows, crc32 gives {len(want[s])}")


# ---------------------------------------------------------------------------
# Names never share slots in silence


def collide_setup():
    check(zlib.crc32(COLLIDE[0].encode()) == zlib.crc32(COLLIDE[1].encode()), "the two names do not collide")


def refused_collision(conn, stmt, what):
    e = expect_error(conn, stmt, "42710", what)
    msg = (e.diag.message_primary or "") + " " + (e.diag.message_detail or "")
    check(COLLIDE[0] in msg and COLLIDE[1] in msg, f"{what}: the message does not name both names: {msg}")
    check((e.diag.message_hint or "").strip(), f"{what}: no hint")


def first_claim_of_collide():
    """The first name is taken (and so registered) once; idempotent."""
    c = connect("sec_worker_a")
    r = one(c, "SELECT claim_slot(%s, 2)", (COLLIDE[0],))[0]
    check(r is not None, f"claim_slot({COLLIDE[0]!r}) got no slot")
    c.close()


def test_colliding_name_refused_by_claim_slot():
    """A name whose crc32 equals a name already used is refused by
    claim_slot and claim_slots with 42710, naming both names."""
    collide_setup()
    first_claim_of_collide()
    c = connect("sec_worker_b")
    refused_collision(c, f"SELECT claim_slot('{COLLIDE[1]}', 2)", "claim_slot of the colliding name")
    refused_collision(c, f"SELECT claim_slots('{COLLIDE[1]}', 2, 1)", "claim_slots of the colliding name")


def test_colliding_name_refused_by_claim_lease():
    """claim_lease refuses a name whose crc32 equals a name already used
    (42710, naming both)."""
    collide_setup()
    first_claim_of_collide()
    c = connect("sec_other")
    refused_collision(c, f"SELECT * FROM claim_lease('{COLLIDE[1]}', 2, 'h:1')", "claim_lease of the colliding name")


def test_colliding_name_refused_by_group_join():
    """group_join and claim_partitions refuse a name whose crc32 equals a
    name already used (42710, naming both)."""
    collide_setup()
    first_claim_of_collide()
    c = connect("sec_other")
    refused_collision(c, f"SELECT group_join('{COLLIDE[1]}')", "group_join of the colliding name")
    refused_collision(c, f"SELECT claim_partitions('{COLLIDE[1]}', 4)", "claim_partitions of the colliding name")


# ---------------------------------------------------------------------------
# The extension's tables


TABLES = ["pg_claim_leases", "pg_claim_lease_members", "pg_claim_failures", "pg_claim_names"]


def test_tables_closed_to_other_roles():
    """pg_claim_leases, pg_claim_lease_members, pg_claim_failures and pg_claim_names cannot be read
    or written directly by a worker role or another role (42501): they
    change only through the functions."""
    present = {r[0] for r in connect().execute(
        "SELECT c.relname FROM pg_class c JOIN pg_depend d ON d.objid = c.oid AND d.classid = 'pg_class'::regclass "
        "AND d.deptype = 'e' JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_claim'" if not PORTABLE
        # the portable edition's tables: those of the installing role in public
        else "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace "
             "AND c.relkind = 'r' AND c.relowner = 'sec_owner'::regrole").fetchall()}
    missing = [t for t in TABLES if t not in present]
    problems = []
    for role in ("sec_worker_a", "sec_other", "sec_attacker"):
        c = connect(role)
        for t in TABLES:
            if t not in present:
                continue
            for stmt in (f"SELECT * FROM public.{t} LIMIT 1", f"DELETE FROM public.{t}",
                         f"UPDATE public.{t} SET name = name", f"TRUNCATE public.{t}",
                         f"INSERT INTO public.{t} (name) VALUES ('x')"):
                try:
                    c.execute(stmt)
                    problems.append(f"{role}: {stmt} succeeded")
                except psycopg.errors.InsufficientPrivilege:
                    pass
                except psycopg.Error as e:
                    problems.append(f"{role}: {stmt}: {e.diag.sqlstate} (not 42501)")
    check(not problems, "; ".join(problems))
    check(not missing, f"the extension has no table {', '.join(missing)}")


# ---------------------------------------------------------------------------
# Defined fleets (docs/security.md "Defined fleets")


def fleet_row(conn, name):
    return conn.execute("SELECT tbl::text, n, pending, owner::text FROM public.pg_claim_fleets WHERE name = %s",
                        (name,)).fetchall()


def test_fleet_definition_belongs_to_its_role():
    """A fleet's definition belongs to the role that wrote it: another role
    can neither replace nor drop it (42501), nor write the definitions table
    or call the internal functions with a forged role; a member of the
    role can replace it, and so can the extension's owner."""
    a, att = as_fleet("sec_worker_a"), connect("sec_attacker")
    a.execute("SELECT define_fleet('sec_fl', 'public.jobs', 4, key => 'id')")
    before = fleet_row(a, "sec_fl")
    check(before and before[0][3] == "sec_fleet", f"the definition does not belong to sec_fleet: {before}")
    att.execute("CREATE TABLE att.mine (id bigint PRIMARY KEY, done boolean)")
    e = expect_error(att, "SELECT define_fleet('sec_fl', 'att.mine', 2, 'done')", "42501",
                     "define_fleet replacing another role's fleet")
    check("sec_fleet" in (e.diag.message_primary or ""), f"the refusal does not name sec_fleet: {e.diag.message_primary}")
    expect_error(att, "SELECT drop_fleet('sec_fl')", "42501", "drop_fleet of another role's fleet")
    fleet_oid = one(a, "SELECT 'sec_fleet'::regrole::oid")[0]
    for stmt, what in (
            ("SELECT public.pg_claim_fleet_put(%s, 'sec_fl', 'att.mine'::regclass::oid, 2, 'done', NULL, NULL, 'auto', NULL)"
             % fleet_oid, "the internal pg_claim_fleet_put with a forged role"),
            ("SELECT public.pg_claim_fleet_drop(%s, 'sec_fl')" % fleet_oid, "the internal pg_claim_fleet_drop"),
            ("UPDATE public.pg_claim_fleets SET tbl = 'att.mine'", "UPDATE of the definitions"),
            ("DELETE FROM public.pg_claim_fleets", "DELETE of the definitions"),
            ("INSERT INTO public.pg_claim_fleets VALUES ('x', 'att.mine', 1, NULL, NULL, NULL, 'auto', NULL, "
             "'sec_attacker', now())", "INSERT into the definitions"),
            ("TRUNCATE public.pg_claim_fleets", "TRUNCATE of the definitions")):
        expect_error(att, stmt, "42501", what)
    check(fleet_row(a, "sec_fl") == before, f"the definition changed: {before} -> {fleet_row(a, 'sec_fl')}")
    b = as_fleet("sec_worker_b")
    b.execute("SELECT define_fleet('sec_fl', 'public.jobs', 8, key => 'id')")
    check(fleet_row(b, "sec_fl")[0][1] == 8, "a member of the fleet role could not replace its definition")
    # a name taken first by another role: the extension's owner removes it
    att.execute("GRANT USAGE ON SCHEMA att TO PUBLIC")
    att.execute("SELECT define_fleet('sec_squat', 'att.mine', 2, 'done')")
    expect_error(a, "SELECT define_fleet('sec_squat', 'public.jobs', 4, key => 'id')", "42501",
                 "define_fleet of a name another role defined first")
    own = connect("sec_owner")
    check(one(own, "SELECT drop_fleet('sec_squat')")[0] is True, "the extension's owner could not drop a definition")
    a.execute("SELECT define_fleet('sec_squat', 'public.jobs', 4, key => 'id')")
    for c in (a, b):
        c.execute("SELECT drop_fleet('sec_fl'), drop_fleet('sec_squat')")


def test_define_fleet_needs_read_privilege():
    """define_fleet checks the definition with the caller's privileges: a
    role that may not read the table, or the columns the definition names,
    gets 42501 and defines nothing."""
    own = connect("sec_owner")
    own.execute("CREATE TABLE public.closed (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false, "
                 "created_at timestamptz)")
    own.execute("GRANT SELECT (id, done) ON public.closed TO sec_other")
    try:
        att, o = connect("sec_attacker"), connect("sec_other")
        expect_error(att, "SELECT define_fleet('sec_closed', 'public.closed', 2, 'done')", "42501",
                     "define_fleet on a table the role may not read")
        expect_error(o, "SELECT define_fleet('sec_closed', 'public.closed', 2, 'done', age => 'created_at')", "42501",
                     "define_fleet with an age column the role may not read")
        check(not fleet_row(own, "sec_closed"), "a refused define_fleet left a definition")
        o.execute("SELECT define_fleet('sec_closed', 'public.closed', 2, 'done')")
        o.execute("SELECT drop_fleet('sec_closed')")
    finally:
        own.execute("DROP TABLE public.closed")


# ---------------------------------------------------------------------------
# The portable edition (docs/portable.md, "Security"): run with
# PGC_SECURITY_PORTABLE only


def test_portable_definer_functions_act_for_the_session_role():
    """The portable edition's define_fleet and drop_fleet store through
    pg_claim_fleet_define and pg_claim_fleet_forget, SECURITY DEFINER
    functions that every role may call: called directly, they act only for
    the calling session's role (which no role can set to a role it is not a
    member of) and check its privileges on the table, so they give no role
    more than define_fleet and drop_fleet do."""
    a, att, own = as_fleet("sec_worker_a"), connect("sec_attacker"), connect("sec_owner")
    att.execute("CREATE TABLE att.mine2 (id bigint PRIMARY KEY, done boolean)")
    own.execute("CREATE TABLE public.closed2 (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
    try:
        a.execute("SELECT define_fleet('sec_pd', 'public.jobs', 4, key => 'id')")
        before = fleet_row(a, "sec_pd")
        for stmt, what in (
                ("SELECT public.pg_claim_fleet_define('sec_pd', 'att.mine2'::regclass::oid, 2, 'done', NULL, NULL, "
                 "'auto', NULL)", "pg_claim_fleet_define replacing another role's fleet"),
                ("SELECT public.pg_claim_fleet_forget('sec_pd')", "pg_claim_fleet_forget of another role's fleet"),
                ("SELECT public.pg_claim_fleet_define('sec_pd2', 'public.closed2'::regclass::oid, 2, 'done', NULL, "
                 "NULL, 'auto', NULL)", "pg_claim_fleet_define on a table the role may not read"),
                ("SELECT set_config('role', 'sec_fleet', false)", "setting the session's role to another role"),
                ("SET ROLE sec_fleet", "SET ROLE to another role")):
            expect_error(att, stmt, "42501", what)
        own.execute("GRANT SELECT (id) ON public.closed2 TO sec_attacker")
        expect_error(att, "SELECT public.pg_claim_fleet_define('sec_pd2', 'public.closed2'::regclass::oid, 2, 'done', "
                          "NULL, NULL, 'auto', NULL)", "42501", "pg_claim_fleet_define with a column the role may not read")
        check(fleet_row(a, "sec_pd") == before and not fleet_row(own, "sec_pd2"),
              f"the definitions changed: {before} -> {fleet_row(a, 'sec_pd')}, {fleet_row(own, 'sec_pd2')}")
        # called directly, for its own session role: what define_fleet does
        att.execute("SELECT public.pg_claim_fleet_define('sec_pd3', 'att.mine2'::regclass::oid, 2, 'done', NULL, "
                    "NULL, 'auto', NULL)")
        check(fleet_row(own, "sec_pd3") == [("att.mine2", 2, "done", "sec_attacker")],
              f"a direct call did not act for its own role: {fleet_row(own, 'sec_pd3')}")
        check(one(att, "SELECT public.pg_claim_fleet_forget('sec_pd3')")[0] is True, "its own definition was not dropped")
    finally:
        a.execute("SELECT drop_fleet('sec_pd')")
        own.execute("DROP TABLE public.closed2")
        att.execute("DROP TABLE att.mine2")


def test_portable_internal_functions_closed():
    """Every internal function of the portable edition that runs with the
    installing role's rights (SECURITY DEFINER) refuses another role
    (42501), but for pg_claim_fleet_define and pg_claim_fleet_forget (the
    test above) and pg_claim_name_owns_key (open in the extension too: it
    tells whether a name's key is free, no more than a claim's 42710); and
    every SECURITY DEFINER function runs with a fixed search_path."""
    su, att = connect(), connect("sec_attacker")
    fns = su.execute(
        "SELECT p.oid::regprocedure::text, p.proname, "
        "       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) t), "
        "       coalesce(array_to_string(p.proconfig, ' ') LIKE '%search_path=%', false) "
        "FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef "
        "AND p.proowner = 'sec_owner'::regrole ORDER BY 1").fetchall()
    unfixed = [f for f, _, _, fixed in fns if not fixed]
    check(not unfixed, f"SECURITY DEFINER functions without a fixed search_path: {unfixed}")
    internal = [(f, name, args) for f, name, args, _ in fns
                if name.startswith("pg_claim_")
                and name not in ("pg_claim_fleet_define", "pg_claim_fleet_forget", "pg_claim_name_owns_key")]
    check(len(internal) >= 10, f"only {len(internal)} internal SECURITY DEFINER functions found: {internal}")
    open_ = []
    for f, name, args in internal:
        try:
            att.execute(f"SELECT public.{name}({', '.join('NULL::' + t for t in args)})").fetchall()
            open_.append(f"{f}: a result")
        except psycopg.errors.InsufficientPrivilege:
            pass
        except psycopg.Error as e:
            open_.append(f"{f}: {e.diag.sqlstate} {e.diag.message_primary}")
    check(not open_, f"another role calls internal functions: {open_[:5]}")


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", default="", help="run only the tests whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the database and roles")
    a = ap.parse_args()
    found = list(globals().items()) + list(vars(fleet_views).items()) + list(vars(balance).items())
    tests = [(n, f) for n, f in found if n.startswith("test_") and callable(f) and a.k in n
             and (n not in PORTABLE_ONLY or PORTABLE)]
    if PORTABLE:
        for n, _ in tests:
            if n in NOT_PORTABLE:
                print(f"n/a     {n}: {NOT_PORTABLE[n]}", flush=True)
        tests = [(n, f) for n, f in tests if n not in NOT_PORTABLE]
    t0 = time.monotonic()
    setup()
    failed = []
    try:
        for name, fn in tests:
            try:
                fn()
                print(f"ok      {name}", flush=True)
            except Failure as e:
                failed.append(name)
                print(f"FAILED  {name}: {e}", flush=True)
            except Exception as e:  # noqa: BLE001 - an unexpected error fails the test, the run goes on
                failed.append(name)
                print(f"FAILED  {name}: {type(e).__name__}: {e}", flush=True)
                traceback.print_exc(limit=3)
    finally:
        if not a.keep:
            teardown()
    print(f"security{' (portable edition)' if PORTABLE else ''}: "
          f"{len(tests) - len(failed)} of {len(tests)} promises hold in {time.monotonic() - t0:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
