#!/usr/bin/env bash
# In-place upgrade: CREATE EXTENSION pg_claim VERSION '<old>' in a database
# that then uses it (expression indexes, a generated column, a view, a table
# partitioned the way pg_hash_slot routes, a slot held by another session),
# ALTER EXTENSION pg_claim UPDATE, and check that
#   - the updated extension's objects are identical to a fresh install of the
#     current version (catalog.sql, an empty diff): this also fails when the
#     generated install script changed and no upgrade script covers it;
#   - every object built on the old version gives the same results, through
#     the same, still valid indexes (no rebuild: mapping values never change);
#   - the slot held across the update is still held.
# Runs against PGHOST/PGPORT, a server whose installation has the frozen
# install scripts of earlier versions (scripts/lib.sh puts tests/upgrade/releases/pg_claim--*.sql
# there).
#
#   tests/upgrade/run.sh [OLD_VERSION]      default 0.1.0
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
old="${1:-0.1.0}"
q() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
value() { psql -X -At -v ON_ERROR_STOP=1 "$@"; }

new=$(value -d postgres -c "SELECT default_version FROM pg_available_extensions WHERE name = 'pg_claim'")
for db in pg_claim_up_old pg_claim_up_new; do
    q -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
done
q -d pg_claim_up_old -c "CREATE EXTENSION pg_claim VERSION '$old'"
q -d pg_claim_up_old -f ../fixtures/objects.sql
q -d pg_claim_up_old -v phase=before -f ../fixtures/results.sql

# another session holds a slot across the update
psql -X -q -d pg_claim_up_old -c "SELECT claim_slot('up_held', 2)" -c "SELECT pg_sleep(120)" >/dev/null 2>&1 &
holder=$!
trap 'kill $holder 2>/dev/null || true' EXIT
deadline=$((SECONDS + 20))
until [ "$(value -d pg_claim_up_old -c "SELECT count(*) FROM slot_holders('up_held')")" = 1 ]; do
    ((SECONDS < deadline)) || { echo "upgrade: the holder did not claim its slot" >&2; exit 1; }
    sleep 0.05
done

q -d pg_claim_up_old -c "ALTER EXTENSION pg_claim UPDATE"
version=$(value -d pg_claim_up_old -c "SELECT extversion FROM pg_extension WHERE extname = 'pg_claim'")
[ "$version" = "$new" ] || { echo "upgrade: extversion is $version after the update, not $new" >&2; exit 1; }
q -d pg_claim_up_old -v phase=after -f ../fixtures/results.sql
changed=$(value -d pg_claim_up_old -c "
    SELECT string_agg(b.what || ': ' || b.result || ' -> ' || coalesce(a.result, 'missing'), '; ')
    FROM up_results b LEFT JOIN up_results a ON a.what = b.what AND a.phase = 'after'
    WHERE b.phase = 'before' AND a.result IS DISTINCT FROM b.result")
[ -z "$changed" ] || { echo "upgrade: results changed: $changed" >&2; exit 1; }
checked=$(value -d pg_claim_up_old -c "SELECT count(*) FROM up_results WHERE phase = 'after'")
held=$(value -d pg_claim_up_old -c "SELECT count(*) FROM slot_holders('up_held')")
[ "$held" = 1 ] || { echo "upgrade: the slot held across the update is gone" >&2; exit 1; }
# the new version's functions work in the updated database
q -d pg_claim_up_old -c "SELECT count(*) FROM claim_lease('up_lease', 1, 'after the update')" \
    -c "SELECT count(*) FROM my_items(NULL::up_items, 0, 8, columns => ARRAY['email'])" >/dev/null

q -d pg_claim_up_new -c "CREATE EXTENSION pg_claim"
value -d pg_claim_up_old -f catalog.sql >"${TMPDIR:-/tmp}/pg_claim_up_old.catalog"
value -d pg_claim_up_new -f catalog.sql >"${TMPDIR:-/tmp}/pg_claim_up_new.catalog"
if ! diff -u "${TMPDIR:-/tmp}/pg_claim_up_new.catalog" "${TMPDIR:-/tmp}/pg_claim_up_old.catalog" >&2; then
    echo "upgrade: $old updated to $new differs from a fresh install of $new (diff above: - fresh, + updated)" >&2
    exit 1
fi
objects=$(wc -l <"${TMPDIR:-/tmp}/pg_claim_up_new.catalog")

kill $holder 2>/dev/null || true
for db in pg_claim_up_old pg_claim_up_new; do
    q -d postgres -c "DROP DATABASE $db WITH (FORCE)"
done
echo "upgrade $old -> $new: $objects objects identical to a fresh install, $checked results unchanged, indexes valid, the held slot kept"
