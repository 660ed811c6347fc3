"""The fault test's servers (tests/faults): the layer's cluster, the
standbys made for failover, the libpq service file through which the
workers find the current primary, and the partition: a proxy in a network
namespace behind a veth pair. The settings of the fleet."""
import os
import signal
import subprocess
import sys
import time

import harness
from harness import as_postgres, check, free_port, poll

HERE = os.path.dirname(os.path.abspath(__file__))
DB = "pg_claim_faults"
N = 4
SESSION_WORKERS = 6  # 4 holders + 2 standbys
LEASE_WORKERS = 6
ELASTIC_WORKERS = 3  # fewer than the slots: one holds 2
MODES = ("session", "lease", "elastic")
TABLES = tuple(f"items_{m}" for m in MODES)
TTL_S = 3.0  # the workers claim every ttl / 3
BATCH = 20
ITEM_MS = 1
PRODUCE_PER_S = 150  # items per table and second
# every worker's session: a holder frozen inside its fenced transaction would
# otherwise block the takeover of its slot for as long as it is frozen
IDLE_IN_TX_S = 3
WORKER_OPTIONS = f"-c idle_in_transaction_session_timeout={IDLE_IN_TX_S}s"
SERVICE = "pg_claim_faults"  # the workers' libpq service: the current primary
# the production settings docs/reliability.md recommends, as session options
RECOMMENDED = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5",
               "tcp_keepalives_count": "3", "tcp_user_timeout": "20000"}
CLIENT_RECOMMENDED = "keepalives=1 keepalives_idle=10 keepalives_interval=5 keepalives_count=3 tcp_user_timeout=20000"
PGC_BIN = os.environ.get("PGC_BIN", "")
DATA0 = os.environ.get("FAULTS_DATA", "")


T_START = time.monotonic()


def log(msg):
    """A progress line with the seconds since the start."""
    harness.log(f"[{time.monotonic() - T_START:5.1f}] {msg}")


# --------------------------------------------------------------------------
# The server: the cluster of the layer, and the standbys made for failover.

class Server(harness.Server):
    """A server of the fault test: the layer's cluster or a standby, its log
    beside its data directory."""

    def __init__(self, data, port):
        super().__init__(data, port, PGC_BIN, log=f"{data}.log")

    def dsn(self, db=DB):
        return super().dsn(db)

    def connect(self, db=DB, **kw):
        return harness.connect(conninfo=self.dsn(db), application_name="faults driver", **kw)


class Cluster:
    """The current primary, found by workers through the service file (libpq's
    PGSERVICEFILE, read at every connection); standbys made with pg_basebackup."""

    def __init__(self, workdir):
        port = int(os.environ["PGPORT"])
        self.primary = Server(DATA0, port)
        self.service_file = os.path.join(workdir, "pg_service.conf")
        self.target_file = os.path.join(workdir, "server.target")  # for the proxy: "host port"
        self.standbys = []  # standbys made and not promoted (a failed run), removed at the end
        self.generation = 0
        self.publish()

    def publish(self):
        service = (f"[{SERVICE}]\nhost=127.0.0.1\nport={self.primary.port}\ndbname={DB}\nuser=postgres\n"
                   f"options={WORKER_OPTIONS}\n")
        for path, text in ((self.service_file, service),
                           (self.target_file, f"{NET.host_addr if NET else '127.0.0.1'} {self.primary.port}")):
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(path + ".tmp", path)

    def connect(self, **kw):
        return self.primary.connect(**kw)

    def make_standby(self):
        self.generation += 1
        data = f"{DATA0}-standby{self.generation}"
        subprocess.run(["rm", "-rf", data], check=True)
        port = free_port()
        as_postgres(f"{PGC_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port),
                    "-U", "postgres", "-D", data, "-R", "-X", "stream", "-c", "fast")
        with open(os.path.join(data, "postgresql.auto.conf"), "a", encoding="utf-8") as f:
            f.write(f"port = {port}\n")
        standby = Server(data, port)
        self.standbys.append(data)
        standby.pg_ctl("start")
        with self.connect() as c:  # streaming from the primary
            poll(lambda: c.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
                 .fetchone()[0] > 0, 30, "the standby to stream")
        return standby

    def failover(self, standby):
        """Stop the primary hard, promote the standby, point the fleet at it."""
        self.primary.pg_ctl("-m", "immediate", "stop")
        standby.pg_ctl("promote")
        self.standbys.remove(standby.data)
        if self.primary.data != DATA0:  # the layer's own cluster is its script's to remove
            subprocess.run(["rm", "-rf", self.primary.data, self.primary.data + ".log"])
        self.primary = standby
        self.publish()

    def cleanup(self):
        for d in [self.primary.data] + self.standbys:
            if os.path.exists(os.path.join(d, "postmaster.pid")):
                Server(d, 0).pg_ctl("-m", "immediate", "stop", check_rc=False)
        for d in self.standbys:
            subprocess.run(["rm", "-rf", d, d + ".log"])
        if self.primary.data != DATA0:
            subprocess.run(["rm", "-rf", self.primary.data, self.primary.data + ".log"])
        # the first cluster's data directory is its script's to remove (pgc_cleanup)
        subprocess.run(["rm", "-f", DATA0 + ".log"])


# --------------------------------------------------------------------------
# The partition: a proxy in a network namespace behind a veth pair.

class Net:
    def __init__(self, workdir):
        tag = os.getpid() % 10000
        self.ns, self.veth, self.peer = f"pgc-faults-{tag}", f"pgcf{tag}a", f"pgcf{tag}b"
        sub = 16 + os.getpid() % 200
        self.host_addr, self.ns_addr = f"10.213.{sub}.1", f"10.213.{sub}.2"
        self.subnet = f"10.213.{sub}.0/30"
        self.proxy_port = 5432
        self.proxy = None
        self.workdir = workdir

    def ip(self, *args, ns=False):
        cmd = (["ip", "netns", "exec", self.ns, "ip"] if ns else ["ip"]) + list(args)
        subprocess.run(cmd, check=True, capture_output=True)

    def up(self):
        self.down()
        subprocess.run(["ip", "netns", "add", self.ns], check=True, capture_output=True)
        self.ip("link", "add", self.veth, "type", "veth", "peer", "name", self.peer)
        self.ip("link", "set", self.peer, "netns", self.ns)
        self.ip("addr", "add", f"{self.host_addr}/30", "dev", self.veth)
        self.ip("link", "set", self.veth, "up")
        self.ip("addr", "add", f"{self.ns_addr}/30", "dev", self.peer, ns=True)
        self.ip("link", "set", self.peer, "up", ns=True)
        self.ip("link", "set", "lo", "up", ns=True)

    def start_proxy(self, target_file):
        self.proxy = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", "ip", "netns", "exec", self.ns, sys.executable, os.path.join(HERE, "proxy.py"),
             self.ns_addr, str(self.proxy_port), target_file],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.workdir, "proxy.err"), "w"), text=True)
        check(self.proxy.stdout.readline().strip() == "listening", "the proxy did not start")

    def dsn(self, extra=""):
        return (f"host={self.ns_addr} port={self.proxy_port} dbname={DB} user=postgres"
                f" connect_timeout=3 {extra}")

    def partition(self):
        self.proxy.send_signal(signal.SIGUSR1)
        self.ip("link", "set", self.peer, "down", ns=True)

    def heal(self):
        self.ip("link", "set", self.peer, "up", ns=True)
        self.proxy.send_signal(signal.SIGUSR2)

    def down(self):
        if self.proxy and self.proxy.poll() is None:
            self.proxy.kill()
            self.proxy.wait()
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


NET = None
