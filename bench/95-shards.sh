#!/usr/bin/env bash
# Scale-out (docs/scale-out.md): the same drain (claim_slot, my_items with
# method => 'pg_hash' on a table hash-partitioned into n = W partitions, each
# batch marked done and logged through one server) on one server (all
# partitions local) and on the postgres_fdw layout (the bench cluster as the
# coordinator with one local partition, the others foreign tables on two
# shard servers started here from the same installation), with every batch
# through the coordinator (my_items, the UPDATE routed by it) or, "direct",
# claim_slot on the coordinator and each batch on the server that holds the
# slot's partition (a keyset query on it); and on Citus where it is built
# (installed as docs/scale-out.md says: a coordinator and two worker nodes, the layout of
# tests/citus/run.py). For W = 4, 8, 16, 32 workers: items/s; the CPU time
# each server spends per batch (a server's postmaster collects the CPU time
# of its exited backends: read from /proc before and after the drain), the
# cost of a batch, which the servers sharing the CPUs of one machine does not
# change; and the statements that touched more than one shard server, read
# from each worker's session (postgres_fdw_get_connections: a bound, target
# 0) or, on Citus, its counts of multi-shard executions
# (citus_stat_counters). Every item is checked to be processed exactly once.
# On one machine the servers and the workers share the CPUs (and the other
# load on it): items/s does not show what separate shard machines would add;
# the CPU per batch and the shard-touch count do.
#
# Options (environment):
#   BENCH_SHARDS_ITEMS    items per drain  (default 40000)
#   BENCH_SHARDS_WORKERS  the W values     (default "4 8 16 32")
#   BENCH_SHARDS_BATCH    items per batch  (default 50)
# The program: tests/shards/shards.py (shared with the test tests/shards/test_shards.py).
source "$(dirname "$0")/lib.sh"
ITEMS="${BENCH_SHARDS_ITEMS:-40000}"
WORKERS="${BENCH_SHARDS_WORKERS:-4 8 16 32}"
BATCH="${BENCH_SHARDS_BATCH:-50}"
coord="$PGPORT"
major=$(($(bench_psql -At -c "SHOW server_version_num") / 10000))
# the shard servers from the bench cluster's installation (scripts/lib.sh)
source "$BENCH_ROOT/scripts/lib.sh" --pg "$major"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT
if [ ! -f "$PGC_INST$PGC_PG_SHARE/extension/postgres_fdw.control" ]; then
    echo "shards: skipped, PostgreSQL $major's installation has no postgres_fdw"
    exit 0
fi
ports=()
for s in a b; do
    pgc_cluster_start "bench-shard-$s" "max_wal_size = 4GB" 2>/dev/null
    ports+=("$PGPORT")
done
export PGPORT="$coord"
echo "the same drain of $ITEMS items (batches of $BATCH, n = W slots = partitions) on one server and on a coordinator + 2 shard servers (postgres_fdw: batches through the coordinator, or direct on the slot's server), $(nproc) cores shared by all servers and workers"
drain() { python3 tests/shards/shards.py bench "$coord" "$1" pg_claim_bench_shards "$ITEMS" "$BATCH" "$WORKERS" "$BENCH_TMP" "$2"; }
drain "" fdw
drain "${ports[*]}" fdw
drain "${ports[*]}" direct
for p in "$coord" "${ports[@]}"; do
    psql -X -q -p "$p" -d postgres -c "DROP DATABASE IF EXISTS pg_claim_bench_shards WITH (FORCE)"
done
if pgc_citus_installed; then
    # a Citus coordinator and two worker nodes (claims on the coordinator)
    pgc_citus_start bench-citus-coordinator bench-citus-worker-1 bench-citus-worker-2
    export PGPORT="$coord"
    python3 tests/shards/shards.py bench "${PGC_CITUS_PORTS[0]}" "${PGC_CITUS_PORTS[*]:1}" pg_claim_bench_shards \
        "$ITEMS" "$BATCH" "$WORKERS" "$BENCH_TMP" citus
else
    echo "citus: skipped, Citus is not installed for PostgreSQL $major (expected in $(pgc_citus_dir), see docs/scale-out.md)"
fi
