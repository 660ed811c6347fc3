"""The pooler tests' PgBouncer (the `pgbouncer` fixture: scripts/test's,
PGC_POOLER_PORT, or one of the session's own) and database."""
import pytest

from harness import connect

from .common import DB, check_pooler


@pytest.fixture(scope="session", autouse=True)
def pooler_database(pgbouncer, request):
    """PgBouncer checked (transaction mode, its pool) and the database made
    again, with pg_claim; dropped at the end when every test passed."""
    check_pooler()
    failed = request.session.testsfailed
    with connect("postgres", notices=False) as d:
        d.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        d.execute(f"CREATE DATABASE {DB}")
    with connect(DB) as d:
        d.execute("CREATE EXTENSION pg_claim")
    yield DB
    if request.session.testsfailed == failed:
        with connect("postgres", notices=False) as d:
            d.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
