#!/usr/bin/env python3
"""pg_claim with Citus (docs/scale-out.md, "Citus"), on three servers.

Needs a Citus coordinator (PGHOST/PGPORT) and two Citus worker nodes
(PGC_CITUS_WORKERS="PORT PORT", same PGHOST; listening on 127.0.0.1), each
with shared_preload_libraries = 'citus', as scripts/test starts them. Checks:

1. the layout: `items` distributed by `skey` with n = 4 shards, and
   slot_keys mapping each slot to a key of its own shard (found with
   Citus's routing function), so each slot's share is one whole shard: every
   shard holds the rows of exactly one slot, and every row is under its
   slot_of(id, 4);
2. every slot's batch and the batch's UPDATE are router queries: EXPLAIN shows
   one task on one node, the node holding that slot's shard; my_items on the
   distributed table gives the same batch; slot_counts gives each slot's
   count;
3. claim_slot runs on the coordinator: a fleet of 4 workers and 2 standbys
   (tests/shards/shards.py, mode citus) drains the table while one worker is
   killed with SIGKILL a third into its share; a standby takes its slot
   over, the processing log holds every item exactly once, and Citus's
   counters (citus_stat_counters) show only single-shard queries;
4. a lease fleet of pg_claim.Worker through PgBouncer while Citus moves a
   shard, a node is added and the shards are rebalanced, with slot_backlog
   and the fleet views checked against each shard's count
   (tests/citus/lease.py).

Exits non-zero on any failed check.
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shards"))
import shards  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import fleet_driver  # noqa: E402
from fleet_driver import check, poll  # noqa: E402
import lease  # noqa: E402

DB = "pg_claim_citus"
N = 4
ITEMS = 4000
BATCH = 50
ITEM_US = 2000
COORD = int(os.environ["PGPORT"])
WORKERS = [int(p) for p in os.environ["PGC_CITUS_WORKERS"].split()]


def build():
    shards.build_citus(COORD, WORKERS, DB, N, ITEMS)


def layout(c):
    rows = c.execute("""
        SELECT get_shard_id_for_distribution_column('items', skey) AS shard,
               count(DISTINCT skey), count(*) FILTER (WHERE k.slot <> slot_of(id, %s))
        FROM items i JOIN slot_keys k ON k.key = i.skey GROUP BY 1""", (N,)).fetchall()
    check(len(rows) == N, f"the items are in {len(rows)} shards, not {N}")
    for shard, slots, wrong in rows:
        check(slots == 1, f"shard {shard} holds the rows of {slots} slots")
        check(wrong == 0, f"shard {shard}: {wrong} rows under another slot's key")
    # slot_counts works on the distributed table (a multi-shard aggregate)
    counts = c.execute("SELECT slot, items FROM slot_counts('items', %s, key => 'id')", (N,)).fetchall()
    expected = c.execute("SELECT k.slot, count(*) FROM items i JOIN slot_keys k ON k.key = i.skey"
                         " GROUP BY 1 ORDER BY 1").fetchall()
    check(sorted(counts) == expected, f"slot_counts on the distributed table: {counts}, expected {expected}")


def explain(c, sql, params):
    return "\n".join(r[0] for r in c.execute("EXPLAIN (VERBOSE, COSTS OFF) " + sql, params).fetchall())


def router(c):
    for slot in range(N):
        (key,) = c.execute("SELECT key FROM slot_keys WHERE slot = %s", (slot,)).fetchone()
        (node,) = c.execute("""
            SELECT p.nodeport FROM pg_dist_shard_placement p
            WHERE p.shardid = get_shard_id_for_distribution_column('items', %s)""", (key,)).fetchone()
        ids = [r[0] for r in c.execute(shards.FETCH_CITUS, (key, 0, BATCH)).fetchall()]
        check(len(ids) == BATCH, f"slot {slot}: a batch of {len(ids)} rows")
        # my_items on the distributed table (a custom plan per batch, which
        # Citus can plan: a multi-shard query) gives the same batch
        got = [r[0] for r in c.execute("SELECT id FROM my_items(NULL::items, %s, %s, key => 'id', batch => %s)",
                                       (slot, N, BATCH)).fetchall()]
        check(got == ids, f"slot {slot}: my_items gives {got[:5]}..., the router query {ids[:5]}...")
        for what, sql, params in (("batch", shards.FETCH_CITUS, (key, 500, BATCH)),
                                  ("UPDATE", shards.MARK_CITUS, (key, ids))):
            plan = explain(c, sql, params)
            check(re.search(r"Task Count: 1\b", plan), f"slot {slot}: the {what} is not one task:\n{plan}")
            nodes = re.findall(r"Node: host=\S+ port=(\d+)", plan)
            check(nodes == [str(node)], f"slot {slot}: the {what} runs on {nodes}, not on {node} only:\n{plan}")


def fleet():
    with tempfile.TemporaryDirectory() as work:
        with shards.connect(COORD, DB) as c:
            c.execute("SELECT citus_stat_counters_reset(0)")
        f = shards.Fleet(COORD, DB, N, BATCH, ITEM_US, 4, 2, work, "citus")
        try:
            victim, slot = poll(lambda: next(((e["proc"], e["slot"]) for e in f.events() if e["event"] == "claimed"),
                                             None), 60, "a worker to claim a slot")
            poll(lambda: any(e["event"] == "batch" and e["proc"] == victim and e["total"] >= ITEMS // N // 3
                             for e in f.events()), 60, "the victim to process a third of its share")
            failed = f.kill_one_then_finish(victim)
        finally:
            f.kill()
        check(not failed, f"workers {failed} failed")
        takers = {e["proc"] for e in f.events() if e["event"] == "claimed" and e["slot"] == slot}
        check(len(takers) >= 2, f"no standby took slot {slot} over: {takers}")
    with shards.connect(COORD, DB) as c:
        # the fleet's distributed statements, counted by Citus
        single, multi = shards.citus_executions(c)
        total, distinct, slot_workers = c.execute("""
            SELECT count(*), count(DISTINCT item),
                   (SELECT count(DISTINCT worker) FROM processing_log WHERE slot = %s)
            FROM processing_log""", (slot,)).fetchone()
        (left,) = c.execute("SELECT count(*) FROM items WHERE NOT done").fetchone()
        (wrong,) = c.execute("SELECT count(*) FROM processing_log WHERE slot <> slot_of(item, %s)", (N,)).fetchone()
    check(total == ITEMS and distinct == ITEMS,
          f"the processing log has {total} rows for {distinct} of {ITEMS} items (every item exactly once expected)")
    check(left == 0 and wrong == 0, f"{left} items not done, {wrong} processed under another slot")
    check(slot_workers >= 2, f"slot {slot}'s items were processed by {slot_workers} worker(s)")
    check(multi == 0 and single >= 2 * ITEMS // BATCH,
          f"the fleet ran {single} single-shard and {multi} multi-shard queries (only single-shard ones expected)")
    return single


def main():
    build()
    with shards.connect(COORD, DB) as c:
        layout(c)
        router(c)
    single = fleet()
    with tempfile.TemporaryDirectory() as work:
        leases = lease.run(COORD, WORKERS, work)
    for port in [COORD, *WORKERS]:
        with shards.connect(port, "postgres") as c:
            c.execute(f"DROP DATABASE {DB} WITH (FORCE)")
    print(f"citus (coordinator + {len(WORKERS)} worker nodes, n = {N}): each slot's share is one whole shard, every"
          f" batch and UPDATE one task on its shard's node; my_items and slot_counts agree; {ITEMS} items processed exactly once"
          f" after SIGKILL of a worker and a standby's takeover, in {single} single-shard and 0 multi-shard queries; {leases}")


if __name__ == "__main__":
    fleet_driver.run_main("citus", main)
