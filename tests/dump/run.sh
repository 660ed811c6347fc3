#!/usr/bin/env bash
# Dump and restore: a database that uses pg_claim installed in its own schema
# (CREATE EXTENSION pg_claim SCHEMA claim) with expression indexes, a
# generated column, a view and hash partitions on its functions, dumped with
# pg_dump in the custom and the plain format and restored into fresh
# databases (pg_restore --exit-on-error, psql -1 with ON_ERROR_STOP). Checks:
# no error, every index valid and used by the query it serves, and the same
# results from the same queries as in the original database.
#
# Runs against PGHOST/PGPORT with the client programs in $PGC_BIN (or PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bin="${PGC_BIN:+$PGC_BIN/}"
q() { "${bin}psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
value() { "${bin}psql" -X -At -v ON_ERROR_STOP=1 "$@"; }
export PGOPTIONS="-c search_path=public,claim -c client_min_messages=warning"
src=pg_claim_dump_src
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fresh_db() { q -d postgres -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1"; }
fresh_db $src
q -d $src -c "CREATE SCHEMA claim" -c "CREATE EXTENSION pg_claim SCHEMA claim"
q -d $src -f ../fixtures/objects.sql
q -d $src -v phase=before -f ../fixtures/results.sql
"${bin}pg_dump" -Fc -d $src -f "$work/db.dump"
"${bin}pg_dump" -Fp -d $src -f "$work/db.sql"

# check DB FORMAT: the restored database gives the original's results, and
# the planner uses the slot index for a share
check() {
    local db="$1" format="$2"
    q -d "$db" -v phase=after -f ../fixtures/results.sql
    local changed
    changed=$(value -d "$db" -c "
        SELECT string_agg(b.what || ': ' || b.result || ' -> ' || coalesce(a.result, 'missing'), '; ')
        FROM up_results b LEFT JOIN up_results a ON a.what = b.what AND a.phase = 'after'
        WHERE b.phase = 'before' AND a.result IS DISTINCT FROM b.result")
    [ -z "$changed" ] || { echo "dump ($format): results changed after the restore: $changed" >&2; return 1; }
    local plan
    plan=$(value -d "$db" -c "EXPLAIN SELECT id FROM up_items WHERE claim.slot_of(id, 8) = 3 ORDER BY id LIMIT 50")
    grep -q up_items_slot <<<"$plan" || { echo "dump ($format): the slot index is not used: $plan" >&2; return 1; }
    local schema
    schema=$(value -d "$db" -c "SELECT extnamespace::regnamespace FROM pg_extension WHERE extname = 'pg_claim'")
    [ "$schema" = claim ] || { echo "dump ($format): the extension is in $schema, not claim" >&2; return 1; }
}

fresh_db pg_claim_dump_custom
"${bin}pg_restore" --exit-on-error -d pg_claim_dump_custom "$work/db.dump"
check pg_claim_dump_custom custom

fresh_db pg_claim_dump_plain
q -1 -d pg_claim_dump_plain -f "$work/db.sql" >/dev/null
check pg_claim_dump_plain plain

checked=$(value -d pg_claim_dump_plain -c "SELECT count(*) FROM up_results WHERE phase = 'after'")
for db in $src pg_claim_dump_custom pg_claim_dump_plain; do
    q -d postgres -c "DROP DATABASE $db WITH (FORCE)"
done
echo "dump and restore (custom and plain formats, extension in schema claim): no error, $checked results unchanged, indexes valid and used"
