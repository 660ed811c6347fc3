#!/usr/bin/env bash
# Leases through a transaction-mode pooler: W clients drain a table through
# one PgBouncer (pool_mode = transaction, a pool of P server connections),
# each batch one statement of 50 items, with
#   lease: claim_lease once per client, then
#          UPDATE ... WHERE id IN (its share's next 50, by the slot index)
#                     AND (SELECT lease_valid(name, slot, token))
#   queue: UPDATE ... FROM (the next 50 not done ... FOR UPDATE SKIP LOCKED)
# for (W, P) = (1, 1), (8, 8), (32, 32), (128, 64), (128, 16), side by side in
# one run; then, on a direct connection with one client, the cost of
# claim_lease (a re-claim), renew_lease and fence per call, and what
# lease_valid adds to a 50-item batch, in microseconds and (with valgrind) in
# instructions, which the machine's load does not change, and in
# instructions what fence once per transaction adds to it, beside SELECT 1.
# Through a pool of P connections the queue contends like P workers, not W:
# the table has both columns.
#
# Knobs: BENCH_LEASE_ITEMS (default 1000000), BENCH_LEASE_SECONDS (5 per run),
# BENCH_LEASE_PAIRS ("1:1 8:8 32:32 128:64 128:16").
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT

items="${BENCH_LEASE_ITEMS:-1000000}"
secs="${BENCH_LEASE_SECONDS:-5}"
pairs="${BENCH_LEASE_PAIRS:-1:1 8:8 32:32 128:64 128:16}"
batch=50
pgbench="$PGC_BIN/pgbench"

bench_setup <<'SQL'
DROP TABLE IF EXISTS bench.lease_items;
CREATE TABLE bench.lease_items (id bigint PRIMARY KEY, payload text NOT NULL, done boolean NOT NULL DEFAULT false);
SQL

# reset W: a fresh table for W slots, indexed for both methods
reset() {
    bench_psql <<SQL >/dev/null
SET client_min_messages = warning;
TRUNCATE bench.lease_items;
DROP INDEX IF EXISTS bench.lease_items_slot, bench.lease_items_pending;
INSERT INTO bench.lease_items (id, payload) SELECT g, md5(g::text) FROM generate_series(1, $items) g;
CREATE INDEX lease_items_slot ON bench.lease_items ((slot_of(id, $1)), id) WHERE NOT done;
CREATE INDEX lease_items_pending ON bench.lease_items (id) WHERE NOT done;
DELETE FROM pg_claim_leases WHERE name = 'bench';
VACUUM ANALYZE bench.lease_items;
SQL
}

cat >"$BENCH_TMP/lease.sql" <<SQL
\\if :slot < 0
SELECT slot, token FROM claim_lease('bench', :w, 'client ' || :client_id, '1 hour') \\gset
\\endif
UPDATE bench.lease_items SET done = true
WHERE id IN (SELECT id FROM bench.lease_items WHERE slot_of(id, :w) = :slot AND NOT done ORDER BY id LIMIT $batch)
  AND (SELECT lease_valid('bench', :slot, :token));
SQL
cat >"$BENCH_TMP/queue.sql" <<SQL
UPDATE bench.lease_items i SET done = true
FROM (SELECT id FROM bench.lease_items WHERE NOT done ORDER BY id LIMIT $batch FOR UPDATE SKIP LOCKED) c
WHERE i.id = c.id;
SQL

# drain SCRIPT W PORT: runs SCRIPT with W clients for $secs s against PORT;
# prints items done per second
drain() {
    local script="$1" w="$2" port="$3" t0 t1 done_
    t0=$(date +%s.%N)
    "$pgbench" -n -M simple -c "$w" -j 2 -T "$secs" -D w="$w" -D slot=-1 -D token=0 -h 127.0.0.1 -p "$port" \
        -f "$script" postgres >"$BENCH_TMP/pgbench.out" 2>&1 ||
        { cat "$BENCH_TMP/pgbench.out" >&2; return 1; }
    t1=$(date +%s.%N)
    done_=$(bench_psql -At -c "SELECT count(*) FROM bench.lease_items WHERE done")
    [ "$done_" -lt "$items" ] || echo "warning: the table was drained before the run ended; raise BENCH_LEASE_ITEMS" >&2
    python3 -c "print(round($done_ / ($t1 - $t0)))"
}

echo "leases through PgBouncer (transaction mode): $items items, batches of $batch, one statement each, $secs s per run"
printf '%5s %5s %16s %16s %12s\n' W P "lease items/s" "queue items/s" "lease/queue"
for pair in $pairs; do
    w="${pair%%:*}"
    p="${pair##*:}"
    pgc_pgbouncer_start "$p" >/dev/null 2>&1
    port="$PGC_POOLER_PORT"
    reset "$w"
    lease=$(drain "$BENCH_TMP/lease.sql" "$w" "$port")
    reset "$w"
    queue=$(drain "$BENCH_TMP/queue.sql" "$w" "$port")
    pgc_cleanup
    printf '%5s %5s %16s %16s %11.2fx\n' "$w" "$p" "$lease" "$queue" "$(python3 -c "print($lease / $queue)")"
done

# Per call, on a direct connection, one client: the median of 3 runs of 2 s.
reset 8
bench_psql -At -c "SELECT token FROM claim_lease('bench', 8, 'cost')" >"$BENCH_TMP/token"
token=$(cat "$BENCH_TMP/token")
percall() { bench_percall "$1" "$2" -D token="$token"; } # NAME SQL: us per transaction
claim=$(percall claim_lease "SELECT * FROM claim_lease('bench', 8, 'cost');")
renew=$(percall renew_lease "SELECT renew_lease('bench', 0, :token);")
fence=$(percall fence "BEGIN; SELECT fence('bench', 0, :token); COMMIT;")
empty=$(percall empty "BEGIN; COMMIT;")
echo "per call (direct connection, one client, median of 3 runs): claim_lease (re-claim) $claim us, renew_lease $renew us, fence $fence us in a transaction (an empty transaction: $empty us)"
# claim_leases in a steady fleet: 32 holders of 64 slots, calls in turn
# (each renews its 2 leases; nothing changes hands once they are balanced)
fleet=$(percall claim_leases "$(printf '%s\n' '\set h random(1, 32)' \
    "SELECT count(*) FROM claim_leases('bench_fleet', 64, 'h' || :h, ttl => '1 hour');")")
echo "per call: claim_leases with 32 live holders of 64 slots, $fleet us"
# a 50-item batch with and without the lease_valid predicate, alternating
batch_sql="UPDATE bench.lease_items SET done = false WHERE id IN (SELECT id FROM bench.lease_items WHERE slot_of(id, 8) = 0 ORDER BY id LIMIT $batch)"
with=$(percall with "$batch_sql AND (SELECT lease_valid('bench', 0, :token));")
without=$(percall without "$batch_sql;")
with2=$(percall with "$batch_sql AND (SELECT lease_valid('bench', 0, :token));")
without2=$(percall without "$batch_sql;")
natural=$(percall natural "$batch_sql AND lease_valid('bench', 0, :token);")
natural2=$(percall natural "$batch_sql AND lease_valid('bench', 0, :token);")
python3 -c "
w = ($with + $with2) / 2; o = ($without + $without2) / 2; n = ($natural + $natural2) / 2
print(f'ratio: a 50-item batch with (SELECT lease_valid(...)) / without = {w / o:.2f}x ({w:.0f} us vs {o:.0f} us)')
print(f'ratio: a 50-item batch with AND lease_valid(...) / without = {n / o:.2f}x ({n:.0f} us vs {o:.0f} us)')"

# The same two batches counted in instructions by valgrind's callgrind, which
# does not depend on what else the machine runs (seconds do): a server of
# its own in single-user mode runs K statements of each kind, each one its
# own transaction; the cost of one is the difference between K = 201 and
# K = 1, so start-up does not count.
if command -v valgrind >/dev/null; then
    cg="$BENCH_TMP/callgrind"
    chmod 755 "$BENCH_TMP"
    install -d -o postgres "$cg"
    pgc_as_postgres "$PGC_BIN/initdb" -D "$cg/data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >/dev/null
    single() { pgc_as_postgres "$@" "$PGC_BIN/postgres" --single -D "$cg/data" -c fsync=off -c jit=off postgres; }
    cg_token=$(single 2>/dev/null <<SQL | sed -n 's/^[[:space:]]*1: token = "\([0-9]*\)".*/\1/p'
CREATE EXTENSION pg_claim;
CREATE SCHEMA bench;
CREATE TABLE bench.lease_items (id bigint PRIMARY KEY, payload text NOT NULL, done boolean NOT NULL DEFAULT false);
INSERT INTO bench.lease_items (id, payload) SELECT g, md5(g::text) FROM generate_series(1, 100000) g;
CREATE INDEX ON bench.lease_items ((slot_of(id, 8)), id);
VACUUM ANALYZE bench.lease_items;
SELECT token FROM claim_lease('bench', 8, 'cost', '1 hour');
SQL
    )
    [ -n "$cg_token" ] || { echo "callgrind: the set-up of the single-user server failed" >&2; exit 1; }
    # K SQL [FILE]: instructions of a single-user server running SQL K times
    # (callgrind's profile kept in FILE when given)
    instructions() {
        local i
        for ((i = 0; i < $1; i++)); do printf '%s\n' "$2"; done |
            single valgrind --tool=callgrind --callgrind-out-file="${3:-/dev/null}" >"$cg/out" 2>&1
        ! grep -m1 ERROR "$cg/out" >&2 || exit 1
        sed -n 's/.*Collected : //p' "$cg/out"
    }
    per_statement() { # SQL: instructions per statement
        local many one
        many=$(instructions 201 "$1")
        one=$(instructions 1 "$1")
        echo $(((many - one) / 200))
    }
    with_i=$(per_statement "$batch_sql AND (SELECT lease_valid('bench', 0, $cg_token));")
    natural_i=$(per_statement "$batch_sql AND lease_valid('bench', 0, $cg_token);")
    without_i=$(per_statement "$batch_sql;")
    # fence once per transaction: a line of two statements is one query
    # string, one transaction; beside it the same with SELECT 1, a statement
    # of the same shape that checks nothing
    fence_i=$(per_statement "SELECT fence('bench', 0, $cg_token); $batch_sql;")
    select1_i=$(per_statement "SELECT 1; $batch_sql;")
    python3 -c "
w = $with_i; n = $natural_i; o = $without_i; f = $fence_i; s = $select1_i
print(f'ratio in instructions (callgrind, single-user server, simple protocol): a 50-item batch with (SELECT lease_valid(...)) / without = {w / o:.3f}x ({w:,} vs {o:,} instructions)')
print(f'ratio in instructions: a 50-item batch with AND lease_valid(...) / without = {n / o:.3f}x ({n:,} instructions)')
print(f'ratio in instructions: SELECT fence(...); then the batch, one transaction / the batch alone = {f / o:.3f}x ({f:,} instructions); SELECT 1; then the batch / alone = {s / o:.3f}x ({s:,})')"
    # Where the instructions of SELECT fence(...) go, beside SELECT 1: each
    # run 201 times and once under callgrind, and callgrind_annotate's
    # inclusive count of a few functions of the server, per statement
    keep() { # NAME SQL: callgrind_annotate --inclusive of K = 201 and K = 1
        local k
        for k in 201 1; do
            instructions "$k" "$2" "$cg/$1.$k" >/dev/null
            callgrind_annotate --inclusive=yes --threshold=100 "$cg/$1.$k" >"$cg/$1.$k.txt"
        done
    }
    keep select_1 "SELECT 1;"
    keep fence "SELECT fence('bench', 0, $cg_token);"
    python3 - "$cg" <<'PY'
import re, sys
def per_call(name):
    counts = {}
    for k in (201, 1):
        for line in open(f"{sys.argv[1]}/{name}.{k}.txt"):
            m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*:(\S+)", line)
            if m:
                f = m.group(2).split("::")[-1]
                counts.setdefault(f, {}).setdefault(k, int(m.group(1).replace(",", "")))
    return {f: (c.get(201, 0) - c.get(1, 0)) / 200 for f, c in counts.items()}
one, fence = per_call("select_1"), per_call("fence")
parts = [("parse", "pg_parse_query"), ("analysis", "pg_analyze_and_rewrite_fixedparams"),
         ("planning", "pg_plan_queries"), ("the call", "fence_wrapper"),
         ("commit", "CommitTransactionCommand"), ("releasing the locks at commit", "ProcReleaseLocks"),
         ("the whole statement", "PostgresMain")]
print("instructions per statement, SELECT fence(...) - SELECT 1 (callgrind_annotate --inclusive): "
      + ", ".join(f"{label} {fence.get(f, 0) - one.get(f, 0):+,.0f}" for label, f in parts))
PY
fi
