"""The values of the bad-input matrix (test_matrix.py): the relations they
name (FIXTURES), a generator of values per argument type with extras for a
few well-known names, the valid value of each argument, and the pairs of
arguments whose values go together."""

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
    ("pg_claim_lease_hand", "now_"): "clock_timestamp()",
    ("pg_claim_leases_balance", "mine"): "0",
    ("my_items_fair", "fair"): "'email'::text",
    ("my_items_fair", "spread"): "NULL::integer",
    ("my_items_fair", "spread_key"): "NULL::text",
    ("my_items_fair_query", "rel"): "'hm_items'::regclass::oid",
    ("my_items_fair_query", "fair"): "'email'::text",
    ("my_items_fair_query", "spread"): "NULL::integer",
    ("my_items_fair_query", "spread_key"): "NULL::text",
    ("pg_claim_tenant_column", "rel"): "'hm_items'::regclass::oid",
    ("pg_claim_tenant_column", "col"): "'email'::text",
    ("pg_claim_tenant_column", "arg"): "'fair'::text",
    ("pg_claim_tenant_arg", "rel"): "'hm_items'::regclass::oid",
    ("pg_claim_tenant_arg", "col"): "'email'::text",
    ("pg_claim_tenant_arg", "arg"): "'route'::text",
    ("pg_claim_tenant_arg", "types"): "'{int8,text}'::regtype[]",
    ("slot_of_spread", "k"): "1",
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
