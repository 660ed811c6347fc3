"""The fleet views' trust rule (docs/security.md, "The fleet views"), played
by an attacker.

A fleet's definition names a relation, and reading that relation runs code
that its owners chose: a view's query, a row-level security policy, a
domain's CHECK when the failure records are cast to the key's type. The
views fleet_slots and fleets (and so contrib/prometheus) read a fleet's
relation only for a reader that trusts every role that chose such code:
one that holds the reader's privileges. Each plant below is a function of
sec_attacker's that, when it runs, records the role it ran as and tries to
make sec_attacker a superuser and to copy a table only the reader may
read; it must never run, whoever reads the views: a superuser, the
extension's owner, a pg_monitor role or a third role.
"""
import psycopg

import harness

from .common import ADMIN, as_fleet, check, connect, lease_of, one

# The readers the plants are played against: (what, how to connect).
READERS = [
    ("a superuser", lambda: harness.connect(conninfo=ADMIN + " dbname=pg_claim_security")),
    ("the extension's owner", lambda: connect("sec_owner")),
    ("a pg_monitor role", lambda: connect("sec_monitor")),
    ("a third role", lambda: connect("sec_other")),
]

# sec_attacker's function: when it runs, it leaves the role it ran as in
# fv.ran, copies what it can of the reader's secret into fv.loot, and
# tries ALTER ROLE ... SUPERUSER (which works only when it runs as a
# superuser). Always true, so a plant's filter keeps every row.
GRAB = """
CREATE TABLE fv.ran (who text, how text);
CREATE TABLE fv.loot (secret text);
GRANT INSERT ON fv.ran, fv.loot TO PUBLIC;
GRANT USAGE ON SCHEMA fv TO PUBLIC;
CREATE FUNCTION fv.grab(how text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fv.ran VALUES (current_user, how);
    BEGIN
        INSERT INTO fv.loot SELECT s FROM public.reader_secret s;
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    BEGIN
        EXECUTE 'ALTER ROLE sec_attacker SUPERUSER';
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    RETURN true;
END $$;
"""

# The plants: the attacker's fleets, each with the SQL that builds its relation.
PLANTS = {
    "fv_view": """
        CREATE TABLE fv.t_view (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
        INSERT INTO fv.t_view SELECT g, false FROM generate_series(1, 20) g;
        CREATE VIEW fv.v AS SELECT * FROM fv.t_view WHERE fv.grab('view');
        GRANT SELECT ON fv.v TO PUBLIC;
        SELECT define_fleet('fv_view', 'fv.v', 4, 'done', key => 'id');
    """,
    "fv_domain": """
        CREATE DOMAIN fv.dkey AS bigint CHECK (fv.grab('domain'));
        CREATE TABLE fv.t_domain (id fv.dkey PRIMARY KEY, done boolean NOT NULL DEFAULT false);
        INSERT INTO fv.t_domain SELECT g, false FROM generate_series(1, 20) g;
        GRANT SELECT ON fv.t_domain TO PUBLIC;
        SELECT define_fleet('fv_domain', 'fv.t_domain', 4, 'done');
        SELECT record_failure('fv_domain', '5', 'planted', 3, '1 hour');
        SELECT record_failure('fv_domain', 'not a number', 'planted', 3, '1 hour');
    """,
    "fv_policy": """
        CREATE TABLE fv.t_policy (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
        INSERT INTO fv.t_policy SELECT g, false FROM generate_series(1, 20) g;
        ALTER TABLE fv.t_policy ENABLE ROW LEVEL SECURITY;
        CREATE POLICY p ON fv.t_policy USING (fv.grab('policy'));
        GRANT SELECT ON fv.t_policy TO PUBLIC;
        SELECT define_fleet('fv_policy', 'fv.t_policy', 4, 'done');
    """,
    "fv_huge": """
        CREATE TABLE fv.t_huge (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
        GRANT SELECT ON fv.t_huge TO PUBLIC;
        SELECT define_fleet('fv_huge', 'fv.t_huge', 1048576, 'done');
    """,
}


def plant():
    su = harness.connect(conninfo=ADMIN + " dbname=pg_claim_security")
    su.execute("DROP SCHEMA IF EXISTS fv CASCADE")
    su.execute("CREATE SCHEMA fv AUTHORIZATION sec_attacker")
    su.execute("DROP TABLE IF EXISTS public.reader_secret")
    su.execute("CREATE TABLE public.reader_secret (s text)")
    su.execute("INSERT INTO public.reader_secret VALUES ('the readers'' secret')")
    su.execute("GRANT SELECT ON public.reader_secret TO sec_owner, sec_monitor, sec_other")
    att = connect("sec_attacker")
    att.execute(GRAB)
    for sql in PLANTS.values():
        att.execute(sql)
    return su, att


def unplant(su, att):
    for name in PLANTS:
        att.execute("SELECT drop_fleet(%s)", (name,))
    su.execute("ALTER ROLE sec_attacker NOSUPERUSER")
    su.execute("DROP SCHEMA fv CASCADE")
    su.execute("DROP TABLE public.reader_secret")


def test_fleet_views_run_no_code_of_an_untrusted_definer():
    """A role's fleet on a view that calls its function, on a table whose
    key is a domain with a CHECK that calls it (the failure records are cast
    to the key's type), or on a table whose row-level security policy calls
    it: reading fleets and fleet_slots as a superuser, the extension's
    owner, a pg_monitor role or a third role runs none of it (the role does
    not become a superuser, copies nothing); each of those fleets shows in
    fleets with untrusted naming what is not trusted and its counts NULL,
    and in fleet_slots with no row, so a definition with n = 1048576 costs
    a reader nothing."""
    su, att = plant()
    problems = []
    try:
        for what, conn in READERS:
            c = conn()
            try:
                rows = c.execute("SELECT fleet, pending, holders, unserved, oldest, claimable, untrusted "
                                 "FROM public.fleets WHERE fleet LIKE 'fv\\_%' ORDER BY fleet").fetchall()
                slots = one(c, "SELECT count(*) FROM public.fleet_slots WHERE fleet LIKE 'fv\\_%'")[0]
            except psycopg.Error as e:
                problems.append(f"{what}: the views failed with {e.diag.sqlstate} {e.diag.message_primary}")
                continue
            finally:
                c.close()
            if [r[0] for r in rows] != sorted(PLANTS):
                problems.append(f"{what}: fleets lists {[r[0] for r in rows]}, not every defined fleet")
            for r in rows:
                if r[6] is None:
                    problems.append(f"{what}: fleet {r[0]} is counted (untrusted NULL): {r}")
                elif any(v is not None for v in r[1:6]):
                    problems.append(f"{what}: untrusted fleet {r[0]} shows counts {r[1:6]}")
            if slots:
                problems.append(f"{what}: fleet_slots shows {slots} rows of the attacker's fleets")
        ran = su.execute("SELECT who, how FROM fv.ran WHERE who <> 'sec_attacker'").fetchall()
        loot = su.execute("SELECT count(*) FROM fv.loot").fetchone()[0]
        sup = one(su, "SELECT rolsuper FROM pg_roles WHERE rolname = 'sec_attacker'")[0]
        if ran:
            problems.append(f"the attacker's function ran inside the views: {sorted(set(ran))}")
        if loot:
            problems.append(f"the attacker copied {loot} rows of the readers' secret")
        if sup:
            problems.append("sec_attacker became a superuser")
        # each plant is named for what it is
        why = dict(su.execute("SELECT fleet, untrusted FROM public.fleets WHERE fleet LIKE 'fv\\_%'").fetchall())
        for name in PLANTS:
            if "sec_attacker" not in (why.get(name) or ""):
                problems.append(f"untrusted of {name} does not name its owner: {why.get(name)!r}")
        check(not problems, "; ".join(problems))
    finally:
        unplant(su, att)


def test_fleet_views_trust_what_the_definer_chose_only_through_the_reader():
    """Even the attacker's own reading is as the attacker: the attacker sees
    its own fleets counted (its plants run with its own rights, which gains
    it nothing). A role trusts a fleet when every role that chose its code
    holds the reader's privileges: after GRANT reader TO definer (the
    exporter's role, docs/security.md), the reader sees the definer's fleet
    counted, and a view of the definer's that calls a third role's function
    is still not counted."""
    su, att = plant()
    own = connect("sec_owner")
    problems = []
    try:
        c = connect("sec_attacker")
        mine = c.execute("SELECT fleet, pending, untrusted FROM public.fleets WHERE fleet IN "
                         "('fv_view', 'fv_policy') ORDER BY fleet").fetchall()
        c.close()
        if mine != [("fv_policy", 20, None), ("fv_view", 20, None)]:
            problems.append(f"the definer does not see its own fleets counted: {mine}")
        # the definer sec_fleet, a reader it holds the privileges of
        su.execute("GRANT sec_reader TO sec_fleet")
        own.execute("CREATE TABLE public.trusted_jobs (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
        own.execute("INSERT INTO public.trusted_jobs SELECT g, g % 4 = 0 FROM generate_series(1, 40) g")
        su.execute("ALTER TABLE public.trusted_jobs OWNER TO sec_fleet")
        f = as_fleet("sec_worker_a")
        f.execute("GRANT SELECT ON public.trusted_jobs TO sec_reader, sec_other")
        f.execute("SELECT define_fleet('sec_trusted', 'public.trusted_jobs', 4, 'done')")
        su.execute("CREATE VIEW public.trusted_view AS SELECT * FROM public.trusted_jobs WHERE fv.grab('trusted view')")
        su.execute("ALTER VIEW public.trusted_view OWNER TO sec_fleet")
        f.execute("GRANT SELECT ON public.trusted_view TO sec_reader")
        f.execute("SELECT define_fleet('sec_trusted_view', 'public.trusted_view', 4, 'done', key => 'id')")
        r = connect("sec_reader")
        got = r.execute("SELECT fleet, pending, untrusted IS NULL FROM public.fleets "
                        "WHERE fleet LIKE 'sec\\_trusted%' ORDER BY fleet").fetchall()
        if got != [("sec_trusted", 30, True), ("sec_trusted_view", None, False)]:
            problems.append(f"the reader that sec_fleet holds the privileges of sees {got}")
        per_slot = r.execute("SELECT slot, pending FROM public.fleet_slots WHERE fleet = 'sec_trusted' "
                             "ORDER BY slot").fetchall()
        direct = r.execute("SELECT slot, backlog FROM public.slot_backlog('public.trusted_jobs', 4, 'done') "
                           "ORDER BY slot").fetchall()
        if per_slot != direct:
            problems.append(f"fleet_slots {per_slot} differs from the reader's own slot_backlog {direct}")
        o = connect("sec_other")
        other = o.execute("SELECT pending, untrusted FROM public.fleets WHERE fleet = 'sec_trusted'").fetchall()
        if other[0][0] is not None or "sec_fleet" not in (other[0][1] or ""):
            problems.append(f"a role sec_fleet does not hold the privileges of sees the fleet counted: {other}")
        ran = su.execute("SELECT who, how FROM fv.ran WHERE who <> 'sec_attacker'").fetchall()
        if ran:
            problems.append(f"the attacker's function ran as another role: {sorted(set(ran))}")
        check(not problems, "; ".join(problems))
    finally:
        f = as_fleet("sec_worker_a")
        for name in ("sec_trusted", "sec_trusted_view"):
            f.execute("SELECT drop_fleet(%s)", (name,))
        su.execute("DROP VIEW IF EXISTS public.trusted_view")
        su.execute("DROP TABLE IF EXISTS public.trusted_jobs")
        su.execute("REVOKE sec_reader FROM sec_fleet")
        unplant(su, att)


def test_fleet_views_show_what_the_caller_can_read():
    """fleet_slots, fleets and slot_backlog read a trusted fleet's table
    with the caller's privileges and row-level security: each role sees the
    pending rows its own SELECT sees; a role that may not read the table
    sees pending NULL, not an error; lease holders and tokens as
    lease_holders shows them."""
    su = harness.connect(conninfo=ADMIN + " dbname=pg_claim_security")
    own = connect("sec_owner")
    own.execute("CREATE TABLE public.tenant_jobs (id bigint PRIMARY KEY, tenant text NOT NULL, "
                "done boolean NOT NULL DEFAULT false)")
    own.execute("INSERT INTO public.tenant_jobs SELECT g, CASE WHEN g % 3 = 0 THEN 'sec_worker_a' "
                "ELSE 'sec_other' END, g % 2 = 0 FROM generate_series(1, 60) g")
    own.execute("ALTER TABLE public.tenant_jobs ENABLE ROW LEVEL SECURITY")
    own.execute("CREATE POLICY mine ON public.tenant_jobs USING (tenant = session_user)")
    own.execute("GRANT SELECT ON public.tenant_jobs TO sec_worker_a, sec_other")
    own.execute("CREATE TABLE public.fleet_only (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
    own.execute("INSERT INTO public.fleet_only SELECT g, false FROM generate_series(1, 10) g")
    own.execute("GRANT SELECT ON public.fleet_only TO sec_fleet")
    # the readers trust the owner's and the fleet role's definitions: both
    # hold every reader's privileges
    readers = ("sec_worker_a", "sec_other", "sec_attacker")
    for role in readers:
        su.execute(f"GRANT {role} TO sec_owner")
    for role in readers[1:]:  # (sec_worker_a reads sec_private as sec_fleet)
        su.execute(f"GRANT {role} TO sec_fleet")
    try:
        own.execute("SELECT define_fleet('sec_tenant', 'public.tenant_jobs', 3, 'done')")
        a = as_fleet("sec_worker_a")
        a.execute("SELECT define_fleet('sec_private', 'public.fleet_only', 2, 'done')")
        slot, token, holder = lease_of(a, "sec_private", 2)
        problems = []
        for role in readers:
            c = connect(role)
            try:
                own_count = one(c, "SELECT count(*) FROM public.tenant_jobs WHERE NOT done")[0]
            except psycopg.errors.InsufficientPrivilege:
                own_count = None
            try:
                pending = one(c, "SELECT pending FROM public.fleets WHERE fleet = 'sec_tenant'")[0]
                per_slot = c.execute("SELECT slot, pending FROM public.fleet_slots WHERE fleet = 'sec_tenant' "
                                     "ORDER BY slot").fetchall()
                private = c.execute("SELECT slot, pending, holder, token FROM public.fleet_slots "
                                    "WHERE fleet = 'sec_private' ORDER BY slot").fetchall()
            except psycopg.Error as e:
                problems.append(f"{role}: the views failed with {e.diag.sqlstate} {e.diag.message_primary}")
                continue
            if pending != own_count:
                problems.append(f"{role}: fleets shows {pending} pending, its own SELECT sees {own_count}")
            if own_count is not None:
                backlog = c.execute("SELECT slot, backlog FROM public.slot_backlog('public.tenant_jobs', 3, 'done') "
                                    "ORDER BY slot").fetchall()
                if backlog != per_slot:
                    problems.append(f"{role}: fleet_slots {per_slot} differs from slot_backlog {backlog}")
            if role == "sec_worker_a":
                continue  # a member of sec_fleet: it may read the fleet's table and leases
            if len(private) != 2:
                problems.append(f"{role}: fleet_slots shows {len(private)} slots of a trusted fleet of n = 2")
            if any(r[1] is not None for r in private):
                problems.append(f"{role}: sees pending rows of a table it may not read: {private}")
            if any(r[2] == holder or r[3] == token for r in private):
                problems.append(f"{role}: sees another role's lease holder or token: {private}")
        mine = a.execute("SELECT pending, holder, token FROM public.fleet_slots WHERE fleet = 'sec_private' "
                         "AND slot = %s", (slot,)).fetchall()
        if mine != [(one(a, "SELECT count(*) FROM public.fleet_only WHERE NOT done AND slot_of(id, 2) = %s",
                         (slot,))[0], holder, token)]:
            problems.append(f"the fleet's own role does not see its slot: {mine}")
        check(not problems, "; ".join(problems))
    finally:
        for role in readers:
            su.execute(f"REVOKE {role} FROM sec_owner")
        for role in readers[1:]:
            su.execute(f"REVOKE {role} FROM sec_fleet")
        for stmt in ("SELECT drop_fleet('sec_tenant')", "DROP TABLE public.tenant_jobs"):
            own.execute(stmt)
        a2 = as_fleet("sec_worker_a")
        a2.execute("SELECT drop_fleet('sec_private')")
        own.execute("DROP TABLE public.fleet_only")
