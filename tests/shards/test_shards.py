"""Native sharding with postgres_fdw (docs/scale-out.md), on three servers.

Needs the coordinator (PGHOST/PGPORT, pg_claim and postgres_fdw installable)
and two shard servers (PGC_SHARD_PORTS="PORT PORT", same PGHOST), as
scripts/test starts them. Builds the layout of shards.py with n = 4
(items_p0 local, items_p1 and items_p3 on the first shard server, items_p2
on the second), then checks:

1. the plan of every slot's batch (the SQL my_items runs, EXPLAINed with its
   parameters) scans exactly one partition, that slot's, with the key range,
   ORDER BY and LIMIT in the remote SQL for a foreign one; a batch's UPDATE
   through the coordinator touches that partition only; and, counted by
   the servers' statistics, one my_items call reads only its partition;
2. what does not push down: the filter pg_hash_slot(id, 4) = 1 on the parent
   reads every partition and evaluates the function on the coordinator;
3. a fleet of 4 workers and 2 standbys (shards.py) drains the table; the
   worker of a foreign slot is killed (SIGKILL) in the middle of its share, a
   standby takes the slot over, and the processing log holds every item
   exactly once, each under its own slot, the killed slot's under two
   workers.

Every wait polls with a deadline.
"""
import os
import re
import tempfile

import pytest

import harness
from harness import Failure, check, log

from . import shards

DB = "pg_claim_shards"
N = 4
ITEMS = 4000
BATCH = 50
ITEM_US = 2000  # 100 ms of "work" per batch of 50
COORD = int(os.environ["PGPORT"])
SHARDS = [int(p) for p in os.environ["PGC_SHARD_PORTS"].split()]


def poll(fn, timeout, what, fleet=None):
    """harness.poll; on a time-out, the fleet's last events are in the failure."""
    try:
        return harness.poll(fn, timeout, what)
    except Failure as e:
        if not fleet:
            raise
        raise Failure(f"{e}; workers: " + ", ".join(
            f"{i}: exit {p.poll()}, {[ev['event'] for ev in fleet.events() if ev['proc'] == i][-3:]}"
            for i, p in enumerate(fleet.procs))) from None


def explain(c, sql, params=()):
    return "\n".join(r[0] for r in c.execute("EXPLAIN (VERBOSE, COSTS OFF) " + sql, params).fetchall())


def scanned(plan):
    """The partitions items_pN that a plan reads or writes (each node once)."""
    return re.findall(r"(?:Scan|Update)(?: using \S+)? on public\.(items_p\d+)", plan)


def plans(c):
    for slot in range(N):
        (q,) = c.execute("SELECT my_items_query('items'::regtype, %s, %s, key => 'id', method => 'pg_hash',"
                         " after => '500', batch => %s)", (slot, N, BATCH)).fetchone()
        c.execute("DEALLOCATE ALL")
        c.execute(f"PREPARE batch(int, int, text, bigint) AS {q}")
        plan = explain(c, "EXECUTE batch(%s, %s, '500', %s)" % (slot, N, BATCH))
        check(scanned(plan) == [f"items_p{slot}"], f"slot {slot}: the batch does not scan only items_p{slot}:\n{plan}")
        if shards.partition_server(slot, SHARDS) is not None:
            remote = re.search(r"Remote SQL: (.*)", plan).group(1)
            check(re.search(rf"FROM public\.items_p{slot} WHERE \(\(id > 500::bigint\)\) ORDER BY id ASC NULLS LAST"
                            rf" LIMIT {BATCH}::bigint", remote),
                  f"slot {slot}: key range, order or limit not pushed down: {remote}")
        ids = [r[0] for r in c.execute(shards.FETCH, (slot, N, None, BATCH)).fetchall()]
        check(len(ids) == BATCH, f"slot {slot}: a batch of {len(ids)} rows")
        plan = explain(c, "UPDATE items SET done = true WHERE id = ANY(%s::bigint[])", (ids,))
        check(set(scanned(plan)) == {f"items_p{slot}"},
              f"slot {slot}: the UPDATE of a batch touches more than items_p{slot}:\n{plan}")

    # at run time, counted by each server: one my_items call on slot 1 reads
    # items_p1 on the first shard server and nothing else
    servers = [(COORD, DB), *[(p, DB) for p in SHARDS]]
    for port, db in servers:
        with shards.connect(port, db) as s:
            s.execute("SELECT pg_stat_reset()")
    with shards.connect(COORD, DB) as s:  # closed: its backends and their foreign sessions flush their counts
        s.execute(shards.FETCH, (1, N, None, BATCH)).fetchall()

    def counts():
        out = {}
        for i, (port, db) in enumerate(servers):
            with shards.connect(port, db) as s:
                for rel, n in s.execute("SELECT relname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0)"
                                        " FROM pg_stat_user_tables WHERE relname LIKE 'items\\_p%'"):
                    if n:
                        out[(i, rel)] = n
        return out

    got = poll(counts, 10, "the scan counts of the shard server")
    check(got == {(1, "items_p1"): 1}, f"one my_items call on slot 1 scanned {got}, not items_p1 on shard 0 once")

    # what does not push down: pg_hash_slot is not shippable (an extension's
    # function), so a filter with it on the parent reads every partition
    plan = explain(c, "SELECT id FROM items WHERE pg_hash_slot(id, 4) = 1 ORDER BY id LIMIT 50")
    check(sorted(set(scanned(plan))) == [f"items_p{p}" for p in range(N)],
          f"the pg_hash_slot filter on the parent is expected to read every partition:\n{plan}")
    check("pg_hash_slot" not in "".join(re.findall(r"Remote SQL: (.*)", plan)),
          f"pg_hash_slot was shipped to a shard server:\n{plan}")


def fleet():
    with tempfile.TemporaryDirectory() as work:
        f = shards.Fleet(COORD, DB, N, BATCH, ITEM_US, 4, 2, work)
        try:
            victim_slot = 1  # a foreign partition
            (victim,) = poll(lambda: next(((e["proc"],) for e in f.events()  # a tuple: proc 0 is falsy
                                           if e["event"] == "claimed" and e["slot"] == victim_slot), None),
                             60, f"a worker to claim slot {victim_slot}", f)
            share = ITEMS // N
            poll(lambda: any(e["event"] == "batch" and e["proc"] == victim and e["total"] >= share // 3
                             for e in f.events()), 60, "the victim to process a third of its share", f)
            failed = f.kill_one_then_finish(victim)
        finally:
            f.kill()
        check(not failed, f"workers {failed} failed")
        ev = f.events()
        check(not any(e["event"] == "done" and e["proc"] == victim for e in ev), "the victim finished before the kill")
        takers = {e["proc"] for e in ev if e["event"] == "claimed" and e["slot"] == victim_slot}
        check(len(takers) >= 2, f"no standby took slot {victim_slot} over: {takers}")
    with shards.connect(COORD, DB) as c:
        total, distinct, wrong_slot, killed_slot_workers, left = c.execute("""
            SELECT count(*), count(DISTINCT item),
                   count(*) FILTER (WHERE pg_hash_slot(item, %s) <> slot),
                   (SELECT count(DISTINCT worker) FROM processing_log WHERE slot = %s),
                   (SELECT count(*) FROM items WHERE NOT done)
            FROM processing_log""", (N, victim_slot)).fetchone()
    check(total == ITEMS and distinct == ITEMS,
          f"the processing log has {total} rows for {distinct} of {ITEMS} items (every item exactly once expected)")
    check(wrong_slot == 0, f"{wrong_slot} items processed under another slot than theirs")
    check(left == 0, f"{left} items not marked done")
    check(killed_slot_workers >= 2, f"slot {victim_slot}'s items were processed by {killed_slot_workers} worker(s)")
    return killed_slot_workers


@pytest.fixture(scope="module")
def layout():
    """The coordinator's partitioned table over the shard servers (shards.py);
    its databases dropped after the module when its tests passed."""
    shards.build(COORD, SHARDS, DB, N, ITEMS)
    yield
    for port in [COORD, *SHARDS]:
        with shards.connect(port, "postgres") as c:
            c.execute(f"DROP DATABASE {DB} WITH (FORCE)")


def test_batches_read_one_partition(layout):
    with shards.connect(COORD, DB) as c:
        plans(c)


def test_fleet_every_item_once(layout):
    workers = fleet()
    log(f"shards (postgres_fdw, coordinator + {len(SHARDS)} shard servers, n = {N}): every batch plan and UPDATE"
        f" reads one partition (key range, order and limit pushed down), one call scans one partition by the servers'"
        f" counts; {ITEMS} items processed exactly once after SIGKILL of a foreign slot's worker and a standby's"
        f" takeover ({workers} workers on that slot)")
