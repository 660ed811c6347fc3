"""The extension's tables are closed to other roles; a defined fleet belongs
to its role, and defining one needs the read privilege on its table."""
import psycopg

from .common import PORTABLE, as_fleet, check, connect, expect_error, fleet_row, one


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
