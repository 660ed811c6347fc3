#!/usr/bin/env bash
# Elastic lease fleets through a transaction-mode pooler: W = 4, 8, 16, 32
# workers share n = 64 slots with claim_leases (a lease thread per worker
# calling it every ttl/3; per batch my_items(..., pending => 'done'), an
# I/O-bound handler of 1 ms per row outside any transaction, then one
# transaction with fence and the batch's UPDATE, in one message), against the FOR UPDATE
# SKIP LOCKED queue with the same handler, batches of 10 and the same pool
# (its claim sets a visibility timeout, so it holds no transaction during
# the handler). Items/s per W side by side in one run (medians of rounds),
# the CPU of the server, PgBouncer and the client, ratio lines; then the
# rebalancing of 8 working workers when a ninth joins, one leaves
# (max => 0) and one is killed (ttl): time to balance and slots moved.
# Writes docs/elastic-throughput.svg (BENCH_ELASTIC_OUT).
#
# Knobs (environment): BENCH_ELASTIC_WORKERS (4,8,16,32), BENCH_ELASTIC_POOL
# (8 server connections), BENCH_ELASTIC_N (64), BENCH_ELASTIC_BATCH (10),
# BENCH_ELASTIC_WORK_US (1000 per row), BENCH_ELASTIC_TTL_MS (3000),
# BENCH_ELASTIC_FENCE (implicit: "SELECT fence(...); UPDATE ..." in one
# message, one transaction; block: the same between BEGIN and COMMIT;
# lease_valid: one UPDATE behind lease_valid),
# BENCH_ELASTIC_SECONDS (4 per window), BENCH_ELASTIC_ROUNDS (3),
# BENCH_ELASTIC_METHODS (leases,queue; queue_tx adds the queue that holds
# its transaction through the handler), BENCH_ELASTIC_REBALANCE_ROUNDS (3),
# BENCH_ELASTIC_OUT (docs).
# The program: bench/src/bin/elastic_bench/.
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT

pool="${BENCH_ELASTIC_POOL:-8}"
bin="$(bench_rust elastic_bench)"
pgc_pgbouncer_start "$pool" >/dev/null 2>&1 || { echo "elastic: PgBouncer did not start" >&2; exit 1; }
"$bin" \
    --pooler-dsn "host=127.0.0.1 port=$PGC_POOLER_PORT user=${PGUSER:-postgres} dbname=${PGDATABASE:-postgres}" \
    --pooler-pidfile "${PGC_POOLERS[-1]}/pgbouncer.pid" \
    --pool "$pool" \
    --workers "${BENCH_ELASTIC_WORKERS:-4,8,16,32}" \
    --n "${BENCH_ELASTIC_N:-64}" \
    --batch "${BENCH_ELASTIC_BATCH:-10}" \
    --work-us "${BENCH_ELASTIC_WORK_US:-1000}" \
    --ttl-ms "${BENCH_ELASTIC_TTL_MS:-3000}" \
    --fence "${BENCH_ELASTIC_FENCE:-implicit}" \
    --seconds "${BENCH_ELASTIC_SECONDS:-4}" \
    --rounds "${BENCH_ELASTIC_ROUNDS:-3}" \
    --methods "${BENCH_ELASTIC_METHODS:-leases,queue}" \
    --rebalance-rounds "${BENCH_ELASTIC_REBALANCE_ROUNDS:-3}" \
    --out-dir "${BENCH_ELASTIC_OUT:-docs}"
