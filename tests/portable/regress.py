#!/usr/bin/env python3
"""The pg_regress tests of tests/pg_regress that apply to the portable edition
(tests/portable/regress.txt), run unchanged against it through pg_regress,
then the isolation specs of tests/isolation listed in
tests/portable/isolation.txt through pg_isolation_regress:

    tests/portable/regress.py PG_REGRESS BINDIR WORKDIR PORTABLE_SQL [TEST...]

Each test and its expected output are copied into WORKDIR with two changes
made to both alike: the test's own CREATE EXTENSION becomes a comment (the
set-up test 0_setup installs the portable file instead, as the superuser
pg_regress connects as), and psql is told not to print the CONTEXT lines of
errors (\\set SHOW_CONTEXT never): PL/pgSQL adds them where the extension's C
functions have none (docs/portable.md). Everything else must be identical.
The isolation specs run on a database where the portable file is installed
first (as the superuser, in public); their own CREATE EXTENSION becomes a
SELECT, and their expected outputs are the extension's, unchanged.
PGHOST and PGPORT name the portable server.
"""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "pg_regress")


def selected(name="regress.txt"):
    with open(os.path.join(ROOT, "tests", "portable", name), encoding="utf-8") as f:
        return [l.split("#")[0].strip() for l in f if l.split("#")[0].strip()]


def copy(name, work, portable_sql):
    for kind, ext in (("sql", ".sql"), ("expected", ".out")):
        with open(os.path.join(SRC, kind, name + ext), encoding="utf-8") as f:
            text = f.read()
        text = text.replace("CREATE EXTENSION IF NOT EXISTS pg_claim;\n",
                            "-- (the portable edition, installed by 0_setup)\n")
        if name == "0_setup":
            text = text.replace("-- (the portable edition, installed by 0_setup)\n",
                                "\\set ECHO none\n" + (f"\\i {portable_sql}\n\\set ECHO all\n" if kind == "sql" else ""))
        text = "\\set SHOW_CONTEXT never\n" + text
        with open(os.path.join(work, kind, name + ext), "w", encoding="utf-8") as f:
            f.write(text)


def main():
    pg_regress, bindir, work, portable_sql, *tests = sys.argv[1:]
    tests = tests or selected()
    if "0_setup" not in tests:
        tests.insert(0, "0_setup")
    shutil.rmtree(work, ignore_errors=True)
    for d in ("sql", "expected", "out"):
        os.makedirs(os.path.join(work, d))
    for t in tests:
        copy(t, work, portable_sql)
    os.system(f"chmod -R a+rwX {work}")
    server = [f"--bindir={bindir}", f"--host={os.environ['PGHOST']}", f"--port={os.environ['PGPORT']}",
              "--user=postgres"]
    r = subprocess.run([pg_regress] + server + [f"--inputdir={work}", f"--outputdir={os.path.join(work, 'out')}",
                                                "--dbname=pg_claim_portable_regress"] + tests)
    if r.returncode != 0:
        with open(os.path.join(work, "out", "regression.diffs"), encoding="utf-8") as f:
            sys.stderr.write(f.read())
        return r.returncode
    if len(sys.argv) > 5:
        return 0  # pg_regress tests named: those only
    return isolation(pg_regress, server, bindir, os.path.join(work, "isolation"), portable_sql)


def isolation(pg_regress, server, bindir, work, portable_sql):
    src = os.path.join(ROOT, "tests", "isolation")
    for d in ("specs", "expected", "out"):
        os.makedirs(os.path.join(work, d))
    specs = selected("isolation.txt")
    for t in specs:
        with open(os.path.join(src, "specs", t + ".spec"), encoding="utf-8") as f:
            text = f.read().replace("CREATE EXTENSION IF NOT EXISTS pg_claim;", "SELECT 1;")
        with open(os.path.join(work, "specs", t + ".spec"), "w", encoding="utf-8") as f:
            f.write(text)
        shutil.copy(os.path.join(src, "expected", t + ".out"), os.path.join(work, "expected"))
    os.system(f"chmod -R a+rwX {work}")
    db = "pg_claim_portable_isolation"
    psql = [os.path.join(bindir, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-U", "postgres"]
    subprocess.run(psql + ["-d", "postgres", "-c", f"DROP DATABASE IF EXISTS {db}", "-c", f"CREATE DATABASE {db}"],
                   check=True)
    subprocess.run(psql + ["-d", db, "-c", "SET client_min_messages = warning", "-f", portable_sql],
                   check=True, env=dict(os.environ, PGOPTIONS="-csearch_path=public"))
    runner = pg_regress.replace(os.path.join("regress", "pg_regress"),
                                os.path.join("isolation", "pg_isolation_regress"))
    r = subprocess.run([runner] + server + [f"--inputdir={work}", f"--outputdir={os.path.join(work, 'out')}",
                                            f"--dbname={db}", "--use-existing"] + specs)
    if r.returncode != 0:
        with open(os.path.join(work, "out", "regression.diffs"), encoding="utf-8") as f:
            sys.stderr.write(f.read())
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
