"""The server of a test (pg_ctl as the postgres user) and PgBouncer."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading

import psycopg

from .core import Failure, poll
from .db import connect


def as_postgres(*cmd, check_rc=True):
    """cmd run as the postgres user; Failure on a non-zero exit (check_rc)."""
    r = subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        raise Failure(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-1500:]}")
    return r


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """A cluster of the test: its data directory, port and binaries (PGC_BIN
    by default). Its log is `log`, else server-NAME.log beside data-NAME, as
    scripts/lib.sh pgc_cluster_start names it."""

    def __init__(self, data, port, bin_dir=None, log=None):
        self.data, self.port = data, port
        self.bin = bin_dir or os.environ.get("PGC_BIN", "")
        head, base = os.path.split(data)
        self.log = log or os.path.join(head, "server-" + base[len("data-"):] + ".log" if base.startswith("data-")
                                       else base + ".log")

    def dsn(self, db="postgres"):
        return f"host=127.0.0.1 port={self.port} dbname={db} user=postgres connect_timeout=3"

    def connect(self, db="postgres", **kw):
        return psycopg.connect(self.dsn(db), autocommit=True, **kw)

    def pg_ctl(self, *args, check_rc=True):
        """pg_ctl -D data ARGS as the postgres user, waiting (60 s at most),
        without RUST_BACKTRACE in the server's environment."""
        if not self.bin:
            raise Failure("PGC_BIN is not set (scripts/test sets it)")
        return as_postgres("env", "-u", "RUST_BACKTRACE", f"{self.bin}/pg_ctl", "-D", self.data,
                           "-l", self.log, "-w", "-t", "60", *args, check_rc=check_rc)

    def restart(self, mode="fast"):
        self.pg_ctl("-m", mode, "restart")


class PgBouncer:
    """Debian's PgBouncer as the postgres user on a free loopback port in
    front of host:port, pool_mode = transaction with `pool` server
    connections per database and user (the configuration of scripts/lib.sh
    pgc_pgbouncer_start, its session-mode database pg_claim_session
    included). PgBouncer 1.18 has no max_prepared_statements: connect with
    prepare_threshold=None (pooled())."""

    def __init__(self, host, port, pool=4, workdir=None):
        self.port = free_port()
        self.pool = pool
        self.dir = tempfile.mkdtemp(prefix="pgbouncer-", dir=workdir)
        os.chmod(self.dir, 0o755)
        shutil.chown(self.dir, "postgres")
        ini = os.path.join(self.dir, "pgbouncer.ini")
        with open(os.path.join(self.dir, "userlist.txt"), "w") as f:
            f.write('"postgres" ""\n')
        with open(ini, "w") as f:
            f.write(f"""[databases]
* = host={host} port={port}
pg_claim_session = host={host} port={port} dbname=postgres pool_mode=session pool_size=2
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = {pool}
max_client_conn = 200
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
""")
        for f in os.listdir(self.dir):
            shutil.chown(os.path.join(self.dir, f), "postgres")
        as_postgres("/usr/sbin/pgbouncer", "-q", "-d", ini)
        poll(self._answers, 20, "PgBouncer to accept connections")

    def _answers(self):
        try:
            return self.admin("SHOW VERSION")
        except psycopg.Error:
            return None

    def pooled(self, dbname="postgres", **kw):
        return pooled(self.port, dbname, **kw)

    def admin(self, command):
        return admin(self.port, command)

    def stop(self):
        try:
            with open(os.path.join(self.dir, "pgbouncer.pid")) as f:
                pid = int(f.read().strip())
            os.kill(pid, signal.SIGTERM)
            poll(lambda: not os.path.exists(f"/proc/{pid}"), 10, "PgBouncer to exit")
        except (OSError, ValueError):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def pooled(port, dbname="postgres", **kw):
    """A client connection through the PgBouncer on 127.0.0.1:port (no
    server-side prepares)."""
    return psycopg.connect(host="127.0.0.1", port=port, dbname=dbname, user="postgres",
                           autocommit=True, prepare_threshold=None, **kw)


def admin(port, command):
    """A command of PgBouncer's admin console (simple protocol): its rows as dicts."""
    with psycopg.connect(host="127.0.0.1", port=port, dbname="pgbouncer", user="postgres", autocommit=True,
                         prepare_threshold=None, cursor_factory=psycopg.ClientCursor) as c:
        cur = c.execute(command)
        if cur.description is None:
            return []
        names = [col.name for col in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


class ServerConnections:
    """The server connections of database `db` behind the PgBouncer on
    127.0.0.1:port, sampled every 50 ms by a thread (which reconnects when
    the server or PgBouncer restarts): `max`, the most PgBouncer held at
    once (SHOW SERVERS), and `apps`, the application names the database's
    backends showed (PgBouncer passes on each client's), not counting the
    test's direct connections (application_name `direct_app`). (A count of
    pg_stat_activity can exceed the pool: a backend waiting on a lock when
    PgBouncer closed its connection, its client killed, lives on until the
    wait ends.)"""

    def __init__(self, db, port, direct_app):
        self.db, self.port, self.direct_app, self.max = db, port, direct_app, 0
        self.apps = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        m = None
        while not self._stop.is_set():
            try:
                m = m or connect("postgres", application_name=self.direct_app)
                servers = [r for r in admin(self.port, "SHOW SERVERS") if r["database"] == self.db]
                self.max = max(self.max, len(servers))
                self.apps.update(app for (app,) in m.execute(
                    "SELECT application_name FROM pg_stat_activity WHERE datname = %s"
                    " AND backend_type = 'client backend' AND application_name <> %s",
                    (self.db, self.direct_app)).fetchall())
            except psycopg.Error:
                m = None
            self._stop.wait(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join(5)
