#!/usr/bin/env bash
# pg_claim's errors carry no Rust backtrace, whatever the server's
# environment. pgrx appends a captured Rust backtrace to the DETAIL of
# every ERROR that passes through Rust code when the standard library's
# backtrace capture is enabled (RUST_BACKTRACE or RUST_LIB_BACKTRACE in the
# server's environment); pg_claim turns capture off when it is loaded
# (backend::error::disable_backtraces).
#
# Usage: tests/backtrace/run.sh DATA_DIR
# Restarts the cluster of DATA_DIR (the PGHOST/PGPORT one, run by the
# postgres user) with RUST_BACKTRACE=1 and RUST_LIB_BACKTRACE=1 in its
# environment, checks that the server has them, then checks the DETAIL of
# errors raised through my_items and my_items_query:
#   - a PostgreSQL ERROR inside my_items' query (a jsonb key paged with an
#     invalid after value): PostgreSQL's own DETAIL, nothing more;
#   - an ERROR of pg_claim itself (slot out of range): no DETAIL;
#   - an ERROR through slot_counts (PL/pgSQL around a Rust function).
# Client programs from $PGC_BIN (or PATH).
set -euo pipefail
data="$1"
bin="${PGC_BIN:+$PGC_BIN/}"
log="$(dirname "$data")/server-backtrace.log"
runuser -u postgres -- env RUST_BACKTRACE=1 RUST_LIB_BACKTRACE=1 \
    "${bin}pg_ctl" -D "$data" -l "$log" -w -t 60 restart >/dev/null
pid=$(head -1 "$data/postmaster.pid")
tr '\0' '\n' <"/proc/$pid/environ" | grep -qx 'RUST_BACKTRACE=1' ||
    { echo "backtrace: the server was not started with RUST_BACKTRACE=1" >&2; exit 1; }

db=pg_claim_backtrace
"${bin}psql" -X -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
# one error per statement; psql goes on after each (no ON_ERROR_STOP)
out=$("${bin}psql" -X -q -d "$db" 2>&1 <<'SQL' || true
\set VERBOSITY default
SET client_min_messages = warning;
CREATE EXTENSION pg_claim;
CREATE TABLE bt_items (doc jsonb PRIMARY KEY);
INSERT INTO bt_items SELECT jsonb_build_object('id', g) FROM generate_series(1, 10) g;
\echo == postgres_error
SELECT count(*) FROM my_items(NULL::bt_items, 0, 2, method => 'pg_hash', after => '{"id": ', batch => 5);
\echo == pg_claim_error
SELECT count(*) FROM my_items(NULL::bt_items, 2, 2, method => 'pg_hash');
\echo == query_error
SELECT my_items_query('bt_items'::regtype, 0, 2);
\echo == slot_counts_error
SELECT * FROM slot_counts('bt_items', 0);
\echo == end
SQL
)
"${bin}psql" -X -q -d postgres -c "DROP DATABASE $db"
echo "$out"

fail=0
expect() {
    if ! grep -qF -- "$1" <<<"$out"; then
        echo "backtrace: expected the line: $1" >&2
        fail=1
    fi
}
expect 'ERROR:  invalid input syntax for type json'
expect 'DETAIL:  The input string ended unexpectedly.'
expect 'ERROR:  slot must be between 0 and 1 (n = 2), got 2'
expect 'ERROR:  method "auto" cannot map key column doc of type pg_catalog.jsonb'
expect 'ERROR:  n must be at least 1, got 0'
# every DETAIL line is PostgreSQL's own one-line DETAIL; no backtrace
# frames ("   0: std::backtrace...", "at src/...", "stack backtrace")
details=$(grep -c '^DETAIL:' <<<"$out" || true)
if [ "$details" != 1 ]; then
    echo "backtrace: expected exactly one DETAIL line, got $details" >&2
    fail=1
fi
if grep -nE '^ *[0-9]+: |backtrace|^ +at [^ ]+\.rs:' <<<"$out"; then
    echo "backtrace: a Rust backtrace reached the client" >&2
    fail=1
fi
[ $fail = 0 ] && echo "backtrace: no Rust backtrace in any DETAIL with RUST_BACKTRACE=1 in the server's environment"
exit $fail
