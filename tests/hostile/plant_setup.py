"""The planted-overload attack's set-up (test_plant.py): the owner's
databases and roles, and the look-alike overloads it plants in every schema
it can create in."""
import random

import harness
from psycopg import sql

from .values import FIXTURES

OWNER, THIRD = "pl_owner", "pl_third"

VARIANTS = [
    # (database, schema of the extension or None for the default)
    ("pg_claim_plant_public", None),
    ("pg_claim_plant_schema", "claim"),
]
POOL = ["integer", "bigint", "smallint", "text", "character varying", "character", '"char"',
        "regclass", "oid", "interval", "numeric", "name", "boolean", "bytea", "uuid", "text[]",
        "anyelement"]
KEY_TABLES = {
    # table: key column type
    "pl_k_varchar": "varchar(40)",
    "pl_k_char": "character(8)",
    "pl_k_dom": "pl_dom_text",
    "pl_k_domvc": "pl_dom_varchar",
}
N_SHARES = 4
STATEMENT_TIMEOUT_MS = 20000


def ident(*parts):
    return sql.Identifier(*parts).as_string(None)


# ---------------------------------------------------------------------------
# Set-up


def reset_cluster(admin):
    with harness.connect(conninfo=admin) as c:
        for db, _ in VARIANTS:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        for r in (OWNER, THIRD):
            c.execute(f"DROP ROLE IF EXISTS {r}")
        c.execute(f"CREATE ROLE {OWNER} LOGIN NOSUPERUSER")
        c.execute(f"CREATE ROLE {THIRD} LOGIN NOSUPERUSER")


def setup_variant(admin, db, extschema):
    """Creates db owned by OWNER, which installs pg_claim; returns the
    extension's schema."""
    with harness.connect(conninfo=admin) as c:
        c.execute(f"CREATE DATABASE {db} OWNER {OWNER}")
    with connect(admin, db, OWNER) as c:
        c.execute("CREATE SCHEMA own")
        if extschema:
            c.execute(f"CREATE SCHEMA {ident(extschema)}")
            c.execute(f"CREATE EXTENSION pg_claim SCHEMA {ident(extschema)}")
            c.execute(f"GRANT USAGE ON SCHEMA {ident(extschema)} TO PUBLIC")
        else:
            c.execute("CREATE EXTENSION pg_claim")
        ext = c.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                        "WHERE e.extname = 'pg_claim'").fetchone()[0]
        owner_of_ext = c.execute("SELECT e.extowner::regrole::text FROM pg_extension e WHERE e.extname = 'pg_claim'").fetchone()[0]
        if owner_of_ext != OWNER:
            raise SystemExit(f"the extension belongs to {owner_of_ext}, not {OWNER}: not a trusted install")
        # what the planted functions record into; everyone may write it
        c.execute("CREATE SEQUENCE own.pl_hits")
        c.execute("CREATE TABLE own.pl_ran (sig text, cur text, sess text, ctx text, at timestamptz DEFAULT clock_timestamp())")
        c.execute("GRANT USAGE ON SCHEMA own TO PUBLIC")
        c.execute("GRANT USAGE ON SEQUENCE own.pl_hits TO PUBLIC")
        c.execute("GRANT INSERT, SELECT ON own.pl_ran TO PUBLIC")
        # the key tables whose shares are checked, owned by the owner
        c.execute("CREATE DOMAIN public.pl_dom_text AS text")
        c.execute("CREATE DOMAIN public.pl_dom_varchar AS varchar(40)")
        for t, ty in KEY_TABLES.items():
            c.execute(f"CREATE TABLE public.{t} (k {ty} PRIMARY KEY, v integer)")
            c.execute(f"INSERT INTO public.{t} SELECT 'k' || g || repeat('x', g % 3), g FROM generate_series(1, 40) g")
            c.execute(f"GRANT SELECT, INSERT ON public.{t} TO PUBLIC")
        # every later session of every role starts with the owner's schemas first
        path = ["own", "public"] + ([extschema] if extschema else [])
        c.execute(f"ALTER DATABASE {db} SET search_path = " + ", ".join(ident(p) for p in path))
    # the bad-input matrix's relations (values.py) (the valid arguments name them); some need a superuser
    with connect(admin, db, None) as c:
        c.execute("SET search_path = public")
        c.execute(FIXTURES)
        c.execute("GRANT USAGE ON SCHEMA hm_s TO PUBLIC")
        c.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public, hm_s TO PUBLIC")
    return ext


def connect(admin, db, role):
    conninfo = admin + f" dbname={db}" + (f" user={role}" if role else "")
    c = harness.connect(conninfo=conninfo)
    return c


# ---------------------------------------------------------------------------
# The functions of the extension, and the plants


REAL = """
SELECT p.oid, n.nspname, p.proname, p.pronargs, p.pronargdefaults, p.prokind, p.provolatile,
       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) WITH ORDINALITY u(t, i) ORDER BY i),
       pg_get_function_result(p.oid), p.proretset
FROM pg_depend d
JOIN pg_proc p ON p.oid = d.objid
JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_claim')
ORDER BY p.proname, p.oid::regprocedure::text
"""


def polymorphic(ty):
    return ty.startswith("any")


def combos(reals, rng):
    """The argument type lists to plant for one function name: [(types,
    extra)] where extra is '' or the text of a DEFAULT or VARIADIC tail."""
    out = set()
    for r in reals:
        nargs, ndef, types = r["nargs"], r["ndefaults"], r["types"]
        if "internal" in types:
            types = [t if t != "internal" else "text" for t in types]
        for k in range(nargs - ndef, nargs + 1):
            real = tuple(types[:k])
            out.add((real, ""))
            for t in POOL:
                out.add(((t,) * k, ""))
                for i in range(k):
                    out.add((real[:i] + (t,) + real[i + 1:], ""))
                if any(polymorphic(x) for x in real) and t != "anyelement":
                    out.add((tuple(t if polymorphic(x) else x for x in real), ""))
            for _ in range(12):
                out.add((tuple(rng.choice(POOL) for _ in range(k)), ""))
            # an extra argument with a default, after the real ones
            for t in ("integer", "text", "bigint", "interval"):
                out.add((real, f"{t} DEFAULT NULL"))
            # VARIADIC forms: all the arguments, or the last ones
            for t in POOL:
                arr = "anyarray" if t == "anyelement" else ("text[]" if t == "text[]" else f"{t}[]")
                if arr == "text[][]":
                    continue
                out.add(((), f"VARIADIC {arr}"))
                if k >= 1:
                    out.add((real[:k - 1], f"VARIADIC {arr}"))
    # a text[] array element type cannot be made VARIADIC twice
    return sorted((c for c in out if "text[][]" not in c[1]), key=lambda c: (len(c[0]), c))


PLANT_BODY = """
DECLARE ctx text;
BEGIN
    GET DIAGNOSTICS ctx = PG_CONTEXT;
    RAISE WARNING 'pg_claim planted ran: % | current_user % | session_user % | %',
        {sig}, current_user, session_user, ctx;
    BEGIN PERFORM nextval('own.pl_hits'); EXCEPTION WHEN OTHERS THEN NULL; END;
    BEGIN
        INSERT INTO own.pl_ran (sig, cur, sess, ctx) VALUES ({sig}, current_user, session_user, ctx);
    EXCEPTION WHEN OTHERS THEN NULL; END;
    BEGIN EXECUTE 'ALTER ROLE {owner} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
    RETURN{ret};
END
"""


# runs a list of statements in one round trip, each in its own subtransaction;
# returns each one's SQLSTATE, or '' for a statement that ran
EXEC_ALL = """
CREATE FUNCTION pg_temp.pl_exec_all(stmts text[]) RETURNS text[] LANGUAGE plpgsql AS $f$
DECLARE out text[] := '{}'; s text;
BEGIN
    FOREACH s IN ARRAY stmts LOOP
        BEGIN
            EXECUTE s;
            out := out || ''::text;
        EXCEPTION WHEN OTHERS THEN
            out := out || SQLSTATE::text;
        END;
    END LOOP;
    RETURN out;
END
$f$
"""


def exec_all(conn, stmts):
    """The SQLSTATE of each statement ('' when it ran), in one round trip;
    conn must have run EXEC_ALL."""
    if not stmts:
        return []
    return conn.execute("SELECT pg_temp.pl_exec_all(%s::text[])", (stmts,)).fetchone()[0]


def plant(conn, schema, name, reals, rng, stats):
    """Plants the overloads of one function name into schema: for each
    argument list, its first result type that CREATE FUNCTION takes."""
    res = reals[0]
    tries = []  # per argument list, the statements to try in order
    for types, extra in combos(reals, rng):
        decl = [t for t in types] + ([extra] if extra else [])
        sig = f"{schema}.{name}({', '.join(decl)})"
        lit = sql.Literal(sig).as_string(None)
        has_poly = any(polymorphic(t) for t in types) or "anyarray" in extra
        results = []
        if not (polymorphic(res["result"].replace("SETOF ", "")) and not has_poly) and res["result"] not in ("trigger", "internal"):
            results.append(res["result"])
        results.append("SETOF integer" if res["retset"] else "integer")
        stmts = []
        for result in results:
            setof = result.startswith("SETOF ") or result.startswith("TABLE(")
            ret = "" if setof or result == "void" else " NULL"
            stmts.append(f"CREATE FUNCTION {ident(schema)}.{ident(name)}({', '.join(decl)}) RETURNS {result} "
                         f"LANGUAGE plpgsql AS $pl$" + PLANT_BODY.format(sig=lit, owner=OWNER, ret=ret) + "$pl$")
        tries.append(stmts)
    # the first result type of every argument list, then the next one of
    # those refused (not for being the real signature), and so on
    step = 0
    while tries:
        states = exec_all(conn, [t[step] for t in tries])
        left = []
        for stmts, state in zip(tries, states):
            if state == "":
                stats["planted"] += 1
                stats.setdefault("created", {}).setdefault((schema, name), []).append(stmts[step])
            elif state == "42723":
                stats["exists"] += 1  # the real function itself, in its own schema
            elif step + 1 < len(stmts):
                left.append(stmts)
            else:
                stats["refused"] += 1
                stats.setdefault("refused_by", {}).setdefault(state, 0)
                stats["refused_by"][state] += 1
        tries, step = left, step + 1


def writable_schemas(conn):
    return [r[0] for r in conn.execute(
        "SELECT nspname FROM pg_namespace WHERE has_schema_privilege(oid, 'CREATE') "
        "AND nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' ORDER BY nspname").fetchall()]


def plant_all(admin, db, seed):
    stats = {"planted": 0, "exists": 0, "refused": 0}
    rng = random.Random(seed)
    with connect(admin, db, OWNER) as c:
        c.add_notice_handler(lambda d: None)
        reals = {}
        for row in c.execute(REAL).fetchall():
            oid, schema, name, nargs, ndef, kind, vol, types, result, retset = row
            reals.setdefault(name, []).append(dict(oid=oid, schema=schema, nargs=nargs, ndefaults=ndef, kind=kind,
                                                   types=types, result=result, retset=retset))
        schemas = writable_schemas(c)
        c.execute(EXEC_ALL)
        # CREATE FUNCTION checks no body here: the validator's cost grows
        # with every function the session has created (tens of thousands
        # here); the bodies are checked after, in one pass that stays
        # linear, and a body that does not compile fails the set-up
        c.execute("SET check_function_bodies = off")
        for schema in schemas:
            for name, rs in reals.items():
                plant(c, schema, name, rs, rng, stats)
        checked = c.execute(
            "SELECT count(plpgsql_validator(p.oid)) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE p.proowner = %s::regrole AND n.nspname = ANY(%s) "
            "AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')",
            (OWNER, schemas)).fetchone()[0]
        if checked != stats["planted"]:
            raise AssertionError(f"{checked} planted bodies checked, {stats['planted']} planted")
    return schemas, sorted(reals), stats


class Lifted:
    """While in effect, the owner's overloads of some names in the
    extension's schema are dropped (created again on exit, from the same
    statements, whose bodies were checked when they were planted): a call
    of the name itself then resolves at its top level, and what it calls
    inside still meets every other plant."""

    def __init__(self, admin, db, extschema, names, stats):
        self.args = admin, db
        self.extschema, self.names, self.stats = extschema, names, stats

    def __enter__(self):
        with connect(*self.args, OWNER) as c:
            sigs = [sig for (sig,) in c.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = ANY(%s) "
                "AND p.pronamespace = %s::regnamespace AND p.proowner = %s::regrole "
                "AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass "
                "AND d.objid = p.oid AND d.deptype = 'e')",
                (list(self.names), ident(self.extschema), OWNER)).fetchall()]
            if sigs:
                c.execute("DROP FUNCTION " + ", ".join(sigs))
        return self

    def __exit__(self, *exc):
        stmts = [stmt for name in self.names for stmt in self.stats.get("created", {}).get((self.extschema, name), [])]
        if stmts:
            with connect(*self.args, OWNER) as c:
                c.add_notice_handler(lambda d: None)
                c.execute("SET check_function_bodies = off;\n" + ";\n".join(stmts))
