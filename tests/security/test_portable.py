"""The portable edition's own promises (docs/portable.md, "Security"):
its SECURITY DEFINER functions act for the session role, its internal
ones are closed. Run with PGC_SECURITY_PORTABLE only."""
import psycopg

from .common import as_fleet, check, connect, expect_error, fleet_row, one


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
