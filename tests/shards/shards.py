#!/usr/bin/env python3
"""Native sharding with postgres_fdw: the layout, the worker and the fleet.

Used by the test (tests/shards/test_shards.py) and the benchmark (bench/95-shards.sh,
through `python3 tests/shards/shards.py bench ...`).

The layout (docs/scale-out.md): on the coordinator, `items (id bigint, done
boolean, payload text) PARTITION BY HASH (id)` with MODULUS n partitions:
`items_p0` is a local table, the others are postgres_fdw foreign tables
whose rows live on the shard servers (`items_p1` on the first, `items_p2` on
the second, `items_p3` on the first, ...). With no shard server given, all
partitions are local: the same drain on one server. pg_claim is created on
the coordinator only; the shard servers hold plain tables.

A worker (`python3 shards.py worker`) claims a slot of n on the coordinator
with claim_slot (a standby waits for one), walks the slot's share with
`my_items(NULL::items, slot, n, method => 'pg_hash', ...)`, which reads only
the slot's partition, and marks each batch done through the coordinator in
one transaction with its processing-log rows. It walks its share once,
holds its slot until every slot's share is walked (table `finished`), and
exits; a standby exits then too.
"""
import json
import os
import signal
import subprocess
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "pylib"))
import fleet_driver  # noqa: E402

FLEET = "shards"  # the claim_slot name of the fleet


def connect(port, dbname, **kw):
    """A connection to the server on `port` (PGHOST as for psql)."""
    return fleet_driver.connect(dbname, port=port, **kw)


def partition_server(p, shards):
    """The index in `shards` of the server holding partition p, or None for local."""
    return None if p == 0 or not shards else (p - 1) % len(shards)


LOG_TABLE = ("CREATE TABLE processing_log (item bigint NOT NULL, slot int NOT NULL, worker text NOT NULL,"
             " batch int NOT NULL)")


def build(coord_port, shard_ports, db, n, items):
    """(Re)creates the database `db` on the coordinator and on every shard
    server, with the layout above and `items` rows (payload 100 bytes)."""
    for port in [coord_port, *shard_ports]:
        with connect(port, "postgres") as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {db}")
    for i, port in enumerate(shard_ports):
        with connect(port, db) as c:
            for p in range(n):
                if partition_server(p, shard_ports) == i:
                    c.execute(f"CREATE TABLE items_p{p} (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false,"
                              f" payload text)")
            c.execute(LOG_TABLE)
    with connect(coord_port, db) as c:
        c.execute("SET client_min_messages = warning")
        c.execute("CREATE EXTENSION pg_claim")
        c.execute("CREATE TABLE items (id bigint NOT NULL, done boolean NOT NULL DEFAULT false, payload text)"
                  " PARTITION BY HASH (id)")
        if shard_ports:
            c.execute("CREATE EXTENSION postgres_fdw")
        host = os.environ.get("PGHOST", "127.0.0.1")
        for i, port in enumerate(shard_ports):
            # batch_size: INSERTs routed to the shard go in batches of rows
            c.execute(f"CREATE SERVER shard_{i} FOREIGN DATA WRAPPER postgres_fdw"
                      f" OPTIONS (host '{host}', port '{port}', dbname '{db}', batch_size '1000', fetch_size '1000')")
            c.execute(f"CREATE USER MAPPING FOR CURRENT_USER SERVER shard_{i}")
        for p in range(n):
            s = partition_server(p, shard_ports)
            bound = f"FOR VALUES WITH (MODULUS {n}, REMAINDER {p})"
            if s is None:
                c.execute(f"CREATE TABLE items_p{p} PARTITION OF items (PRIMARY KEY (id)) {bound}")
            else:
                c.execute(f"CREATE FOREIGN TABLE items_p{p} PARTITION OF items {bound}"
                          f" SERVER shard_{s} OPTIONS (table_name 'items_p{p}')")
        c.execute("INSERT INTO items (id, payload) SELECT g, repeat('x', 100) FROM generate_series(1, %s) g",
                  (items,))
        c.execute(LOG_TABLE)
        c.execute("CREATE TABLE finished (slot int PRIMARY KEY)")  # the slots whose share is walked
    for port in [coord_port, *shard_ports]:
        with connect(port, db) as c:
            c.execute("VACUUM ANALYZE")


def build_citus(coord_port, worker_ports, db, n, items):
    """(Re)creates `db` on a Citus coordinator and its worker nodes (all on
    127.0.0.1, Citus preloaded) with the layout of docs/scale-out.md
    ("Citus"): items distributed by skey in n shards, slot_keys mapping slot
    s of n to a key of the s-th shard in hash-range order, each row's skey
    the key of its slot_of(id, n); the processing log and `finished` are
    local tables of the coordinator."""
    for port in [coord_port, *worker_ports]:
        with connect(port, "postgres") as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {db}")
        with connect(port, db) as c:
            c.execute("SET client_min_messages = warning")
            c.execute("CREATE EXTENSION citus")
            c.execute("CREATE EXTENSION pg_claim")
    with connect(coord_port, db) as c:
        c.execute("SET client_min_messages = warning")
        c.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (coord_port,))
        for port in worker_ports:
            c.execute("SELECT citus_add_node('127.0.0.1', %s)", (port,))
        # the shard key: the distribution column, a plain column (Citus does
        # not distribute by a generated one), filled from slot_keys
        c.execute("CREATE TABLE items (id bigint NOT NULL, skey int NOT NULL, done boolean NOT NULL DEFAULT false,"
                  " payload text, PRIMARY KEY (skey, id))")
        c.execute("SELECT create_distributed_table('items', 'skey', shard_count => %s)", (n,))
        c.execute("""
            CREATE TABLE slot_keys AS
            SELECT (row_number() OVER (ORDER BY min(s.shardminvalue::int)) - 1)::int AS slot, min(k) AS key
            FROM generate_series(0, 10000) k,
                 LATERAL (SELECT get_shard_id_for_distribution_column('items', k) AS shardid) r
                 JOIN pg_dist_shard s USING (shardid)
            GROUP BY s.shardid""")
        (keys,) = c.execute("SELECT count(*) FROM slot_keys").fetchone()
        if keys != n:
            sys.exit(f"citus: found keys for {keys} of the {n} shards")
        c.execute("""
            INSERT INTO items (id, skey, payload)
            SELECT g, k.key, repeat('x', 100) FROM generate_series(1, %s) g JOIN slot_keys k ON k.slot = slot_of(g, %s)""",
                  (items, n))
        c.execute(LOG_TABLE)
        c.execute("CREATE TABLE finished (slot int PRIMARY KEY)")
        c.execute("VACUUM ANALYZE items")


def citus_executions(c):
    """Citus's counts of single-shard and multi-shard query executions in
    the current database since the last citus_stat_counters_reset
    (citus.enable_stat_counters = on)."""
    return c.execute("SELECT query_execution_single_shard, query_execution_multi_shard FROM citus_stat_counters"
                     " WHERE name = current_database()").fetchone()


# The statements of a worker, also explained by the test.
FETCH = "SELECT id, done FROM my_items(NULL::items, %s, %s, key => 'id', method => 'pg_hash', after => %s, batch => %s)"
MARK = "UPDATE items SET done = true WHERE id = ANY(%s::bigint[])"
LOG = "INSERT INTO processing_log (item, slot, worker, batch) SELECT unnest(%s::bigint[]), %s, %s, %s"


# direct mode: the batch on the server that holds the slot's partition
FETCH_DIRECT = "SELECT id, done FROM items_p{slot} WHERE id > %s ORDER BY id LIMIT %s"
MARK_DIRECT = "UPDATE items_p{slot} SET done = true WHERE id = ANY(%s::bigint[])"
SHARD_OF = """
    SELECT o.port, coalesce(t.name, %s)
    FROM pg_foreign_table ft JOIN pg_foreign_server s ON s.oid = ft.ftserver,
         LATERAL (SELECT option_value FROM pg_options_to_table(s.srvoptions) WHERE option_name = 'port') o(port),
         LATERAL (SELECT option_value FROM pg_options_to_table(ft.ftoptions) WHERE option_name = 'table_name') t(name)
    WHERE ft.ftrelid = %s::regclass"""


# citus mode (tests/citus/run.py): items distributed by skey, each slot's
# rows under the key of one shard (slot_keys), one router query per statement
FETCH_CITUS = "SELECT id, done FROM items WHERE skey = %s AND id > %s ORDER BY id LIMIT %s"
MARK_CITUS = "UPDATE items SET done = true WHERE skey = %s AND id = ANY(%s::bigint[])"


def worker(port, db, n, batch, item_us, mode="fdw"):
    """One worker process: prints JSON lines (claimed, batch, done) on stdout.

    mode "fdw": every batch through the coordinator (my_items, the UPDATE
    routed to the partition). mode "direct": claim_slot on the coordinator,
    the batches on the server holding the slot's partition, which holds
    exactly the slot's rows (a keyset query on it; the processing log there,
    in the batch's transaction). mode "citus": claim_slot on the Citus
    coordinator, the slot's shard key from slot_keys, and every statement a
    router query on that shard (tests/citus/run.py)."""
    me = f"w{os.getpid()}"

    def emit(event, **kw):
        print(json.dumps({"event": event, "worker": me, "t": time.time(), **kw}), flush=True)

    # no named prepared statements: every UPDATE is planned with its array,
    # so the planner prunes it to the partitions of its ids
    def all_finished():
        return conn.execute("SELECT count(*) FROM finished").fetchone()[0] >= n

    with connect(port, db, prepare_threshold=None) as conn:
        while True:
            (slot,) = conn.execute("SELECT claim_slot(%s, %s, interval '200 ms')", (FLEET, n)).fetchone()
            if slot is not None:
                break
            if all_finished():
                emit("done", slot=None, fetches=0, marks=0, items=0, servers=[])
                return
        emit("claimed", slot=slot)
        work, fetch, mark = conn, FETCH, MARK
        args = lambda after: (slot, n, after, batch)  # noqa: E731
        mark_args = lambda todo: (todo,)  # noqa: E731
        if mode == "direct":
            row = conn.execute(SHARD_OF, (f"items_p{slot}", f"items_p{slot}")).fetchone()
            if row:  # a foreign partition: its server (same PGHOST)
                work = connect(int(row[0]), db, prepare_threshold=None)
            fetch, mark = FETCH_DIRECT.format(slot=slot), MARK_DIRECT.format(slot=slot)
            args = lambda after: (int(after or 0), batch)  # noqa: E731
        elif mode == "citus":
            (key,) = conn.execute("SELECT key FROM slot_keys WHERE slot = %s", (slot,)).fetchone()
            fetch, mark = FETCH_CITUS, MARK_CITUS
            args = lambda after: (key, int(after or 0), batch)  # noqa: E731
            mark_args = lambda todo: (key, todo)  # noqa: E731
        after, fetches, marks, count = None, 0, 0, 0
        while True:
            rows = work.execute(fetch, args(after)).fetchall()
            fetches += 1
            if not rows:
                break
            after = str(rows[-1][0])
            todo = [i for i, done in rows if not done]
            if not todo:
                continue
            time.sleep(item_us * len(todo) / 1e6)  # the work on the batch
            with work.transaction():
                work.execute(mark, mark_args(todo))
                work.execute(LOG, (todo, slot, me, fetches))
            marks += 1
            count += len(todo)
            emit("batch", slot=slot, items=len(todo), total=count)
        # the share is walked; the slot stays held until every share is, so
        # that no other worker walks it again while a slot is left unclaimed
        # (woken by the last one's NOTIFY; a check a second at most)
        conn.execute("LISTEN shards_finished")
        conn.execute("INSERT INTO finished VALUES (%s) ON CONFLICT DO NOTHING", (slot,))
        while not all_finished():
            for _ in conn.notifies(timeout=1.0, stop_after=1):
                pass
        conn.execute("NOTIFY shards_finished")
        # the shard servers this session ever read or wrote through
        servers = []
        if conn.execute("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'postgres_fdw')").fetchone()[0]:
            servers = [r[0] for r in conn.execute("SELECT server_name FROM postgres_fdw_get_connections()")]
        emit("done", slot=slot, fetches=fetches, marks=marks, items=count, servers=servers)


class Fleet:
    """W workers and S standbys (this file's `worker`), their events read from
    their stdout into files under workdir."""

    def __init__(self, port, db, n, batch, item_us, workers, standbys, workdir, mode="fdw"):
        self.procs = []
        self.files = []
        args = [sys.executable, os.path.abspath(__file__), "worker", str(port), db, str(n), str(batch), str(item_us),
                mode]
        for i in range(workers + standbys):
            path = os.path.join(workdir, f"worker-{i}.jsonl")
            f = open(path, "w")
            self.files.append(path)
            self.procs.append(subprocess.Popen(args, stdout=f, stdin=subprocess.DEVNULL))
            f.close()

    def events(self):
        out = []
        for i, path in enumerate(self.files):
            with open(path) as f:
                for line in f:
                    if line.endswith("\n"):
                        out.append({**json.loads(line), "proc": i})
        return out

    def wait(self, deadline):
        """Waits for every process; True when all exited by the deadline."""
        for p in self.procs:
            left = deadline - time.monotonic()
            try:
                p.wait(timeout=max(left, 0.01))
            except subprocess.TimeoutExpired:
                return False
        return True

    def kill_one_then_finish(self, victim, seconds=120):
        """SIGKILL worker `victim` and wait for the others to exit (a
        fleet_driver.Failure when they have not within `seconds`); the indexes
        of those that exited with an error."""
        self.procs[victim].send_signal(signal.SIGKILL)
        self.procs[victim].wait()
        fleet_driver.check(self.wait(time.monotonic() + seconds), f"the fleet did not finish within {seconds} s")
        return [i for i, p in enumerate(self.procs) if i != victim and p.returncode != 0]

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def server_cpu(port):
    """CPU seconds used by the server on `port` so far: its postmaster's and
    those of its exited children (backends, whose time the postmaster
    collects when it reaps them)."""
    with connect(port, "postgres") as c:
        (data,) = c.execute("SHOW data_directory").fetchone()
    with open(os.path.join(data, "postmaster.pid")) as f:
        pid = int(f.readline())
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime, cutime, cstime: fields 14 to 17 of proc(5)
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def wait_backends_gone(ports, db, timeout=30):
    """Waits until no client session is connected to `db` on any of `ports`
    (Citus's maintenance daemon and its connections stay)."""
    deadline = time.monotonic() + timeout
    for port in ports:
        with connect(port, "postgres") as c:
            while c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                            " AND backend_type = 'client backend'"
                            " AND application_name NOT LIKE 'citus\\_internal gpid=99999999%%'", (db,)).fetchone()[0]:
                if time.monotonic() > deadline:
                    sys.exit(f"shards bench: sessions of {db} still connected to port {port}")
                time.sleep(0.05)


def bench(coord_port, shard_ports, db, items, batch, worker_counts, workdir, mode):
    """The same drain for each W of worker_counts (n = W slots): prints one
    line per W with items/s, the CPU time each server spent per batch (the
    cost of a batch, which does not depend on the servers sharing the CPUs of
    one machine), and the statements that touched more than one shard
    server. That count is read from each worker's session on the coordinator
    (postgres_fdw_get_connections): a batch reads its slot's partition, so it
    touched another server only if the session connected to a server other
    than its slot's; the statements of such a session are counted (a bound),
    and 0 means none. In mode "direct" a worker's batches run on one server
    by construction; in mode "citus" (the ports: a Citus coordinator and its
    worker nodes) Citus counts single- and multi-shard executions."""
    if mode == "citus":
        layout = f"Citus coordinator + {len(shard_ports)} nodes"
    elif not shard_ports:
        layout = "one server"
    elif mode == "fdw":
        layout = f"coordinator + {len(shard_ports)} shards, fdw"
    else:
        layout = f"coordinator + {len(shard_ports)} shards, direct"
    servers = [coord_port, *shard_ports]
    for w in worker_counts:
        (build_citus if mode == "citus" else build)(coord_port, shard_ports, db, w, items)
        wait_backends_gone(servers, db)
        if mode == "citus":
            with connect(coord_port, db) as c:
                c.execute("SELECT citus_stat_counters_reset(0)")
        cpu0 = [server_cpu(p) for p in servers]
        t0 = time.time()
        fleet = Fleet(coord_port, db, w, batch, 0, w, 0, workdir, mode)
        ok = fleet.wait(time.monotonic() + 900)
        if not ok:
            fleet.kill()
            sys.exit(f"shards bench: W = {w} did not finish in 900 s")
        if any(p.returncode != 0 for p in fleet.procs):
            sys.exit(f"shards bench: a worker failed at W = {w}")
        wait_backends_gone(servers, db)
        cpu = [server_cpu(p) - c0 for p, c0 in zip(servers, cpu0)]
        elapsed = max(e["t"] for e in fleet.events() if e["event"] == "batch") - t0  # to the last batch
        ev = [e for e in fleet.events() if e["event"] == "done"]
        marks = sum(e["marks"] for e in ev)
        statements = sum(e["fetches"] + e["marks"] for e in ev)
        logged = []
        # in mode direct, each server logs its partitions' items; Citus's
        # worker nodes have no log (it is a local table of the coordinator)
        for port in [coord_port] if mode == "citus" else servers:
            with connect(port, db) as c:
                logged += [r[0] for r in c.execute("SELECT item FROM processing_log")]
        if len(logged) != items or len(set(logged)) != items or sum(e["items"] for e in ev) != items:
            sys.exit(f"shards bench: W = {w}: {len(set(logged))} of {items} items logged, in {len(logged)} rows")
        if mode == "citus":
            with connect(coord_port, db) as c:
                single, multi = citus_executions(c)
            touched = f"{multi} of {single + multi} (citus_stat_counters)"
        elif mode == "direct":
            touched = "0 (by construction)"
        elif shard_ports:
            multi = sum(e["fetches"] + e["marks"] for e in ev
                        if set(e["servers"]) - {f"shard_{partition_server(e['slot'], shard_ports)}"})
            touched = f"{multi} of {statements}"
        else:
            touched = "- (one server)"
        names = ["coordinator", "node 1", "node 2"] if mode == "citus" else \
            ["coordinator", "shard 0", "shard 1"] if shard_ports else ["server"]
        per_batch = ", ".join(f"{name} {c / marks * 1000:.2f}" for name, c in zip(names, cpu))
        print(f"{layout:30s} W={w:2d} {items / elapsed:6.0f} items/s; server CPU ms per batch: {per_batch};"
              f" statements on more than one shard: {touched}", flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "worker":
        port, db, n, batch, item_us, mode = sys.argv[2:8]
        worker(int(port), db, int(n), int(batch), float(item_us), mode)
    elif cmd == "bench":
        # bench COORD_PORT "SHARD_PORTS" DB ITEMS BATCH "W1 W2 ..." WORKDIR fdw|direct|citus
        coord, shard_ports, db, items, batch, ws, workdir, mode = sys.argv[2:10]
        bench(int(coord), [int(p) for p in shard_ports.split()], db, int(items), int(batch),
              [int(x) for x in ws.split()], workdir, mode)
    else:
        sys.exit(f"usage: {sys.argv[0]} worker|bench ...")
