# The prologue of every benchmark in bench/: each NN-*.sh sources it first.
# Strict mode, the checkout's root as the working directory, a scratch
# directory removed on exit ($BENCH_TMP), one psql helper, the set-up every
# benchmark starts with, and the build of the Rust benchmarks (crate bench/,
# package pg_claim_bench). Needs PGHOST/PGPORT/PGUSER of a cluster where
# pg_claim can be created (scripts/bench starts one).

set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BENCH_ROOT="$(dirname "$BENCH_DIR")"
cd "$BENCH_ROOT"
BENCH_TMP="$(mktemp -d)"
trap 'rm -rf "$BENCH_TMP"' EXIT

# bench_psql [psql options...]: psql on the database postgres, without
# ~/.psqlrc, quiet, stopping at the first error.
bench_psql() { psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }

# bench_setup <<SQL: quietly (client_min_messages = warning) creates
# pg_claim and the timing helper bench.time_queries of common.sql, then runs
# the benchmark's own set-up SQL from stdin.
bench_setup() {
    {
        echo "SET client_min_messages = warning;"
        echo "CREATE EXTENSION IF NOT EXISTS pg_claim;"
        cat "$BENCH_DIR/common.sql"
        cat
    } | bench_psql >/dev/null
}

# bench_rust NAME: builds the Rust benchmark NAME (bench/src/bin/NAME/) and
# prints the path of its binary.
bench_rust() {
    cargo build --quiet --release -p pg_claim_bench --bin "$1"
    printf '%s\n' "$BENCH_ROOT/target/release/$1"
}

# bench_time RUNS QUERY...: runs each QUERY RUNS times, interleaved, with
# parallel workers and JIT off (plus the settings in $BENCH_SETTINGS), and
# writes the median wall time of each in ms to $BENCH_TMP/times, one line
# per query in order (bench.time_queries of common.sql).
bench_time() {
    local runs="$1" q list=""
    shift
    for q in "$@"; do
        list+="${list:+, }\$bench\$$q\$bench\$"
    done
    bench_psql -At <<SQL >"$BENCH_TMP/times"
SET max_parallel_workers_per_gather = 0;
SET jit = off;
${BENCH_SETTINGS:-}
SELECT median_ms FROM bench.time_queries(ARRAY[$list], $runs);
SQL
}

# bench_report ARG... <<'PY': runs the Python on stdin that prints the
# benchmark's lines from the medians of the last bench_time, with sys
# imported, the ARGs in sys.argv[1:] and the medians in the list t.
bench_report() {
    python3 -c "import sys
t = [float(l) for l in open(sys.argv.pop(1)) if l.strip()]
$(cat)" "$BENCH_TMP/times" "$@"
}

# bench_percall NAME SQL [PGBENCH OPTION...]: the microseconds per
# transaction of the pgbench script SQL, one client on a direct connection,
# simple protocol: the median of 3 runs of ${BENCH_PERCALL_SECONDS:-2} s.
# NAME only labels the call in the caller's output.
bench_percall() {
    local sql="$2" runs=() i pgbench
    # beside the psql the benchmarks run (scripts/bench's installation)
    pgbench="${PGC_BIN:-$(dirname "$(command -v psql)")}/pgbench"
    shift 2
    printf '%s\n' "$sql" >"$BENCH_TMP/percall.sql"
    for i in 1 2 3; do
        runs+=("$("$pgbench" -n -M simple -c 1 -T "${BENCH_PERCALL_SECONDS:-2}" "$@" \
            -f "$BENCH_TMP/percall.sql" postgres 2>/dev/null |
            sed -n 's/^latency average = \([0-9.]*\) ms/\1/p')")
    done
    printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p | python3 -c "import sys; print(round(float(sys.stdin.read()) * 1000, 1))"
}
