"""Every mapping of both editions on every key type PostgreSQL can hash,
against each other and against PostgreSQL itself:

- pg_hash_slot(k, 7) of each row of a table PARTITION BY HASH (k) with
  MODULUS 7 is the remainder of the partition the server routed the row to
  (its tableoid), in both editions, in a plain plan and in a forced parallel
  one (the mapping runs in a parallel worker: EXPLAIN ANALYZE shows workers
  launched);
- my_items(..., method => 'pg_hash') of each slot returns the rows of that
  partition, and slot_counts counts them;
- range_slot(k, bounds) is the number of bounds <= k, counted in SQL;
- every value of slot_of, jump_slot, crc32, pg_hash_slot (many n),
  slot_of_spread and range_slot is the extension's (or both fail with the same SQLSTATE), NULL
  keys included; enums and the types built on them hash by OID, which differs
  between two databases, so for them only the partition is compared.

Environment as tests/portable/test_portable.py: PGHOST and PGPORT of the portable
server, PGC_EXT_PORT (and PGC_EXT_HOST) of the extension's, PGC_PORTABLE_SQL.
PGC_MAPPING_ROWS rows per type (default 400).
"""
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg

import harness
from harness import Expectations, log

HOST = os.environ["PGHOST"]
PORT = os.environ["PGPORT"]
EXT_PORT = os.environ["PGC_EXT_PORT"]
EXT_HOST = os.environ.get("PGC_EXT_HOST", HOST)
SQL_FILE = os.environ["PGC_PORTABLE_SQL"]
ROWS = int(os.environ.get("PGC_MAPPING_ROWS", "400"))
DB = "pg_claim_mappings"  # the extension's: DB + "_ext"
MODULUS = 7
NS = [1, 2, 3, 7, 64, 1000, 2147483647]
check = Expectations(show_ok=True)  # each test verifies its checks at its end

SETUP = """
CREATE TYPE public.mood AS ENUM ('sad', 'ok', 'happy', 'élan');
CREATE TYPE public.pair AS (a integer, b text);
CREATE TYPE public.moody AS (m public.mood, n numeric);
CREATE DOMAIN public.dint AS integer CHECK (VALUE > -2000000000);
CREATE DOMAIN public.dtext AS text;
CREATE DOMAIN public.dchar AS char(6);
"""

# (name, type, value of row g; every 37th row gets a NULL key)
T = "md5(g::text)"
TYPES = [
    ("char5", "char(5)", "left(md5(g::text), g % 6)"),
    ("char1", "char(1)", "chr(65 + g % 26)"),
    ("charpad", "char(12)", "rpad(left(md5(g::text), g % 5), g % 9) || chr(228 + g % 3)"),
    ("varchar", "varchar(40)", f"{T} || chr(160 + g % 400)"),
    ("text", "text", f"repeat(chr(32 + g % 900), g % 4) || {T}"),
    ("bytea_raw", "bytea", "decode(md5(g::text), 'hex')"),
    ("bytea_text", "bytea", "convert_to(repeat(chr(33 + g % 3000), g % 5) || g, 'UTF8')"),
    ("bytea_mixed", "bytea", "decode(CASE WHEN g % 3 = 0 THEN 'c3a9' WHEN g % 3 = 1 THEN 'ed9f' || substr(md5(g::text), 1, 2) "
                             "ELSE 'f0' || substr(md5(g::text), 1, 6) END, 'hex')"),
    ("int2", "smallint", "(g * 7919 % 65536 - 32768)"),
    ("int4", "integer", "(g::bigint * 2654435761 % 4294967296 - 2147483648)"),
    ("int8", "bigint", "(g::numeric * 6364136223846793005 % 18446744073709551616 - 9223372036854775808)"),
    ("numeric", "numeric", "round((g % 1000 - 500) / 7.0, g % 6)"),
    ("numeric_scaled", "numeric(20,6)", "(g % 50)::numeric / 4"),
    ("float4", "real", "(g * 1.5 - 700)"),
    ("float8", "double precision", "CASE WHEN g % 500 = 1 THEN 'NaN' WHEN g % 500 = 2 THEN '-0' ELSE (g / 3.0)::text END::float8"),
    ("enum", "public.mood", "(enum_range(NULL::public.mood))[1 + g % 4]"),
    ("domain_int", "public.dint", "g * 1000 - 5000"),
    ("domain_text", "public.dtext", T),
    ("domain_char", "public.dchar", "left(md5(g::text), g % 7)"),
    ("composite", "public.pair", "row(CASE WHEN g % 11 <> 0 THEN g % 20 END, left(md5(g::text), g % 4))::public.pair"),
    ("composite_enum", "public.moody", "row((enum_range(NULL::public.mood))[1 + g % 4], g % 9)::public.moody"),
    ("int_array", "integer[]", "ARRAY[g % 13, g % 7, CASE WHEN g % 5 <> 0 THEN g END]"),
    ("text_array", "text[]", "ARRAY[left(md5(g::text), g % 3), 'x']"),
    ("int4range", "int4range", "int4range(g % 100, g % 100 + g % 4)"),
    ("tstzrange", "tstzrange", "tstzrange('2020-01-01'::timestamptz + g * interval '1 hour', NULL)"),
    ("int4multirange", "int4multirange", "int4multirange(int4range(g % 50, g % 50 + 3), int4range(100, 100 + g % 3))"),
    ("uuid", "uuid", "md5(g::text)::uuid"),
    ("timestamp", "timestamp", "CASE WHEN g % 400 = 1 THEN 'infinity' WHEN g % 400 = 2 THEN '-infinity' ELSE "
                              "('1970-01-01'::timestamp + g * interval '12345 minutes 7.25 seconds')::text END::timestamp"),
    ("timestamptz", "timestamptz", "CASE WHEN g % 400 = 1 THEN 'infinity' ELSE "
                                   "('1899-06-01 00:00:00+03'::timestamptz + g * interval '77777 minutes 1.5 seconds')::text END::timestamptz"),
    ("date", "date", "CASE WHEN g % 400 = 1 THEN 'infinity' WHEN g % 400 = 2 THEN '-infinity' "
                     "ELSE ('1950-01-01'::date + g * 29)::text END::date"),
    ("time", "time", "'00:00'::time + g * interval '41 seconds'"),
    ("timetz", "timetz", "('00:00'::time + g * interval '41 seconds')::text || '+0' || (g % 9)"),
    ("interval", "interval", "g * interval '1 day 3 minutes'"),
    ("bool", "boolean", "g % 2 = 0"),
    ("inet", "inet", "('10.' || g % 256 || '.' || g / 256 % 256 || '.1/' || (8 + g % 25))::inet"),
    ("macaddr", "macaddr", "('08:00:2b:01:' || lpad(to_hex(g % 256), 2, '0') || ':' || lpad(to_hex(g / 256 % 256), 2, '0'))"),
    ("jsonb", "jsonb", "jsonb_build_object('g', g % 30, 't', left(md5(g::text), 2))"),
    ("name", "name", T),
    ("char_internal", '"char"', "chr(33 + g % 90)"),
    ("oid", "oid", "(g::bigint * 2654435761 % 4294967296)::text"),
    ("xid", "xid", "(g::bigint * 2654435761 % 4294967296)::text"),
    ("pg_lsn", "pg_lsn", "(g * 7 || '/' || to_hex(g * 1000003))"),
]
# where the server has ICU: keys under a nondeterministic collation, which
# hash alike when they compare equal ('abc', 'ABC')
ICU_TYPES = [
    ("text_ci", "text COLLATE public.ci", "CASE WHEN g % 2 = 0 THEN upper(left(md5(g::text), 2)) ELSE left(md5((g + 1)::text), 2) END"),
    ("char_ci", "char(4) COLLATE public.ci", "CASE WHEN g % 2 = 0 THEN upper(left(md5(g::text), 2)) ELSE 'ß' || g % 3 END"),
]
ICU = "CREATE COLLATION public.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
# hashed by an OID, which differs between the two databases
BY_OID = {"enum", "composite_enum"}




def connect(port, portable):
    return harness.connect(host=HOST if portable else EXT_HOST, port=port, user="postgres",
                           dbname=DB if portable else DB + "_ext",
                           options="-csearch_path=claim,public")


def fresh(port, portable):
    db = DB if portable else DB + "_ext"
    with harness.connect("postgres", host=HOST if portable else EXT_HOST, port=port, user="postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"CREATE DATABASE {db}")
    with connect(port, portable) as c:
        if portable:
            c.execute("CREATE SCHEMA claim")
        else:
            c.execute("CREATE EXTENSION pg_claim")
        c.execute(SETUP)
        try:
            c.execute(ICU)
            icu = True
        except psycopg.errors.FeatureNotSupported:  # a build without ICU (the wheels of 16 and 18)
            icu = False
    if portable:
        r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", SQL_FILE],
                           env=dict(os.environ, PGUSER="postgres", PGDATABASE=DB, PGOPTIONS="-csearch_path=claim"),
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"mappings: the portable file did not install: {r.stderr[-500:]}")
    return icu


def load(c, name, typ, expr):
    """The table m_NAME of ROWS rows, hash-partitioned on k with MODULUS 7."""
    c.execute(f"CREATE TABLE m_{name} (g integer NOT NULL, k {typ}) PARTITION BY HASH (k)")
    for r in range(MODULUS):
        c.execute(f"CREATE TABLE m_{name}_{r} PARTITION OF m_{name} FOR VALUES WITH (MODULUS {MODULUS}, REMAINDER {r})")
    c.execute(f"INSERT INTO m_{name} SELECT g, CASE WHEN g % 37 <> 0 THEN ({expr})::{typ} END "
              f"FROM generate_series(1, {ROWS}) g")
    c.execute(f"ANALYZE m_{name}")


def result(c, sql, *args):
    """(value, None) or (None, SQLSTATE)."""
    try:
        return c.execute(sql, args or None).fetchone()[0], None
    except psycopg.Error as e:
        return None, e.sqlstate


ROUTED = ("SELECT count(*) FILTER (WHERE pg_hash_slot(k, {m}) IS DISTINCT FROM "
          "substring(tableoid::regclass::text from '_([0-9]+)$')::integer), min(g) FILTER (WHERE pg_hash_slot(k, {m}) "
          "IS DISTINCT FROM substring(tableoid::regclass::text from '_([0-9]+)$')::integer) "
          "FROM m_{name} WHERE num_nulls(k) = 0")

PARALLEL = ["SET parallel_setup_cost = 0", "SET parallel_tuple_cost = 0", "SET min_parallel_table_scan_size = 0",
            "SET max_parallel_workers_per_gather = 2", "SET parallel_leader_participation = off"]


def force_parallel(c):
    for s in PARALLEL:
        c.execute(s)
    force = "debug_parallel_query" if c.info.server_version >= 160000 else "force_parallel_mode"
    c.execute(f"SET {force} = on")


def routed(c, name, edition):
    """The rows whose pg_hash_slot is not their partition, in a plain plan and
    in a parallel one whose workers ran: the checks, as (ok, what)."""
    q = ROUTED.format(m=MODULUS, name=name)
    plain, err = result(c, f"SELECT row(x.*)::text FROM ({q}) x")
    checks = [(err is None and plain == "(0,)",
               f"{edition}: pg_hash_slot of {name} is the partition PostgreSQL routes each row to"
               + (f" (mismatches, first row: {plain})" if plain != "(0,)" else "") + (f" (SQLSTATE {err})" if err else ""))]
    c.execute("BEGIN")
    try:
        force_parallel(c)
        deadline, launched, perr = time.monotonic() + 10, 0, None
        while not launched and perr is None and time.monotonic() < deadline:
            try:
                plan = c.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {q}").fetchone()[0]
            except psycopg.Error as e:
                perr = e.sqlstate
                break
            launched = sum(node.get("Workers Launched", 0) for node in walk(plan[0]["Plan"]))
        got = c.execute(f"SELECT row(x.*)::text FROM ({q}) x").fetchone()[0] if perr is None else None
    finally:
        c.execute("ROLLBACK")
    checks.append((perr is None and launched > 0 and got == "(0,)",
                   f"{edition}: the same in a parallel plan, pg_hash_slot in its workers"
                   + (f" (SQLSTATE {perr})" if perr else f" ({launched} workers launched, {got})")))
    return checks


def walk(node):
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


def shares(c, name):
    """my_items' pg_hash shares and slot_counts, with what each partition holds."""
    want = [c.execute(f"SELECT coalesce(array_agg(g ORDER BY g), '{{}}') FROM m_{name}_{r} WHERE num_nulls(k) = 0")
            .fetchone()[0] for r in range(MODULUS)]
    mine = [result(c, f"SELECT coalesce(array_agg(g ORDER BY g), '{{}}') FROM my_items(NULL::m_{name}, {r}, {MODULUS}, "
                      "key => 'k', method => 'pg_hash')") for r in range(MODULUS)]
    counts = result(c, f"SELECT array_agg(items ORDER BY slot) FROM slot_counts('m_{name}', {MODULUS}, key => 'k', "
                       "method => 'pg_hash')")
    return want, mine, counts


def values(c, name):
    """Every mapping's values over the table (or its SQLSTATE), in row order."""
    out = {}
    order = f"FROM m_{name} m, unnest(%s::integer[]) n"
    for fn in ("slot_of", "jump_slot", "pg_hash_slot"):
        out[fn] = result(c, f"SELECT array_agg({fn}(k, n) ORDER BY g, n) {order}", NS)
    out["crc32"] = result(c, f"SELECT array_agg(crc32(k) ORDER BY g) FROM m_{name}")
    # (text and integer tenants; other key types have none: 42883 in both)
    out["slot_of_spread"] = result(c, f"SELECT array_agg(slot_of_spread(k, g::bigint, n, least(n, 5)) ORDER BY g, n) "
                                      f"{order}", NS)
    out["slot_of_spread text key"] = result(c, f"SELECT array_agg(slot_of_spread(k, md5(g::text), n, least(n, 3)) "
                                               f"ORDER BY g, n) {order}", NS)
    bounds = result(c, f"SELECT array_agg(k ORDER BY k)::text FROM (SELECT k, row_number() OVER (ORDER BY k) i "
                       f"FROM (SELECT DISTINCT k FROM m_{name} WHERE num_nulls(k) = 0) d) b WHERE i % 97 = 1")
    out["range_slot"] = result(c, f"SELECT array_agg(range_slot(k, b) ORDER BY g) FROM m_{name}, "
                                  f"(SELECT array_agg(k ORDER BY k) b FROM (SELECT k, row_number() OVER (ORDER BY k) i "
                                  f"FROM (SELECT DISTINCT k FROM m_{name} WHERE num_nulls(k) = 0) d) x WHERE i % 97 = 1) s")
    out["range_slot counted"] = result(
        c, f"SELECT count(*) FILTER (WHERE range_slot(k, b) IS DISTINCT FROM (SELECT count(*) FROM "
           f"generate_subscripts(b, 1) j WHERE b[j] <= k)) FROM m_{name}, (SELECT array_agg(k ORDER BY k) b FROM "
           f"(SELECT k, row_number() OVER (ORDER BY k) i FROM (SELECT DISTINCT k FROM m_{name} WHERE num_nulls(k) = 0) d) x "
           f"WHERE i % 97 = 1) s WHERE num_nulls(k) = 0")
    return out, bounds


def test_every_mapping_on_every_key_type():
    t0 = time.monotonic()
    icu = fresh(EXT_PORT, False) & fresh(PORT, True)
    if not icu:
        print("      (no ICU in this server: the nondeterministic collation cases are not run)")
    run = TYPES + (ICU_TYPES if icu else [])

    def edition_of(c, edition, name, typ, expr):
        """One key type's table loaded on c: (routed checks, shares, values)."""
        load(c, name, typ, expr)
        return routed(c, name, edition), shares(c, name), values(c, name)

    def lane(types):
        """Each key type of a lane on both editions, on the lane's own
        connections: {name: ((routed checks, shares, values) of each edition)}."""
        out = {}
        with connect(EXT_PORT, False) as e, connect(PORT, True) as p:
            for name, typ, expr in types:
                out[name] = tuple(edition_of(c, edition, name, typ, expr)
                                  for c, edition in ((e, "extension"), (p, "portable")))
        return out

    # two lanes of key types at once: the portable server's mappings are
    # the slow part, and each lane keeps one of its processors busy
    with ThreadPoolExecutor(2) as pool:
        got = {}
        for part in pool.map(lane, (run[0::2], run[1::2])):
            got.update(part)
    for name, typ, expr in run:
        (re_, (we, me, ce), (ve, be)), (rp, (wp, mp, cp), (vp, bp)) = got[name]
        for ok, what in re_ + rp:
            check(ok, what)
        for edition, want, mine, counts in (("extension", we, me, ce), ("portable", wp, mp, cp)):
            sizes = [len(w) for w in want]
            check(all(m == (w, None) for m, w in zip(mine, want)) and counts == (sizes, None),
                  f"{edition}: my_items(method => 'pg_hash') of each slot is its partition's rows of {name}, "
                  f"slot_counts {counts[0] if counts[1] is None else counts[1]}"
                  + "".join(f"; slot {r}: {m[1] or f'{len(m[0])} rows, {len(w)} in the partition'}"
                            for r, (m, w) in enumerate(zip(mine, want)) if m != (w, None)))
        check(be == bp, f"{name}: the range bounds are the same in both databases")
        for fn in ve:
            same = ve[fn] == vp[fn] or (fn == "pg_hash_slot" and name in BY_OID
                                        and ve[fn][1] is None and vp[fn][1] is None)
            if fn == "range_slot counted":
                # (array keys have no range_slot: its bounds would be of the key's own type)
                check(ve[fn] == vp[fn] and (ve[fn] == (0, None) or ve[fn][1] == "42883"),
                      f"range_slot of {name}: the number of bounds <= key (mismatches {ve[fn]}, {vp[fn]})")
                continue
            first = ""
            if not same and ve[fn][1] is None and vp[fn][1] is None:
                i = next(i for i, (a, b) in enumerate(zip(ve[fn][0], vp[fn][0])) if a != b)
                first = f"; first difference at value {i}: {ve[fn][0][i]} != {vp[fn][0][i]}"
            what = (f"{len(ve[fn][0] or [])} values" if ve[fn][1] is None else f"SQLSTATE {ve[fn][1]}")
            check(same, f"{fn}({name}): {what} as the extension's"
                  + (f" (portable: {vp[fn][1] or 'values'})" if not same else "") + first
                  + (" (by OID: each its own)" if name in BY_OID and fn in ("pg_hash_slot", "range_slot")
                     and ve[fn][1] is None else ""))
    log(f"mappings: {len(run)} key types, {ROWS} rows each, {len(check.failed)} failed, {time.monotonic() - t0:.1f} s")
    check.verify()
