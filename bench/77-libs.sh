#!/usr/bin/env bash
# The worker libraries against a FOR UPDATE SKIP LOCKED loop in the same
# language, side by side: for each number of workers W, one PgBouncer in
# pool_mode = transaction with a pool of W server connections, then the
# Python script (clients/python/tests/bench.py: pg_claim.Worker and a psycopg
# loop) and the Node.js script (clients/node/bench/throughput.js: pg-claim's
# Worker and a node-postgres loop), each draining a table in batches with a
# handler of 0 ms and of 1 ms per row, its two ways alternating round by
# round. Each script prints the median items/s of each way, their ratio, and
# where a batch's time went (round trips through the pooler, waits for a
# server connection, client CPU, and the server's execution time where the
# server loads pg_stat_statements: BENCH_SERVER_CONF="shared_preload_libraries
# = 'pg_stat_statements'" scripts/bench libs).
#
# Knobs: BENCH_LIBS_WORKERS ("4 16"), BENCH_LIBS_ROUNDS (5), BENCH_LIBS_ITEMS
# (20000), BENCH_LIBS_BATCH (10), BENCH_LIBS_N (64), BENCH_LIBS_ROW_MS ("0 1"),
# BENCH_LIBS_LANGS ("python node").
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT

workers="${BENCH_LIBS_WORKERS:-4 16}"
rounds="${BENCH_LIBS_ROUNDS:-5}"
items="${BENCH_LIBS_ITEMS:-20000}"
batch="${BENCH_LIBS_BATCH:-10}"
n="${BENCH_LIBS_N:-64}"
row_ms="${BENCH_LIBS_ROW_MS:-0 1}"
langs="${BENCH_LIBS_LANGS:-python node}"

# the scripts create and drop databases of their own (py_bench, node_bench)
bench_setup </dev/null
direct="postgresql://${PGUSER:-postgres}@127.0.0.1:$PGPORT/postgres"
echo "worker libraries / SKIP LOCKED loop of the same language: $items items, batches of $batch, n = $n," \
    "handlers of ${row_ms// /, } ms per row, $rounds rounds each way, alternating; PgBouncer (transaction mode), pool = W"
for w in $workers; do
    pgc_pgbouncer_start "$w" >/dev/null 2>&1
    for lang in $langs; do
        echo
        case "$lang" in
        python)
            echo "Python (pg_claim.Worker, psycopg loop), W = $w:"
            # shellcheck disable=SC2086 # the lists are one argument per value
            PGC_POOLER_PORT="$PGC_POOLER_PORT" python3 clients/python/tests/bench.py --items "$items" \
                --batch "$batch" --n "$n" --workers "$w" --io-ms 0 --row-ms $row_ms --rounds "$rounds"
            ;;
        node)
            echo "Node.js (pg-claim Worker, node-postgres loop), W = $w:"
            (cd clients/node && node bench/throughput.js --direct "$direct" \
                --pooled "postgresql://postgres@127.0.0.1:$PGC_POOLER_PORT/postgres" --items "$items" \
                --batch "$batch" --n "$n" --workers "$w" --io-ms 0 --row-ms "${row_ms// /,}" --rounds "$rounds")
            ;;
        *)
            echo "BENCH_LIBS_LANGS: unknown language '$lang' (python, node)" >&2
            exit 2
            ;;
        esac
    done
    pgc_cleanup
done
