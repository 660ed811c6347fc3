"""The fixtures of pg_claim's Python tests (scripts/test runs them with pytest,
against the cluster it started: PGHOST, PGPORT and PGUSER, PGC_BIN its
binaries, PGC_DATA or FAULTS_DATA its data directory, PGC_POOLER_PORT the
PgBouncer in front of it). The helpers they use are in harness/."""
import os
import shutil
import signal
import sys
import tempfile

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(TESTS, "pylib"))

from harness import Failure, PgBouncer, Server, connect, quiet, stop_all  # noqa: E402
from harness.server import admin, pooled  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("pg_claim")
    g.addoption("--seed", type=int, default=None, help="the seed of a random test (default: a random one)")
    g.addoption("--calls", type=int, default=None, help="hostile: the random caller's number of calls")
    g.addoption("--seconds", type=float, default=None, help="hostile: run the random caller for S seconds")
    g.addoption("--server-log", default=None, help="the server's log file (default: found from data_directory)")
    g.addoption("--check-doc", default=None, metavar="FILE", help="hostile: FILE's tables must be this run's")
    g.addoption("--update-doc", default=None, metavar="FILE", help="hostile: write this run's tables into FILE")
    g.addoption("--soak", type=float, default=None, metavar="MINUTES", help="faults: random faults for MINUTES")
    g.addoption("--doc", action="append", metavar="FILE", help="docs: the examples of FILE only (repeatable)")
    g.addoption("--keep", action="store_true", help="docs: leave the databases")


class Cluster:
    """The test server: host, port, its data directory and binaries, and a
    Server for pg_ctl (restart) when the data directory is known."""

    def __init__(self):
        self.host = os.environ.get("PGHOST", "")
        self.port = int(os.environ.get("PGPORT", "5432"))
        self.bin = os.environ.get("PGC_BIN", "")
        self.data = os.environ.get("PGC_DATA") or os.environ.get("FAULTS_DATA") or None
        self.server = Server(self.data, self.port, self.bin) if self.data else None

    def connect(self, dbname="postgres", **kw):
        return connect(dbname, **kw)

    def restart(self, mode="fast"):
        if self.server is None:
            pytest.fail("the cluster's data directory is unknown (PGC_DATA; scripts/test sets it)")
        self.server.restart(mode)


@pytest.fixture(scope="session")
def cluster():
    return Cluster()


class Pooler:
    """The PgBouncer of scripts/test (PGC_POOLER_PORT, PGC_POOLER_POOL), or
    one started for the session in front of the cluster."""

    def __init__(self, cluster):
        self.own = None
        if "PGC_POOLER_PORT" in os.environ:
            self.port = int(os.environ["PGC_POOLER_PORT"])
            self.pool = int(os.environ.get("PGC_POOLER_POOL", "4"))
        else:
            self.own = PgBouncer(cluster.host, cluster.port, pool=4)
            self.port, self.pool = self.own.port, self.own.pool
            # for the helpers and the worker processes, as scripts/test exports them
            os.environ.update(PGC_POOLER_PORT=str(self.port), PGC_POOLER_POOL=str(self.pool))

    def pooled(self, dbname="postgres", **kw):
        return pooled(self.port, dbname, **kw)

    def admin(self, command):
        return admin(self.port, command)

    def stop(self):
        if self.own:
            self.own.stop()
            for k in ("PGC_POOLER_PORT", "PGC_POOLER_POOL"):
                os.environ.pop(k, None)


@pytest.fixture(scope="session")
def pgbouncer(cluster):
    p = Pooler(cluster)
    yield p
    p.stop()


def module_failed(request):
    return request.session.testsfailed > request.node.stash.get(_failed_before, 0)


_failed_before = pytest.StashKey[int]()


@pytest.fixture(scope="module", autouse=True)
def _time_limit(request):
    """A module's TIME_LIMIT_S bounds it: a Failure in whatever runs when
    the alarm goes off, and at SIGTERM."""
    request.node.stash[_failed_before] = request.session.testsfailed
    limit = getattr(request.module, "TIME_LIMIT_S", None)
    if not limit:
        yield
        return

    def on_alarm(*_):
        raise Failure(f"{request.module.__name__} did not finish within {limit} s")

    def on_term(signum, _):
        raise Failure(f"stopped by signal {signum}")
    old = signal.signal(signal.SIGALRM, on_alarm), signal.signal(signal.SIGTERM, on_term)
    signal.alarm(int(limit))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old[0])
        signal.signal(signal.SIGTERM, old[1])


@pytest.fixture(scope="module")
def workdir(request):
    """A fresh directory for the module's worker processes (their stderr
    files, *.err); after a failure, the tail of each non-empty one is shown."""
    d = tempfile.mkdtemp(prefix="pg_claim-test-")
    os.chmod(d, 0o755)
    yield d
    if module_failed(request):
        for f in sorted(os.listdir(d)):
            path = os.path.join(d, f)
            if f.endswith(".err") and os.path.getsize(path):
                sys.stderr.write(f"--- stderr of {f[:-4]}:\n{open(path, errors='replace').read()[-3000:]}\n")
    shutil.rmtree(d, ignore_errors=True)


class Databases:
    """databases(NAME, extension=True): NAME dropped and created again (with
    pg_claim); databases.adopt(NAME): one the tests make themselves. Every
    one is dropped after the module when its tests passed, and kept for
    inspection otherwise."""

    def __init__(self):
        self.made = []

    def __call__(self, name, extension=True):
        with connect("postgres", notices=False) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {name}")
        self.adopt(name)
        if extension:
            with connect(name) as c:
                c.execute("CREATE EXTENSION pg_claim")
        return name

    def adopt(self, name):
        if name not in self.made:
            self.made.append(name)
        return name

    def drop(self):
        with connect("postgres", notices=False) as c:
            for name in self.made:
                c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def databases(request):
    d = Databases()
    yield d
    if not module_failed(request):
        d.drop()


@pytest.fixture(scope="session")
def roles():
    """roles(conn, {NAME: OPTIONS}): each role dropped if it exists and
    created with its options (CREATE ROLE NAME OPTIONS), in order, on conn's
    server; dropped again at the end of the run (after the fixtures that
    asked for this one: the databases they own must be gone by then)."""
    made = []

    def make(conn, spec):
        for name in reversed(list(spec)):
            conn.execute(f"DROP ROLE IF EXISTS {name}")
        for name, options in spec.items():
            conn.execute(f"CREATE ROLE {name} {options}")
            made.append((conn.info.dsn, name))
        return list(spec)
    yield make
    for dsn, name in reversed(made):
        with quiet(connect(conninfo=dsn)) as c:
            c.execute(f"DROP ROLE IF EXISTS {name}")


class Fleet:
    """The worker processes (harness.WorkerProcess) a module started: add
    each as it starts; every one still running is stopped after the module
    (stop() earlier, kill=True for SIGKILL)."""

    def __init__(self):
        self.workers = []

    def add(self, w):
        self.workers.append(w)
        return w

    def stop(self, within=5, kill=False):
        stop_all(self.workers, within, kill)


@pytest.fixture(scope="module")
def fleet():
    f = Fleet()
    yield f
    f.stop()
