#!/usr/bin/env python3
"""Native sharding with postgres_fdw: the layout, the worker and the fleet.

Used by the test (tests/shards/run.py) and the benchmark (bench/95-shards.sh,
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
one transaction with its processing-log rows. It walks its share once, then
exits; a standby that gets no slot exits once no item is left to do.
"""
import json
import os
import signal
import subprocess
import sys
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
FLEET = "shards"  # the claim_slot name of the fleet


def connect(port, dbname, **kw):
    """A connection to the server on `port` (PGHOST as for psql)."""
    return psycopg.connect(port=port, dbname=dbname, autocommit=True, **kw)


def partition_server(p, shards):
    """The index in `shards` of the server holding partition p, or None for local."""
    return None if p == 0 or not shards else (p - 1) % len(shards)


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
        c.execute("CREATE TABLE processing_log (item bigint NOT NULL, slot int NOT NULL, worker text NOT NULL,"
                  " batch int NOT NULL)")
    for port in [coord_port, *shard_ports]:
        with connect(port, db) as c:
            c.execute("VACUUM ANALYZE")


# The statements of a worker, also explained by the test.
FETCH = "SELECT id, done FROM my_items(NULL::items, %s, %s, key => 'id', method => 'pg_hash', after => %s, batch => %s)"
MARK = "UPDATE items SET done = true WHERE id = ANY(%s)"
LOG = "INSERT INTO processing_log (item, slot, worker, batch) SELECT unnest(%s::bigint[]), %s, %s, %s"


def worker(port, db, n, batch, item_us):
    """One worker process: prints JSON lines (claimed, batch, done) on stdout."""
    me = f"w{os.getpid()}"

    def emit(event, **kw):
        print(json.dumps({"event": event, "worker": me, **kw}), flush=True)

    # no named prepared statements: every UPDATE is planned with its array,
    # so the planner prunes it to the partitions of its ids
    with connect(port, db, prepare_threshold=None) as conn:
        while True:
            (slot,) = conn.execute("SELECT claim_slot(%s, %s, interval '200 ms')", (FLEET, n)).fetchone()
            if slot is not None:
                break
            (left,) = conn.execute("SELECT EXISTS (SELECT FROM items WHERE NOT done)").fetchone()
            if not left:
                emit("done", slot=None, fetches=0, marks=0, items=0)
                return
        emit("claimed", slot=slot)
        after, fetches, marks, count = None, 0, 0, 0
        while True:
            rows = conn.execute(FETCH, (slot, n, after, batch)).fetchall()
            fetches += 1
            if not rows:
                break
            after = str(rows[-1][0])
            todo = [i for i, done in rows if not done]
            if not todo:
                continue
            time.sleep(item_us * len(todo) / 1e6)  # the work on the batch
            with conn.transaction():
                conn.execute(MARK, (todo,))
                conn.execute(LOG, (todo, slot, me, fetches))
            marks += 1
            count += len(todo)
            emit("batch", slot=slot, items=len(todo), total=count)
        emit("done", slot=slot, fetches=fetches, marks=marks, items=count)


class Fleet:
    """W workers and S standbys (this file's `worker`), their events read from
    their stdout into files under workdir."""

    def __init__(self, port, db, n, batch, item_us, workers, standbys, workdir):
        self.procs = []
        self.files = []
        args = [sys.executable, os.path.abspath(__file__), "worker", str(port), db, str(n), str(batch), str(item_us)]
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

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def scans(ports_dbs):
    """Sum of seq_scan + idx_scan over the tables items_p* of every (port, db)."""
    total = 0
    for port, db in ports_dbs:
        with connect(port, db) as c:
            total += c.execute("SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)"
                               " FROM pg_stat_user_tables WHERE relname LIKE 'items\\_p%'").fetchone()[0]
    return int(total)


def bench(coord_port, shard_ports, db, items, batch, worker_counts, workdir):
    """The same drain for each W of worker_counts (n = W slots): prints one
    line per W with items/s, the per-batch cost (worker-seconds per batch) and
    the partition scans beyond one per statement, a bound on the batches that
    read more than one partition."""
    layout = f"{len(shard_ports)} shard servers + coordinator" if shard_ports else "one server"
    for w in worker_counts:
        build(coord_port, shard_ports, db, w, items)
        servers = [(coord_port, db), *[(p, db) for p in shard_ports]]
        for port, d in servers:
            with connect(port, d) as c:
                c.execute("SELECT pg_stat_reset()")
        before = scans(servers)
        t0 = time.monotonic()
        fleet = Fleet(coord_port, db, w, batch, 0, w, 0, workdir)
        ok = fleet.wait(time.monotonic() + 600)
        elapsed = time.monotonic() - t0
        if not ok:
            fleet.kill()
            sys.exit(f"shards bench: W = {w} did not finish in 600 s")
        if any(p.returncode != 0 for p in fleet.procs):
            sys.exit(f"shards bench: a worker failed at W = {w}")
        ev = [e for e in fleet.events() if e["event"] == "done"]
        fetches = sum(e["fetches"] for e in ev)
        marks = sum(e["marks"] for e in ev)
        done = sum(e["items"] for e in ev)
        with connect(coord_port, db) as c:
            dup, logged = c.execute("SELECT count(*) - count(DISTINCT item), count(DISTINCT item)"
                                    " FROM processing_log").fetchone()
        if dup or logged != items or done != items:
            sys.exit(f"shards bench: W = {w}: {logged} of {items} items logged, {dup} twice")
        # pgstat counters are flushed when the backends exit; wait for them
        deadline = time.monotonic() + 10
        while True:
            extra = scans(servers) - before - fetches - marks
            if extra >= 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        print(f"{layout:32s} W={w:2d}  {items / elapsed:9.0f} items/s  "
              f"{elapsed * w / fetches * 1000:6.2f} ms per batch per worker  "
              f"{fetches} fetches + {marks} updates, partition scans beyond one per statement: {extra}",
              flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "worker":
        port, db, n, batch, item_us = sys.argv[2:7]
        worker(int(port), db, int(n), int(batch), float(item_us))
    elif cmd == "bench":
        # bench COORD_PORT "SHARD_PORTS" DB ITEMS BATCH "W1 W2 ..." WORKDIR
        coord, shard_ports, db, items, batch, ws, workdir = sys.argv[2:9]
        bench(int(coord), [int(p) for p in shard_ports.split()], db, int(items), int(batch),
              [int(x) for x in ws.split()], workdir)
    else:
        sys.exit(f"usage: {sys.argv[0]} worker|bench ...")
