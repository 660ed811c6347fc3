"""A lease fleet of pg_claim.Worker on Citus, through PgBouncer, while Citus
moves the shards (tests/citus/test_citus.py runs it; docs/scale-out.md, "Citus").

In a database of its own on the coordinator and the two worker nodes:
`orders` (CUSTS customers, each with its items in `seq` order by id)
distributed by `skey` in N shards, every customer's rows under the shard
key of its slot (slot_of(cust, N), through slot_keys: each slot's share is
one whole shard); the processing log distributed by skey too, colocated
with `orders`; the fleet defined with define_fleet (route => 'cust').

WORKERS lease-mode workers (tests/citus/lease_worker.py) connect through
PgBouncer in transaction mode on the coordinator; SHARDED of them are given
shard_column and shard_keys (slot_keys), the other reads through my_items.
While they run:
1. with every slot held and the workers stopped (SIGSTOP, a moment shorter
   than the ttl), slot_backlog, fleet_slots and fleets are checked against
   each shard's own count of its pending rows on its node
   (run_command_on_placements) and against the live leases;
2. citus_move_shard_placement moves slot 0's shard (and its colocated log
   shard) to the other node;
3. a third worker node is started and added (citus_add_node);
4. citus_rebalance_start spreads the shards over the three nodes, and
   citus_rebalance_wait waits for it.
Work must be left after the rebalance (the fleet ran through all of it).
Then the fleet drains the table, the views are checked again (nothing
pending, every slot held), and the workers stop on SIGTERM.

Checks: every item in the log exactly once, under its own slot and shard
key; each customer's items in `seq` order (the log's global order, the
coordinator's sequence log_ord); after each move, each slot's UPDATE is one
task on the node that now holds its shard; and, from Citus's counts
(citus_stat_counters) less the checks' own, exactly one multi-shard query
per my_items fetch and count window of the worker without shard keys
(my_items filters by the mapping function: every shard), and none for the
others: no batch's write, and no read of a worker with shard keys, touched
two shards; at least one single-shard query per read with shard keys, and
two per batch (its UPDATE and its log rows; the rebalance's own background
work may add some).
"""
import json
import os
import re
import signal
import sys

from harness import WorkerProcess, check, connect, poll
from harness.server import admin

from .servers import Servers

HERE = os.path.dirname(os.path.abspath(__file__))

DB = "pg_claim_citus_lease"
NAME = "citus_orders"
N, CUSTS, ITEMS, BATCH, ITEM_US, TTL_S, WORKERS = 4, 40, 8000, 25, 6000, 3, 3
SHARDED = 2  # workers given shard_column and shard_keys; the others read through my_items
MARK = "UPDATE orders SET done = true WHERE skey = %s AND id = ANY(%s::bigint[])"


def task_nodes(c, sql, params):
    """(Citus's task count, the ports of the nodes it names) in EXPLAIN of sql."""
    plan = "\n".join(r[0] for r in c.execute("EXPLAIN (VERBOSE, COSTS OFF) " + sql, params).fetchall())
    count = re.search(r"Task Count: (\d+)", plan)
    return (int(count.group(1)) if count else None), [int(p) for p in re.findall(r"Node: host=\S+ port=(\d+)", plan)]


def node_of(c, key):
    """The port of the node holding the shard of shard key `key` of orders."""
    return c.execute("SELECT nodeport FROM pg_dist_shard_placement"
                     " WHERE shardid = get_shard_id_for_distribution_column('orders', %s)", (key,)).fetchone()[0]


def create_db(port):
    with connect("postgres", port=port) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    with connect(DB, port=port) as c:
        c.execute("SET client_min_messages = warning")
        c.execute("CREATE EXTENSION citus")
        c.execute("CREATE EXTENSION pg_claim")


def build(coord, nodes):
    for port in [coord, *nodes]:
        create_db(port)
    with connect(DB, port=coord) as c:
        c.execute("SET client_min_messages = warning")
        c.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (coord,))
        for port in nodes:
            c.execute("SELECT citus_add_node('127.0.0.1', %s)", (port,))
        c.execute("CREATE TABLE orders (id bigint NOT NULL, skey int NOT NULL, cust int NOT NULL, seq int NOT NULL,"
                  " done boolean NOT NULL DEFAULT false, payload text, PRIMARY KEY (skey, id))")
        c.execute("SELECT create_distributed_table('orders', 'skey', shard_count => %s)", (N,))
        c.execute("CREATE TABLE processing_log (skey int NOT NULL, item bigint NOT NULL, cust int NOT NULL,"
                  " seq int NOT NULL, ord bigint NOT NULL, worker text NOT NULL, slot int NOT NULL, token bigint)")
        c.execute("SELECT create_distributed_table('processing_log', 'skey', colocate_with => 'orders')")
        c.execute("CREATE SEQUENCE log_ord")  # a plain sequence of the coordinator
        c.execute("""
            CREATE TABLE slot_keys AS
            SELECT (row_number() OVER (ORDER BY min(s.shardminvalue::int)) - 1)::int AS slot, min(k) AS key
            FROM generate_series(0, 10000) k,
                 LATERAL (SELECT get_shard_id_for_distribution_column('orders', k) AS shardid) r
                 JOIN pg_dist_shard s USING (shardid)
            GROUP BY s.shardid""")
        c.execute("INSERT INTO orders (id, skey, cust, seq, payload)"
                  " SELECT g, k.key, g %% %s, g / %s, repeat('x', 100)"
                  " FROM generate_series(1, %s) g JOIN slot_keys k ON k.slot = slot_of(g %% %s, %s)",
                  (CUSTS, CUSTS, ITEMS, CUSTS, N))
        # the partial index the share's fetch and the backlog read, on every shard
        c.execute(f"CREATE INDEX ON orders ((slot_of(cust, {N})), id) WHERE NOT done")
        c.execute("SELECT define_fleet(%s, 'orders', %s, 'done', key => 'id', route => 'cust')", (NAME, N))
        c.execute("VACUUM ANALYZE orders")


def counters(c):
    return c.execute("SELECT query_execution_single_shard, query_execution_multi_shard FROM citus_stat_counters"
                     " WHERE name = current_database()").fetchone()


class Fleet:
    def __init__(self, pooler_port, workdir, keys):
        self.procs, self.labels = [], []
        for i in range(WORKERS):
            label = f"w{i + 1}"
            env = dict(os.environ, LEASE_DSN=f"host=127.0.0.1 port={pooler_port} dbname={DB} user=postgres",
                       LEASE_LABEL=label, LEASE_N=str(N), LEASE_TTL_S=str(TTL_S), LEASE_BATCH=str(BATCH),
                       LEASE_ITEM_US=str(ITEM_US))
            if i < SHARDED:  # the library's shard_keys: router fetches
                env["LEASE_SHARD_KEYS"] = json.dumps(keys)
            self.labels.append(label)
            self.procs.append(WorkerProcess([sys.executable, os.path.join(HERE, "lease_worker.py")], env,
                                            os.path.join(workdir, f"{label}.err")))

    def count(self, kind, sharded=None):
        return sum(1 for p in self.procs for e in p.events
                   if e["event"] == kind and (sharded is None or e.get("sharded") == sharded))

    def signal(self, sig):
        for p in self.procs:
            p.proc.send_signal(sig)

    def check_alive(self):
        dead = [(w, p) for w, p in zip(self.labels, self.procs) if p.proc.poll() is not None]
        why = {w: self._why(p) for w, p in dead}
        check(not dead, f"workers exited early: {[(w, p.proc.returncode) for w, p in dead]}: {why}")

    @staticmethod
    def _why(p):
        """What a worker that exited said last: its "error" event
        (tests/pylib/fleet_worker.py), else the end of its stderr."""
        e = p.last(("error",))
        if e is not None:
            return e.get("error")
        with open(p.err_path) as f:
            return "".join(f.readlines()[-5:])

    def handled(self, k):
        """Whether the fleet handled k batches; a worker that exited fails the wait at once."""
        self.check_alive()
        return self.count("handled") >= k

    def kill(self):
        for p in self.procs:
            if p.proc.poll() is None:
                p.proc.kill()
            p.proc.wait()


class Driver:
    """The checks' own Citus executions, counted while the fleet is stopped."""

    def __init__(self, coord, fleet, pooler):
        self.coord, self.fleet, self.pooler, self.own = coord, fleet, pooler, [0, 0]

    def _waiting(self):
        """The fleet's clients PgBouncer holds for a server connection: a
        statement a stopped worker sent runs once it gets one."""
        return sum(int(p["cl_waiting"]) for p in admin(self.pooler, "SHOW POOLS") if p["database"] == DB)

    def paused(self, fn):
        """fn(connection) with every worker stopped (SIGSTOP): what Citus
        counts meanwhile is the check's; the fleet's statements in flight
        are over first (no backend of the fleet active, and none waiting in
        the pooler for a server connection)."""
        self.fleet.signal(signal.SIGSTOP)
        try:
            with connect(DB, port=self.coord) as c:
                poll(lambda: not self._waiting() and not c.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state = 'active'"
                    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    " AND application_name NOT LIKE 'citus%%'", (DB,)).fetchone()[0], 10, "the fleet to be idle")
                before = counters(c)
                r = fn(c)
                after = counters(c)
            self.own = [o + a - b for o, a, b in zip(self.own, after, before)]
            return r
        finally:
            self.fleet.signal(signal.SIGCONT)


def views(c, held):
    """slot_backlog, fleet_slots and fleets against each shard's count on its
    node and the live leases; `held`: whether every slot must be held."""
    keys = dict(c.execute("SELECT slot, key FROM slot_keys").fetchall())
    per_shard = {int(shard): int(n) for shard, n in c.execute(
        "SELECT shardid, result FROM run_command_on_placements('orders', 'SELECT count(*) FROM %s WHERE NOT done')"
        " WHERE success").fetchall()}
    check(len(per_shard) == N, f"counted {len(per_shard)} of {N} shards")
    want = {s: per_shard[c.execute("SELECT get_shard_id_for_distribution_column('orders', %s)", (k,)).fetchone()[0]]
            for s, k in keys.items()}
    backlog = dict(c.execute("SELECT slot, backlog FROM slot_backlog('orders', %s, 'done', key => 'id',"
                             " route => 'cust')", (N,)).fetchall())
    check(backlog == want, f"slot_backlog {backlog}, the shards' own counts {want}")
    rows = c.execute("SELECT slot, pending, holder, mode, token FROM fleet_slots WHERE fleet = %s ORDER BY slot",
                     (NAME,)).fetchall()
    check({r[0]: r[1] for r in rows} == want, f"fleet_slots pending {rows}, the shards' counts {want}")
    leases = {r[0]: (r[1], r[2]) for r in c.execute(
        "SELECT slot, holder, token FROM slot_status(%s, %s) WHERE holder IS NOT NULL AND state <> 'unserved'",
        (NAME, N)).fetchall()}
    shown = {r[0]: (r[2], r[4]) for r in rows if r[2] is not None}
    check(shown == leases, f"fleet_slots holders {shown}, slot_status {leases}")
    check(not held or (len(shown) == N and all(r[3] == "lease" for r in rows)), f"not every slot held: {rows}")
    pending, holders, unserved = c.execute("SELECT pending, holders, unserved FROM fleets WHERE fleet = %s",
                                           (NAME,)).fetchone()
    check(pending == sum(want.values()) and holders == len({h for h, _ in leases.values()})
          and unserved == N - len(leases), f"fleets: pending {pending}, holders {holders}, unserved {unserved};"
          f" expected {sum(want.values())}, {len({h for h, _ in leases.values()})}, {N - len(leases)}")
    return sum(want.values())


def held_views(c):
    """views(c, True) once every slot is held (a slot given back to a
    holder with less work is unserved until it takes it): None before."""
    (k,) = c.execute("SELECT count(*) FROM fleet_slots WHERE fleet = %s AND mode = 'lease'", (NAME,)).fetchone()
    return views(c, True) if k == N else None


def routed(c, keys):
    """Each slot's UPDATE is one task on the node holding its shard; the nodes, per slot."""
    at = {}
    for slot, key in keys.items():
        tasks, nodes = task_nodes(c, MARK, (key, [1, 2]))
        at[slot] = node_of(c, key)
        check(tasks == 1 and nodes == [at[slot]], f"slot {slot}: the UPDATE is {tasks} tasks on {nodes},"
              f" its shard is on {at[slot]}")
    return at


def run(coord, nodes, workdir):
    """The fleet of the module's docstring; its line for the layer's report."""
    build(coord, nodes)
    with Servers() as servers, connect(DB, port=coord) as c:
        keys = dict(c.execute("SELECT slot, key FROM slot_keys").fetchall())
        pooler = servers.pooler(coord, 4)
        c.execute("SELECT citus_stat_counters_reset(0)")
        fleet = Fleet(pooler, workdir, keys)
        driver = Driver(coord, fleet, pooler)
        try:
            poll(lambda: fleet.handled(2 * N), 30, "the fleet to handle batches")
            poll(lambda: driver.paused(held_views) is not None, 30, "every slot held", interval=0.3)
            # a shard move while the fleet runs: slot 0's shard to the other node
            src = node_of(c, keys[0])
            dst = next(p for p in nodes if p != src)
            c.execute("SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('orders', %s),"
                      " '127.0.0.1', %s, '127.0.0.1', %s, shard_transfer_mode => 'block_writes')",
                      (keys[0], src, dst))
            check(driver.paused(lambda d: routed(d, keys))[0] == dst, f"slot 0's shard is not on {dst} after the move")
            log_node = c.execute("SELECT nodeport FROM pg_dist_shard_placement WHERE shardid ="
                                 " get_shard_id_for_distribution_column('processing_log', %s)", (keys[0],)).fetchone()
            check(log_node == (dst,), f"the log's shard of slot 0 is on {log_node}, not with its orders on {dst}")
            # a node added mid-run, and a rebalance onto it
            fleet.check_alive()
            new = servers.citus_node("citus-worker-new")
            create_db(new)
            c.execute("SELECT citus_add_node('127.0.0.1', %s)", (new,))
            c.execute("SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes')")
            c.execute("SELECT citus_rebalance_wait()")
            at = driver.paused(lambda d: routed(d, keys))
            check(new in at.values(), f"no shard on the new node {new} after the rebalance: {at}")
            (left,) = driver.paused(lambda d: d.execute("SELECT count(*) FROM orders WHERE NOT done").fetchone())
            check(left > 0, "the fleet finished before the rebalance: lower ITEM_US's share of the run")
            fleet.check_alive()
            poll(lambda: driver.paused(lambda d: d.execute("SELECT count(*) FROM orders WHERE NOT done")
                                       .fetchone()[0] == 0), 60, "the fleet to drain the table", interval=0.5)
            poll(lambda: driver.paused(held_views) is not None, 30, "every slot held after the drain", interval=0.3)
            fleet.check_alive()
            # every batch event is in: the fleet handled every item
            poll(lambda: sum(e["items"] for p in fleet.procs for e in p.events if e["event"] == "handled") >= ITEMS,
                 10, "the workers to report every batch")
            # the workers gone first: an idle fetch in flight would be counted
            # by one side and not yet by the other
            fleet.signal(signal.SIGTERM)
            for p in fleet.procs:
                p.proc.wait(timeout=20)
            single, multi = counters(c)
            batches = fleet.count("handled")
            fetches, counts = fleet.count("fetch", False), fleet.count("count", False)
            routed_reads = fleet.count("fetch", True) + fleet.count("count", True)
        finally:
            fleet.kill()
        fleet_single, fleet_multi = single - driver.own[0], multi - driver.own[1]
        with connect(DB, port=coord) as c:
            total, distinct, wrong = c.execute(
                "SELECT count(*), count(DISTINCT item), count(*) FILTER (WHERE l.slot <> slot_of(l.cust, %s)"
                " OR l.skey <> k.key) FROM processing_log l JOIN slot_keys k ON k.slot = slot_of(l.cust, %s)",
                (N, N)).fetchone()
            out_of_order = c.execute(
                "SELECT count(*) FROM (SELECT seq < lag(seq) OVER (PARTITION BY cust ORDER BY ord) AS back"
                " FROM processing_log) s WHERE back").fetchone()[0]
        check(total == ITEMS and distinct == ITEMS, f"the log has {total} rows for {distinct} of {ITEMS} items")
        check(wrong == 0, f"{wrong} items logged under another slot or shard key")
        check(out_of_order == 0, f"{out_of_order} items processed before an earlier item of their customer")
        # every multi-shard query a my_items fetch or count window of a worker
        # without shard keys: no batch's write, and no read of a worker with
        # shard keys, went to two shards
        check(routed_reads > 0 and fetches > 0, f"{routed_reads} reads with shard keys, {fetches} without")
        check(fleet_multi == fetches + counts and fleet_single >= 2 * batches + routed_reads,
              f"the fleet ran {fleet_single} single-shard and {fleet_multi} multi-shard queries for {batches} batches,"
              f" {fetches} fetches and {counts} count windows through my_items, {routed_reads} reads with shard keys"
              f" (expected at least {2 * batches + routed_reads} and exactly {fetches + counts})")
        for port in [coord, *nodes]:
            with connect("postgres", port=port) as c:
                c.execute(f"DROP DATABASE {DB} WITH (FORCE)")
    return (f"a lease fleet of {WORKERS} pg_claim.Worker through PgBouncer processed {ITEMS} items exactly once,"
            f" each customer's in order, through a shard move, a node added and a rebalance; {batches} batches"
            f" written in single-shard queries; {routed_reads} fetches and count windows of the {SHARDED} workers"
            f" with shard_keys single-shard too ({fleet_single} single-shard queries in all), the other's {fetches}"
            f" my_items fetches and {counts} count windows one multi-shard query each ({fleet_multi} multi-shard"
            f" queries in all); slot_backlog,"
            " fleet_slots and fleets matched each shard's count")
