#!/usr/bin/env python3
"""Bad input for every SQL function of pg_claim: a generated matrix and a random caller.

The functions are read from the catalog at run time (the objects of the
extension in pg_depend, their argument types and names in pg_proc), so a
function added later is covered without editing this file. Each argument gets
its values from a generator chosen by its type (and, for a few well-known
names such as `rel`, `key` or `method`, extra values): NULL, 0, -1,
2^31-1, empty, 64 KiB and non-UTF-8-looking text, quoted, mixed-case and
schema-qualified identifiers, a table that does not exist or that another
session dropped, a view, a partitioned table, a foreign table, a temporary
table, a key column that is missing or of an unsupported type, a table with
no index on the key, a ttl out of range.

Matrix mode (the default): every function is called once with valid
arguments, then once per argument and value of that argument's generator, the
other arguments valid. A VARIADIC function gets its last argument as an array
(`VARIADIC expr`), as clients call it. Random mode (--random N calls, or --seconds S): each
call picks a function and draws every argument from the generators, from
random text and from random numbers, as the calling role postgres, or as a
role with no grants.

Every call must end in a result or in an ERROR whose SQLSTATE is in the
documented list (ALLOWED below, docs/reliability.md "Bad input"); an error
raised by pg_claim itself must carry a hint, and name the bad value when it
is a number or a word; no call may take longer than the
statement timeout, lose its connection (a crashed backend) or raise XX000.
After the run, the server's log (found from data_directory, or --log) is
scanned for "terminated by signal", PANIC and XX000 (the log line prefix
gets the SQLSTATE for the run). Exits non-zero on any failure.

--markdown prints the matrix as the table of docs/reliability.md;
--check-doc FILE fails when the table in FILE differs from it, and
--update-doc FILE writes it there; --allowed prints the SQLSTATE list.

Needs a running cluster with pg_claim installable (PGHOST/PGPORT/PGUSER as
scripts/lib.sh sets them, a superuser; or PGC_HOSTILE_DSN, a keyword/value
connection string to a maintenance database). Works in its own database,
pg_claim_hostile, with a role hm_nobody, both dropped and created again at
every run: one run at a time per cluster. For the run it adds the SQLSTATE
(%e) to the server's log_line_prefix (ALTER SYSTEM, reset at the end).
A soak runs the random caller for as long as it lasts: --seconds S.
"""
import argparse
import os
import random
import re
import sys
import time

import psycopg
from psycopg import errors, sql

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
    "42704": "undefined_object: a type that does not exist or was dropped; an oid that is not a row type",
    "42804": "datatype_mismatch: a key type the method cannot map; polymorphic arguments that do not fit together",
    "42723": "duplicate_function: a function created in pg_claim's schema would take the place of the mapping function a share query calls",
    "42P10": "invalid_column_reference: no single key column (no primary key, a two-column one): pass key",
    "42809": "wrong_object_type: not a table (a view, a composite type, a sequence, an index, a scalar)",
    "42883": "undefined_function: no function for these argument types (aggregate support functions take internal, PostgreSQL 15), or a key type without the hash or btree support needed; an internal function of the extension missing or not a member of it",
    "42710": "duplicate_object: a name whose lock key (crc32) another name already has in the database's name registry",
    "53400": "configuration_limit_exceeded: more advisory locks than pg_claim.max_locks_per_session",
    "55000": "object_not_in_prerequisite_state: a name leased with another n or in the other mode; a foreign table whose wrapper cannot scan",
    "PC001": "fence: the token is not the slot's current one",
}


def fail(failures, what):
    failures.append(what)
    print(f"FAILED: {what}", file=sys.stderr)


# ---------------------------------------------------------------------------
# Fixtures: the relations the generators name.

FIXTURES = r"""
DROP SCHEMA IF EXISTS hm_s CASCADE;
CREATE SCHEMA hm_s;
CREATE TABLE hm_items (id bigint PRIMARY KEY, email text, amount numeric, doc jsonb, pt point);
INSERT INTO hm_items SELECT g, 'u' || g || '@example.com', g, '{}', point(g, g) FROM generate_series(1, 50) g;
CREATE TABLE hm_s.hm_items (id text PRIMARY KEY, note text);
INSERT INTO hm_s.hm_items SELECT 'k' || g, 'n' FROM generate_series(1, 20) g;
CREATE TABLE "HmMixed" ("Id" integer PRIMARY KEY, "Note" text);
INSERT INTO "HmMixed" SELECT g, 'n' FROM generate_series(1, 20) g;
CREATE TABLE "hm x""; DROP TABLE hm_items; --" ("id""; --" integer PRIMARY KEY);
INSERT INTO "hm x""; DROP TABLE hm_items; --" SELECT generate_series(1, 20);
CREATE TABLE hm_noindex (id bigint, v text);
INSERT INTO hm_noindex SELECT g, 'v' FROM generate_series(1, 20) g;
CREATE TABLE hm_nopk (a integer, b text);
CREATE TABLE hm_pk2 (a integer, b integer, PRIMARY KEY (a, b));
CREATE TABLE hm_keys (b bytea PRIMARY KEY, u uuid UNIQUE, t text UNIQUE, s smallint UNIQUE);
INSERT INTO hm_keys SELECT int4send(g), md5(g::text)::uuid, 't' || g, g FROM generate_series(1, 20) g;
CREATE VIEW hm_view AS SELECT id, email FROM hm_items;
CREATE TABLE hm_part (id integer PRIMARY KEY, v text) PARTITION BY HASH (id);
CREATE TABLE hm_part0 PARTITION OF hm_part FOR VALUES WITH (modulus 2, remainder 0);
CREATE TABLE hm_part1 PARTITION OF hm_part FOR VALUES WITH (modulus 2, remainder 1);
INSERT INTO hm_part SELECT g, 'v' FROM generate_series(1, 20) g;
DROP FOREIGN DATA WRAPPER IF EXISTS hm_fdw CASCADE;
CREATE FOREIGN DATA WRAPPER hm_fdw;
CREATE SERVER hm_server FOREIGN DATA WRAPPER hm_fdw;
CREATE FOREIGN TABLE hm_foreign (id integer) SERVER hm_server;
CREATE TYPE hm_comp AS (x integer);
CREATE SEQUENCE hm_seq;
CREATE TABLE hm_gone (id integer PRIMARY KEY);
"""
# per session: the temporary table
TEMP_FIXTURE = """
CREATE TEMP TABLE IF NOT EXISTS hm_temp (id integer PRIMARY KEY);
INSERT INTO hm_temp SELECT generate_series(1, 10) ON CONFLICT DO NOTHING;
"""
RECREATE_GONE = "DROP TABLE IF EXISTS hm_gone; CREATE TABLE hm_gone (id integer PRIMARY KEY); INSERT INTO hm_gone VALUES (1), (2)"
GONE = "DROP TABLE hm_gone"

# The relations, as (label, SQL name). The label goes into the docs.
RELATIONS = [
    ("a table", "hm_items"),
    ("schema-qualified", "hm_s.hm_items"),
    ("mixed case, quoted", '"HmMixed"'),
    ("a name that looks like SQL", '"hm x""; DROP TABLE hm_items; --"'),
    ("no index on the key", "hm_noindex"),
    ("no primary key", "hm_nopk"),
    ("two-column primary key", "hm_pk2"),
    ("a view", "hm_view"),
    ("a partitioned table", "hm_part"),
    ("a foreign table", "hm_foreign"),
    ("a temporary table", "pg_temp.hm_temp"),
    ("a composite type", "hm_comp"),
]
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 2048) g)"  # 64 KiB, incompressible enough
DROPPED = "dropped by another session"


class V:
    """A value of a generator: its label in the matrix and its SQL expression.
    `dropped`: "prepared": the call is prepared and run once, then another
    session drops hm_gone, and the prepared call runs again; "recreated":
    the call runs once, another session drops hm_gone and creates a new
    table of that name, and the call runs again."""

    def __init__(self, label, expr, dropped=None):
        self.label, self.expr, self.dropped = label, expr, dropped


def text_values():
    return [
        V("NULL", "NULL::text"),
        V("''", "''::text"),
        V("64 KiB", BIG),
        V("not UTF-8", r"convert_from('\xc328'::bytea, 'UTF8')"),
        V("mojibake", "'Ã©Ã¿\ufffd\u200b'::text"),
        V("control characters", r"E'\x01\t\n\x7f'::text"),
        V("quotes", """'x"; DROP TABLE y; --'::text"""),
        V("mixed case", "'MixedCase'::text"),
        V("schema-qualified", "'public.hm_items'::text"),
    ]


def int_values(lo=-(2**31), hi=2**31 - 1, ty="integer"):
    vals = [V("NULL", f"NULL::{ty}"), V("0", f"0::{ty}"), V("-1", f"(-1)::{ty}"), V("1", f"1::{ty}"), V("2", f"2::{ty}")]
    vals += [V(str(hi), f"{hi}::{ty}"), V(str(lo), f"({lo})::{ty}")]
    return vals


def rel_values(argtype):
    """The relation generator, for an argument that names a relation."""
    out = []
    if argtype == "anyelement":
        out += [V(label, f"NULL::{name}") for label, name in RELATIONS]
        out += [
            V("dropped and created again by another session", "NULL::hm_gone", dropped="recreated"),
            V("does not exist", "NULL::hm_nope"),
            V("NULL::integer", "NULL::integer"),
            V("untyped NULL", "NULL"),
            V("1", "1"),
        ]
    elif argtype == "regclass":
        out += [V(label, "'" + name.replace("'", "''") + "'::regclass") for label, name in RELATIONS if label != "a composite type"]
        out += [
            V("does not exist", "'hm_nope'::regclass"),
            V(DROPPED, "'hm_gone'::regclass", dropped="prepared"),
            V("a sequence", "'hm_seq'::regclass"),
            V("an index", "'hm_items_pkey'::regclass"),
            V("NULL", "NULL::regclass"),
            V("0", "0::regclass"),
        ]
    elif argtype == "oid":
        out += [V(f"row type: {label}", "'" + name.replace("'", "''") + "'::regtype::oid") for label, name in RELATIONS]
        out += [
            V("relation: a table", "'hm_items'::regclass::oid"),
            V(f"row type {DROPPED}", "'hm_gone'::regtype::oid", dropped="prepared"),
            V(f"relation {DROPPED}", "'hm_gone'::regclass::oid", dropped="prepared"),
            V("integer", "'integer'::regtype::oid"),
            V("NULL", "NULL::oid"),
            V("0", "0::oid"),
            V("4294967295", "4294967295::oid"),
        ]
    return out


# Values of an argument by its type; extras by its name.
def values_for(name, argtype, fn=None):
    on_table = fn is None or "rel" in fn.names
    if name in ("rel", "tbl"):
        return rel_values(argtype)
    if argtype in ("integer",):
        return int_values()
    if argtype == "bigint":
        return int_values(-(2**63), 2**63 - 1, "bigint")
    if argtype == "smallint":
        return int_values(-(2**15), 2**15 - 1, "smallint")
    if argtype == "text":
        vals = text_values()
        extra = {
            "key": ["id", "nope", "ID", "ctid", "email", "amount", "doc", "pt"],
            "method": ["auto", "jump", "pg_hash", "crc32", "modulo", "JUMP"],
            "after": ["10", "ten", "99999999999999999999", "-1"],
        }.get(name, []) if on_table else []
        return vals + [V(repr(e).replace('"', "'"), f"'{e}'::text") for e in extra]
    if argtype == "interval":
        return [
            V("NULL", "NULL::interval"),
            V("0", "'0 seconds'::interval"),
            V("-1 s", "'-1 second'::interval"),
            V("1 µs", "'1 microsecond'::interval"),
            V("1 month", "'1 month'::interval"),
            V("178000000 years", "'178000000 years'::interval"),
        ]
    if argtype == "boolean":
        return [V("NULL", "NULL::boolean"), V("true", "true"), V("false", "false")]
    if argtype == "bytea":
        return [V("NULL", "NULL::bytea"), V("empty", "''::bytea"), V("\\xff00", r"'\xff00'::bytea"), V("64 KiB", f"convert_to({BIG}, 'SQL_ASCII')")]
    if argtype == "uuid":
        return [V("NULL", "NULL::uuid"), V("nil", "'00000000-0000-0000-0000-000000000000'::uuid"), V("max", "'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid")]
    if argtype == "text[]":
        return [
            V("NULL", "NULL::text[]"),
            V("{}", "'{}'::text[]"),
            V("{NULL}", "ARRAY[NULL]::text[]"),
            V("{email}", "ARRAY['email']"),
            V("{nope}", "ARRAY['nope']"),
            V("{email,email}", "ARRAY['email','email']"),
            V("{64 KiB}", f"ARRAY[{BIG}]"),
            V("2-D", "'{{a},{b}}'::text[]"),
        ]
    if argtype == "anyelement":
        return [
            V("untyped NULL", "NULL"),
            V("NULL::integer", "NULL::integer"),
            V("42", "42"),
            V("'text'", "'text'::text"),
            V("64 KiB text", BIG),
            V("1.5 numeric", "1.5::numeric"),
            V("a point (no hash or btree)", "point(1, 2)"),
            V("a jsonb", "'{}'::jsonb"),
            V("an anonymous record", "ROW(1, 'a')"),
            V("a row of a table", "(SELECT h FROM hm_items h LIMIT 1)"),
            V("an array", "ARRAY[1, 2]"),
            V("an enum-less domain-free name", "'x'::name"),
        ]
    if argtype == "anyarray":
        return [
            V("NULL::integer[]", "NULL::integer[]"),
            V("{}", "'{}'::integer[]"),
            V("{10,20}", "'{10,20}'::integer[]"),
            V("{20,10} (not increasing)", "'{20,10}'::integer[]"),
            V("{10,NULL}", "'{10,NULL}'::integer[]"),
            V("{{1},{2}} (2-D)", "'{{1},{2}}'::integer[]"),
            V("text[]", "'{a,b}'::text[]"),
            V("point[]", "ARRAY[point(1,2)]"),
            V("10,000 bounds", "(SELECT array_agg(g) FROM generate_series(1, 10000) g)"),
        ]
    if argtype == "internal":
        return [V("NULL", "NULL")]
    return [V("NULL", f"NULL::{argtype}")]


# The valid value of an argument: by name first, then by type.
VALID_BY_NAME = {
    ("rel", "anyelement"): "NULL::hm_items",
    ("rel", "regclass"): "'hm_items'::regclass",
    ("rel", "oid"): "'hm_items'::regtype::oid",
    ("slot", "integer"): "0",
    ("n", "integer"): "2",
    ("key", "text"): "NULL::text",
    ("key", "anyelement"): "42",
    ("bounds", "anyarray"): "'{10,20}'::integer[]",
    ("method", "text"): "'auto'::text",
    ("after", "text"): "NULL::text",
    ("route", "text"): "NULL::text",
    ("pending", "text"): "NULL::text",
    ("age", "text"): "NULL::text",
    ("batch", "integer"): "10",
    ("columns", "text[]"): "NULL::text[]",
    ("items", "text[]"): "ARRAY['1']::text[]",
    ("token", "bigint"): "1",
    ("ttl", "interval"): "'30 seconds'::interval",
    ("wait", "interval"): "'10 milliseconds'::interval",
    ("holder", "text"): "'w'::text",
    ("name", "text"): "'hm'::text",
    ("grp", "text"): "'g'::text",
    # slot_partition: a table hash-partitioned with modulus 2 (n's valid value)
    ("tbl", "regclass"): "'hm_part'::regclass",
    # the internal lease functions: the calling role, and crc32('hm') and
    # its int4 form (what claim_lease and claim_leases pass)
    ("role", "oid"): "'postgres'::regrole::oid",
    ("crc_", "bigint"): "3758026421",
    ("key_", "integer"): "-536940875",
}
VALID_BY_TYPE = {
    "integer": "2",
    "bigint": "1",
    "smallint": "1::smallint",
    "text": "'hm'::text",
    "bytea": r"'\x01'::bytea",
    "uuid": "'00000000-0000-0000-0000-000000000001'::uuid",
    "interval": "'1 second'::interval",
    "boolean": "true",
    "anyelement": "42",
    "anyarray": "'{10,20}'::integer[]",
    "text[]": "NULL::text[]",
    "regclass": "'hm_items'::regclass",
    "oid": "'hm_items'::regtype::oid",
    "internal": "NULL",
}


# The valid value of an argument of one function, where the general rules
# above give a value that does not fit (slot_backlog needs a pending column;
# the fleet functions name their table tbl).
VALID_BY_FUNCTION = {
    ("slot_backlog", "tbl"): "'hm_items'::regclass",
    ("slot_backlog", "pending"): "'email'::text",
    ("slot_backlog", "key"): "NULL::text",
    ("slot_backlog_query", "rel"): "'hm_items'::regclass::oid",
    ("slot_backlog_query", "pending"): "'email'::text",
    ("define_fleet", "tbl"): "'hm_items'::regclass",
    ("define_fleet", "key"): "NULL::text",
    ("pg_claim_fleet_failures_query", "rel"): "'hm_items'::regclass::oid",
    ("pg_claim_fleet_backlog_query", "rel"): "'hm_items'::regclass::oid",
    ("pg_claim_fleet_backlog_query", "pending"): "'email'::text",
    ("pg_claim_fleet_backlog_query", "key"): "NULL::text",
    ("pg_claim_fleet_backlog_query", "route"): "NULL::text",
    ("pg_claim_fleet_backlog_query", "method"): "'auto'::text",
    ("pg_claim_fleet_backlog_query", "age"): "NULL::text",
    ("pg_claim_fleet_put", "tbl"): "'hm_items'::regclass::oid",
    ("pg_claim_fleet_put", "key"): "NULL::text",
    # report_backlog: a count of pending items; the weighted planner's
    # clock and the holder's count of renewed leases
    ("report_backlog", "remaining"): "10::bigint",
    ("pg_claim_lease_report", "remaining"): "10::bigint",
    ("pg_claim_leases_balance", "now_"): "clock_timestamp()",
    ("pg_claim_leases_balance", "mine"): "0",
}


def valid(name, argtype, fn):
    """The valid values of an argument, best first: a call with the first
    that works is the base of the function's cases."""
    out = []
    if (fn.name, name) in VALID_BY_FUNCTION:
        out.append(VALID_BY_FUNCTION[(fn.name, name)])
    if (name, argtype) in VALID_BY_NAME and (name not in ("key", "after") or "rel" in fn.names):
        out.append(VALID_BY_NAME[(name, argtype)])
    out += [v for v in VALID_ALSO.get((name, argtype), [])]
    out.append(VALID_BY_TYPE.get(argtype) or f"NULL::{argtype}")
    return out


# other valid values to try (a relation's oid where its row type's is not taken)
VALID_ALSO = {("rel", "oid"): ["'hm_items'::regclass::oid"]}

# Pairs of arguments whose values go together: a relation and its key.
PAIRS = {
    ("rel", "key"): [
        ("no index on the key", "hm_noindex", "id"),
        ("no primary key", "hm_nopk", "a"),
        ("a view", "hm_view", "id"),
        ("a foreign table", "hm_foreign", "id"),
        ("a partitioned table", "hm_part", "v"),
        ("bytea key", "hm_keys", "b"),
        ("uuid key", "hm_keys", "u"),
        ("smallint key", "hm_keys", "s"),
        ("mixed case key", '"HmMixed"', "Id"),
        ("mixed case key, folded", '"HmMixed"', "id"),
        ("a key that looks like SQL", '"hm x""; DROP TABLE hm_items; --"', 'id"; --'),
    ],
}


def pair_expr(base, rel):
    """The function's valid relation argument, naming rel instead."""
    if "hm_items" not in base:
        return None
    return base.replace("'hm_items'", "'" + rel.replace("'", "''") + "'").replace("::hm_items", "::" + rel)


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
        self.other = psycopg.connect(dsn, autocommit=True)
        self.connect()

    def connect(self):
        self.conn = psycopg.connect(self.dsn, autocommit=True)
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
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    dsn = admin_dsn + f" dbname={DB}"
    with psycopg.connect(dsn, autocommit=True) as c:
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


def markdown(rows):
    """One line per function and argument: each outcome with the values that end in it."""
    out = ["| function | argument | outcome: values |", "|---|---|---|"]
    groups = {}
    order = []
    for sig, arg, label, outcome in rows:
        k = (sig, arg)
        if k not in groups:
            groups[k] = {}
            order.append(k)
        groups[k].setdefault(outcome, []).append(label)
    for sig, arg in order:
        parts = []
        for outcome, labels in groups[(sig, arg)].items():
            parts.append(f"**{outcome}**: " + ", ".join(l.replace("|", "\\|") for l in labels))
        out.append(f"| `{sig}` | {('`' + arg + '`') if arg else '(all valid)'} | " + "; ".join(parts) + " |")
    return "\n".join(out) + "\n"


def allowed_markdown():
    out = ["| SQLSTATE | meaning |", "|---|---|"]
    for k, v in ALLOWED.items():
        name, _, meaning = v.partition(": ")
        out.append(f"| `{k}` {name} | {meaning} |")
    return "\n".join(out) + "\n"


# The generated blocks of docs/reliability.md, each between its markers.
def marks(block):
    return (f"<!-- {block}: generated by tests/hostile/matrix.py; do not edit -->", f"<!-- end of {block} -->")


def update_doc(path, blocks):
    text = open(path, encoding="utf-8").read()
    for block, content in blocks.items():
        begin, end = marks(block)
        i, j = text.index(begin) + len(begin) + 1, text.index(end)
        text = text[:i] + content + text[j:]
    open(path, "w", encoding="utf-8").write(text)


def check_doc(path, blocks, failures):
    import difflib

    text = open(path, encoding="utf-8").read()
    for block, content in blocks.items():
        begin, end = marks(block)
        m = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), text, re.S)
        if not m:
            fail(failures, f"{path} has no generated {block} between the markers")
        elif m.group(1) != content:
            diff = "".join(difflib.unified_diff(m.group(1).splitlines(True), content.splitlines(True), path, "matrix.py"))
            fail(failures, f"the {block} in {path} differs from this run's (rewrite it with --update-doc):\n{diff}")


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random", type=int, metavar="N", help="random mode: N calls")
    ap.add_argument("--seconds", type=float, metavar="S", help="random mode: calls for S seconds")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--markdown", action="store_true", help="print the matrix as a Markdown table")
    ap.add_argument("--check-doc", metavar="FILE", help="fail when FILE's matrix differs from this run's")
    ap.add_argument("--update-doc", metavar="FILE", help="write this run's matrix into FILE, between the markers")
    ap.add_argument("--log", help="the server's log file (default: from data_directory)")
    ap.add_argument("--allowed", action="store_true", help="print the documented SQLSTATEs as Markdown and exit")
    a = ap.parse_args()
    if a.allowed:
        sys.stdout.write(allowed_markdown())
        return 0
    failures = []
    admin = os.environ.get("PGC_HOSTILE_DSN", "dbname=postgres")
    dsn = prepare_database(admin)
    with psycopg.connect(dsn, autocommit=True) as c:
        fns = load_functions(c)
        log = log_path(c, a.log)
        prefix = c.execute("SHOW log_line_prefix").fetchone()[0]
        if "%e" not in prefix:
            c.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] %e '")
            c.execute("SELECT pg_reload_conf()")
    offset = os.path.getsize(log) if log and os.path.exists(log) else None
    runner = Runner(dsn, failures)
    t0 = time.monotonic()
    try:
        if a.random is None and a.seconds is None:
            rows = matrix(runner, fns)
            table = markdown(rows)
            if a.markdown:
                sys.stdout.write(table)
            blocks = {"matrix": table, "SQLSTATE list": allowed_markdown()}
            if a.update_doc:
                update_doc(a.update_doc, blocks)
            if a.check_doc:
                check_doc(a.check_doc, blocks, failures)
            summary = f"matrix: {len(fns)} functions, {len(rows)} calls"
        else:
            seed = a.seed if a.seed is not None else random.randrange(2**32)
            done = random_calls(runner, fns, random.Random(seed), a.random, a.seconds)
            by = ", ".join(f"{k} {v}" for k, v in sorted(runner.stats.items(), key=lambda kv: -kv[1]))
            summary = f"random caller: {done} calls over {len(fns)} functions (seed {seed}; outcomes: {by})"
    finally:
        runner.conn.close()
        runner.other.close()
        with psycopg.connect(admin, autocommit=True) as c:
            if "%e" not in prefix:
                c.execute("ALTER SYSTEM RESET log_line_prefix")
                c.execute("SELECT pg_reload_conf()")
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            c.execute("DROP ROLE IF EXISTS hm_nobody")
    before = len(failures)
    if offset is not None:
        scan_log(log, offset, failures)
    else:
        fail(failures, "the server log was not found (pass --log)")
    log_state = "clean" if len(failures) == before else "NOT clean"
    print(f"{summary} in {time.monotonic() - t0:.0f} s; {len(failures)} failures; server log {log_state}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
