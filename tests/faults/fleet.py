"""The fault test's fleet (tests/faults/worker.py processes in session,
lease and elastic lease mode), its producer and holder history, and the
checker of what it wrote."""
import collections
import os
import random
import sys
import threading
import time

import psycopg

from harness import WorkerProcess, check, poll, stop_all

from .cluster import (BATCH, DB, ELASTIC_WORKERS, HERE, ITEM_MS, LEASE_WORKERS, MODES, N, PRODUCE_PER_S, SERVICE,
                      SESSION_WORKERS, TABLES, TTL_S)


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
        stop_all(self.workers)
        for t in self.threads:
            t.join(5)

    def errors(self):
        return [(str(w), e) for w in self.workers for e in w.events if e["event"] in ("error", "garbage")]


ALL_SLOTS = {(t, s) for t in TABLES for s in range(N)}


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
