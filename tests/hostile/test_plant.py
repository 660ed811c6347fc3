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
valid arguments (the bad-input matrix's generators, each argument cast to the declared
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
superuser does about it). Each variant is a test; its last line is a
summary with the counts (the calls reported apart are listed above it).
--seed N: the seed of the plants' random mixes (default 27).
"""
import os
import time

import pytest

from harness import check, connect as harness_connect, log

from .calls import fail, load_functions
from .plant_calls import SIGNATURES, Caller, check_rolsuper, check_shares, choose_calls, run_calls
from .plant_setup import OWNER, THIRD, VARIANTS, Lifted, connect, plant_all, reset_cluster, setup_variant

ADMIN = os.environ.get("PGC_HOSTILE_DSN", "dbname=postgres")



def run_variant(admin, db, schema_opt, seed, failures, report):
    extschema = setup_variant(admin, db, schema_opt)
    roles = [("owner", OWNER), ("superuser", None), ("third role", THIRD)]
    with connect(admin, db, None) as c:
        fns = load_functions(c)
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


@pytest.fixture(scope="module")
def owner():
    """The roles of the attack, made again for the module; its databases and
    roles dropped after it."""
    reset_cluster(ADMIN)
    yield
    with harness_connect(conninfo=ADMIN) as c:
        for db, _ in VARIANTS:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        for r in (OWNER, THIRD):
            c.execute(f"DROP ROLE IF EXISTS {r}")


def fns(xs):
    return sorted({x.split(": ")[2] for x in xs})


def summary(report, failures, t0):
    """The report's lines: the variant, what was reported apart, the counts."""
    for v in report.get("variants", []):
        log(v)
    amb, direct = report.get("ambiguous", []), report.get("direct", [])
    for x in amb:
        log(f"ambiguous (the owner's duplicate in the extension's schema): {x}")
    for x in direct:
        log(f"resolved by the caller's own statement to the owner's overload: {x}")
    if amb:
        log(f"ambiguous (42725) only through the owner's duplicates in the extension's schema, "
            f"{len(amb)} calls of: {', '.join(fns(amb))}")
    if report.get("refused_42723"):
        log(f"refused with 42723 (generated SQL would call the owner's function), {len(report['refused_42723'])} "
            f"calls of: {', '.join(fns(report['refused_42723']))}")
    if report.get("captured"):
        log(f"CAPTURED: {', '.join(sorted(report['captured']))}")
    if direct:
        log(f"the caller's own statement resolved to the owner's overload in the extension's schema, "
            f"{len(direct)} calls of: {', '.join(fns(direct))}")
    if report.get("direct_escalation"):
        log(f"a superuser's own statement ran the owner's overload as superuser (PostgreSQL's resolution: "
            f"docs/security.md), {len(report['direct_escalation'])} calls of: "
            f"{', '.join(fns(report['direct_escalation']))}")
    log(f"planted overloads: {report['planted']} planted, {report['calls']} calls as owner, superuser and a third "
        f"role; {len(amb)} ambiguous in the extension's own schema (42725), {len(direct)} resolved by the caller's "
        f"own statement; {len(failures)} failures in {time.monotonic() - t0:.0f} s")


@pytest.mark.parametrize("db, schema", VARIANTS, ids=[s or "public" for _, s in VARIANTS])
def test_planted_overloads_never_run(owner, request, db, schema):
    """The extension in the variant's schema: every function called by the
    owner, a superuser and a third role, before planting, with every plant
    in place and with its name's own plants lifted."""
    seed = request.config.getoption("--seed")
    failures = []
    report = {"calls": 0, "planted": 0, "refused": 0}
    t0 = time.monotonic()
    run_variant(ADMIN, db, schema, 27 if seed is None else seed, failures, report)
    summary(report, failures, t0)
    check(not failures, f"{len(failures)} failures, the first: {failures[:5]}")
