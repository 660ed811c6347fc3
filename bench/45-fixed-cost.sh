#!/usr/bin/env bash
# The fixed cost of a my_items call: a batch of 50 rows of slot 3 of 16 on a
# 5,000,000-row table stored in key order, through my_items and through the
# same hand-written SQL, side by side in one pgbench script (each query with
# its own random key), for every combination of
#   - protocol: pgbench -M simple and -M prepared;
#   - cache: hot (keys drawn from a 100,000-key window read before timing,
#     so every page the batches touch is in shared_buffers) and cold (keys
#     drawn from the whole table, whose heap and indexes are about 2.6
#     times shared_buffers, so most batches read pages from outside
#     shared_buffers; the operating system's page cache is not dropped);
#   - index: the full slot index ((slot_of(id, 16)), id), and the pending
#     rows through the partial index ((slot_of(id, 16)), id) WHERE sent_at
#     IS NULL (my_items(..., pending => 'sent_at') against the hand-written
#     query with AND sent_at IS NULL; 10% of the rows are pending).
# Target: my_items within 1.1x of the hand-written query in every case.
# Then a worker's walk: both after the same key, which moves on by a batch
# at every turn (target: my_items within 1.05x). Then the fixed cost alone:
# batches of 1 row (hot, full index), where the difference between the two
# is what a my_items call adds.
source "$(dirname "$0")/lib.sh"
ROWS="${BENCH_FC_ROWS:-5000000}"
SECONDS_PER_TURN="${BENCH_SECONDS:-20}"
WINDOW=100000
HOT_FROM=$((ROWS / 2))
HOT_TO=$((HOT_FROM + WINDOW))
PGBENCH="$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)"

bench_setup <<SQL
DROP TABLE IF EXISTS bench_fc;
CREATE TABLE bench_fc (id bigint PRIMARY KEY, payload text NOT NULL, sent_at timestamptz);
INSERT INTO bench_fc
SELECT g, md5(g::text), CASE WHEN abs(hashint8(g)) % 10 = 0 THEN NULL ELSE now() END
FROM generate_series(1, $ROWS) g;
CREATE INDEX bench_fc_slot ON bench_fc ((slot_of(id, 16)), id);
CREATE INDEX bench_fc_pending ON bench_fc ((slot_of(id, 16)), id) WHERE sent_at IS NULL;
VACUUM ANALYZE bench_fc;
SQL
size=$(bench_psql -At -c "SELECT pg_size_pretty(pg_total_relation_size('bench_fc')) || ' (shared_buffers ' || current_setting('shared_buffers') || ')'")

# script CACHE INDEX [BATCH]: the pgbench script of one case
script() {
    local lo=1 hi=$((ROWS - 1000)) pend="" filter="" batch="${3:-50}"
    if [ "$1" = hot ]; then lo=$HOT_FROM hi=$HOT_TO; fi
    if [ "$2" = partial ]; then pend=", pending => 'sent_at'" filter=" AND sent_at IS NULL"; fi
    cat <<SQL
\set a random($lo, $hi)
\set b random($lo, $hi)
SELECT * FROM my_items(NULL::bench_fc, 3, 16, after => :a::text, batch => $batch$pend);
SELECT * FROM bench_fc WHERE slot_of(id, 16) = 3$filter AND id > :b ORDER BY id LIMIT $batch;
SQL
}

# walk_script: a worker's walk, both queries after the same key, which moves
# on by about one batch (50 rows of slot 3 of 16 span about 800 keys) at
# every turn (pgbench keeps :a between turns; it starts at HOT_FROM)
walk_script() {
    cat <<SQL
\set a (:a + 800) % $((ROWS - 1000))
SELECT * FROM my_items(NULL::bench_fc, 3, 16, after => :a::text, batch => 50);
SELECT * FROM bench_fc WHERE slot_of(id, 16) = 3 AND id > :a ORDER BY id LIMIT 50;
SQL
}

load=$(cut -d' ' -f1-3 /proc/loadavg)
for index in full partial one walk; do
    for cache in hot cold; do
        if [ "$index" = one ]; then
            [ "$cache" = hot ] || continue
            script hot full 1 >"$BENCH_TMP/$cache-$index.sql"
        elif [ "$index" = walk ]; then
            [ "$cache" = hot ] || continue
            walk_script >"$BENCH_TMP/$cache-$index.sql"
        else
            script "$cache" "$index" >"$BENCH_TMP/$cache-$index.sql"
        fi
        for mode in simple prepared; do
            if [ "$cache" = hot ]; then
                # read the window's pages (heap, slot indexes) before timing
                "$PGBENCH" -n -c 1 -j 1 -T 2 -M "$mode" -D a="$HOT_FROM" -f "$BENCH_TMP/$cache-$index.sql" postgres >/dev/null 2>&1
            fi
            "$PGBENCH" -n -r -c 1 -j 1 -T "$SECONDS_PER_TURN" -M "$mode" -D a="$HOT_FROM" -f "$BENCH_TMP/$cache-$index.sql" postgres 2>/dev/null |
                awk '/SELECT \* FROM my_items/ {m=$1} /SELECT \* FROM bench_fc/ {h=$1} END {print m, h}' \
                    >"$BENCH_TMP/lat-$cache-$index-$mode"
        done
    done
done

# the index each query's plan reads: my_items' generic plan, and the
# hand-written query's plan for a key in the middle of the table
index_of() { sed -n 's/.*Index Scan using \([a-z_]*\).*/\1/p' | head -1; }
plans=""
for pend in "" ", pending => 'sent_at'"; do
    q=$(bench_psql -At -c "SELECT my_items_query('bench_fc'::regtype, 3, 16, after => '1', batch => 50$pend)")
    mi=$(bench_psql -At -c "SET plan_cache_mode = force_generic_plan" -c "PREPARE q(int, int, text, int) AS $q" \
        -c "EXPLAIN (COSTS OFF) EXECUTE q(3, 16, '$HOT_FROM', 50)" | index_of)
    filter=""
    [ -z "$pend" ] || filter=" AND sent_at IS NULL"
    hw=$(bench_psql -At -c "EXPLAIN (COSTS OFF) SELECT * FROM bench_fc WHERE slot_of(id, 16) = 3$filter AND id > $HOT_FROM ORDER BY id LIMIT 50" | index_of)
    plans+="${plans:+; }${pend:+pending: }my_items reads $mi, hand-written SQL $hw"
done

: >"$BENCH_TMP/times"  # no bench_time medians here
bench_report "$BENCH_TMP" "$ROWS" "$SECONDS_PER_TURN" "$size" "$HOT_FROM" "$HOT_TO" "$plans" "$load" <<'PY'
tmp, rows, secs, size, lo, hi, plans, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]
print(f"my_items fixed cost: 50 rows of slot 3 of 16 after a random key, {rows} rows stored in key order, table and indexes {size}")
print(f"  pgbench -r, 1 client, {secs} s per case, both queries in turn with their own random keys, mean latency per statement")
print(f"  hot: keys in [{lo}, {hi}] (pages in shared_buffers); cold: keys over the whole table (mostly outside shared_buffers, in the OS page cache)")
print("  full: index ((slot_of(id, 16)), id); partial: pending => 'sent_at' vs AND sent_at IS NULL, index ((slot_of(id, 16)), id) WHERE sent_at IS NULL")
print(f"  plans: {plans}")
print(f"  load average before the runs: {load}")
for index in ("full", "partial"):
    for cache in ("hot", "cold"):
        for mode in ("simple", "prepared"):
            mi, hw = map(float, open(f"{tmp}/lat-{cache}-{index}-{mode}").read().split())
            print(f"ratio: my_items / hand-written SQL, {index} index, {cache}, {mode} protocol = {mi/hw:.2f}x"
                  f"  ({mi*1000:.1f} us vs {hw*1000:.1f} us; target <= 1.1x)")
for mode in ("simple", "prepared"):
    mi, hw = map(float, open(f"{tmp}/lat-hot-walk-{mode}").read().split())
    print(f"ratio: my_items / hand-written SQL, a worker's walk (after the last key, moving on), {mode} protocol = {mi/hw:.2f}x"
          f"  ({mi*1000:.1f} us vs {hw*1000:.1f} us; target <= 1.05x)")
for mode in ("simple", "prepared"):
    mi, hw = map(float, open(f"{tmp}/lat-hot-one-{mode}").read().split())
    print(f"fixed cost: batch of 1, full index, hot, {mode} protocol: my_items {mi*1000:.1f} us, hand-written SQL {hw*1000:.1f} us,"
          f" difference {(mi-hw)*1000:+.1f} us per call ({mi/hw:.2f}x)")
PY
bench_psql -c "DROP TABLE bench_fc" >/dev/null
