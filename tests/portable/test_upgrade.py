"""The portable file over each earlier build kept in tests/portable/releases/
(the release 0.5.0, and the first 0.5.0 build, whose pg_claim_current had
fewer OUT parameters): installed by a database owner that is not a
superuser, used (a lease, a failure record, an index and a generated column
on the mappings), then the current file run over it. It must install, keep
the rows, the index and the column, and leave the schema's catalog as a fresh
install of the current file leaves it: every function (arguments, result,
body, markings, privileges), view, table column, index and comment.

Environment as tests/portable/test_portable.py: PGHOST and PGPORT of the portable
server, PGC_PORTABLE_SQL the current file.
"""
import glob
import os
import subprocess

import harness
from harness import Expectations, log

HOST, PORT = os.environ["PGHOST"], os.environ["PGPORT"]
SQL_FILE = os.environ["PGC_PORTABLE_SQL"]
RELEASES = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "releases", "*.sql")))
OWNER = "portable_upgrader"
check = Expectations(show_ok=True)  # each test verifies its checks at its end

CATALOG = """
SELECT 'function ' || p.oid::regprocedure || ' -> ' || pg_get_function_result(p.oid) || ' args '
       || pg_get_function_arguments(p.oid) || ' ' || l.lanname || ' ' || p.provolatile::text || p.proparallel::text
       || p.proisstrict::text || p.prosecdef::text || ' ' || coalesce(p.proconfig::text, '') || ' '
       || (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(coalesce(p.proacl, acldefault('f', p.proowner))) a) || ' ' || md5(coalesce(pg_get_functiondef(p.oid), p.prosrc))
       || ' ' || coalesce(obj_description(p.oid, 'pg_proc'), '')
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = 'claim'::regnamespace
UNION ALL
SELECT c.relkind::text || ' ' || c.oid::regclass || ' ' || (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(coalesce(c.relacl, acldefault('r', c.relowner))) a) || ' '
       || coalesce(pg_get_viewdef(c.oid), '') || coalesce(obj_description(c.oid, 'pg_class'), '')
FROM pg_class c WHERE c.relnamespace = 'claim'::regnamespace
UNION ALL
SELECT 'column ' || a.attrelid::regclass || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || ' ' || a.attnotnull || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = 'claim'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
WHERE c.relnamespace = 'claim'::regnamespace
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
WHERE connamespace = 'claim'::regnamespace
UNION ALL
SELECT 'trigger ' || tgrelid::regclass || ' ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'claim'::regnamespace AND NOT t.tgisinternal
"""




def connect(db, user="postgres"):
    return harness.connect(host=HOST, port=PORT, user=user, dbname=db,
                           options="-csearch_path=claim,public")


def install(db, path):
    r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", path],
                       env=dict(os.environ, PGUSER=OWNER, PGDATABASE=db, PGOPTIONS="-csearch_path=claim"),
                       capture_output=True, text=True)
    return r.returncode, r.stderr.strip()


def fresh(db):
    with harness.connect(host=HOST, port=PORT, user="postgres", dbname="postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"CREATE DATABASE {db} OWNER {OWNER}")
    with connect(db, OWNER) as c:
        c.execute("CREATE SCHEMA claim")


def catalog(db):
    with connect(db) as c:
        return set(r[0] for r in c.execute(CATALOG))


def test_over_each_earlier_build():
    with harness.connect(host=HOST, port=PORT, user="postgres", dbname="postgres") as c:
        for db in ["pg_claim_upgrade_fresh"] + [f"pg_claim_upgrade_{i}" for i in range(len(RELEASES))]:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"DROP ROLE IF EXISTS {OWNER}")
        c.execute(f"CREATE ROLE {OWNER} LOGIN NOSUPERUSER")
    check(len(RELEASES) >= 2, f"earlier builds kept: {', '.join(os.path.basename(r) for r in RELEASES)}")
    fresh("pg_claim_upgrade_fresh")
    rc, err = install("pg_claim_upgrade_fresh", SQL_FILE)
    check(rc == 0, f"the current file installs fresh ({err[-200:]})")
    want = catalog("pg_claim_upgrade_fresh")
    for i, old in enumerate(RELEASES):
        db, name = f"pg_claim_upgrade_{i}", os.path.basename(old)
        fresh(db)
        rc, err = install(db, old)
        check(rc == 0, f"{name} installs ({err[-200:]})")
        with connect(db, OWNER) as c:
            c.execute("SELECT claim_lease('kept', 4, 'h1')")
            c.execute("SELECT record_failure('kept', '42', 'boom')")
            c.execute("""CREATE TABLE public.items (id bigint PRIMARY KEY, email text,
                             part integer GENERATED ALWAYS AS (claim.pg_hash_slot(email, 8)) STORED);
                         CREATE INDEX items_slot ON public.items ((claim.slot_of(id, 8)), id);
                         INSERT INTO public.items (id, email) SELECT g, 'u' || g FROM generate_series(1, 500) g""")
            before = c.execute("SELECT array_agg(part ORDER BY id) FROM public.items").fetchone()[0]
        rc, err = install(db, SQL_FILE)
        check(rc == 0, f"the current file runs over {name} ({err[:300] if rc else err[-200:]})")
        rc2, err2 = install(db, SQL_FILE)
        check(rc2 == 0, f"and again over itself ({err2[-200:]})")
        got = catalog(db)
        missing, extra = sorted(want - got), sorted(got - want)
        check(not missing and not extra, f"over {name}: the catalog of a fresh install"
              + "".join(f"\n      missing: {m[:2000]}" for m in missing[:5])
              + "".join(f"\n      extra:   {m[:2000]}" for m in extra[:5]))
        with connect(db, OWNER) as c:
            kept = (c.execute("SELECT count(*) FROM claim.pg_claim_leases WHERE name = 'kept'").fetchone()[0],
                    c.execute("SELECT count(*) FROM claim.pg_claim_failures WHERE name = 'kept'").fetchone()[0])
            after = c.execute("SELECT array_agg(claim.pg_hash_slot(email, 8) ORDER BY id) FROM public.items").fetchone()[0]
            valid = c.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = 'public.items_slot'::regclass").fetchone()[0]
            used = c.execute("SELECT count(*) FROM public.items WHERE claim.slot_of(id, 8) = 3").fetchone()[0]
        check(kept == (1, 1) and before == after and valid and used == len(range(3, 501, 8)),
              f"over {name}: the leases {kept[0]} and failure record {kept[1]} kept, the generated column and the "
              f"index on the mappings kept and valid ({used} rows of slot 3)")
    with harness.connect(host=HOST, port=PORT, user="postgres", dbname="postgres") as c:
        for db in ["pg_claim_upgrade_fresh"] + [f"pg_claim_upgrade_{i}" for i in range(len(RELEASES))]:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"DROP ROLE IF EXISTS {OWNER}")
    log(f"upgrade: {len(RELEASES)} earlier builds, {len(check.failed)} failed")
    check.verify()
