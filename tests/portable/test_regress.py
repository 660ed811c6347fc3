"""The pg_regress tests of tests/pg_regress that apply to the portable edition
(tests/portable/regress.txt), run unchanged against it through pg_regress,
then the isolation specs of tests/isolation listed in
tests/portable/isolation.txt through pg_isolation_regress: one pytest test
per pg_regress test (test_regress[NAME]) and per spec (test_isolation[NAME]).

Each test and its expected output are copied into the work directory with
two changes made to both alike: the test's own CREATE EXTENSION becomes a
comment (the set-up test 0_setup installs the portable file instead, as the
superuser pg_regress connects as), and psql is told not to print the CONTEXT
lines of errors (\\set SHOW_CONTEXT never): PL/pgSQL adds them where the
extension's C functions have none (docs/portable.md). Everything else must be
identical. The selected tests run in one pg_regress run, 0_setup first
(whether or not its own test is selected; a test fails too when 0_setup's
output differs). The isolation specs run on a database where the portable
file is installed first (as the superuser, in public); their own CREATE
EXTENSION becomes a SELECT, and their expected outputs are the extension's,
unchanged.

Environment: PGHOST and PGPORT of the portable server, PGC_BIN its binaries
(psql), PGC_PG_REGRESS the pg_regress program (pg_isolation_regress is found
beside it, in ../isolation/), PGC_PORTABLE_SQL the generated file,
PGC_PORTABLE_REGRESS_DIR the work directory (replaced; it stays after the
run for inspection; default: a temporary one).
"""
import os
import re
import shutil
import subprocess

import pytest

from harness import Failure, check, log

TIME_LIMIT_S = 600
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "pg_regress")
ISOLATION_SRC = os.path.join(ROOT, "tests", "isolation")
PG_REGRESS = os.environ.get("PGC_PG_REGRESS", "")
SQL_FILE = os.environ.get("PGC_PORTABLE_SQL", "")
SETUP = "0_setup"
REGRESS_DB = "pg_claim_portable_regress"
ISOLATION_DB = "pg_claim_portable_isolation"


def selected(name):
    with open(os.path.join(ROOT, "tests", "portable", name), encoding="utf-8") as f:
        return [l.split("#")[0].strip() for l in f if l.split("#")[0].strip()]


REGRESS_TESTS = [SETUP] + [t for t in selected("regress.txt") if t != SETUP]
ISOLATION_SPECS = selected("isolation.txt")


def copy(name, work):
    for kind, ext in (("sql", ".sql"), ("expected", ".out")):
        with open(os.path.join(SRC, kind, name + ext), encoding="utf-8") as f:
            text = f.read()
        text = text.replace("CREATE EXTENSION IF NOT EXISTS pg_claim;\n",
                            "-- (the portable edition, installed by 0_setup)\n")
        if name == SETUP:
            text = text.replace("-- (the portable edition, installed by 0_setup)\n",
                                "\\set ECHO none\n" + (f"\\i {SQL_FILE}\n\\set ECHO all\n" if kind == "sql" else ""))
        text = "\\set SHOW_CONTEXT never\n" + text
        with open(os.path.join(work, kind, name + ext), "w", encoding="utf-8") as f:
            f.write(text)


def chosen(request, test):
    """The names of this module's test `test` that pytest runs (after -k)."""
    return [item.callspec.params["name"] for item in request.session.items
            if item.module is request.module and item.originalname == test]


def workdir(tmp_path_factory, sub):
    base = os.environ.get("PGC_PORTABLE_REGRESS_DIR") or str(tmp_path_factory.mktemp("portable-regress"))
    work = os.path.join(base, sub)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return work


class Run:
    """One pg_regress (or pg_isolation_regress) run: its exit status, its
    output, and the diff of each test whose output differs."""

    def __init__(self, cmd, out, tests):
        log(f"$ {' '.join(cmd)}")
        r = subprocess.run(cmd, capture_output=True, text=True)
        self.rc, self.output = r.returncode, r.stdout + r.stderr
        log(self.output.rstrip())
        self.out, self.tests = out, tests
        self.diffs = {}
        path = os.path.join(out, "regression.diffs")
        text = open(path, encoding="utf-8", errors="replace").read() if os.path.exists(path) else ""
        # one section per test that differs, each from its `diff ... results/NAME.out` line
        for section in re.split(r"^(?=diff )", text, flags=re.M):
            m = re.match(r"diff .*/results/([^/\s]+)\.out\s*$", section.split("\n", 1)[0])
            if m:
                self.diffs[m.group(1)] = section
        if self.rc != 0 and not self.diffs:
            raise Failure(f"{os.path.basename(cmd[0])} failed (exit status {self.rc}) and no test's output "
                          f"differs:\n{self.output[-3000:]}")

    def check(self, name, what):
        check(name in self.tests, f"{what} {name} was not run")
        check(os.path.exists(os.path.join(self.out, "results", name + ".out")),
              f"{what} {name} left no output:\n{self.output[-3000:]}")
        check(name not in self.diffs, f"{what} {name}: the output differs from the expected one:\n{self.diffs.get(name)}")


def server(cluster):
    return [f"--bindir={cluster.bin}", f"--host={cluster.host}", f"--port={cluster.port}", "--user=postgres"]


@pytest.fixture(scope="module")
def environment(cluster):
    for var, value in (("PGC_PG_REGRESS", PG_REGRESS), ("PGC_PORTABLE_SQL", SQL_FILE), ("PGC_BIN", cluster.bin)):
        if not value:
            pytest.fail(f"{var} is not set (scripts/test portable sets it)")
    return cluster


@pytest.fixture(scope="module")
def regress_run(request, environment, databases, tmp_path_factory):
    """The selected pg_regress tests (0_setup first) in one pg_regress run."""
    tests = [SETUP] + [t for t in chosen(request, "test_regress") if t != SETUP]
    work = workdir(tmp_path_factory, "regress")
    for d in ("sql", "expected", "out"):
        os.makedirs(os.path.join(work, d))
    for t in tests:
        copy(t, work)
    subprocess.run(["chmod", "-R", "a+rwX", work], check=True)
    databases.adopt(REGRESS_DB)
    out = os.path.join(work, "out")
    return Run([PG_REGRESS] + server(environment) + [f"--inputdir={work}", f"--outputdir={out}",
                                                     f"--dbname={REGRESS_DB}"] + tests, out, tests)


@pytest.fixture(scope="module")
def isolation_run(request, environment, databases, tmp_path_factory):
    """The selected isolation specs in one pg_isolation_regress run, on a
    database where the portable file is installed."""
    specs = chosen(request, "test_isolation")
    work = workdir(tmp_path_factory, "isolation")
    for d in ("specs", "expected", "out"):
        os.makedirs(os.path.join(work, d))
    for t in specs:
        with open(os.path.join(ISOLATION_SRC, "specs", t + ".spec"), encoding="utf-8") as f:
            text = f.read().replace("CREATE EXTENSION IF NOT EXISTS pg_claim;", "SELECT 1;")
        with open(os.path.join(work, "specs", t + ".spec"), "w", encoding="utf-8") as f:
            f.write(text)
        shutil.copy(os.path.join(ISOLATION_SRC, "expected", t + ".out"), os.path.join(work, "expected"))
    subprocess.run(["chmod", "-R", "a+rwX", work], check=True)
    databases(ISOLATION_DB, extension=False)
    psql = [os.path.join(environment.bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-U", "postgres"]
    r = subprocess.run(psql + ["-d", ISOLATION_DB, "-c", "SET client_min_messages = warning", "-f", SQL_FILE],
                       capture_output=True, text=True, env=dict(os.environ, PGOPTIONS="-csearch_path=public"))
    check(r.returncode == 0, f"installing {SQL_FILE} into {ISOLATION_DB} failed:\n{r.stderr[-3000:]}")
    runner = PG_REGRESS.replace(os.path.join("regress", "pg_regress"),
                                os.path.join("isolation", "pg_isolation_regress"))
    out = os.path.join(work, "out")
    return Run([runner] + server(environment) + [f"--inputdir={work}", f"--outputdir={out}",
                                                 f"--dbname={ISOLATION_DB}", "--use-existing"] + specs, out, specs)


@pytest.mark.parametrize("name", REGRESS_TESTS)
def test_regress(name, regress_run):
    if name != SETUP:
        check(SETUP not in regress_run.diffs,
              f"the set-up {SETUP}'s output differs, so {name}'s cannot be trusted:\n{regress_run.diffs.get(SETUP)}")
    regress_run.check(name, "pg_regress test")


@pytest.mark.parametrize("name", ISOLATION_SPECS)
def test_isolation(name, isolation_run):
    isolation_run.check(name, "isolation spec")
