#!/usr/bin/env bash
# Dump and restore: a database that uses pg_claim installed in its own schema
# (CREATE EXTENSION pg_claim SCHEMA claim) with expression indexes, a
# generated column, a view and hash partitions on its functions, dumped with
# pg_dump in the custom and the plain format and restored into fresh
# databases (pg_restore --exit-on-error, psql -1 with ON_ERROR_STOP). Checks:
# no error, every index valid and used by the query it serves, the same
# results from the same queries as in the original database, and the same
# failure records (pg_claim_failures is part of a dump: an item set aside
# stays set aside, one waiting for its retry keeps its attempts and error),
# and the same defined fleets (pg_claim_fleets: name, table, owner, time of
# definition) with what the view fleets shows of them.
#
# Runs against PGHOST/PGPORT with the client programs in $PGC_BIN (or PATH).
#
# Across versions: with PGC_DUMP_FROM_PORT and PGC_DUMP_FROM_BIN (the older
# version's client programs), the original database is on that server (same
# PGHOST), an older major version, dumped with its own pg_dump and restored
# with the newer pg_restore and psql of $PGC_BIN into PGPORT's server. Not the
# newer pg_dump, the usual advice: PostgreSQL 15.20 stores a `pg_attver`
# attribute option on every column, which its own pg_dump leaves out, but
# which 18.6's pg_dump copies into the dump as `ALTER COLUMN ... SET
# (pg_attver=...)`, and 18.6 rejects that (unrecognized parameter "pg_attver").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bin="${PGC_BIN:+$PGC_BIN/}"
q() { "${bin}psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
value() { "${bin}psql" -X -At -v ON_ERROR_STOP=1 "$@"; }
export PGOPTIONS="-c search_path=public,claim -c client_min_messages=warning"
src=pg_claim_dump_src
from_port="${PGC_DUMP_FROM_PORT:-$PGPORT}"
from_bin="${PGC_DUMP_FROM_BIN:+$PGC_DUMP_FROM_BIN/}"
[ -n "${PGC_DUMP_FROM_PORT:-}" ] || from_bin="$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fresh_db() { q -p "${2:-$PGPORT}" -d postgres -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1"; }
fresh_db $src "$from_port"
q -p "$from_port" -d $src -c "CREATE SCHEMA claim" -c "CREATE EXTENSION pg_claim SCHEMA claim"
q -p "$from_port" -d $src -f ../fixtures/objects.sql
q -p "$from_port" -d $src -v phase=before -f ../fixtures/results.sql
failures_sql="SELECT string_agg(item || ' ' || state || ' ' || attempts || ' ' || last_error, '; ' ORDER BY item)
              FROM claim.item_failures('dump')"
q -p "$from_port" -d $src -c "SELECT claim.record_failure('dump', 'dead-1', 'boom', 1)" \
    -c "SELECT claim.record_failure('dump', 'retry-1', 'flaky', 5, '1 hour')" >/dev/null
failures_before=$(value -p "$from_port" -d $src -c "$failures_sql")
# defined fleets (pg_claim_fleets is part of a dump too): their definitions
# and what the view fleets shows of them
q -p "$from_port" -d $src \
    -c "CREATE TABLE dump_outbox (id bigint PRIMARY KEY, customer integer, created_at timestamptz NOT NULL,
                                  sent_at timestamptz)" \
    -c "INSERT INTO dump_outbox SELECT g, g % 7, '2026-01-01 00:00+00'::timestamptz + g * interval '1 s',
            CASE WHEN g % 4 <> 0 THEN '2026-02-01 00:00+00'::timestamptz END FROM generate_series(1, 400) g" \
    -c "CREATE INDEX dump_outbox_pending ON dump_outbox (id) WHERE sent_at IS NULL" \
    -c "SELECT claim.define_fleet('dump_mailer', 'dump_outbox', 4, 'sent_at', age => 'created_at')" \
    -c "SELECT claim.define_fleet('dump_routed', 'dump_outbox', 3, 'sent_at', route => 'customer', method => 'jump')" \
    -c "SELECT claim.record_failure('dump_mailer', '8', 'boom', 1)" >/dev/null
fleets_sql="SELECT string_agg(f::text, '; ' ORDER BY f.fleet) FROM claim.fleets f;
            SELECT string_agg(d.name || ' ' || d.tbl::text || ' ' || d.owner::text || ' ' || d.defined_at, '; ' ORDER BY d.name)
            FROM claim.pg_claim_fleets d"
fleets_before=$(PGTZ=UTC value -p "$from_port" -d $src -c "$fleets_sql")
[ "$(grep -c dump_ <<<"$fleets_before")" = 2 ] || { echo "dump: the fleets before the dump: $fleets_before" >&2; exit 1; }
from_version=$(value -p "$from_port" -d $src -c "SHOW server_version")
"${from_bin}pg_dump" -p "$from_port" -Fc -d $src -f "$work/db.dump"
"${from_bin}pg_dump" -p "$from_port" -Fp -d $src -f "$work/db.sql"

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
    local failures
    failures=$(value -d "$db" -c "$failures_sql")
    [ "$failures" = "$failures_before" ] ||
        { echo "dump ($format): failure records '$failures_before' restored as '$failures'" >&2; return 1; }
    local fleets
    fleets=$(PGTZ=UTC value -d "$db" -c "$fleets_sql")
    [ "$fleets" = "$fleets_before" ] ||
        { echo "dump ($format): fleets '$fleets_before' restored as '$fleets'" >&2; return 1; }
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
to_version=$(value -d pg_claim_dump_plain -c "SHOW server_version")
q -p "$from_port" -d postgres -c "DROP DATABASE $src WITH (FORCE)"
for db in pg_claim_dump_custom pg_claim_dump_plain; do
    q -d postgres -c "DROP DATABASE $db WITH (FORCE)"
done
echo "dump from PostgreSQL $from_version, restore into $to_version (custom and plain formats, extension in schema claim): no error, $checked results, the failure records and the defined fleets unchanged, indexes valid and used"
