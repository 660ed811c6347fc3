#!/usr/bin/env bash
# Waking a slot's worker (docs/wake.md): insert -> processed latency p50 /
# p99 of a fleet of pg_claim.Worker (lease mode through PgBouncer) that
# LISTENs on notify_slot's per-slot channels on a direct connection
# (fallback poll 30 s) against one that polls every second, side by side on
# the same insert moments, and the queries each idle fleet sends per minute.
# The client is bench/wake.py (the Python library, psycopg 3), which creates
# a database for each fleet; knobs there.
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT
python3 -c 'import psycopg' 2>/dev/null || pgc_ensure_clients

# a server connection for each of the 16 workers' work and lease connections
pgc_pgbouncer_start 32 >/dev/null 2>&1
PGC_POOLER_PORT="$PGC_POOLER_PORT" python3 "$BENCH_DIR/wake.py"
