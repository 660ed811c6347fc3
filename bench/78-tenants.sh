#!/usr/bin/env bash
# Tenants: pg_claim.Worker in lease mode through PgBouncer in transaction
# mode on a table shared by one large tenant and 200 small ones, five
# schemes with the same rows, handler and workers: key order, fair
# (my_items_fair), spread (at most k workers on one tenant), and fair in a
# fleet capped at W and at G holders (cap_fleet): the small tenants' time
# from insert to done, items/s with the caps and without, the most workers
# on one tenant and in all at once, every row done exactly once. The
# driver is bench/tenants.py (figures there); its options come from
# scripts/bench's command line (`scripts/bench tenants --quick`, BENCH_ARGS).
# Writes target/bench/tenants.json and tenants.txt.
#
# Knobs (environment): BENCH_TENANTS_POOL (16 server connections).
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT
python3 -c 'import psycopg' 2>/dev/null || pgc_ensure_clients

pool="${BENCH_TENANTS_POOL:-16}"
pgc_pgbouncer_start "$pool" >/dev/null 2>&1 || { echo "tenants: PgBouncer did not start" >&2; exit 1; }
read -ra args <<<"${BENCH_ARGS:-}"
python3 "$BENCH_DIR/tenants.py" "${args[@]}"
