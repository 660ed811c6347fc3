#!/usr/bin/env bash
# claim_leases at scale: the time of one call with M live holders of one
# name (M = 1,000 and 10,000 by default), n = 1024 slots, on a direct
# connection, one client: a random live holder's call, which renews its
# leases and computes its target (a stable fleet: nothing changes hands).
# Each M twice:
#   current   the statistics of the leases and members tables know the name
#             (ANALYZE after the fleet is laid out);
#   unknown   they were taken before the name had a row (the planner
#             estimates one row of it: a new name, or stale statistics).
# Autovacuum is off for the two tables while it runs, so the statistics stay
# as set. The fleet is laid out by inserting the rows a balanced fleet of M
# holders leaves (slot s held by holder s mod M; each member's count as of
# its last call), and checked first: one call of every 97th holder moves no
# slot.
#
# Knobs (environment): BENCH_HOLDERS ("1000 10000"), BENCH_PERCALL_SECONDS
# (2 per run, 3 runs).
source "$(dirname "$0")/lib.sh"

holders="${BENCH_HOLDERS:-1000 10000}"
n=1024

bench_setup <<'SQL'
ALTER TABLE pg_claim_lease_members SET (autovacuum_enabled = off);
ALTER TABLE pg_claim_leases SET (autovacuum_enabled = off);
SQL
trap 'bench_psql -c "ALTER TABLE pg_claim_lease_members RESET (autovacuum_enabled); ALTER TABLE pg_claim_leases RESET (autovacuum_enabled)" >/dev/null; rm -rf "$BENCH_TMP"' EXIT

# layout M STATS: the name bench_holders with M live holders of n slots
layout() {
    local m="$1" stats="$2"
    bench_psql <<SQL >/dev/null
SET client_min_messages = warning;
DELETE FROM pg_claim_leases WHERE name = 'bench_holders';
DELETE FROM pg_claim_lease_members WHERE name = 'bench_holders';
$([ "$stats" = unknown ] && echo "ANALYZE pg_claim_leases; ANALYZE pg_claim_lease_members;")
INSERT INTO pg_claim_leases (name, slot, n, holder, token, acquired_at, expires_at, owner)
SELECT 'bench_holders', s, $n, 'h' || (s % $m), next_token(NULL), now(), now() + interval '1 hour',
       current_user::regrole
FROM generate_series(0, $n - 1) s;
INSERT INTO pg_claim_lease_members (name, holder, owner, n, max, held, joined_at, seen_at, expires_at)
SELECT 'bench_holders', 'h' || h, current_user::regrole, $n, $n,
       $n / $m + (h < $n % $m)::int, now() - h * interval '1 millisecond', now(), now() + interval '1 hour'
FROM generate_series(0, $m - 1) h;
$([ "$stats" = current ] && echo "ANALYZE pg_claim_leases; ANALYZE pg_claim_lease_members;")
CREATE TEMP TABLE before AS SELECT slot, token FROM pg_claim_leases WHERE name = 'bench_holders';
SELECT count(*) FROM generate_series(0, $m - 1, 97) h, LATERAL claim_leases('bench_holders', $n, 'h' || h, ttl => '1 hour');
DO \$\$ BEGIN
    IF EXISTS (SELECT 1 FROM before b JOIN pg_claim_leases l USING (slot)
               WHERE l.name = 'bench_holders' AND (l.token <> b.token OR l.expires_at <= now())) THEN
        RAISE EXCEPTION 'the laid-out fleet of % holders is not stable', $m;
    END IF;
END \$\$;
SQL
}

echo "claim_leases, one call of a random live holder of $n slots (direct connection, one client, median of 3 runs of ${BENCH_PERCALL_SECONDS:-2} s)"
printf '%8s %16s %16s\n' holders "current stats" "unknown name"
for m in $holders; do
    call=$(printf '%s\n' "\\set h random(0, $((m - 1)))" \
        "SELECT count(*) FROM claim_leases('bench_holders', $n, 'h' || :h, ttl => '1 hour');")
    layout "$m" current
    current=$(bench_percall current "$call")
    layout "$m" unknown
    unknown=$(bench_percall unknown "$call")
    printf '%8s %13s us %13s us\n' "$m" "$current" "$unknown"
done
bench_psql -c "DELETE FROM pg_claim_leases WHERE name = 'bench_holders'; DELETE FROM pg_claim_lease_members WHERE name = 'bench_holders'" >/dev/null
