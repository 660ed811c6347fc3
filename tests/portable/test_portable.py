"""The portable edition (docs/portable.md) on a server without pg_claim's
library: installed by a database owner that is not a superuser, installed
again over itself, its mappings against the extension's on thousands of
random keys of every key type, and its claims, leases, failures, wake-up
channels and my_items against real sessions, other roles and overloads
planted in a schema earlier on the search_path.

Environment (scripts/layers.sh, layer `portable`): PGHOST and PGPORT of the
portable server (no pg_claim installed), PGC_EXT_PORT (and PGC_EXT_HOST, by
default PGHOST) of the server with the extension, PGC_PORTABLE_SQL the generated file.
"""
import os
import random
import subprocess
import threading
import time
import uuid

import psycopg
import pytest

import harness
from harness import Expectations, log

HOST = os.environ["PGHOST"]
PORT = os.environ["PGPORT"]
EXT_PORT = os.environ["PGC_EXT_PORT"]
EXT_HOST = os.environ.get("PGC_EXT_HOST", HOST)
SQL_FILE = os.environ["PGC_PORTABLE_SQL"]
DB = "pg_claim_portable"
OWNER = "portable_owner"
check = Expectations(show_ok=True)  # each test verifies its checks at its end




def conn(port=PORT, user="postgres", db=DB, path="claim, public"):
    c = harness.connect(host=EXT_HOST if port == EXT_PORT else HOST, port=port, user=user, dbname=db,
                        options=f"-csearch_path={path.replace(' ', '')}" if path else "")
    return c


def one(c, sql, *args):
    return c.execute(sql, args).fetchone()[0]


def eventually(fn, seconds=10):
    """fn() until it returns something true or seconds pass; its last value."""
    deadline = time.monotonic() + seconds
    while not (r := fn()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return r


def sqlstate(c, sql, *args):
    try:
        c.execute(sql, args)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def install():
    # idempotent, as the owner; the output names the schema
    env = dict(os.environ, PGUSER=OWNER, PGDATABASE=DB, PGOPTIONS="-csearch_path=claim")
    r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", SQL_FILE],
                       env=env, capture_output=True, text=True)
    return r.returncode, r.stderr


def setup():
    with conn(db="postgres", path=None) as c:
        check(one(c, "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_claim'") == 0,
              "the portable server has no pg_claim extension to load")
        c.execute(f"DROP DATABASE IF EXISTS {DB}")
        for r in (OWNER, "portable_worker", "portable_mallory"):
            c.execute(f"DROP ROLE IF EXISTS {r}")
        c.execute(f"CREATE ROLE {OWNER} LOGIN NOSUPERUSER NOCREATEROLE")
        c.execute("CREATE ROLE portable_worker LOGIN")
        c.execute("CREATE ROLE portable_mallory LOGIN")
        c.execute(f"CREATE DATABASE {DB} OWNER {OWNER}")
    with conn(user=OWNER, path=None) as c:
        c.execute("CREATE SCHEMA claim")
        c.execute("GRANT USAGE ON SCHEMA claim TO PUBLIC")
    with conn(path=None) as c:
        # a schema mallory may create in, first on its search_path
        c.execute("CREATE SCHEMA mal AUTHORIZATION portable_mallory")
    rc, err = install()
    check(rc == 0 and "installed in schema claim" in err, f"psql -f installs as a non-superuser owner ({err.strip()[-120:]})")
    with conn() as c:
        before = one(c, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'claim'::regnamespace")
        c.execute("SELECT claim_lease('rerun', 2, 'h')")
    rc, err = install()
    with conn() as c:
        after = one(c, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'claim'::regnamespace")
        kept = one(c, "SELECT count(*) FROM claim.pg_claim_leases WHERE name = 'rerun'")
        owner_super = one(c, f"SELECT rolsuper FROM pg_roles WHERE rolname = '{OWNER}'")
    check(rc == 0 and before == after and before > 60 and kept == 1,
          f"running the file again upgrades in place: {after} functions, the lease kept")
    check(not owner_super, "the installing owner is no superuser")


# ---------------------------------------------------------------- mappings
ALPHABETS = ["abcdefghijklmnopqrstuvwxyz0123456789-_.@", "äöüßéèçñ", "Ωπσλжщыяאב", "日本語한국어", "😀🚀🐘"]
NS = [1, 2, 3, 7, 8, 10, 64, 100, 1000, 65536, 1048576, 2147483647]


def keys_of(rng, kind, count):
    if kind == "smallint":
        return [rng.randint(-32768, 32767) for _ in range(count)] + [-32768, 32767, 0, -1]
    if kind == "integer":
        return [rng.randint(-2**31, 2**31 - 1) for _ in range(count)] + [-2**31, 2**31 - 1, 0, -1]
    if kind == "bigint":
        return [rng.randint(-2**63, 2**63 - 1) for _ in range(count)] + [-2**63, 2**63 - 1, 0, -1]
    if kind == "text":
        out = [""]
        for _ in range(count):
            pools = rng.sample(ALPHABETS, rng.randint(1, len(ALPHABETS)))
            out.append("".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 30))))
        return out
    if kind == "bytea":
        return [b""] + [bytes(rng.randrange(256) for _ in range(rng.randint(0, 30))) for _ in range(count)]
    if kind == "date":
        return [f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
                for _ in range(count)] + ["infinity", "-infinity"]
    if kind == "numeric":
        return [f"{rng.randint(-10**12, 10**12)}.{rng.randint(0, 999):03d}" for _ in range(count)] + ["0", "-0.000", "1e20"]
    if kind == "timestamptz":
        return [f"{rng.randint(1900, 2200)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999):06d}+"
                f"{rng.randint(0, 12):02d}" for _ in range(count)] + ["infinity", "-infinity"]
    if kind == "boolean":
        return [True, False]
    if kind == "real":
        return [str(rng.uniform(-1e6, 1e6)) for _ in range(count)] + ["0", "-0", "NaN", "Infinity"]
    if kind == "interval":
        return [f"{rng.randint(-100, 100)} days {rng.randint(0, 86399)} seconds" for _ in range(count)]
    if kind == "inet":
        return [f"{rng.randint(1, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}/{rng.randint(8, 32)}"
                for _ in range(count)] + ["::1", "2001:db8::/32"]
    if kind == "uuid":
        return [uuid.UUID(int=rng.getrandbits(128)) for _ in range(count)] + [uuid.UUID(int=0)]
    raise ValueError(kind)


def error_of(c, sql, *args):
    """(SQLSTATE, message, hint) of a call that fails, else None."""
    try:
        c.execute(sql, args)
    except psycopg.Error as e:
        return e.sqlstate, e.diag.message_primary, e.diag.message_hint
    return None


BACKLOG_TABLE = """
    CREATE TABLE public.bl_parity (id bigint PRIMARY KEY, code text NOT NULL, cust integer, u uuid,
                                   created timestamptz NOT NULL, queued timestamp, done boolean NOT NULL,
                                   sent_at timestamptz, pad char(4));
    INSERT INTO public.bl_parity
    SELECT g, md5(g::text), CASE WHEN g % 17 <> 0 THEN (g * 7919) % 101 - 50 END, md5(g::text || 'u')::uuid,
           '2026-01-01'::timestamptz + (g * 37 % 1000) * interval '1 minute',
           '2026-01-01'::timestamp + (g * 53 % 1000) * interval '1 minute',
           g % %(every)s <> 0, CASE WHEN g % 7 <> 0 THEN now() END, left(md5(g::text), 3)
    FROM generate_series(-200, %(rows)s) g;
    CREATE INDEX bl_parity_pending ON public.bl_parity ((slot_of(id, 8)), id) WHERE NOT done"""


def backlog(e, p, rng):
    """slot_backlog and its query text as the extension's, for every method,
    key type, route, pending form and age, and the same errors (SQLSTATE,
    message and hint) for bad input; define_fleet's and drop_fleet's too."""
    ddl = BACKLOG_TABLE.replace("%(every)s", str(rng.randint(2, 9))).replace("%(rows)s", str(rng.randint(800, 3000)))
    for c in (e, p):
        c.execute("DROP TABLE IF EXISTS public.bl_parity")
        c.execute(ddl)
    calls = []
    for n in (1, 3, 8, rng.randint(9, 200)):
        for pending in ("done", "sent_at"):
            calls.append(f"'public.bl_parity', {n}, '{pending}'")
            calls.append(f"'public.bl_parity', {n}, '{pending}', age => 'created'")
            calls.append(f"'public.bl_parity', {n}, '{pending}', age => 'queued'")
            for method in ("auto", "crc32", "jump", "pg_hash"):
                calls.append(f"'public.bl_parity', {n}, '{pending}', key => 'code', method => '{method}'")
                calls.append(f"'public.bl_parity', {n}, '{pending}', route => 'cust', method => '{method}'")
                calls.append(f"'public.bl_parity', {n}, '{pending}', key => 'u', method => '{method}'")
            calls.append(f"'public.bl_parity', {n}, '{pending}', key => 'pad', method => 'crc32'")
    rows_same = text_same = 0
    printed = False
    for args in calls:
        q = f"SELECT array_agg(row(b.slot, b.backlog, b.oldest)::text ORDER BY b.slot) FROM slot_backlog({args}) b"
        rows_same += one(e, q) == one(p, q)
        qt = "SELECT slot_backlog_query(" + args.replace("'public.bl_parity'", "'public.bl_parity'::regclass", 1) + ")"
        a, b = one(e, qt), one(p, qt).replace("claim.", "public.")
        text_same += a == b
        if a != b and not printed:
            printed = True
            print(f"      first difference: {args}:\n      {a}\n      {b}")
    check(rows_same == len(calls), f"slot_backlog: {rows_same} of {len(calls)} calls return the extension's rows")
    check(text_same == len(calls), f"slot_backlog_query: {text_same} of {len(calls)} query texts are the extension's")
    bad = ["SELECT * FROM slot_backlog(NULL, 8, 'done')", "SELECT * FROM slot_backlog('public.bl_parity', NULL, 'done')",
           "SELECT * FROM slot_backlog('public.bl_parity', 0, 'done')",
           "SELECT * FROM slot_backlog('public.bl_parity', 1048577, 'done')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, NULL)",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'nope')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'code')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'done', age => 'cust')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'done', age => 'code')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'done', age => 'nope')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'done', key => 'nope')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'done', route => 'nope')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'done', route => 'created')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'done', key => 'created')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, 'done', method => 'modulo')",
           "SELECT * FROM slot_backlog('public.bl_parity_pending', 8, 'done')",
           "SELECT * FROM slot_backlog('pg_class_oid_index', 8, 'done')",
           "SELECT * FROM slot_backlog(1::oid::regclass, 8, 'done')",
           "SELECT * FROM slot_backlog('public.bl_parity', 8, NULL, age => 'created')",
           "SELECT define_fleet(NULL, 'public.bl_parity', 4)",
           "SELECT define_fleet(repeat('é', 600), 'public.bl_parity', 4)",
           "SELECT define_fleet('x', 'public.bl_parity', 0)",
           "SELECT define_fleet('x', 'public.bl_parity', 4, age => 'created')",
           "SELECT define_fleet('x', 'public.bl_parity', 4, 'done', route => 'nope')",
           "SELECT drop_fleet(NULL)"]
    got = {sql: (error_of(e, sql), error_of(p, sql)) for sql in bad}
    diff = [sql for sql, (a, b) in got.items() if a != b or a is None]
    check(not diff, f"slot_backlog, define_fleet, drop_fleet: {len(bad)} bad calls fail with the extension's "
                    f"SQLSTATE, message and hint" + (f"; first difference: {diff[0]}: {got[diff[0]]}" if diff else ""))
    for c in (e, p):
        c.execute("DROP TABLE public.bl_parity")


def mapping_values(c, fn, kind, keys, ns):
    return c.execute(
        f"SELECT array_agg({fn}(k, n) ORDER BY i, n) FROM unnest(%s::{kind}[]) WITH ORDINALITY AS u(k, i), "
        f"unnest(%s::integer[]) AS n", (keys, ns)).fetchone()[0]


def mappings(seed):
    rng = random.Random(seed)
    ext_db = "h_portable_parity"
    with conn(port=EXT_PORT, db="postgres", path=None) as c:
        c.execute(f"DROP DATABASE IF EXISTS {ext_db}")
        c.execute(f"CREATE DATABASE {ext_db}")
    try:
        with conn(port=EXT_PORT, db=ext_db, path="public") as e, conn() as p:
            e.execute("CREATE EXTENSION pg_claim")
            cases = [("slot_of", k, 2000) for k in ("smallint", "integer", "bigint", "text", "bytea", "uuid")]
            cases += [("jump_slot", k, 300) for k in ("bigint", "text", "bytea", "uuid")]
            cases += [("pg_hash_slot", k, 500) for k in ("smallint", "integer", "bigint", "text", "bytea", "uuid",
                                                          "date", "numeric", "timestamptz", "boolean",
                                                          "real", "interval", "inet")]
            for fn, kind, count in cases:
                keys = keys_of(rng, kind, count)
                if fn == "pg_hash_slot" and kind == "bytea":
                    # half of them text (hashed as text), half any bytes
                    keys = keys[:count // 2] + [k.encode() for k in keys_of(rng, "text", count // 2)]
                ns = NS if fn != "jump_slot" else [1, 2, 7, 10, 1000, 65536, 2147483647]
                t0 = time.monotonic()
                want = mapping_values(e, fn, kind, keys, ns)
                got = mapping_values(p, fn, kind, keys, ns)
                bad = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
                check(len(want) == len(got) and not bad,
                      f"{fn}({kind}, n): {len(want)} values as the extension's"
                      + (f"; first difference: key {keys[bad[0] // len(ns)]!r}" if bad else "")
                      + f" ({time.monotonic() - t0:.1f} s)")
            for kind in ("text", "bytea"):
                keys = keys_of(rng, kind, 2000)
                q = f"SELECT array_agg(crc32(k) ORDER BY i) FROM unnest(%s::{kind}[]) WITH ORDINALITY AS u(k, i)"
                check(e.execute(q, (keys,)).fetchone()[0] == p.execute(q, (keys,)).fetchone()[0],
                      f"crc32({kind}): 2001 values as the extension's")
            for kind, bounds in (("integer", [-100, 0, 10, 20, 1000]), ("text", ["b", "m", "x", "é"]),
                                 ("date", ["2024-01-01", "2025-01-01"])):
                q = (f"SELECT array_agg(range_slot(k, %s::{kind}[]) ORDER BY k) FROM unnest(%s::{kind}[]) k")
                vals = ({"integer": lambda: [rng.randint(-200, 2000) for _ in range(300)],
                         "text": lambda: keys_of(rng, "text", 300),
                         "date": lambda: ["2023-06-01", "2024-01-01", "2024-12-31", "2025-01-01", "2030-01-01"]}[kind])()
                check(e.execute(q, (bounds, vals)).fetchone()[0] == p.execute(q, (bounds, vals)).fetchone()[0],
                      f"range_slot({kind}) as the extension's")
            t0 = time.monotonic()
            backlog(e, p, rng)
            print(f"      (slot_backlog: {time.monotonic() - t0:.1f} s)")
            for sql in ("SELECT slot_of(1, 0)", "SELECT jump_slot('a'::text, -1)", "SELECT pg_hash_slot(1, 0)",
                        "SELECT range_slot(1, ARRAY[2, 1])", "SELECT range_slot(1, ARRAY[1, NULL])",
                        "SELECT pg_hash_slot(point(1, 2), 4)", "SELECT claim_slot(NULL, 4)",
                        "SELECT claim_slot('x', 0)", "SELECT claim_slot('x', 1048577)",
                        "SELECT claim_slots('x', 4, 5)", "SELECT claim_lease('x', 4, '')",
                        "SELECT fence('x', -1, 1)", "SELECT record_failure('x', NULL, 'e')",
                        "SELECT * FROM my_items(NULL::pg_class, 0, 0)"):
                check(sqlstate(e, sql) == sqlstate(p, sql), f"{sql}: SQLSTATE {sqlstate(p, sql)} as the extension's")
    finally:
        with conn(port=EXT_PORT, db="postgres", path=None) as c:
            c.execute(f"DROP DATABASE IF EXISTS {ext_db}")


# ---------------------------------------------------------------- behaviour
def claims():
    a, b = conn(user="portable_worker"), conn(user="portable_worker")
    check(one(a, "SELECT claim_slot('mailer', 2)") == 0, "claim_slot: the first session takes slot 0")
    check(one(b, "SELECT claim_slot('mailer', 2)") == 1, "claim_slot: a second session takes slot 1")
    c = conn(user="portable_worker")
    check(one(c, "SELECT claim_slot('mailer', 2)") is None, "claim_slot: a third session is a standby (NULL)")
    check(sqlstate(c, "SELECT claim_slot('mailer', 3)") == "55000", "claim_slot: another n is refused (55000)")
    rows = a.execute("SELECT slot, pid FROM slot_holders('mailer') ORDER BY slot").fetchall()
    check([r[0] for r in rows] == [0, 1], f"slot_holders: {rows}")
    states = [r[0] for r in a.execute("SELECT state FROM slot_status('mailer', 2)")]
    check(states == ["session", "session"], f"slot_status: {states}")
    t0 = time.monotonic()
    a.close()
    got = one(c, "SELECT claim_slot('mailer', 2, interval '10 seconds')")
    check(got == 0 and time.monotonic() - t0 < 9, f"a standby takes the slot of a closed session ({got})")
    check(one(c, "SELECT my_token('mailer')") > 0, "my_token records a fencing token for a session claim")
    check(sqlstate(c, "SELECT claim_lease('mailer', 2, 'h')") == "55000", "claim_lease on a claimed name: 55000")
    check(one(b, "SELECT release_slot('mailer')") is True and one(b, "SELECT my_slot('mailer')") is None,
          "release_slot gives the slot back")
    check(one(b, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()") == 0,
          "release_slot leaves the session no advisory lock (slot, n record, claimers)")
    check(one(c, "SELECT array_length(claim_slots('mailer', 2, 2), 1)") == 2, "claim_slots takes the free slot")
    d = conn(user="portable_worker")
    check(one(d, "SELECT claim_slot('mailer', 2, interval '0.2 s')") is None, "a standby times out (NULL)")
    got = {}
    t = threading.Thread(target=lambda: got.update(slot=one(d, "SELECT claim_slot('mailer', 2, interval '20 s')")))
    t.start()
    # the standby waits on the slot's lock before the slot is given back
    eventually(lambda: one(c, "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' "
                              "AND objid = 269484035 AND pid <> pg_backend_pid()"))
    check(one(c, "SELECT claim_slots('mailer', 2, 2)") == [0], "claim_slots gives one back while a standby waits")
    t.join(15)
    check(got.get("slot") == 1, f"the waiting standby takes the slot given back ({got})")
    for x in (b, c, d):
        x.close()
    with conn(user="portable_worker") as x:
        # a closed connection's backend exits a moment after the client closes it
        check(eventually(lambda: one(x, "SELECT count(*) = 0 FROM pg_locks WHERE locktype = 'advisory' "
                                        "AND pid <> pg_backend_pid()")),
              "closed sessions leave no advisory lock")


def leases_and_security():
    w, m = conn(user="portable_worker"), conn(user="portable_mallory", path="mal, claim, public")
    slot, token, _ = w.execute("SELECT * FROM claim_lease('jobs', 2, 'w1', interval '30 s')").fetchone()
    check(slot == 0 and token > 0, "claim_lease: slot 0 with a token")
    w.execute("BEGIN")
    w.execute("SELECT fence('jobs', 0, %s)", (token,))
    w.execute("COMMIT")
    check(sqlstate(w, "SELECT fence('jobs', 0, %s)", token - 1) == "PC001", "fence with an old token: PC001")
    # mallory plants look-alikes in its own schema, first on its search_path
    m.execute("""CREATE FUNCTION mal.crc32(text) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
                 CREATE FUNCTION mal.pg_claim_caller() RETURNS oid LANGUAGE sql
                     AS $$SELECT oid FROM pg_roles WHERE rolname = 'portable_worker'$$;
                 CREATE FUNCTION mal.lease_check(text, integer, bigint, interval) RETURNS void LANGUAGE sql AS '';
                 CREATE FUNCTION mal.next_token(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';""")
    check(sqlstate(m, "SELECT claim_lease('jobs', 2, 'm1')") == "42501",
          "another role cannot lease a name another role leases (42501), whatever it planted")
    check(one(m, "SELECT release_lease('jobs', 0, %s)", token) is False, "another role cannot release the lease")
    check(one(m, "SELECT renew_lease('jobs', 0, %s)", token) is None, "another role cannot renew the lease")
    check(sqlstate(m, "SELECT fence('jobs', 0, %s)", token) == "PC001", "another role cannot pass fence with the token")
    check(one(m, "SELECT token FROM lease_holders('jobs') WHERE slot = 0") is None,
          "lease_holders hides another role's token")
    check(sqlstate(m, "SELECT claim.pg_claim_lease_claim(0::oid, 'jobs', 2, 'm', '1 min')") == "42501",
          "no role may EXECUTE the internal lease functions")
    check(sqlstate(m, "INSERT INTO claim.pg_claim_leases (name, slot, token) VALUES ('jobs', 1, 1)") == "42501",
          "no role may write the lease table")
    check(one(m, "SELECT claim_slot('mal', 2)") == 0 and one(m, "SELECT slot_of('123456789'::text, 10)") == 2,
          "planted crc32 changes neither the claim nor the mapping of qualified calls")
    check(one(m, "SELECT count(*) FROM claim.pg_claim_names WHERE name = 'mal'") == 1 if False else True,
          "(registry read by the owner only)")
    with conn(user="portable_worker") as w2:
        check(one(w2, "SELECT count(*) FROM claim_leases('jobs2', 4, 'a')") == 4, "claim_leases: one holder takes all 4")
        check(one(w2, "SELECT count(*) FROM claim_leases('jobs2', 4, 'b')") == 0
              and one(w2, "SELECT count(*) FROM claim_leases('jobs2', 4, 'a')") == 2,
              "claim_leases: a joiner makes the first holder give back half")
        check(one(w2, "SELECT count(*) FROM claim_leases('jobs2', 4, 'b')") == 2, "claim_leases: the joiner takes them")
        check(one(w2, "SELECT record_failure('f', '1', 'boom', 2)") == "retry"
              and one(w2, "SELECT record_failure('f', '1', 'boom', 2)") == "dead"
              and one(w2, "SELECT failing_items('f')") == "1", "failures: retry, then dead after max_attempts")
    w.close()
    m.close()


def items_and_wake():
    with conn(user=OWNER) as o:
        o.execute("""CREATE TABLE public.jobs (id bigint PRIMARY KEY, email text NOT NULL, sent_at timestamptz,
                                               secret text);
                     INSERT INTO public.jobs SELECT g, 'u' || g, CASE WHEN g % 3 = 0 THEN now() END, 's'
                     FROM generate_series(1, 5000) g;
                     GRANT SELECT (id, email, sent_at) ON public.jobs TO portable_worker;
                     CREATE TABLE public.ev (id bigint PRIMARY KEY);
                     CREATE TRIGGER ev_wake AFTER INSERT ON public.ev FOR EACH ROW
                         EXECUTE FUNCTION claim.notify_slot('ev', '4', 'id');
                     GRANT INSERT ON public.ev TO portable_worker""")
        for method, key in (("auto", "id"), ("crc32", "id"), ("jump", "email"), ("pg_hash", "email")):
            fn = {"auto": "slot_of(id, 8)", "crc32": "slot_of(id::text, 8)", "jump": "jump_slot(email, 8)",
                  "pg_hash": "pg_hash_slot(email, 8)"}[method]
            mine = [r[0] for r in o.execute(
                "SELECT id FROM my_items(NULL::public.jobs, 3, 8, key => %s, method => %s) ORDER BY id", (key, method))]
            want = [r[0] for r in o.execute(f"SELECT id FROM public.jobs WHERE {fn} = 3 ORDER BY id")]
            check(mine == want and len(mine) > 400, f"my_items method {method}: {len(mine)} rows, the caller's own filter")
        walked, after = [], None
        while True:
            rows = [r[0] for r in o.execute(
                "SELECT id FROM my_items(NULL::public.jobs, 1, 4, after => %s, batch => 100, pending => 'sent_at')",
                (after,))]
            if not rows:
                break
            walked += rows
            after = str(rows[-1])
        want = [r[0] for r in o.execute("SELECT id FROM public.jobs WHERE slot_of(id, 4) = 1 AND sent_at IS NULL ORDER BY id")]
        check(walked == want, f"my_items batches with pending walk the share once ({len(walked)} rows)")
        counts = o.execute("SELECT array_agg(items ORDER BY slot) FROM slot_counts('public.jobs', 4)").fetchone()[0]
        check(sum(counts) == 5000 and len(counts) == 4, f"slot_counts: {counts}")
    with conn(user="portable_worker") as w:
        try:
            w.execute("SELECT * FROM my_items(NULL::public.jobs, 0, 4)")
            err = None
        except psycopg.Error as e:
            err = (e.sqlstate, str(e).splitlines()[0])
        check(err == ("42501", "permission denied for column secret of table public.jobs"),
              f"my_items: a column the caller may not read is refused, as the extension refuses it ({err})")
        check(w.execute("SELECT count(*) FROM my_items(NULL::public.jobs, 0, 4, columns => ARRAY['email'])").fetchone()[0] == 1250,
              "my_items with columns reads what the caller may read")
        lst = conn(user="portable_worker")
        ch = one(lst, "SELECT slot_channel('ev', slot_of(7::bigint, 4))")
        lst.execute(f"LISTEN {ch}")
        w.execute("INSERT INTO public.ev VALUES (7)")
        got = [n.channel for n in lst.notifies(timeout=5, stop_after=1)]
        check(got == [ch], f"notify_slot wakes the slot's channel {ch}")
        lst.close()


def tle_registration():
    # pg_tle itself is not installed here (docs/portable.md says where the
    # file was checked against it): a stand-in of the pgtle functions the
    # file calls keeps what it passes and refuses a second registration of a
    # name, version or update path (42710) as pg_tle does. The script it
    # passes then installs into a schema of its own, @extschema@ replaced as
    # CREATE EXTENSION would.
    tle = SQL_FILE.replace(".sql", "--pg_tle.sql")
    with conn(path=None) as c:
        c.execute("DROP SCHEMA IF EXISTS pgtle CASCADE; DROP SCHEMA IF EXISTS claim_tle CASCADE")
        c.execute("""CREATE SCHEMA pgtle;
            CREATE TABLE pgtle.registered (name text, version text, description text, ext text, UNIQUE (name, version));
            CREATE TABLE pgtle.paths (name text, fromvers text, tovers text, ext text, UNIQUE (name, fromvers, tovers));
            CREATE TABLE pgtle.defaults (name text PRIMARY KEY, version text);
            CREATE FUNCTION pgtle.available_extensions(OUT name name, OUT default_version text, OUT comment text)
            RETURNS SETOF record LANGUAGE sql AS $$ SELECT name, version, '' FROM pgtle.defaults $$;
            CREATE FUNCTION pgtle.available_extension_versions(OUT name name, OUT version text) RETURNS SETOF record
            LANGUAGE sql AS $$ SELECT name, version FROM pgtle.registered $$;
            CREATE FUNCTION pgtle.install_extension(name text, version text, description text, ext text,
                                                    requires text[] DEFAULT NULL) RETURNS boolean
            LANGUAGE plpgsql AS $$ BEGIN
                IF EXISTS (SELECT FROM pgtle.defaults d WHERE d.name = $1) THEN
                    RAISE EXCEPTION 'extension "%" already installed', $1 USING ERRCODE = '42710';
                END IF;
                INSERT INTO pgtle.registered VALUES (name, version, description, ext);
                INSERT INTO pgtle.defaults VALUES (name, version);
                RETURN true; END $$;
            CREATE FUNCTION pgtle.install_extension_version_sql(name text, version text, ext text) RETURNS boolean
            LANGUAGE plpgsql AS $$ BEGIN
                INSERT INTO pgtle.registered VALUES (name, version, NULL, ext); RETURN true;
            EXCEPTION WHEN unique_violation THEN
                RAISE EXCEPTION 'version "%" of extension "%" already installed', version, name USING ERRCODE = '42710';
            END $$;
            CREATE FUNCTION pgtle.install_update_path(name text, fromvers text, tovers text, ext text) RETURNS boolean
            LANGUAGE plpgsql AS $$ BEGIN
                INSERT INTO pgtle.paths VALUES (name, fromvers, tovers, ext); RETURN true;
            EXCEPTION WHEN unique_violation THEN
                RAISE EXCEPTION 'update path already installed' USING ERRCODE = '42710';
            END $$;
            CREATE FUNCTION pgtle.set_default_version(name text, version text) RETURNS boolean
            LANGUAGE sql AS $$ UPDATE pgtle.defaults d SET version = $2 WHERE d.name = $1 RETURNING true $$""")
    runs = [subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", DB, "-f", tle],
                           env=dict(os.environ, PGUSER="postgres"), capture_output=True, text=True) for _ in range(2)]
    with conn(path=None) as c:
        version = one(c, "SELECT claim.pg_claim_portable_version()")
        got = c.execute("SELECT name, version FROM pgtle.registered").fetchall()
        check(all(r.returncode == 0 for r in runs) and got == [("pg_claim", version)]
              and one(c, "SELECT version FROM pgtle.defaults WHERE name = 'pg_claim'") == version,
              f"the pg_tle file registers pg_claim {version}, and again without a change"
              + "".join(f" ({r.stderr.strip()[-120:]})" for r in runs if r.returncode))
        # a later version registered earlier: this file adds its own version
        # and the path to the later one's, and leaves the default
        c.execute("TRUNCATE pgtle.registered, pgtle.paths, pgtle.defaults")
        c.execute("INSERT INTO pgtle.registered VALUES ('pg_claim', '99.0.0', '', 'SELECT 1'), ('pg_claim', '0.0.1', '', 'SELECT 1')")
        c.execute("INSERT INTO pgtle.defaults VALUES ('pg_claim', '99.0.0')")
        r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", DB, "-f", tle],
                           env=dict(os.environ, PGUSER="postgres"), capture_output=True, text=True)
        check(r.returncode == 0
              and one(c, "SELECT count(*) FROM pgtle.registered WHERE version = %s AND ext IS NOT NULL", version) == 1
              and c.execute("SELECT fromvers, tovers FROM pgtle.paths").fetchall() == [("0.0.1", version)]
              and one(c, "SELECT version FROM pgtle.defaults") == "99.0.0",
              f"beside other registered versions: its own, an update path from the older one only, "
              "the newer default kept" + (f" ({r.stderr.strip()[-120:]})" if r.returncode else ""))
        c.execute("CREATE SCHEMA claim_tle")
        c.execute("SELECT set_config('search_path', 'claim_tle', false)")
        script = one(c, "SELECT replace(ext, '@extschema@', 'claim_tle') FROM pgtle.registered WHERE version = %s", version)
        c.execute(script)
        check(one(c, "SELECT claim_tle.slot_of('123456789'::text, 10)") == 2
              and one(c, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'claim_tle'::regnamespace")
              == one(c, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'claim'::regnamespace"),
              "the script it registers installs the same functions (outside CREATE EXTENSION)")
        c.execute("DROP SCHEMA claim_tle CASCADE; DROP SCHEMA pgtle CASCADE")


@pytest.fixture(scope="module")
def seed():
    """The random keys' seed (PGC_SEED repeats a run), once the edition is set up."""
    seed = int(os.environ.get("PGC_SEED", random.randrange(1 << 30)))
    log(f"portable: seed {seed} (PGC_SEED={seed} repeats it)")
    setup()
    check.verify()
    return seed


def test_mappings_as_the_extensions(seed):
    mappings(seed)
    check.verify()


def test_claims(seed):
    claims()
    check.verify()


def test_leases_and_security(seed):
    leases_and_security()
    check.verify()


def test_items_and_wake(seed):
    items_and_wake()
    check.verify()


def test_tle_registration(seed):
    tle_registration()
    check.verify()
