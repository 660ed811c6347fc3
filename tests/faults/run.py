#!/usr/bin/env python3
"""pg_claim under faults: a fleet drains three tables while the server, the
network and the workers fail, and a checker reads what was written.

    tests/faults/run.py                 every fault once, each checked (the
                                        scripts/test layer "faults")
    tests/faults/run.py --soak MINUTES  faults chosen at random for MINUTES,
                                        then one summary line (scripts/soak)

Needs a running cluster with pg_claim available (PGHOST/PGPORT of
scripts/lib.sh pgc_cluster_start, FAULTS_DATA its data directory, PGC_BIN
its binaries), run as root: the driver stops, starts, kills and fails the
server over (as the postgres user), and builds a network namespace for the
partition. The cluster must listen on every address (listen_addresses = '*');
the driver admits the namespace's subnet in pg_hba.conf.

The fleet (tests/faults/worker.py: pg_claim.Worker processes of the Python
worker library, on real TCP connections): session-mode workers (one slot
each, claim_slots; the token from my_token) on table items_session and
lease-mode workers (one slot each, claim_leases) on items_lease, each n = 4
with more workers than slots, and lease-mode workers with every slot of
their share (3 workers for 4 slots: "elastic") on items_elastic; each batch
is handled inside a transaction that passed the slot's fence (session mode:
the session's lock), writing a row per item in processing_log. A producer
adds items all along; at the end it stops and the fleet drains. Workers find
the server through a libpq service file, which the driver rewrites after a
failover.

The checker (check_log) counts, from processing_log and the tables:
- duplicates: items with more than one log row;
- lost: items not done, or done without a log row;
- overlapping holds: for a slot of a table, a write (log row) carrying a
  token smaller than a token already written for that slot by an earlier
  write: an older holder wrote after a newer one had taken over. Together
  with the holder history (lease_holders sampled all along: a slot's token
  never goes back), this is "never two live holders of a slot at once" as
  the writes can see it.

For each fault it prints the time from the fault until the share moves
again: until every affected slot has a new write. Exits non-zero on any
failed check. Every wait polls with a deadline; no timing is asserted.
"""
import argparse
import collections
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "pylib"))
from fleet_driver import Failure, WorkerProcess, check, poll  # noqa: E402
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
    print(f"[{time.monotonic() - T_START:5.1f}] {msg}", flush=True)


def as_postgres(*cmd, check_rc=True):
    r = subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        raise Failure(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-1500:]}")
    return r


# --------------------------------------------------------------------------
# The server: the cluster of the layer, and the standbys made for failover.

class Server:
    def __init__(self, data, port):
        self.data, self.port = data, port

    def dsn(self, db=DB):
        return f"host=127.0.0.1 port={self.port} dbname={db} user=postgres connect_timeout=3"

    def connect(self, db=DB, **kw):
        return psycopg.connect(self.dsn(db), autocommit=True, application_name="faults driver", **kw)

    def pg_ctl(self, *args, check_rc=True):
        return as_postgres("env", "-u", "RUST_BACKTRACE", f"{PGC_BIN}/pg_ctl", "-D", self.data,
                           "-l", f"{self.data}.log", "-w", "-t", "60", *args, check_rc=check_rc)


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


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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


# --------------------------------------------------------------------------
# The fleet

class Worker(WorkerProcess):
    def __init__(self, mode, workdir, service_file, lifetime, conninfo=None, holder=None, item_ms=ITEM_MS):
        self.mode = mode
        env = dict(os.environ, PGSERVICEFILE=service_file, FAULT_MODE=mode, FAULT_N=str(N),
                   FAULT_CONNINFO=conninfo or f"service={SERVICE} connect_timeout=3",
                   FAULT_NAME=f"fleet_{mode}", FAULT_TABLE=f"items_{mode}", FAULT_TTL_S=str(TTL_S),
                   FAULT_BATCH=str(BATCH), FAULT_ITEM_MS=str(item_ms),
                   FAULT_LIFETIME_S=str(lifetime), FAULT_HOLDER=holder or "")
        for k in ("PGHOST", "PGPORT", "PGSERVICE", "PGDATABASE", "PGUSER"):
            env.pop(k, None)
        super().__init__([sys.executable, os.path.join(HERE, "worker.py")], env,
                         os.path.join(workdir, f"{mode}-{len(os.listdir(workdir))}.err"))
        self.holder = holder or f"{mode}-{self.pid}"

    def claims(self):
        """{slot: (token, backend pid)} of its claims. Session mode: the
        server's view (slot_holders, the session named by the worker's
        application_name; token None), as a session's claims end with it
        unannounced. Lease modes: as it last reported them, with the pid of
        its last batch's backend (stale after a reconnection until its next
        batch)."""
        if self.mode == "session":
            return {slot: (None, pid) for slot, (holder, pid) in session_holders().items()
                    if holder == self.holder}
        e = self.last(("held",))
        if e is None:
            return {}
        pid = (self.last(("fetched",)) or {}).get("pid")
        return {slot: (token, pid) for slot, token in e["slots"]}

    def claim(self):
        """(slot, token, pid) of its one claim, or None (session and lease mode)."""
        c = self.claims()
        return next(((slot, token, pid) for slot, (token, pid) in c.items()), None)

    def __str__(self):
        return f"{self.mode} worker {self.pid}"

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.terminate()


class Fleet:
    def __init__(self, cluster, workdir, lifetime):
        self.cluster, self.workdir, self.lifetime = cluster, workdir, lifetime
        FLEET_CLUSTER[0] = cluster
        self.workers = []
        self.stop_event = threading.Event()
        self.producing = threading.Event()
        self.producing.set()
        self.history = collections.defaultdict(list)  # (name, slot) -> [(t, holder, token)]
        self.history_bad = []
        self.produced = 0
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._monitor, daemon=True)]

    def start_monitors(self):
        """The producer and the holder history."""
        for t in self.threads:
            t.start()

    def start(self, session=SESSION_WORKERS, lease=LEASE_WORKERS, elastic=ELASTIC_WORKERS):
        self.start_monitors()
        modes = ["session"] * session + ["lease"] * lease + ["elastic"] * elastic
        for m in sorted(modes, key=lambda m: random.random()):
            self.add(m)

    def add(self, mode, conninfo=None, **kw):
        w = Worker(mode, self.workdir, self.cluster.service_file, self.lifetime, conninfo=conninfo, **kw)
        self.workers.append(w)
        return w

    def _loop(self, body, period):
        """body(conn) every period seconds on a connection to the current primary, reconnecting."""
        conn = None
        while not self.stop_event.is_set():
            try:
                if conn is None or conn.closed:
                    conn = self.cluster.connect()
                body(conn)
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
            self.stop_event.wait(period)
        if conn is not None:
            conn.close()

    def _produce(self):
        period = 0.1
        k = max(1, int(PRODUCE_PER_S * period))

        def body(conn):
            if self.producing.is_set():
                for t in TABLES:
                    conn.execute(f"INSERT INTO {t} (done) SELECT false FROM generate_series(1, %s)", (k,))
                self.produced += len(TABLES) * k
        self._loop(body, period)

    def _monitor(self):
        """The holder history: every change of (holder, token) of every slot."""
        last = {}
        server = [None]

        def body(conn):
            if server[0] != conn.info.port:  # a failover: the new primary's history starts here
                server[0] = conn.info.port
                last.clear()
            rows = conn.execute(" UNION ALL ".join(
                f"SELECT 'fleet_{m}', slot, holder, token FROM lease_holders('fleet_{m}')" for m in MODES)).fetchall()
            now = time.time()
            for name, slot, holder, token in rows:
                key = (name, slot)
                if last.get(key) != (holder, token):
                    prev = last.get(key)
                    if prev is not None and token < prev[1]:
                        self.history_bad.append((key, prev, (holder, token)))
                    last[key] = (holder, token)
                    self.history[key].append((now, holder, token))
        self._loop(body, 0.05)

    def holders(self, mode):
        """{slot: worker} of the live claims the workers report."""
        out = {}
        if mode == "session":  # the server's view (Worker.claims), read once
            by_holder = {w.holder: w for w in self.workers if w.mode == mode and w.proc.poll() is None}
            return {slot: by_holder[h] for slot, (h, _) in session_holders().items() if h in by_holder}
        for w in self.workers:
            if w.mode == mode and w.proc.poll() is None:
                for slot in w.claims():
                    out[slot] = w
        return out

    def wait_full(self, timeout=60):
        def full():
            if all(len(self.holders(m)) == N for m in MODES):
                return True
            return False
        poll(full, timeout, f"every fleet to hold all {N} slots")

    def moved_since(self, t0, slots, timeout=90):
        """Seconds from t0 until every (table, slot) of slots has a write logged after t0."""
        def check_moved():
            try:
                with self.cluster.connect() as c:
                    rows = c.execute("SELECT tbl, slot, min(logged_at) FROM processing_log"
                                     " WHERE logged_at > to_timestamp(%s) GROUP BY 1, 2", (t0,)).fetchall()
            except psycopg.Error:
                return None
            got = {(tbl, slot): at.timestamp() for tbl, slot, at in rows}
            if all(s in got for s in slots):
                return max(got[s] for s in slots) - t0
            return None
        return poll(check_moved, timeout, f"the shares {sorted(slots)} to move again", interval=0.1)

    def stop(self):
        self.stop_event.set()
        for w in self.workers:
            w.stop()
        deadline = time.monotonic() + 5
        for w in self.workers:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        for t in self.threads:
            t.join(5)

    def errors(self):
        return [(str(w), e) for w in self.workers for e in w.events if e["event"] in ("error", "garbage")]


ALL_SLOTS = {(t, s) for t in TABLES for s in range(N)}


# --------------------------------------------------------------------------
# The checker

def check_log(conn, final=False):
    """{duplicates, lost, overlapping, items}: counts over the whole run. Before
    the final drain, items not done yet are pending, not lost."""
    (dups,) = conn.execute("SELECT count(*) FROM (SELECT 1 FROM processing_log GROUP BY tbl, item"
                           " HAVING count(*) > 1) x").fetchone()
    lost = 0
    items = 0
    for t in TABLES:
        (k, not_done, unlogged) = conn.execute(
            f"SELECT count(*), count(*) FILTER (WHERE NOT done), count(*) FILTER (WHERE NOT EXISTS"
            f" (SELECT 1 FROM processing_log l WHERE l.tbl = %s AND l.item = i.id)) FROM {t} i",
            (t,)).fetchone()
        items += k
        lost += max(not_done, unlogged) if final else unlogged - not_done
    (orphans,) = conn.execute("SELECT count(*) FROM processing_log l WHERE NOT EXISTS (" + " UNION ALL ".join(
        f"SELECT 1 FROM {t} i WHERE l.tbl = '{t}' AND i.id = l.item" for t in TABLES) + ")").fetchone()
    (overlap,) = conn.execute(
        "SELECT count(*) FROM (SELECT token, max(token) OVER (PARTITION BY tbl, slot ORDER BY id"
        " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS newest_before FROM processing_log) x"
        " WHERE token < newest_before").fetchone()
    return {"items": items, "duplicates": dups, "lost": lost + orphans, "overlapping": overlap}


def assert_clean(conn, fleet, what, final=False):
    c = check_log(conn, final)
    check(c["duplicates"] == 0 and c["lost"] == 0 and c["overlapping"] == 0 and not fleet.history_bad,
          f"{what}: {c}, holder history going back: {fleet.history_bad[:3]}")
    return c


def setup_db(cluster):
    with cluster.connect(db="postgres") as d:
        d.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        d.execute(f"CREATE DATABASE {DB}")
    with cluster.connect() as d:
        d.execute("CREATE EXTENSION pg_claim")
        d.execute("""
            CREATE TABLE items_session (id bigserial PRIMARY KEY, done boolean NOT NULL);
            CREATE TABLE items_lease (id bigserial PRIMARY KEY, done boolean NOT NULL);
            CREATE TABLE items_elastic (id bigserial PRIMARY KEY, done boolean NOT NULL);
            CREATE TABLE processing_log (id bigserial PRIMARY KEY, tbl text NOT NULL, item bigint NOT NULL,
                worker text NOT NULL, slot integer NOT NULL, token bigint NOT NULL,
                logged_at timestamptz NOT NULL DEFAULT clock_timestamp());
            CREATE INDEX ON processing_log (tbl, item);
            CREATE INDEX ON processing_log (logged_at);
        """)


def drain(fleet, timeout=120):
    """Stop producing; wait until every item is done. Seconds it took."""
    fleet.producing.clear()
    t0 = time.monotonic()

    def done():
        try:
            with fleet.cluster.connect() as c:
                return c.execute("SELECT " + " AND ".join(
                    f"NOT EXISTS (SELECT 1 FROM {t} WHERE NOT done)" for t in TABLES)).fetchone()[0]
        except psycopg.Error:
            return False
    poll(done, timeout, "every item to be done", interval=0.2)
    return time.monotonic() - t0


# --------------------------------------------------------------------------
# The faults. Each returns (what happened, seconds until the share moved).

def check_new_tokens(fleet, t0, what):
    """Tokens first seen after t0 (newly issued: a lease holder that reclaims its
    unexpired lease keeps its token) are greater than every token seen before.
    A session holder's new token is written at its first fenced batch, which
    can come after the fleet holds every slot again, and the holder history
    records it at its next poll: the new tokens are waited for (15 s)."""
    before = {tok for h in fleet.history.values() for (t, _, tok) in h if t <= t0}

    def issued():
        return {tok for h in list(fleet.history.values()) for (t, _, tok) in list(h) if t > t0} - before
    try:
        new = poll(issued, 15, f"tokens issued after the {what}")
    except Failure:
        new = set()
    check(new and min(new) > max(before, default=0),
          f"tokens issued after the {what}: {sorted(new)[:3]}, not all above {max(before, default=0)}")


def fault_restart(fleet, rng=None):
    """pg_ctl stop -m immediate mid-drain, then start: crash recovery."""
    t0 = time.time()
    fleet.cluster.primary.pg_ctl("-m", "immediate", "stop")
    fleet.cluster.primary.pg_ctl("start")
    moved = fleet.moved_since(t0, ALL_SLOTS)
    fleet.wait_full()
    check_new_tokens(fleet, t0, "restart")
    return "server stopped (immediate) and started: every session ends; workers reconnect, claim, finish", moved


def session_pid(slot, c=None):
    """The backend holding session slot `slot` (slot_holders), or None."""
    if c is None:
        with FLEET_CLUSTER[0].connect() as c:
            return session_pid(slot, c)
    r = c.execute("SELECT pid FROM slot_holders('fleet_session') WHERE slot = %s", (slot,)).fetchone()
    return r and r[0]


def session_holders():
    """{slot: (application_name, pid)} of the sessions holding slots of
    fleet_session (a worker's sessions are named by its holder); {} while
    the server cannot be reached."""
    try:
        with FLEET_CLUSTER[0].connect() as c:
            return {slot: (app, pid) for slot, app, pid in c.execute(
                "SELECT h.slot, a.application_name, h.pid FROM slot_holders('fleet_session') h"
                " JOIN pg_stat_activity a ON a.pid = h.pid").fetchall()}
    except psycopg.Error:
        return {}


FLEET_CLUSTER = [None]


def fault_backend_kill(fleet, rng=None):
    """SIGKILL one holder's backend: the postmaster resets every session."""
    slot = (rng or random).choice(sorted(fleet.holders("session")))
    pid = poll(lambda: session_pid(slot), 10, f"a backend to hold session slot {slot}")
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    moved = fleet.moved_since(t0, ALL_SLOTS)
    fleet.wait_full()
    check_new_tokens(fleet, t0, "reset")
    return f"SIGKILL of backend {pid}: the postmaster resets all sessions; the same recovery", moved


def fault_failover(fleet, rng=None):
    """A streaming replica promoted; the fleet moves to it."""
    standby = fleet.cluster.make_standby()
    t0 = time.time()
    fleet.cluster.failover(standby)
    moved = fleet.moved_since(t0, ALL_SLOTS)
    fleet.wait_full()
    # every token seen before the failover: valid on the new primary only if current
    seen = {(name, slot, tok) for (name, slot), h in fleet.history.items() for (t, _, tok) in h if t < t0}
    with fleet.cluster.connect() as c:
        # items_MODE -> fleet_MODE
        logged = c.execute("SELECT DISTINCT 'fleet_' || substr(tbl, 7), slot, token FROM processing_log"
                           " WHERE logged_at < to_timestamp(%s)", (t0,)).fetchall()
        seen |= set(logged)
        bad = []
        for name, slot, tok in seen:
            valid, current = c.execute(
                "SELECT lease_valid(%s, %s, %s), (SELECT token FROM lease_holders(%s) WHERE slot = %s)",
                (name, slot, tok, name, slot)).fetchone()
            if valid and tok != current:
                bad.append((name, slot, tok, current))
    check(not bad, f"old tokens valid on the new primary: {bad[:5]}")
    check_new_tokens(fleet, t0, "failover")
    return (f"primary stopped, replica promoted; {len(seen)} tokens of the old primary checked,"
            " none valid unless current"), moved


def freeze(fleet, rng, mode, where):
    """SIGSTOP a holder of `mode` whose backend then is `where` ('idle', 'idle in
    transaction' after its fence, None: either). (worker, slot, token, backend
    pid, state, t0)."""
    deadline = time.monotonic() + 40
    with fleet.cluster.connect() as c:
        while time.monotonic() < deadline:
            slot, w = rng.choice(sorted(fleet.holders(mode).items()))
            token, pid = w.claims().get(slot, (None, None))
            if mode == "session":  # the session holding the slot
                pid = session_pid(slot, c)
            if pid is None:
                time.sleep(0.05)
                continue
            t0 = time.time()
            os.kill(w.pid, signal.SIGSTOP)

            def settled():
                r = c.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                return ("gone", "") if r is None else (r if r[0] != "active" else None)
            state, query = poll(settled, 10, f"the frozen {mode} worker's backend to settle", interval=0.005)
            # inside the transaction: the library opens it with the fence in
            # one message, so a transaction idle is always past its fence
            fenced = state == "idle in transaction"
            if (state == "idle" or fenced) and where in (None, state):
                if mode != "elastic":
                    return w, slot, token, pid, state, t0
                # an elastic holder holds several slots: the slot of its batch in
                # progress (the one its transaction fenced), if it has one
                ev = w.last(("fetched", "wrote", "refused", "rejected"))
                if ev and ev["event"] == "fetched" and w.claims().get(ev["slot"], (None,))[0] == ev["token"]:
                    return w, ev["slot"], ev["token"], pid, state, t0
                if not fenced:
                    return w, slot, token, pid, state, t0
            os.kill(w.pid, signal.SIGCONT)
            time.sleep(rng.uniform(0, 0.03))
    raise Failure(f"could not freeze a {mode} holder {where} within 40 s")


def fault_sigstop(fleet, rng=None, mode=None, where=None):
    """A holder frozen with SIGSTOP (idle, or inside its fenced transaction), then resumed."""
    rng = rng or random
    mode = mode or rng.choice(MODES)
    w, slot, token, pid, state, t0 = freeze(fleet, rng, mode, where)
    since = len(w.events)
    name, tbl = f"fleet_{mode}", f"items_{mode}"

    def holder():
        with fleet.cluster.connect() as c:
            if mode == "session":
                r = c.execute("SELECT pid FROM slot_holders(%s) WHERE slot = %s", (name, slot)).fetchone()
                return r and r[0]
            r = c.execute("SELECT holder, token FROM lease_holders(%s) WHERE slot = %s AND NOT expired",
                          (name, slot)).fetchone()
            return r and r[1]
    mine = pid if mode == "session" else token
    if mode == "session" and state == "idle":
        # the backend is idle, not dead: the slot stays with the frozen worker
        deadline = t0 + 2 * TTL_S
        while time.time() < deadline:
            h = holder()
            check(h == pid, f"session slot {slot} of the frozen worker: holder {h}")
            time.sleep(0.2)
        tc = time.time()
        os.kill(w.pid, signal.SIGCONT)
        moved = fleet.moved_since(tc, {(tbl, slot)})
        check(slot in w.claims() and holder() == pid, f"{w} lost its session slot while frozen")
        return (f"session, frozen idle: slot {slot} kept through {2 * TTL_S:g} s; the same worker"
                f" writes again {moved:.2f} s after SIGCONT"), moved
    # anything else: the claim moves to a standby, after the lease's TTL or
    # after idle_in_transaction_session_timeout ends the frozen transaction
    poll(lambda: (lambda h: h is not None and h != mine)(holder()), IDLE_IN_TX_S + TTL_S + 20,
         f"a standby to take {mode} slot {slot} over from a worker frozen {state}")
    moved = fleet.moved_since(t0, {(tbl, slot)})
    os.kill(w.pid, signal.SIGCONT)
    try:
        # its session ended (its write refused, a reconnection), or its next
        # claim without the slot (an elastic worker may keep its other slots)
        # (frozen inside the transaction: its late write, or its commit, must fail)
        e = w.wait_for(lambda e: e["event"] in ("refused", "reconnecting")
                       or (state == "idle" and e["event"] == "held" and slot in e["lost"]),
                       since, 30, f"the loss of slot {slot}")
    except Failure as f:
        raise Failure(f"{f}; its last events: {w.events[-4:]}") from None
    # (session mode: the token of the refused write is the claim's my_token)
    check(e["event"] != "refused" or (e["slot"] == slot and (mode == "session" or e["token"] == token)),
          f"{w}: {e}")
    why = {"refused": f"its late write failed ({e.get('error')})",
           "reconnecting": f"its session was ended ({e.get('error')})"}.get(
               e["event"], "its next claim_leases call returned the slot no more")
    return f"{mode}, frozen {state}: slot {slot} taken over {moved:.2f} s after SIGSTOP; resumed: {why}", moved


def fault_worker_kill(fleet, rng=None):
    """SIGKILL of a holder process (not its backend): its slot is free at once (session) or after TTL."""
    rng = rng or random
    m = rng.choice(MODES)
    slot, w = rng.choice(sorted(fleet.holders(m).items()))
    t0 = time.time()
    os.kill(w.pid, signal.SIGKILL)
    moved = fleet.moved_since(t0, {(f"items_{m}", slot)})
    fleet.workers.remove(w)
    fleet.add(m)  # a replacement keeps the fleet's size
    return f"{m} worker SIGKILLed holding slot {slot}", moved


def fault_cancel(fleet, rng=None):
    """pg_cancel_backend of a random worker's backend: its statement fails, the worker reconnects."""
    rng = rng or random
    m = rng.choice(MODES)
    slot, w = rng.choice(sorted(fleet.holders(m).items()))
    pid = session_pid(slot) if m == "session" else w.claims().get(slot, (None, None))[1]
    t0 = time.time()
    with fleet.cluster.connect() as c:
        c.execute("SELECT pg_cancel_backend(%s)", (pid,))
    moved = fleet.moved_since(t0, {(f"items_{m}", slot)})
    return f"pg_cancel_backend of a {m} holder's backend", moved


# --------------------------------------------------------------------------
# The silent partition, with the defaults and with the recommended settings

def start_partition_workers(fleet):
    """Workers behind the proxy, started before the rest of the fleet so they hold slots."""
    conninfo = {"defaults": NET.dsn(f"options='{WORKER_OPTIONS}'"),
                "recommended": NET.dsn(CLIENT_RECOMMENDED + f" options='{WORKER_OPTIONS} "
                                       + " ".join(f"-c {k}={v}" for k, v in RECOMMENDED.items()) + "'")}
    ws = {
        # short batches: the session workers spend most of their time idle, outside a transaction
        "session/defaults": fleet.add("session", conninfo["defaults"]),
        "session/recommended": fleet.add("session", conninfo["recommended"]),
        # a slow batch (inside its fenced transaction): the partition cuts it
        # in the middle, so its write is late (the library gives it up, its
        # waits being bounded by the ttl, or the heal delivers it)
        "lease/defaults": fleet.add("lease", conninfo["defaults"], item_ms=40),
    }
    for w in ws.values():
        w.wait_for(lambda e: e["event"] == "held" and e["slots"], 0, 30, "a claim")
    return ws


def fault_partition(fleet, ws, out):
    sd, sr, ld = ws["session/defaults"], ws["session/recommended"], ws["lease/defaults"]
    for w in (sd, sr, ld):
        check(w.claim() is not None, f"{w} behind the proxy holds no claim")
    (sd_slot, _, _), (sr_slot, _, _), (ld_slot, ld_token, _) = sd.claim(), sr.claim(), ld.claim()
    sd_pid, sr_pid = session_pid(sd_slot), session_pid(sr_slot)
    check(sd_pid and sr_pid, f"session slots {sd_slot} and {sr_slot} have no holding backend")
    # cut the lease worker's batch in the middle, at a moment when both session
    # workers' backends are idle (not inside a transaction, which
    # idle_in_transaction_session_timeout would end first)
    with fleet.cluster.connect() as c:
        for attempt in range(40):
            since = len(ld.events)
            ld.wait_event(("fetched",), since, 20)
            ld_since = len(ld.events)
            t0 = time.time()
            NET.partition()

            def settled():
                r = c.execute("SELECT array_agg(state) FILTER (WHERE state <> 'idle'),"
                              " bool_or(state = 'active') FROM pg_stat_activity WHERE pid IN (%s, %s)",
                              (sd_pid, sr_pid)).fetchone()
                return r if not r[1] else None
            busy, _ = poll(settled, 10, "the cut backends to settle", interval=0.005)
            if not busy:
                break
            NET.heal()  # one of them was inside a transaction: again
            time.sleep(0.5)
        else:
            raise Failure("could not cut the session workers while idle")
    log(f"  partition at t = 0: proxy silent and link down (session slots {sd_slot} with the defaults,"
        f" {sr_slot} with the recommended settings, both idle; lease slot {ld_slot} in the middle of a batch)")
    def lease_taken():
        with fleet.cluster.connect() as c:
            r = c.execute("SELECT holder, token FROM lease_holders('fleet_lease') WHERE slot = %s"
                          " AND NOT expired", (ld_slot,)).fetchone()
        return r if r and r[1] != ld_token else None
    poll(lease_taken, TTL_S + 20, "a standby to take the partitioned lease over")
    lease_moved = fleet.moved_since(t0, {("items_lease", ld_slot)})
    log(f"  lease (ttl {TTL_S:g} s): taken over by a standby, share moving {lease_moved:.2f} s after the cut")

    def freed(pid, slot):
        with fleet.cluster.connect() as c:
            r = c.execute("SELECT pid FROM slot_holders('fleet_session') WHERE slot = %s", (slot,)).fetchone()
        return r is None or r[0] != pid
    poll(lambda: freed(sr_pid, sr_slot), 60, "the server to free the slot of the partitioned worker"
         " with the recommended keepalive settings")
    sr_freed = time.time() - t0
    sr_moved = fleet.moved_since(t0, {("items_session", sr_slot)})
    held = not freed(sd_pid, sd_slot)
    held_for = time.time() - t0
    check(held, "the slot of the partitioned session worker with the default settings was freed"
          f" within {held_for:.1f} s")
    log(f"  session, recommended settings: the server ended the session and freed slot {sr_slot}"
        f" {sr_freed:.1f} s after the cut; share moving {sr_moved:.1f} s after it")
    log(f"  session, defaults: slot {sd_slot} still held by the cut session {held_for:.1f} s after the cut"
        " (the kernel's keepalive default: 2 hours idle)")
    th = time.time()
    NET.heal()
    e = ld.wait_event(("refused", "wrote"), ld_since, 60)
    check(e["event"] == "refused" and e["token"] == ld_token,
          f"the partitioned lease worker's late write was not refused: {e}, {ld.events[ld_since:]}")
    # the library bounds each reply by the ttl (a deadline, tcp_user_timeout):
    # its write fails during the partition already, or at the heal
    check(e["t"] > t0, f"the partitioned lease worker's write was refused {t0 - e['t']:.2f} s before the cut")
    with fleet.cluster.connect() as c:
        try:
            with c.transaction():
                c.execute("SELECT fence('fleet_lease', %s, %s)", (ld_slot, ld_token))
            raise Failure(f"fence passed the partitioned lease worker's token {ld_token}")
        except psycopg.Error as ex:
            check(ex.sqlstate == "PC001", f"fence on the partitioned worker's token: {ex.sqlstate} {ex}")
    log(f"  the lease worker's late write of {e['items']} items refused {e['t'] - t0:.2f} s after the cut"
        f" ({e['error']}); after the heal its token fails fence (PC001)")
    # the default-settings session worker is still the holder: its writes go on
    moved_sd = fleet.moved_since(th, {("items_session", sd_slot)})
    check(sd.claim() is not None and sd.claim()[0] == sd_slot, f"{sd} no longer holds slot {sd_slot}")
    log(f"  heal: the default-settings session worker, still the holder, writes again"
        f" {moved_sd:.2f} s after the heal")
    out["partition, lease (ttl 3 s)"] = ("lease expires; a standby takes over; the late write fails"
                                          " (the library's reply deadline, or its ended session)", lease_moved)
    out["partition, session, recommended keepalives"] = (
        "server ends the session after tcp_user_timeout/keepalives; a standby takes the slot", sr_moved)
    out["partition, session, defaults"] = (
        f"slot kept by the cut session ({held_for:.0f} s and more, up to ~2 h of kernel keepalive);"
        " it works again after the heal", None)


# --------------------------------------------------------------------------
# Cancels, timeouts and the lock table: nothing half-made left behind

def advisory_locks(c, pid):
    return c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
                     (pid,)).fetchone()[0]


def expect_error(conn, sql, args, states, what):
    try:
        conn.execute(sql, args)
    except psycopg.Error as e:
        check(e.sqlstate in states, f"{what}: SQLSTATE {e.sqlstate} ({e}), expected {states}")
        return e
    raise Failure(f"{what}: no error")


def cancels_and_timeouts(cluster):
    results = []
    with cluster.connect() as obs, cluster.connect() as holder, cluster.connect() as victim:
        vpid = victim.info.backend_pid

        def cancel_soon(pid, waiting_for):
            def go():
                poll(lambda: obs.execute("SELECT wait_event_type IS NOT NULL AND state = 'active'"
                                         " FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0],
                     10, waiting_for, interval=0.01)
                obs.execute("SELECT pg_cancel_backend(%s)", (pid,))
            t = threading.Thread(target=go)
            t.start()
            return t

        # claim_slot: a standby waiting for a held slot
        check(holder.execute("SELECT claim_slot('cx', 1)").fetchone()[0] == 0, "holder's claim_slot")
        for how in ("pg_cancel_backend", "statement_timeout"):
            if how == "statement_timeout":
                victim.execute("SET statement_timeout = '300ms'")
                t = None
            else:
                t = cancel_soon(vpid, "claim_slot to wait")
            expect_error(victim, "SELECT claim_slot('cx', 1, '30 s')", (), {"57014"}, f"claim_slot, {how}")
            if t:
                t.join()
            victim.execute("RESET statement_timeout")
            check(advisory_locks(obs, vpid) == 0, f"claim_slot cancelled ({how}) left advisory locks")
            check(victim.execute("SELECT my_slot('cx')").fetchone()[0] is None, "my_slot after cancel")
            results.append(f"claim_slot waiting, {how}: 57014, no lock left")
        holder.execute("SELECT release_slot('cx')")
        check(victim.execute("SELECT claim_slot('cx', 1)").fetchone()[0] == 0, "claim after the cancels")
        victim.execute("SELECT release_slot('cx')")

        # claim_lease: waiting for the name's lease mutex held by an open transaction
        holder.execute("BEGIN")
        check(holder.execute("SELECT slot FROM claim_lease('lx', 1, 'h')").fetchone() == (0,), "h's lease")
        for how in ("pg_cancel_backend", "statement_timeout"):
            t = None
            if how == "statement_timeout":
                victim.execute("SET statement_timeout = '300ms'")
            else:
                t = cancel_soon(vpid, "claim_lease to wait")
            expect_error(victim, "SELECT * FROM claim_lease('lx', 2, 'v')", (), {"57014"}, f"claim_lease, {how}")
            if t:
                t.join()
            victim.execute("RESET statement_timeout")
            check(advisory_locks(obs, vpid) == 0, f"claim_lease cancelled ({how}) left a lock")
            results.append(f"claim_lease waiting, {how}: 57014, no row, no lock left")
        holder.execute("COMMIT")
        rows = obs.execute("SELECT slot, holder FROM lease_holders('lx')").fetchall()
        check(rows == [(0, "h")], f"lease rows after the cancelled claims: {rows}")

        # my_items: waiting for a table lock
        obs.execute("CREATE TABLE IF NOT EXISTS cancel_items (id bigint PRIMARY KEY)")
        obs.execute("INSERT INTO cancel_items SELECT generate_series(1, 100) ON CONFLICT DO NOTHING")
        for how in ("pg_cancel_backend", "statement_timeout"):
            holder.execute("BEGIN")
            holder.execute("LOCK TABLE cancel_items IN ACCESS EXCLUSIVE MODE")
            t = None
            if how == "statement_timeout":
                victim.execute("SET statement_timeout = '300ms'")
            else:
                t = cancel_soon(vpid, "my_items to wait")
            expect_error(victim, "SELECT count(*) FROM my_items(NULL::cancel_items, 0, 4)", (), {"57014"},
                         f"my_items, {how}")
            if t:
                t.join()
            victim.execute("RESET statement_timeout")
            holder.execute("COMMIT")
            (k,) = victim.execute("SELECT count(*) FROM my_items(NULL::cancel_items, 0, 4)").fetchone()
            check(k == 25, f"my_items after the cancel: {k} rows")
            check(advisory_locks(obs, vpid) == 0, "my_items cancelled left a lock")
            results.append(f"my_items waiting for a lock, {how}: 57014, the next call works")

        # claim_partitions(name, 4096) takes 4096 locks in a few ms; a cancel or a
        # timeout lands at some point of it or after it. Whatever it was, the
        # session holds exactly the partitions my_partitions reports: all of them
        # (the call finished before the interrupt was noticed) or none.
        victim.execute("SET pg_claim.max_locks_per_session = 1048576")
        for how in ("pg_cancel_backend", "statement_timeout"):
            outcomes = collections.Counter()
            for attempt in range(40):
                t = None
                if how == "statement_timeout":
                    victim.execute("SELECT set_config('statement_timeout', %s, false)",
                                   (f"{1 + attempt % 4}ms",))
                else:
                    t = threading.Timer(0.00025 * attempt,
                                        lambda: obs.execute("SELECT pg_cancel_backend(%s)", (vpid,)))
                    t.start()
                err = None
                try:
                    victim.execute("SELECT claim_partitions('px', 4096)")
                except psycopg.Error as e:
                    check(e.sqlstate == "57014", f"claim_partitions, {how}: {e.sqlstate} {e}")
                    err = e
                if t:
                    t.join()
                victim.execute("RESET statement_timeout")
                held = obs.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
                                   " AND objid::bigint >= x'30000000'::bigint", (vpid,)).fetchone()[0]
                mine = victim.execute("SELECT cardinality(my_partitions('px'))").fetchone()[0]
                check(held == mine and held in (0, 4096),
                      f"claim_partitions, {how}: {held} partition locks held, my_partitions {mine}")
                outcomes[("57014" if err else "ok", held)] += 1
                victim.execute("SELECT group_leave('px')")
                check(advisory_locks(obs, vpid) == 0, f"after group_leave: locks left ({how})")
            check(any(k[0] == "57014" for k in outcomes), f"claim_partitions, {how}: never interrupted: {outcomes}")
            results.append(f"claim_partitions('px', 4096), {how}, 40 times: "
                           + ", ".join(f"{k[0]} holding {k[1]}: {v}" for k, v in sorted(outcomes.items()))
                           + "; always exactly what my_partitions reports")
        victim.execute("RESET pg_claim.max_locks_per_session")

    # without idle_in_transaction_session_timeout: a lease holder idle (or frozen)
    # inside its fenced transaction keeps its expired lease from changing hands
    with cluster.connect() as h, cluster.connect() as standby:
        (_, token) = h.execute("SELECT slot, token FROM claim_lease('iz', 1, 'h', '500 ms')").fetchone()
        h.execute("BEGIN")
        h.execute("SELECT fence('iz', 0, %s)", (token,))
        t0 = time.monotonic()
        while time.monotonic() < t0 + 3:
            expired, got = standby.execute(
                "SELECT (SELECT expired FROM lease_holders('iz')),"
                " (SELECT token FROM claim_lease('iz', 1, 's', '500 ms'))").fetchone()
            check(got is None, f"a standby took the lease of a holder inside its fenced transaction: {got}")
            time.sleep(0.1)
        check(expired, "the lease did not expire")
        h.execute("COMMIT")
        got = standby.execute("SELECT token FROM claim_lease('iz', 1, 's', '500 ms')").fetchone()
        check(got and got[0] > token, f"the standby's claim after the commit: {got}")
        results.append("without idle_in_transaction_session_timeout: a lease holder idle inside its fenced"
                       " transaction kept its expired lease (ttl 0.5 s) from every standby for 3 s, until it"
                       " committed; then the standby took it with a greater token")

    # idle_in_transaction_session_timeout on a holder, in each mode
    with cluster.connect() as obs:
        for m in ("session", "lease"):
            c = cluster.connect()
            if m == "session":
                c.execute("SELECT claim_slot('ix', 1)")
                (token,) = c.execute("SELECT my_token('ix')").fetchone()
                name = "ix"
            else:
                (_, token) = c.execute("SELECT slot, token FROM claim_lease('il', 1, 'h')").fetchone()
                name = "il"
            c.execute("SET idle_in_transaction_session_timeout = '300ms'")
            c.execute("BEGIN")
            c.execute("SELECT fence(%s, 0, %s)", (name, token))
            pid = c.info.backend_pid
            poll(lambda: obs.execute("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s",
                                     (pid,)).fetchone()[0], 20, "the idle-in-transaction holder to end")
            c.close()
            with cluster.connect() as n2:
                if m == "session":
                    # the slot is free and the new holder's my_token does not wait for a fenced transaction
                    n2.execute("SET lock_timeout = '2s'")
                    check(n2.execute("SELECT claim_slot('ix', 1)").fetchone()[0] == 0, "slot after the timeout")
                    (t2,) = n2.execute("SELECT my_token('ix')").fetchone()
                    check(t2 > token, f"new token {t2} not above {token}")
                    n2.execute("SELECT release_slot('ix')")
                    results.append("idle_in_transaction_session_timeout on a fenced session holder: session ends,"
                                   " slot free, next my_token greater, no lock left")
                else:
                    n2.execute("SET lock_timeout = '2s'")
                    # the lease stays until its TTL; its holder renews it from a new connection
                    check(n2.execute("SELECT renew_lease('il', 0, %s, '1 s') IS NOT NULL", (token,)).fetchone()[0],
                          "renewal after the timeout")
                    check(n2.execute("SELECT lease_valid('il', 0, %s)", (token,)).fetchone()[0], "token valid")
                    results.append("idle_in_transaction_session_timeout on a fenced lease holder: session ends,"
                                   " the lease row is intact and renewable, its fence lock is gone")
    return results


def lock_table_exhausted(cluster):
    results = []
    with cluster.connect() as obs, cluster.connect() as hog, cluster.connect() as other:
        (per_xact, conns) = obs.execute("SELECT current_setting('max_locks_per_transaction')::int,"
                                        " current_setting('max_connections')::int").fetchone()
        hpid = hog.info.backend_pid
        hog.execute("SET pg_claim.max_locks_per_session = 1048576")
        other.execute("SELECT claim_slot('bystander', 1)")
        # many groups, the largest n first: claim_partitions until the lock table is
        # full; each refused call must leave none of its locks behind
        groups, refused, err = [], collections.Counter(), None
        for p in (4096, 1024, 256, 64, 16):
            while True:
                name = f"huge{len(groups) + sum(refused.values())}"
                try:
                    hog.execute("SELECT claim_partitions(%s, %s)", (name, p))
                    groups.append(p)
                except psycopg.Error as ex:
                    check(ex.sqlstate == "53200" and ex.diag.message_hint,
                          f"claim_partitions({name}, {p}) on a full lock table: {ex.sqlstate} {ex}")
                    err = ex
                    refused[p] += 1
                    held = obs.execute(
                        "SELECT count(*) FILTER (WHERE objid::bigint >= x'30000000'::bigint) FROM pg_locks"
                        " WHERE locktype = 'advisory' AND pid = %s", (hpid,)).fetchone()[0]
                    check(held == sum(groups), f"{held} partition locks held for groups of {sum(groups)}"
                          f" partitions: the refused call of {p} left some")
                    check(hog.execute("SELECT cardinality(my_partitions(%s))", (name,)).fetchone()[0] == 0,
                          "the refused group's partitions")
                    hog.execute("SELECT group_leave(%s)", (name,))
                    break
        # then claim_slot on new names: refused at once, 3 locks per held slot
        before = advisory_locks(obs, hpid)
        held_slots, slot_err = 0, None
        for i in range(2000):
            try:
                hog.execute("SELECT claim_slot(%s, 1)", (f"many{i}",))
                held_slots += 1
            except psycopg.Error as ex:
                slot_err = ex
                break
        check(slot_err is not None and slot_err.sqlstate == "53200" and slot_err.diag.message_hint,
              f"claim_slot on a full lock table: {slot_err!r}")
        locks = advisory_locks(obs, hpid)
        check(locks == before + 3 * held_slots, f"{locks} advisory locks for {held_slots} more slots (3 each)")
        check(hog.execute("SELECT my_slot(%s)", (f"many{held_slots}",)).fetchone()[0] is None,
              "the refused claim_slot's slot")
        # other sessions: the bystander still holds its slot, and works once the hog lets go
        check(other.execute("SELECT my_slot('bystander')").fetchone()[0] == 0, "bystander lost its slot")
        hog.execute("SELECT pg_advisory_unlock_all()")
        check(advisory_locks(obs, hpid) == 0, "locks after unlock_all")
        check(other.execute("SELECT claim_slot('bystander2', 2)").fetchone()[0] == 0, "bystander's next claim")
        check(other.execute("SELECT count(*) FROM pg_class").fetchone()[0] > 0, "bystander's query")
        results.append(f"lock table of max_locks_per_transaction = {per_xact} x max_connections = {conns}:"
                       f" claim_partitions filled it with {len(groups)} groups ({sum(groups)} partitions);"
                       f" {sum(refused.values())} refused calls (53200, {err.diag.message_primary}) left none"
                       f" of their locks; claim_slot then: {held_slots} more, the next refused (53200),"
                       " exactly 3 locks per held slot; the other session kept its slot and worked")
    return results


# --------------------------------------------------------------------------
# The two commands

# The faults of the suite, by the names `scripts/test faults NAME...` takes.
SUITE_FAULTS = ("cancels", "lock-table", "partition", "restart", "backend-kill", "sigstop", "failover")
ONLY = set()  # the faults chosen on the command line; empty: all


def want(name):
    return not ONLY or name in ONLY


def run_suite(workdir):
    cluster = Cluster(workdir)
    setup_db(cluster)
    if want("cancels"):
        log("nothing half-made after cancels and timeouts:")
        for r in cancels_and_timeouts(cluster):
            log(f"  {r}")
    if want("lock-table"):
        log("the lock table exhausted (max_locks_per_transaction small):")
        for r in lock_table_exhausted(cluster):
            log(f"  {r}")
    if not ONLY - {"cancels", "lock-table"} and ONLY:
        return cluster

    fleet = Fleet(cluster, workdir, lifetime=400)
    results = {}
    try:
        fleet.start_monitors()
        partition = want("partition")
        ws = start_partition_workers(fleet) if partition else None
        for i in range(SESSION_WORKERS - (2 if partition else 0)):
            fleet.add("session")
        for i in range(LEASE_WORKERS - (1 if partition else 0)):
            fleet.add("lease")
        for i in range(ELASTIC_WORKERS):
            fleet.add("elastic")
        fleet.wait_full()
        log(f"fleet: {len(fleet.workers)} workers (session, lease and elastic lease mode, n = {N} each,"
            f" ttl {TTL_S:g} s, claims every ttl / 3), {PRODUCE_PER_S} new items per table and second")
        rng = random.Random(1)
        if partition:
            log("silent partition between three workers and the server (a proxy in its own network namespace):")
            fault_partition(fleet, ws, results)
            with cluster.connect() as c:
                log(f"  {assert_clean(c, fleet, 'partition')}")
        for name, fn in (("server stop -m immediate + start", fault_restart),
                         ("backend SIGKILL (postmaster reset)", fault_backend_kill)):
            if not want("restart" if fn is fault_restart else "backend-kill"):
                continue
            what, moved = fn(fleet, rng)
            results[name] = (what, moved)
            with cluster.connect() as c:
                counts = assert_clean(c, fleet, name)
            log(f"  {name}: share moving again after {moved:.2f} s; {counts}")
        for m in MODES if want("sigstop") else ():
            for where in ("idle", "idle in transaction"):
                what, moved = fault_sigstop(fleet, rng, m, where)
                results[f"SIGSTOP of {'an' if m == 'elastic' else 'a'} {m} holder, {where}"] = (what, moved)
                with cluster.connect() as c:
                    counts = assert_clean(c, fleet, f"SIGSTOP {m} {where}")
                log(f"  SIGSTOP: {what}; {counts}")
        if want("failover"):
            what, moved = fault_failover(fleet, rng)
            results["failover to a promoted replica"] = (what, moved)
            with cluster.connect() as c:
                counts = assert_clean(c, fleet, "failover")
            log(f"  failover: {what}; share moving after {moved:.2f} s; {counts}")
        drained = drain(fleet)
        check(not fleet.errors(), f"worker errors: {fleet.errors()[:3]}")
    finally:
        fleet.stop()
    with cluster.connect() as c:
        counts = assert_clean(c, fleet, "end", final=True)
    log(f"drained {drained:.1f} s after production stopped; checker: {counts['items']} items,"
        f" {counts['duplicates']} duplicates, {counts['lost']} lost, {counts['overlapping']} overlapping holds")
    log("fault | what happens | share moving again after")
    for name, (what, moved) in results.items():
        log(f"  {name} | {what} | {'-' if moved is None else f'{moved:.2f} s'}")
    return cluster


SOAK_FAULTS = {
    "restart": fault_restart,
    "backend_kill": fault_backend_kill,
    "failover": fault_failover,
    "sigstop": fault_sigstop,
    "worker_kill": fault_worker_kill,
    "cancel": fault_cancel,
}


def run_soak(workdir, minutes, seed):
    cluster = Cluster(workdir)
    setup_db(cluster)
    rng = random.Random(seed)
    fleet = Fleet(cluster, workdir, lifetime=minutes * 60 + 300)
    kinds = collections.Counter()
    slowest = (0.0, "-")
    violation = None
    end = time.monotonic() + minutes * 60
    try:
        fleet.start()
        fleet.wait_full()
        order = []
        while time.monotonic() < end:
            if not order:  # every kind once per round, in a random order
                order = rng.sample(sorted(SOAK_FAULTS), len(SOAK_FAULTS))
            kind = order.pop()
            _, moved = SOAK_FAULTS[kind](fleet, rng)
            kinds[kind] += 1
            if moved > slowest[0]:
                slowest = (moved, kind)
            with cluster.connect() as c:
                counts = check_log(c)
            if counts["duplicates"] or counts["lost"] or counts["overlapping"] or fleet.history_bad:
                violation = f"after {kind}: {counts}"
                break
            fleet.wait_full()
            time.sleep(rng.uniform(1, 4))  # let the fleet work between faults
        drain(fleet)
        errors = fleet.errors()
    finally:
        fleet.stop()
    with cluster.connect() as c:
        counts = check_log(c, final=True)
        (processed,) = c.execute("SELECT count(*) FROM processing_log").fetchone()
    ok = (not violation and not errors and not fleet.history_bad
          and counts["duplicates"] == counts["lost"] == counts["overlapping"] == 0)
    print(f"soak {minutes:g} min (seed {seed}): faults {sum(kinds.values())}"
          f" ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); items processed {processed};"
          f" duplicates {counts['duplicates']}; lost {counts['lost']}; overlapping holds {counts['overlapping']};"
          f" slowest takeover {slowest[0]:.2f} s ({slowest[1]}); {'ok' if ok else 'VIOLATION'}", flush=True)
    if violation or errors:
        print(f"soak: {violation or ''} {errors[:3]}", file=sys.stderr)
    return cluster, ok


def main():
    global NET
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--soak", type=float, metavar="MINUTES")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("faults", nargs="*", metavar="FAULT",
                    help=f"run only these faults of the suite: {', '.join(SUITE_FAULTS)}")
    args = ap.parse_args()
    bad = [f for f in args.faults if f not in SUITE_FAULTS]
    if bad:
        ap.error(f"no fault {bad[0]!r} (the faults: {', '.join(SUITE_FAULTS)})")
    ONLY.update(args.faults)
    check(PGC_BIN and DATA0, "PGC_BIN and FAULTS_DATA must be set (scripts/test and scripts/soak set them)")
    limit = int((args.soak or 0) * 60 + (600 if args.soak else 420))

    def on_alarm(*_):
        raise Failure(f"did not finish within {limit} s")

    def on_term(signum, _):
        raise Failure(f"stopped by signal {signum}")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.alarm(limit)
    workdir = tempfile.mkdtemp(prefix="pg_claim-faults-")
    os.chmod(workdir, 0o755)
    ok = False
    cluster = None
    try:
        if args.soak is None and not want("partition"):
            cluster = run_suite(workdir)
            ok = True
        elif args.soak is None:
            NET = Net(workdir)
            NET.up()
            with open(os.path.join(DATA0, "pg_hba.conf"), "a", encoding="utf-8") as f:
                f.write(f"host all all {NET.subnet} trust\n")
            Server(DATA0, 0).pg_ctl("reload")
            target = os.path.join(workdir, "server.target")
            with open(target, "w", encoding="utf-8") as f:
                f.write(f"{NET.host_addr} {os.environ['PGPORT']}")
            NET.start_proxy(target)
            cluster = run_suite(workdir)
            ok = True
        else:
            seed = args.seed if args.seed is not None else random.randrange(1 << 30)
            cluster, ok = run_soak(workdir, args.soak, seed)
    except Exception as e:  # noqa: BLE001 - any failure: report, with the workers' stderr
        if not isinstance(e, Failure):
            traceback.print_exc()
        print(f"fault test FAILED: {e}", file=sys.stderr)
        for f in sorted(os.listdir(workdir)):
            if f.endswith(".err"):
                err = open(os.path.join(workdir, f), errors="replace").read()
                if err:
                    print(f"--- stderr of {f}:\n{err[-2000:]}", file=sys.stderr)
    finally:
        signal.alarm(0)
        if NET:
            NET.down()
        if cluster:
            cluster.cleanup()
        subprocess.run(["rm", "-rf", workdir])
    if ok and args.soak is None:
        log("fault test: passed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
