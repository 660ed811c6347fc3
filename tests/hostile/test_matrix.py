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
no index on the key, a ttl out of range (values.py).

test_matrix: every function is called once with valid arguments, then once
per argument and value of that argument's generator, the other arguments
valid. A VARIADIC function gets its last argument as an array (`VARIADIC
expr`), as clients call it. test_random_caller (--calls N, default 5000, or
--seconds S; --seed N): each call picks a function and draws every argument
from the generators, from random text and from random numbers, as the
calling role postgres, or as a role with no grants.

Every call must end in a result or in an ERROR whose SQLSTATE is in the
documented list (calls.ALLOWED, docs/reliability.md "Bad input"); an error
raised by pg_claim itself must carry a hint, and name the bad value when it
is a number or a word; no call may take longer than the statement timeout,
lose its connection (a crashed backend) or raise XX000. After each test the
server's log (found from data_directory, or --server-log) is scanned for
"terminated by signal", PANIC and XX000 (the log line prefix gets the
SQLSTATE for the run).

--check-doc FILE fails when the tables in FILE (docs/reliability.md) differ
from this run's matrix and SQLSTATE list; --update-doc FILE writes them there.

Needs a running cluster with pg_claim installable (PGHOST/PGPORT/PGUSER as
scripts/lib.sh sets them, a superuser; or PGC_HOSTILE_DSN, a keyword/value
connection string to a maintenance database). Each test works in its own
database, pg_claim_hostile, with a role hm_nobody, both dropped and created
again: one run at a time per cluster. For the run it adds the SQLSTATE (%e)
to the server's log_line_prefix (ALTER SYSTEM, reset at the end). With
PGC_HOSTILE_PORTABLE=FILE, the portable edition's public functions instead.
"""
import os
import random
import time

import pytest

from harness import check, connect, log

from .calls import DB, Runner, fail, load_functions, log_path, matrix, prepare_database, random_calls, scan_log
from .doc_tables import allowed_markdown, check_doc, markdown, update_doc

ADMIN = os.environ.get("PGC_HOSTILE_DSN", "dbname=postgres")


class Hostile:
    """One test's database and Runner, with the server log's offset at its
    start; finish() cleans up, scans the log and fails on any failure."""

    def __init__(self, server_log):
        self.failures = []
        self.t0 = time.monotonic()
        dsn = prepare_database(ADMIN)
        with connect(conninfo=dsn) as c:
            self.fns = load_functions(c)
            self.log = log_path(c, server_log)
            self.prefix = c.execute("SHOW log_line_prefix").fetchone()[0]
            if "%e" not in self.prefix:
                c.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] %e '")
                c.execute("SELECT pg_reload_conf()")
        self.offset = os.path.getsize(self.log) if self.log and os.path.exists(self.log) else None
        self.runner = Runner(dsn, self.failures)
        self.closed = False

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.runner.conn.close()
        self.runner.other.close()
        with connect(conninfo=ADMIN) as c:
            if "%e" not in self.prefix:
                c.execute("ALTER SYSTEM RESET log_line_prefix")
                c.execute("SELECT pg_reload_conf()")
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            c.execute("DROP ROLE IF EXISTS hm_nobody")

    def finish(self, summary):
        self.close()
        before = len(self.failures)
        if self.offset is not None:
            scan_log(self.log, self.offset, self.failures)
        else:
            fail(self.failures, "the server log was not found (pass --server-log)")
        state = "clean" if len(self.failures) == before else "NOT clean"
        log(f"{summary} in {time.monotonic() - self.t0:.0f} s; {len(self.failures)} failures; server log {state}")
        check(not self.failures, f"{len(self.failures)} failures, the first: {self.failures[:5]}")


@pytest.fixture
def hostile(request):
    h = Hostile(request.config.getoption("--server-log"))
    yield h
    h.close()


def test_matrix(hostile, request):
    rows = matrix(hostile.runner, hostile.fns)
    blocks = {"matrix": markdown(rows), "SQLSTATE list": allowed_markdown()}
    if request.config.getoption("--update-doc"):
        update_doc(request.config.getoption("--update-doc"), blocks)
    if request.config.getoption("--check-doc"):
        check_doc(request.config.getoption("--check-doc"), blocks, hostile.failures)
    hostile.finish(f"matrix: {len(hostile.fns)} functions, {len(rows)} calls")


def test_random_caller(hostile, request):
    calls, seconds = request.config.getoption("--calls"), request.config.getoption("--seconds")
    if calls is None and seconds is None:
        calls = 5000
    seed = request.config.getoption("--seed")
    seed = seed if seed is not None else random.randrange(2**32)
    done = random_calls(hostile.runner, hostile.fns, random.Random(seed), calls, seconds)
    by = ", ".join(f"{k} {v}" for k, v in sorted(hostile.runner.stats.items(), key=lambda kv: -kv[1]))
    hostile.finish(f"random caller: {done} calls over {len(hostile.fns)} functions (seed {seed}; outcomes: {by})")
