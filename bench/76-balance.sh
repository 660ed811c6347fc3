#!/usr/bin/env bash
# Balance: pg_claim.Worker in lease mode against a FOR UPDATE SKIP LOCKED
# queue with the same handler, rows and workers, through PgBouncer in
# transaction mode, every scheme in one run: makespan and its ratio to the
# queue's, the idle tail, rows moved per hand-over, hand-over latency, the
# bound of the heaviest slot, every row done exactly once; workers join,
# leave, are killed and paused past their ttl mid-run. The driver is
# bench/balance.py (scenarios and figures there); its options come from
# scripts/bench's command line (`scripts/bench balance --quick --scenario a`,
# BENCH_ARGS). Writes target/bench/balance.json, balance.txt and
# balance-a.svg (the plot of scenario a).
#
# Knobs (environment): BENCH_BALANCE_POOL (16 server connections).
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT
python3 -c 'import psycopg' 2>/dev/null || pgc_ensure_clients

pool="${BENCH_BALANCE_POOL:-16}"
pgc_pgbouncer_start "$pool" >/dev/null 2>&1 || { echo "balance: PgBouncer did not start" >&2; exit 1; }
read -ra args <<<"${BENCH_ARGS:-}"
python3 "$BENCH_DIR/balance.py" "${args[@]}"
