"""Calling every function of pg_claim with bad input and judging each
outcome (test_matrix.py, and plant.py for the function list): the
documented SQLSTATEs, the functions from the catalog, a Runner of calls,
the matrix and the random caller, and the server log's scan."""
import os
import re
import sys
import time

import psycopg

import harness
from psycopg import sql

from .values import (GONE, PAIRS, RECREATE_GONE, TEMP_FIXTURE, FIXTURES, pair_expr, valid,  # noqa: F401
                     values_for)

DB = "pg_claim_hostile"
STATEMENT_TIMEOUT_MS = 10000

# Every SQLSTATE a call may end in, with what it means here. A new one is a
# failure until it is understood and documented (docs/reliability.md).
ALLOWED = {
    "22023": "invalid_parameter_value: pg_claim's checks of n, slot, batch, ttl, names, methods",
    "22004": "null_value_not_allowed: a NULL where pg_claim needs a value",
    "22003": "numeric_value_out_of_range: an `after` out of the key type's range; next_token at the largest bigint",
    "22021": "character_not_in_repertoire: bytes that are not UTF-8, refused by PostgreSQL before the call",
    "22P02": "invalid_text_representation: an `after` that is not a value of the key's type",
    "42601": "syntax_error: a relation name with too many dots (regclass input, before the call)",
    "42602": "invalid_name: a relation name that is not a valid name (regclass input, before the call)",
    "3F000": "invalid_schema_name: a relation name in a schema that does not exist (regclass input, before the call)",
    "0A000": "feature_not_supported: a relation name of three parts, database.schema.name (regclass input); a value of type internal (from PostgreSQL 16 on): both before the call; a lease or failure function that writes, under REPEATABLE READ or SERIALIZABLE; a two-dimensional items array (clear_failure, item_failures: PostgreSQL's array_position refuses it)",
    "42501": "insufficient_privilege: no SELECT on the table or a column, no EXECUTE on the function; claim_lease of a name with a live lease of a role whose privileges the caller lacks",
    "42P01": "undefined_table: a relation that does not exist or was dropped",
    "42703": "undefined_column: a key or listed column that the table does not have (names are exact)",
    "42704": "undefined_object: a type that does not exist or was dropped; an oid that is not a row type; resize_fleet or cap_fleet of a name with no live member, lease or definition",
    "42804": "datatype_mismatch: a key type the method cannot map; polymorphic arguments that do not fit together",
    "42723": "duplicate_function: a function created in pg_claim's schema would take the place of the mapping function a share query calls",
    "42P10": "invalid_column_reference: no single key column (no primary key, a two-column one): pass key",
    "42809": "wrong_object_type: not a table (a view, a composite type, a sequence, an index, a scalar)",
    "42883": "undefined_function: no function for these argument types (aggregate support functions take internal, PostgreSQL 15), or a key type without the hash or btree support needed; an internal function of the extension missing or not a member of it",
    "42710": "duplicate_object: a name whose lock key (crc32) another name already has in the database's name registry",
    "53400": "configuration_limit_exceeded: more advisory locks than pg_claim.max_locks_per_session",
    "55000": "object_not_in_prerequisite_state: a name leased with another n or in the other mode; resize_fleet of a name with session claims; a foreign table whose wrapper cannot scan",
    "55P03": "lock_not_available: resize_fleet while another resize of the name is in progress; claim_lease or claim_leases after ttl / 3 waiting for the name's claim mutex",
    "PC001": "fence: the token is not the slot's current one",
    "PC002": "claim_leases, claim_lease: the call's n is not the fleet's (after a resize_fleet, or another n than its live claim_leases members')",
}


def fail(failures, what):
    failures.append(what)
    print(f"FAILED: {what}", file=sys.stderr)


# ---------------------------------------------------------------------------
# The functions, from the catalog.

FUNCTIONS = """
SELECT p.oid, n.nspname, p.proname, p.prokind, p.proretset,
       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) WITH ORDINALITY u(t, i) ORDER BY i) AS types,
       coalesce(p.proargnames[1:p.pronargs], array_fill(''::text, ARRAY[p.pronargs])) AS names,
       p.oid::regprocedure::text AS signature, p.provariadic <> 0 AS variadic
FROM pg_depend d
JOIN pg_proc p ON p.oid = d.objid
JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_claim')
ORDER BY p.proname, p.oid::regprocedure::text
"""
# PGC_HOSTILE_PORTABLE=FILE: the portable edition's file (docs/portable.md)
# installed in public instead of the extension, and its public functions
# called (the layer portable).
if os.environ.get("PGC_HOSTILE_PORTABLE"):
    FUNCTIONS = """
SELECT p.oid, n.nspname, p.proname, p.prokind, p.proretset,
       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) WITH ORDINALITY u(t, i) ORDER BY i) AS types,
       coalesce(p.proargnames[1:p.pronargs], array_fill(''::text, ARRAY[p.pronargs])) AS names,
       p.oid::regprocedure::text AS signature, p.provariadic <> 0 AS variadic
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.proname NOT LIKE 'pg\\_claim\\_%' AND p.proname NOT IN ('lease_check', 'next_token', 'failure_check')
ORDER BY p.proname, p.oid::regprocedure::text
"""


class Fn:
    def __init__(self, row):
        self.oid, self.schema, self.name, self.kind, self.retset, self.types, names, self.signature, variadic = row
        # a VARIADIC function is called with its last argument as an array
        # (clear_failure('n', VARIADIC '{a}'::text[])), as a client passes one
        self.variadic = variadic
        self.names = [nm or f"arg{i + 1}" for i, nm in enumerate(names)]

    def call_sql(self, exprs):
        q = sql.Identifier(self.schema, self.name).as_string(None)
        if self.variadic and exprs:
            exprs = list(exprs[:-1]) + ["VARIADIC " + exprs[-1]]
        args = ", ".join(exprs)
        if self.kind == "a":
            return f"SELECT {q}({args}) FROM (VALUES (1), (2)) AS v(x)"
        if self.retset:
            return f"SELECT * FROM {q}({args}) LIMIT 1000"
        return f"SELECT {q}({args})"


# ---------------------------------------------------------------------------
# Running a call and judging its outcome.


class Runner:
    def __init__(self, dsn, failures):
        self.dsn = dsn
        self.failures = failures
        self.stats = {}
        self.other = harness.connect(conninfo=dsn)
        self.connect()

    def connect(self):
        self.conn = harness.connect(conninfo=self.dsn)
        self.conn.add_notice_handler(lambda d: None)
        self.conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        self.conn.execute("SET lock_timeout = '5s'")
        self.conn.execute(TEMP_FIXTURE)

    def reset(self):
        self.conn.execute("RESET ROLE")
        self.conn.execute("SELECT pg_advisory_unlock_all()")

    def run(self, fn, exprs, dropped=None, role=None, where="", quiet=False, value=None):
        """Runs one call; returns its outcome label, and records failures."""
        stmt = fn.call_sql(exprs)
        what = f"{fn.signature} with {where} [{ascii(stmt)[:400]}]"
        try:
            if fn.name in ("claim_slot", "claim_slots"):
                # one mode per name: a live lease left by claim_lease('hm', ...)
                # would refuse claim_slot('hm', ...) with 55000
                self.conn.execute("DELETE FROM pg_claim_leases")
            if role:
                self.conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            if dropped == "recreated":
                self.other.execute(RECREATE_GONE)
                try:
                    self.conn.execute(stmt).fetchall()
                except psycopg.Error:
                    pass
                self.other.execute(RECREATE_GONE)
                cur = self.conn.execute(stmt)
            elif dropped:
                self.other.execute(RECREATE_GONE)
                self.conn.execute("DEALLOCATE ALL")
                self.conn.execute(f"PREPARE hm_call AS {stmt}")
                try:
                    self.conn.execute("EXECUTE hm_call").fetchall()
                except psycopg.Error:
                    pass
                self.other.execute(GONE)
                cur = self.conn.execute("EXECUTE hm_call")
            else:
                cur = self.conn.execute(stmt)
            rows = cur.fetchall()
            outcome = summarize(rows)
        except psycopg.OperationalError as e:
            if self.conn.closed or self.conn.broken:
                fail(self.failures, f"{what}: connection lost (backend crash?): {e}")
                self.connect()
                return "CONNECTION LOST"
            outcome = e.diag.sqlstate if quiet else self.judge_error(e, what, value)
        except psycopg.Error as e:
            outcome = e.diag.sqlstate if quiet else self.judge_error(e, what, value)
        finally:
            if not (self.conn.closed or self.conn.broken):
                try:
                    self.reset()
                except psycopg.Error:
                    self.conn.close()
                    self.connect()
        return outcome

    def judge_error(self, e, what, value=None):
        d = e.diag
        state = d.sqlstate or "?"
        if state == "XX000":
            fail(self.failures, f"{what}: internal error XX000: {d.message_primary}")
        elif state == "57014":
            fail(self.failures, f"{what}: did not finish within {STATEMENT_TIMEOUT_MS} ms")
        elif state not in ALLOWED:
            fail(self.failures, f"{what}: undocumented SQLSTATE {state}: {d.message_primary}")
        own = (d.source_file or "").endswith(".rs") or (d.source_function or "") == "exec_stmt_raise"
        if own and not (d.message_hint or "").strip():
            fail(self.failures, f"{what}: pg_claim's error {state} has no hint: {d.message_primary}")
        # a number or a short word refused by pg_claim's checks is named in
        # the message
        named = value.strip("'") if value and re.fullmatch(r"-?\d+|'\w+'", value) else None
        if own and state in ("22023", "42703", "42804") and named and named not in (d.message_primary or ""):
            fail(self.failures, f"{what}: pg_claim's error does not name the value {named}: {d.message_primary}")
        return state


def summarize(rows):
    if not rows:
        return "no rows"
    if len(rows) == 1 and len(rows[0]) == 1 and rows[0][0] is None:
        return "NULL"
    return "rows" if len(rows) > 1 else "value"


# ---------------------------------------------------------------------------


def prepare_database(admin_dsn):
    with harness.connect(conninfo=admin_dsn) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    dsn = admin_dsn + f" dbname={DB}"
    with harness.connect(conninfo=dsn) as c:
        c.add_notice_handler(lambda d: None)
        if os.environ.get("PGC_HOSTILE_PORTABLE"):
            c.execute(open(os.environ["PGC_HOSTILE_PORTABLE"], encoding="utf-8").read())
        else:
            c.execute("CREATE EXTENSION pg_claim")
        c.execute(FIXTURES)
        c.execute("DROP ROLE IF EXISTS hm_nobody")
        c.execute("CREATE ROLE hm_nobody")
    return dsn


def load_functions(conn):
    return [Fn(r) for r in conn.execute(FUNCTIONS).fetchall()]


def matrix(runner, fns):
    """Returns [(signature, argument, value label, outcome)]."""
    rows = []
    for fn in fns:
        base = [valid(nm, ty, fn)[0] for nm, ty in zip(fn.names, fn.types)]
        # where the first valid value fails, try the others
        for i, (nm, ty) in enumerate(zip(fn.names, fn.types)):
            for alt in valid(nm, ty, fn)[1:]:
                if runner.run(fn, base, quiet=True) not in ALLOWED:
                    break
                base[i] = alt
        rows.append((fn.signature, "", "valid arguments", runner.run(fn, base, where="valid arguments")))
        for i, (nm, ty) in enumerate(zip(fn.names, fn.types)):
            for v in values_for(nm, ty, fn):
                exprs = list(base)
                exprs[i] = v.expr
                outcome = runner.run(fn, exprs, dropped=v.dropped, where=f"{nm} = {v.label}", value=v.label)
                rows.append((fn.signature, f"{nm} {ty}", v.label, outcome))
        for (a, b), cases in PAIRS.items():
            if a not in fn.names or b not in fn.names:
                continue
            ia, ib = fn.names.index(a), fn.names.index(b)
            for label, rel, key in cases:
                ea = pair_expr(base[ia], rel)
                if ea is None:
                    continue
                exprs = list(base)
                exprs[ia], exprs[ib] = ea, sql.Literal(key).as_string(None) + "::text"
                outcome = runner.run(fn, exprs, where=f"{a}, {b} = {label}")
                rows.append((fn.signature, f"{a}, {b}", label, outcome))
    return rows


def random_text(rng):
    alphabet = "abcXYZ019 _-.\"'`;\\$%()\t\n\u00e9\u00ff\u4e2d\U0001f600\u200b\ufffd"
    return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 5, 40, 300, 3000])))


def random_value(rng, fn, nm, ty):
    r = rng.random()
    if r >= 0.55 and ty == "regclass":
        return sql.Literal(random_text(rng)).as_string(None) + "::regclass"
    if r >= 0.55 and ty == "text[]":
        return "ARRAY[" + ", ".join(sql.Literal(random_text(rng)).as_string(None) for _ in range(rng.randint(1, 3))) + "]::text[]"
    if r < 0.55 or ty not in ("integer", "bigint", "smallint", "text", "interval"):
        if rng.random() < 0.2:
            return valid(nm, ty, fn)[0]
        return rng.choice(values_for(nm, ty, fn)).expr
    if ty in ("integer", "bigint", "smallint"):
        bits = {"integer": 31, "bigint": 63, "smallint": 15}[ty]
        n = rng.choice([rng.randint(-(2**bits), 2**bits - 1), rng.randint(-3, 70), 2 ** rng.randint(0, bits - 1)])
        return f"({n})::{ty}"
    if ty == "text":
        return sql.Literal(random_text(rng)).as_string(None) + "::text"
    # interval
    return f"'{rng.randint(-10**6, 10**6)} {rng.choice(['microseconds', 'seconds', 'days', 'years'])}'::interval"


def random_calls(runner, fns, rng, calls, seconds):
    done = 0
    start = time.monotonic()
    callable_fns = [f for f in fns if "internal" not in f.types]
    while (calls is None or done < calls) and (seconds is None or time.monotonic() - start < seconds):
        fn = rng.choice(callable_fns)
        exprs = [random_value(rng, fn, nm, ty) for nm, ty in zip(fn.names, fn.types)]
        role = "hm_nobody" if rng.random() < 0.15 else None
        dropped = ("prepared" if any("'hm_gone'" in e for e in exprs)
                   else "recreated" if any("hm_gone" in e for e in exprs) else None)
        outcome = runner.run(fn, exprs, dropped=dropped, role=role, where=f"random call {done + 1}")
        runner.stats[outcome] = runner.stats.get(outcome, 0) + 1
        if rng.random() < 0.02:
            runner.other.execute(RECREATE_GONE)
        done += 1
    return done


def log_path(conn, given):
    if given:
        return given
    data = conn.execute("SHOW data_directory").fetchone()[0]
    head, base = os.path.split(data)
    if base.startswith("data-"):
        return os.path.join(head, "server-" + base[len("data-"):] + ".log")
    return None


def scan_log(path, offset, failures):
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    # Only the log's own lines count (prefix '%m [%p] %e ', set by main):
    # the text of a logged statement may contain anything, "XX000" included.
    entry = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ \[\d+\] (\w{5}) ([A-Z]+):  (.*)")
    for line in text.splitlines():
        m = entry.match(line)
        if not m:
            continue
        state, level, message = m.groups()
        if state == "XX000" or level == "PANIC" or (level == "LOG" and "terminated by signal" in message):
            fail(failures, f"server log: {line[:300]}")
