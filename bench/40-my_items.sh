#!/usr/bin/env bash
# my_items, side by side in one run:
#  1. batch fetch: one page of a worker's share (50 rows after a random key,
#     through the (slot_of(id, 8), id) index) with my_items vs the same
#     hand-written SQL, both sent by pgbench as a client would, in turns.
#     Target: my_items within 1.1x of the hand-written query's latency.
#  2. a whole share of an 8-way hash-partitioned table: my_items(...,
#     method => 'pg_hash') (reads one partition) vs the pg_hash_slot filter
#     over the whole table. Target: at least 4x faster.
source "$(dirname "$0")/lib.sh"
ROWS="${BENCH_ROWS:-1000000}"
HP_ROWS="${BENCH_HP_ROWS:-2000000}"
SECONDS_PER_TURN="${BENCH_SECONDS:-20}"
RUNS="${BENCH_RUNS:-5}"
PGBENCH="$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)"

bench_setup <<SQL
DROP TABLE IF EXISTS bench_items, bench_hp;
CREATE TABLE bench_items (id bigint PRIMARY KEY, payload text NOT NULL, done boolean NOT NULL DEFAULT false);
INSERT INTO bench_items SELECT g, md5(g::text), false FROM generate_series(1, $ROWS) g ORDER BY md5(g::text);
CREATE INDEX bench_items_slot ON bench_items ((slot_of(id, 8)), id);
CREATE TABLE bench_hp (id bigint PRIMARY KEY, payload text NOT NULL) PARTITION BY HASH (id);
SELECT format('CREATE TABLE bench_hp_%s PARTITION OF bench_hp FOR VALUES WITH (MODULUS 8, REMAINDER %s)', r, r)
FROM generate_series(0, 7) r \gexec
INSERT INTO bench_hp SELECT g, md5(g::text) FROM generate_series(1, $HP_ROWS) g;
VACUUM ANALYZE bench_items;
VACUUM ANALYZE bench_hp;
SQL

# ---------------------------------------------------------------- 1. batch fetch
# One pgbench script runs both queries in turn, so machine noise hits both
# alike; -r reports each statement's mean latency. Each query gets its own
# random key: with one shared key, whichever ran second would find the same
# rows already in the CPU caches (about 40 us per batch here).
cat >"$BENCH_TMP/batch.sql" <<SQL
\set a random(1, $ROWS)
\set b random(1, $ROWS)
SELECT * FROM my_items(NULL::bench_items, 3, 8, after => :a::text, batch => 50);
SELECT * FROM bench_items WHERE slot_of(id, 8) = 3 AND id > :b ORDER BY id LIMIT 50;
SQL
for mode in simple prepared; do
    "$PGBENCH" -n -r -c 1 -j 1 -T "$SECONDS_PER_TURN" -M "$mode" -f "$BENCH_TMP/batch.sql" postgres 2>/dev/null |
        awk '/SELECT \* FROM my_items/ {m=$1} /SELECT \* FROM bench_items/ {h=$1} END {print m, h}' >"$BENCH_TMP/lat-$mode"
done

# ---------------------------------------------------------------- 2. partitioned share
bench_time "$RUNS" \
    "SELECT count(*) FROM my_items(NULL::bench_hp, 3, 8, method => 'pg_hash')" \
    "SELECT count(*) FROM bench_hp WHERE pg_hash_slot(id, 8) = 3"
share=$(bench_psql -At -c "SELECT count(*) FROM my_items(NULL::bench_hp, 3, 8, method => 'pg_hash')")

bench_report "$BENCH_TMP" "$ROWS" "$HP_ROWS" "$SECONDS_PER_TURN" "$share" <<'PY'
tmp, rows, hp_rows, secs, share = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
print(f"my_items batch fetch: 50 rows of slot 3 of 8 after a random key, {rows} rows, index (slot_of(id, 8), id)")
print(f"  pgbench -r, 1 client, {secs} s per protocol, both queries in turn, mean latency per statement")
for mode in ("simple", "prepared"):
    mi, hw = map(float, open(f"{tmp}/lat-{mode}").read().split())
    print(f"  -M {mode:8s}  my_items {mi*1000:7.1f} us   hand-written SQL {hw*1000:7.1f} us")
    print(f"ratio: my_items / hand-written SQL, batch of 50, {mode} protocol = {mi/hw:.2f}x  (target <= 1.1x)")
print(f"8-way hash-partitioned table, {hp_rows} rows, whole share of slot 3 of 8 ({share} rows), median of runs, no parallel workers")
print(f"  my_items(method => 'pg_hash') {t[0]:8.1f} ms   pg_hash_slot filter over the table {t[1]:8.1f} ms")
print(f"ratio: whole-table pg_hash_slot filter / my_items on the one partition = {t[1]/t[0]:.2f}x  (target >= 4x)")
PY
bench_psql -c "DROP TABLE bench_items, bench_hp" >/dev/null
