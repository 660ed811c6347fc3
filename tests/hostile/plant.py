#!/usr/bin/env python3
"""The planted-overload attack: the installing database owner plants look-alike
functions everywhere it may create them, and nobody who calls pg_claim runs them.

pg_claim is a trusted extension: a database owner who is not a superuser can
install it, and its SECURITY DEFINER functions then run as the bootstrap
superuser. This test plays that owner. On a throwaway cluster (PGHOST/PGPORT/
PGUSER as scripts/lib.sh sets them, a superuser; or PGC_HOSTILE_DSN) it makes
two databases, each owned by the role pl_owner (not a superuser), which runs
CREATE EXTENSION pg_claim itself: once in `public` (the default; `public`
belongs to the database's owner from PostgreSQL 15 on), once in a schema it
created (CREATE EXTENSION pg_claim SCHEMA claim). Then, as the owner:

- the database's search_path is set so that the owner's own schema comes
  first, then public, then the extension's schema (ALTER DATABASE ... SET,
  which every later session of every role inherits);
- in every schema the owner can create in (public, its own schemas, the
  extension's schema when it is the owner's) it plants overloads of every
  function name of the extension, read from pg_depend/pg_proc at run time:
  for every arity a real function of that name can be called with, all
  arguments of one type and every position of the real signature replaced
  by each type of a pool (integer, bigint, smallint, text, varchar,
  character, "char", regclass, oid, interval, numeric, name, boolean, bytea,
  uuid, text[], anyelement), the polymorphic ones made concrete, random
  mixes, copies with an extra DEFAULT argument, and VARIADIC forms;
- each planted function, when it runs, raises a WARNING naming itself, the
  current and session user and its call stack, increments a sequence (which a
  rollback does not undo), inserts a row into a table the owner owns, and
  tries ALTER ROLE pl_owner SUPERUSER in an exception block.

Every function of the extension is then called, schema-qualified and with
valid arguments (matrix.py's generators, each argument cast to the declared
type unless that is polymorphic), by the owner, by a superuser and by a third
role with no grants, in batches of one name, each role's batch starting from
no leases and no failure records: once before planting (the baseline), once
with every plant in place, and once more with each called name's own
overloads in the extension's schema lifted (dropped for its batch and created
again after it), so that the call resolves at its top level and everything it
calls inside meets every other plant. Then, for each role: my_items and
slot_counts on varchar, character(8) and domain keys give the shares Python
computes as zlib.crc32(key::text) % n, and notify_slot on a varchar key
notifies the channel of that slot for every inserted row.

A failure: a planted function that runs from inside a call of the extension
(a capture: its call stack has a frame of the extension's code), the owner
becoming a superuser through one, a result or outcome that differs from the
baseline, a share that differs from Python's. Reported apart, not failures:
a call that ends in 42725 ("is not unique") because the owner planted a
duplicate in the extension's own schema (the owner can break its own
database), as long as a call the extension makes inside has exactly the
argument types of one of its own functions (otherwise a single
better-matching overload would capture it: a failure); a call that generated SQL refuses with 42723 because the function
it would call is not the extension's own; and a call whose own top-level
statement resolves to the owner's exact-typed overload of a polymorphic
function in the extension's schema (PostgreSQL's resolution of the caller's
statement, even when the caller is a superuser: docs/security.md says what a
superuser does about it). Exits non-zero on failure; the last line is a
summary with the counts (-v lists the calls reported apart).

    python3 tests/hostile/plant.py [-v] [--seed N] [--keep]
"""
import argparse
import os
import random
import re
import sys
import time
import zlib

import psycopg
from psycopg import sql

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import matrix  # noqa: E402  (the function list and the valid arguments)

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


def fail(failures, what):
    failures.append(what)
    print(f"FAILED: {what}", file=sys.stderr)


def ident(*parts):
    return sql.Identifier(*parts).as_string(None)


# ---------------------------------------------------------------------------
# Set-up


def reset_cluster(admin):
    with psycopg.connect(admin, autocommit=True) as c:
        for db, _ in VARIANTS:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        for r in (OWNER, THIRD):
            c.execute(f"DROP ROLE IF EXISTS {r}")
        c.execute(f"CREATE ROLE {OWNER} LOGIN NOSUPERUSER")
        c.execute(f"CREATE ROLE {THIRD} LOGIN NOSUPERUSER")


def setup_variant(admin, db, extschema):
    """Creates db owned by OWNER, which installs pg_claim; returns the
    extension's schema."""
    with psycopg.connect(admin, autocommit=True) as c:
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
    # matrix.py's relations (the valid arguments name them); some need a superuser
    with connect(admin, db, None) as c:
        c.execute("SET search_path = public")
        c.execute(matrix.FIXTURES)
        c.execute("GRANT USAGE ON SCHEMA hm_s TO PUBLIC")
        c.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public, hm_s TO PUBLIC")
    return ext


def connect(admin, db, role):
    conninfo = admin + f" dbname={db}" + (f" user={role}" if role else "")
    c = psycopg.connect(conninfo, autocommit=True)
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


def plant(conn, schema, name, reals, rng, stats):
    """Plants the overloads of one function name into schema."""
    res = reals[0]
    for types, extra in combos(reals, rng):
        decl = [t for t in types] + ([extra] if extra else [])
        sig = f"{schema}.{name}({', '.join(decl)})"
        lit = sql.Literal(sig).as_string(None)
        has_poly = any(polymorphic(t) for t in types) or "anyarray" in extra
        results = []
        if not (polymorphic(res["result"].replace("SETOF ", "")) and not has_poly) and res["result"] not in ("trigger", "internal"):
            results.append(res["result"])
        results.append("SETOF integer" if res["retset"] else "integer")
        for result in results:
            setof = result.startswith("SETOF ") or result.startswith("TABLE(")
            ret = "" if setof or result == "void" else " NULL"
            stmt = (f"CREATE FUNCTION {ident(schema)}.{ident(name)}({', '.join(decl)}) RETURNS {result} "
                    f"LANGUAGE plpgsql AS $pl$" + PLANT_BODY.format(sig=lit, owner=OWNER, ret=ret) + "$pl$")
            try:
                conn.execute(stmt)
                stats["planted"] += 1
                stats.setdefault("created", {}).setdefault((schema, name), []).append(stmt)
                break
            except psycopg.errors.DuplicateFunction:
                stats["exists"] += 1  # the real function itself, in its own schema
                break
            except psycopg.Error as e:
                if result is results[-1]:
                    stats["refused"] += 1
                    stats.setdefault("refused_by", {}).setdefault(e.diag.sqlstate, 0)
                    stats["refused_by"][e.diag.sqlstate] += 1


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
        for schema in schemas:
            for name, rs in reals.items():
                plant(c, schema, name, rs, rng, stats)
    return schemas, sorted(reals), stats


class Lifted:
    """While in effect, the owner's overloads of some names in the
    extension's schema are dropped (created again on exit): a call of the
    name itself then resolves at its top level, and what it calls inside
    still meets every other plant."""

    def __init__(self, admin, db, extschema, names, stats):
        self.args = admin, db
        self.extschema, self.names, self.stats = extschema, names, stats

    def __enter__(self):
        with connect(*self.args, OWNER) as c:
            for name in self.names:
                for (sig,) in c.execute(
                        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = %s "
                        "AND p.pronamespace = %s::regnamespace AND p.proowner = %s::regrole "
                        "AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass "
                        "AND d.objid = p.oid AND d.deptype = 'e')",
                        (name, ident(self.extschema), OWNER)).fetchall():
                    c.execute(f"DROP FUNCTION {sig}")
        return self

    def __exit__(self, *exc):
        with connect(*self.args, OWNER) as c:
            c.add_notice_handler(lambda d: None)
            for name in self.names:
                for stmt in self.stats.get("created", {}).get((self.extschema, name), []):
                    c.execute(stmt)


# ---------------------------------------------------------------------------
# Calls


class Caller:
    """One connection of one role; counts the planted functions that ran
    during each call (from the sequence, which no rollback undoes, and the
    warnings)."""

    def __init__(self, admin, db, role, label):
        self.label = label
        self.conn = connect(admin, db, role)
        self.warnings = []
        self.conn.add_notice_handler(self.notice)
        self.conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        self.conn.execute("SET lock_timeout = '5s'")
        self.probe = connect(admin, db, None)

    def notice(self, d):
        if (d.message_primary or "").startswith("pg_claim planted ran"):
            self.warnings.append(d.message_primary)

    def hits(self):
        return self.probe.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM own.pl_hits").fetchone()[0]

    def call(self, stmt):
        """(outcome, rows or error message, planted warnings)"""
        self.warnings = []
        self.context = ""
        before = self.hits()
        try:
            rows = self.conn.execute(stmt).fetchall()
            outcome, detail = matrix.summarize(rows), rows
        except psycopg.Error as e:
            if self.conn.closed or self.conn.broken:
                raise
            outcome, detail = e.diag.sqlstate or "?", e.diag.message_primary
            self.context = e.diag.context or ""
        try:
            self.conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            pass
        ran = self.hits() - before
        if ran and self.probe.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone()[0]:
            # a planted function ran as a superuser: the owner is one now
            self.warnings.append(f"pg_claim planted ran: ESCALATION | current_user ? | session_user ? | "
                                 f"{OWNER} became a SUPERUSER during this call\n(see the captures)")
            self.probe.execute(f"ALTER ROLE {OWNER} NOSUPERUSER")
        return outcome, detail, ran, list(self.warnings)

    def close(self):
        self.conn.close()
        self.probe.close()


def cast(expr, ty):
    if polymorphic(ty) or ty == "internal":
        return expr
    return f"({expr})::{ty}"


def choose_calls(caller, fns):
    """The valid call of each function, chosen as matrix.py chooses its base."""
    calls = []
    for fn in fns:
        if "internal" in fn.types:
            continue
        base = [matrix.valid(nm, ty, fn)[0] for nm, ty in zip(fn.names, fn.types)]
        for i, (nm, ty) in enumerate(zip(fn.names, fn.types)):
            for alt in matrix.valid(nm, ty, fn)[1:]:
                o = caller.call(fn.call_sql([cast(e, t) for e, t in zip(base, fn.types)]))[0]
                if o not in matrix.ALLOWED:
                    break
                base[i] = alt
        calls.append((fn, fn.call_sql([cast(e, t) for e, t in zip(base, fn.types)])))
    return calls


def comparable(fn, vol, outcome, detail):
    """What must be equal before and after planting: the outcome, and for
    immutable functions the rows themselves."""
    if vol == "i" and isinstance(detail, list):
        return (outcome, tuple(map(tuple, detail)))
    return (outcome,)


def judge_planted(ran, warnings, extschema, failures, what, report):
    """A planted function that ran: a capture unless the caller's own
    statement resolved to it in the extension's schema (its call stack has
    no frame but its own)."""
    direct, captured = [], {}
    escalated = any("ESCALATION" in w for w in warnings)
    warnings = [w for w in warnings if "ESCALATION" not in w]
    for w in warnings:
        parts = [x.strip() for x in w.replace("pg_claim planted ran:", "", 1).split("|", 3)]
        sig, cur = parts[0], parts[1].replace("current_user ", "")
        frames = [ln for ln in parts[3].splitlines() if ln.strip()]
        if len(frames) <= 1 and sig.startswith(extschema + "."):
            direct.append(sig)
        else:
            captured.setdefault(f"{sig} as {cur}", frames[1] if len(frames) > 1 else "")
    if captured:
        report.setdefault("captured", set()).update(k.split(" as ")[0] for k in captured)
        first = next(iter(captured.items()))
        fail(failures, f"{what}: CAPTURED: {len(warnings) - len(direct)} run(s) of planted functions: "
             f"{', '.join(sorted(captured))} (called from: {first[1][:200]})")
    if direct:
        report.setdefault("direct", []).append(f"{what}: the statement itself resolved to {direct[0]}")
        db = what.split("]")[0].lstrip("[")
        report.setdefault("direct_runs", {}).setdefault(db, 0)
        report["direct_runs"][db] += len(direct)
    if escalated and captured:
        fail(failures, f"{what}: {OWNER} BECAME A SUPERUSER through a captured call")
    elif escalated:
        # the caller (a superuser) called the owner's function itself
        report.setdefault("direct_escalation", []).append(f"{what}: {direct[0] if direct else '?'}")
    if ran and not warnings:
        fail(failures, f"{what}: {ran} planted function(s) ran (the sequence moved) without a warning reaching the caller")


def reset_state(admin, db, extschema):
    """Every role's calls start from no leases and no failure records, so
    that each phase sees the same state (a superuser may write the tables)."""
    with connect(admin, db, None) as c:
        for t in ("pg_claim_leases", "pg_claim_failures"):
            if c.execute("SELECT to_regclass(%s)", (f"{ident(extschema)}.{t}",)).fetchone()[0]:
                c.execute(f"DELETE FROM {ident(extschema)}.{t}")


# name -> the argument type lists of the extension's functions of that name
SIGNATURES = {}


def judge_ambiguous(message, context, called, extschema, failures, report, what):
    """A call that ended in 42725. Acceptable when the ambiguous function is
    in the extension's schema (the owner's duplicate there) and, for a call
    made inside the extension, when its argument types are exactly those of
    one of the extension's functions: a call with other argument types is
    one that a single better-matching overload would capture (hidden here
    only because many overloads make it ambiguous)."""
    if not in_extschema(message, extschema):
        fail(failures, f"{what}: 42725 outside the extension's schema: {message}")
        return
    m = re.search(r"function \S+?\.(\w+)\((.*)\) is not unique", message or "")
    nested = bool(context) or (m is not None and m.group(1) != called)
    if m and nested and m.group(2) not in SIGNATURES.get(m.group(1), set()):
        fail(failures, f"{what}: the extension calls {m.group(1)}({m.group(2)}), whose argument types are not "
             f"those of its own function (one better-matching overload would capture the call): {message}")
        return
    report.setdefault("ambiguous", []).append(f"{what}: {message}")


def in_extschema(message, extschema):
    """Whether an error names a function of the extension's schema."""
    return bool(re.search(r"function (" + re.escape(extschema) + "|" + re.escape(ident(extschema)) + r")\.\w+\(",
                          str(message or "")))


def run_calls(admin, db, extschema, roles, calls_of, baseline, failures, report, phase):
    for label, role in roles:
        reset_state(admin, db, extschema)
        caller = Caller(admin, db, role, label)
        try:
            for fn, vol, stmt in calls_of:
                what = f"[{db}] {phase}: {label}: {fn.signature}"
                outcome, detail, ran, warnings = caller.call(stmt)
                report["calls"] += 1
                if ran or warnings:
                    judge_planted(ran, warnings, extschema, failures, what, report)
                if phase == "baseline":
                    baseline[(label, fn.signature)] = comparable(fn, vol, outcome, detail)
                    continue
                if outcome == "42725":
                    judge_ambiguous(detail, caller.context, fn.name, extschema, failures, report, what)
                    continue
                before = baseline.get((label, fn.signature))
                if outcome == "42723" and before and before[0] != "42723":
                    # generated SQL refused to call a function that is not
                    # the extension's own: a refusal, not a capture
                    report.setdefault("refused_42723", []).append(f"{what}: {detail}")
                    continue
                now = comparable(fn, vol, outcome, detail)
                direct = ran or warnings  # judged above: a capture failed already
                if before != now and not direct:
                    fail(failures, f"{what}: outcome {now[0]} after planting, {before[0] if before else '?'} before"
                         + (f" ({str(detail)[:200]})" if outcome not in ("value", "rows", "NULL", "no rows") else ""))
        finally:
            caller.close()


def check_rolsuper(admin, failures, when):
    with psycopg.connect(admin, autocommit=True) as c:
        sup = c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone()[0]
        if sup:
            c.execute(f"ALTER ROLE {OWNER} NOSUPERUSER")
    if sup:
        fail(failures, f"{OWNER} is a SUPERUSER {when}")


def check_shares(admin, db, extschema, roles, failures, report):
    """my_items, slot_counts and notify_slot on varchar, character(n) and
    domain keys agree with zlib.crc32(key::text) % n."""
    ext = ident(extschema)
    with connect(admin, db, OWNER) as c:
        c.add_notice_handler(lambda d: None)
        c.execute("DROP TRIGGER IF EXISTS pl_notify ON public.pl_k_varchar")
        c.execute(f"CREATE TRIGGER pl_notify AFTER INSERT ON public.pl_k_varchar FOR EACH ROW "
                  f"EXECUTE FUNCTION {ext}.notify_slot('plk', '{N_SHARES}', 'k')")
    for label, role in roles:
        caller = Caller(admin, db, role, label)
        c = caller.conn
        try:
            for t in KEY_TABLES:
                what = f"[{db}] {label}: shares of {t}"
                keys = [r[0] for r in c.execute(f"SELECT k::text FROM public.{t}").fetchall()]
                expect = {}
                for k in keys:
                    expect.setdefault(zlib.crc32(k.encode()) % N_SHARES, set()).add(k)
                o, counts, ran, w = caller.call(f"SELECT slot, items FROM {ext}.slot_counts('public.{t}'::regclass, {N_SHARES})")
                report["calls"] += 1
                if ran or w:
                    judge_planted(ran, w, extschema, failures, what + " (slot_counts)", report)
                want = sorted((s, len(expect.get(s, ()))) for s in range(N_SHARES))
                if o == "42725":
                    judge_ambiguous(counts, caller.context, "slot_counts", extschema, failures, report,
                                    f"[{db}] shares: {label}: slot_counts on {t}")
                elif o == "42723":
                    report.setdefault("refused_42723", []).append(f"[{db}] shares: {label}: slot_counts on {t}: {counts}")
                elif o != "rows" or sorted(counts) != want:
                    fail(failures, f"{what}: slot_counts gave {counts if o in ('rows', 'value') else o + ' ' + str(counts)}, Python {want}")
                for s in range(N_SHARES):
                    o, rows, ran, w = caller.call(f"SELECT k::text FROM {ext}.my_items(NULL::public.{t}, {s}, {N_SHARES})")
                    report["calls"] += 1
                    if ran or w:
                        judge_planted(ran, w, extschema, failures, what + f" (my_items slot {s})", report)
                    got = {r[0] for r in rows} if isinstance(rows, list) else rows
                    if o == "42725":
                        judge_ambiguous(rows, caller.context, "my_items", extschema, failures, report,
                                        f"[{db}] shares: {label}: my_items on {t}")
                    elif o == "42723":
                        report.setdefault("refused_42723", []).append(f"[{db}] shares: {label}: my_items on {t}: {rows}")
                    elif got != expect.get(s, set()):
                        fail(failures, f"{what}: my_items slot {s} of {N_SHARES} gave {sorted(got) if isinstance(got, set) else got}, "
                             f"Python {sorted(expect.get(s, set()))}")
            # notify_slot: one notification per row, on its slot's channel
            what = f"[{db}] {label}: notify_slot on a varchar key"
            chans = {}
            for s in range(N_SHARES):
                ch = c.execute(f"SELECT {ext}.slot_channel('plk', {s})").fetchone()[0]
                chans[ch] = s
                c.execute(f"LISTEN {ident(ch)}")
            sent = {}
            for i in range(8):
                k = f"{label}-{i}"
                caller.warnings = []
                before = caller.hits()
                try:
                    c.execute("INSERT INTO public.pl_k_varchar VALUES (%s, 0)", (k,))
                    sent[k] = zlib.crc32(k.encode()) % N_SHARES
                except psycopg.Error as e:
                    if e.diag.sqlstate == "42725":
                        judge_ambiguous(e.diag.message_primary, e.diag.context, "notify_slot", extschema,
                                        failures, report, what)
                    else:
                        fail(failures, f"{what}: INSERT failed: {e.diag.sqlstate} {e.diag.message_primary}")
                ran = caller.hits() - before
                if ran or caller.warnings:
                    judge_planted(ran, list(caller.warnings), extschema, failures, what, report)
                report["calls"] += 1
            got = []
            deadline = time.monotonic() + 10
            while len(got) < len(sent) and time.monotonic() < deadline:
                for n in c.notifies(timeout=max(0.05, deadline - time.monotonic()), stop_after=len(sent) - len(got)):
                    got.append(chans.get(n.channel, n.channel))
            want = sorted(sent.values())
            if sorted(got, key=str) != sorted(want, key=str):
                fail(failures, f"{what}: notifications on slots {sorted(got, key=str)}, Python {want}")
        finally:
            caller.close()


# ---------------------------------------------------------------------------


def run_variant(admin, db, schema_opt, seed, failures, report):
    extschema = setup_variant(admin, db, schema_opt)
    roles = [("owner", OWNER), ("superuser", None), ("third role", THIRD)]
    with connect(admin, db, None) as c:
        fns = matrix.load_functions(c)
        for fn in fns:
            SIGNATURES.setdefault(fn.name, set()).add(", ".join(fn.types))
        vol = dict(c.execute("SELECT p.oid, p.provolatile FROM pg_proc p").fetchall())
    chooser = Caller(admin, db, None, "superuser")
    try:
        calls = [(fn, vol[fn.oid], stmt) for fn, stmt in choose_calls(chooser, fns)]
    finally:
        chooser.close()
    # the calls in batches, one per name; every role's batch starts from no
    # leases and no failure records, in every phase
    by_name = {}
    for call in calls:
        by_name.setdefault(call[0].name, []).append(call)
    baseline = {}
    for cs in by_name.values():
        run_calls(admin, db, extschema, roles, cs, baseline, failures, report, "baseline")
    schemas, names, stats = plant_all(admin, db, seed)
    report["planted"] += stats["planted"]
    report["refused"] += stats["refused"]
    report.setdefault("variants", []).append(
        f"{db}: extension in {extschema}; {len(names)} names, {stats['planted']} overloads planted in "
        f"{', '.join(schemas)} ({stats['refused']} refused by CREATE FUNCTION: {stats.get('refused_by', {})}, "
        f"{stats['exists']} the real signature)")
    # every plant in place: a call of a name the owner duplicated in the
    # extension's schema may be ambiguous (42725) or resolve to the owner's
    # overload at its top level
    for cs in by_name.values():
        run_calls(admin, db, extschema, roles, cs, baseline, failures, report, "all planted")
    # each name called with its own overloads in the extension's schema
    # lifted, all the others in place
    for name, cs in by_name.items():
        with Lifted(admin, db, extschema, [name], stats):
            run_calls(admin, db, extschema, roles, cs, baseline, failures, report, "name lifted")
    with Lifted(admin, db, extschema, ["my_items", "slot_counts", "slot_channel"], stats):
        check_shares(admin, db, extschema, roles, failures, report)
    with connect(admin, db, None) as c:
        n = c.execute("SELECT count(*) FROM own.pl_ran").fetchone()[0]
        seq = c.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM own.pl_hits").fetchone()[0]
    direct = report.get("direct_runs", {}).get(db, 0)
    if seq > direct:
        with connect(admin, db, None) as c:
            rows = c.execute("SELECT sig, cur, sess FROM own.pl_ran LIMIT 5").fetchall()
        fail(failures, f"[{db}] planted functions ran {seq} time(s) ({direct} of them by the caller's own statement); "
             f"{n} recorded (not rolled back), e.g. {rows}")
    check_rolsuper(admin, failures, f"after the calls in {db}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--keep", action="store_true", help="keep the databases and roles for inspection")
    ap.add_argument("-v", "--verbose", action="store_true", help="list the calls reported apart")
    a = ap.parse_args()
    admin = os.environ.get("PGC_HOSTILE_DSN", "dbname=postgres")
    failures = []
    report = {"calls": 0, "planted": 0, "refused": 0}
    t0 = time.monotonic()
    reset_cluster(admin)
    try:
        for db, schema in VARIANTS:
            run_variant(admin, db, schema, a.seed, failures, report)
    finally:
        if not a.keep:
            with psycopg.connect(admin, autocommit=True) as c:
                for db, _ in VARIANTS:
                    c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
                for r in (OWNER, THIRD):
                    c.execute(f"DROP ROLE IF EXISTS {r}")
    for v in report.get("variants", []):
        print(v, file=sys.stderr)
    amb, direct = report.get("ambiguous", []), report.get("direct", [])
    if a.verbose:
        for x in amb:
            print(f"ambiguous (the owner's duplicate in the extension's schema): {x}", file=sys.stderr)
        for x in direct:
            print(f"resolved by the caller's own statement to the owner's overload: {x}", file=sys.stderr)

    def fns(xs):
        return sorted({x.split(": ")[2] for x in xs})
    if amb:
        print(f"ambiguous (42725) only through the owner's duplicates in the extension's schema, "
              f"{len(amb)} calls of: {', '.join(fns(amb))}", file=sys.stderr)
    if report.get("refused_42723"):
        print(f"refused with 42723 (generated SQL would call the owner's function), {len(report['refused_42723'])} calls "
              f"of: {', '.join(fns(report['refused_42723']))}", file=sys.stderr)
    if report.get("captured"):
        print(f"CAPTURED: {', '.join(sorted(report['captured']))}", file=sys.stderr)
    if direct:
        print(f"the caller's own statement resolved to the owner's overload in the extension's schema, "
              f"{len(direct)} calls of: {', '.join(fns(direct))}", file=sys.stderr)
    if report.get("direct_escalation"):
        print(f"a superuser's own statement ran the owner's overload as superuser (PostgreSQL's resolution: "
              f"docs/security.md), {len(report['direct_escalation'])} calls of: "
              f"{', '.join(fns(report['direct_escalation']))}", file=sys.stderr)
    print(f"planted overloads: {report['planted']} planted, {report['calls']} calls as owner, superuser and a third "
          f"role; {len(amb)} ambiguous in the extension's own schema (42725), {len(direct)} resolved by the caller's "
          f"own statement; {len(failures)} failures in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
