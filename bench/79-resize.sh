#!/usr/bin/env bash
# Resize: W = 32 pg_claim.Worker processes (lease mode) through PgBouncer in
# transaction mode drain an outbox on n = 8, and resize_fleet takes the
# fleet to n = 32 mid-run: items/s before and after, the time from the call
# to every new slot being held and served, the per-second series and the
# dip of the switch, every row done exactly once. The driver is
# bench/resize.py (its figures there); its options come from scripts/bench's
# command line (`scripts/bench resize --quick`, BENCH_ARGS). Writes
# target/bench/resize.json and resize.txt.
#
# Knobs (environment): BENCH_RESIZE_POOL (40 server connections: a batch
# holds one for its handler's I/O, and 32 slots serve at once).
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT
python3 -c 'import psycopg' 2>/dev/null || pgc_ensure_clients

pool="${BENCH_RESIZE_POOL:-40}"
pgc_pgbouncer_start "$pool" >/dev/null 2>&1 || { echo "resize: PgBouncer did not start" >&2; exit 1; }
read -ra args <<<"${BENCH_ARGS:-}"
python3 "$BENCH_DIR/resize.py" "${args[@]}"
