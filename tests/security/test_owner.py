"""The installing owner (docs/security.md): its REVOKE EXECUTE takes
effect, and look-alikes planted in a superuser's search_path, in the
extension's schema or a worker's search_path never run."""
import zlib

import psycopg
from psycopg import sql

from .common import GROUPS, PORTABLE, Failure, check, connect, one


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
