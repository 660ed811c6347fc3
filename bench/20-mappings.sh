#!/usr/bin/env bash
# Key → slot mappings compared, in one run on one server:
#  1. the fraction of keys each mapping moves when the slot count changes
#     (n -> n+1 and n -> 2n), over 1M keys;
#  2. the per-row cost of jump_slot, pg_hash_slot and range_slot beside
#     slot_of, as the increment over a bare scan of 2M rows.
source "$(dirname "$0")/lib.sh"
ROWS="${BENCH_ROWS:-2000000}"
KEYS="${BENCH_KEYS:-1000000}"
RUNS="${BENCH_RUNS:-7}"
bench_setup <<SQL
DROP TABLE IF EXISTS bench_map_keys, bench_map_rows;
-- 1M keys: bigint ids (sequential, the common case), text keys, and timestamps
CREATE TABLE bench_map_keys AS
  SELECT g::bigint AS id, 'customer-' || md5(g::text) AS k,
         timestamptz '2024-01-01 00:00+00' + (g ^ 1.3) * interval '1 second' AS at
  FROM generate_series(1, $KEYS) g;
CREATE TABLE bench_map_rows AS
  SELECT g::bigint - ($ROWS / 2) AS id, 'customer-' || md5(g::text) AS k
  FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE bench_map_keys, bench_map_rows;
SQL

echo "Keys moved when the slot count changes ($KEYS keys; a key moves when its slot differs)"
printf '  %-34s %8s %8s %8s %8s\n' "mapping" "4->5" "8->9" "16->17" "8->16"
bench_psql -At -F '|' <<'SQL' >"$BENCH_TMP/move"
SET max_parallel_workers_per_gather = 2;
-- equal-depth range bounds for n slots: the n-1 inner quantiles of the data
CREATE TEMP TABLE bounds AS
  SELECT n, percentile_disc(ARRAY(SELECT i::float8 / n FROM generate_series(1, n - 1) i))
              WITHIN GROUP (ORDER BY at) AS b
  FROM bench_map_keys, unnest(ARRAY[4, 5, 8, 9, 16, 17]) n GROUP BY n;
-- range, "split the last range": n+1 slots by adding a bound at the median of the
-- last range, so only its upper half moves (into the new slot n)
CREATE TEMP TABLE split AS
  SELECT n, b || (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY at)
                  FROM bench_map_keys WHERE at >= b[cardinality(b)]) AS b
  FROM bounds WHERE n IN (4, 8, 16);
WITH pairs(a, z) AS (VALUES (4, 5), (8, 9), (16, 17), (8, 16)),
     ba AS (SELECT p.a, p.z, x.b AS ba, y.b AS bz, s.b AS bs
            FROM pairs p JOIN bounds x ON x.n = p.a JOIN bounds y ON y.n = p.z LEFT JOIN split s ON s.n = p.a AND p.z = p.a + 1)
SELECT ba.a, ba.z,
       avg((slot_of(id, a) <> slot_of(id, z))::int),
       avg((slot_of(k, a) <> slot_of(k, z))::int),
       avg((jump_slot(id, a) <> jump_slot(id, z))::int),
       avg((jump_slot(k, a) <> jump_slot(k, z))::int),
       avg((pg_hash_slot(id, a) <> pg_hash_slot(id, z))::int),
       avg((range_slot(at, ba) <> range_slot(at, bz))::int),
       avg((range_slot(at, ba) <> range_slot(at, bs))::int)
FROM ba, bench_map_keys GROUP BY ba.a, ba.z, ba.ba, ba.bz, ba.bs ORDER BY ba.a, ba.z;
-- skew: the largest slot's share over the ideal 1/n, for n = 8
SELECT 'skew', m, max(c) * 8.0 / sum(c)
FROM (SELECT 'modulo(id)' AS m, slot_of(id, 8) s, count(*) c FROM bench_map_keys GROUP BY 1, 2
      UNION ALL SELECT 'crc32(text)', slot_of(k, 8), count(*) FROM bench_map_keys GROUP BY 1, 2
      UNION ALL SELECT 'jump(id)', jump_slot(id, 8), count(*) FROM bench_map_keys GROUP BY 1, 2
      UNION ALL SELECT 'jump(text)', jump_slot(k, 8), count(*) FROM bench_map_keys GROUP BY 1, 2
      UNION ALL SELECT 'pg_hash(id)', pg_hash_slot(id, 8), count(*) FROM bench_map_keys GROUP BY 1, 2
      UNION ALL SELECT 'range(at), equal-depth', range_slot(at, (SELECT b FROM bounds WHERE n = 8)), count(*) FROM bench_map_keys GROUP BY 1, 2
      UNION ALL SELECT 'range(at), equal-width', range_slot(at, (SELECT array_agg(lo + (hi - lo) * i / 8 ORDER BY i) FROM (SELECT min(at) lo, max(at) hi FROM bench_map_keys) mm, generate_series(1, 7) i)), count(*) FROM bench_map_keys GROUP BY 1, 2) t
GROUP BY m ORDER BY m;
SQL
python3 - "$BENCH_TMP/move" <<'PY'
import sys
lines = [l.rstrip("\n").split("|") for l in open(sys.argv[1]) if l.strip()]
moves = [l for l in lines if l[0] != "skew"]
skew = [l for l in lines if l[0] == "skew"]
names = ["modulo (slot_of bigint)", "crc32 (slot_of text)", "jump (jump_slot bigint)",
         "jump (jump_slot text)", "pg_hash (pg_hash_slot bigint)",
         "range, bounds recomputed", "range, split the last range"]
cols = {(int(l[0]), int(l[1])): [float(x) if x else None for x in l[2:]] for l in moves}
order = [(4, 5), (8, 9), (16, 17), (8, 16)]
for i, name in enumerate(names):
    cells = []
    for p in order:
        v = cols[p][i]
        cells.append("     -  " if v is None else f"{v:8.3f}")
    print(f"  {name:34s} " + " ".join(cells))
print(f"  {'ideal (1 - n/m)':34s} " + " ".join(f"{1 - a / b:8.3f}" for a, b in order))
print("Skew at n = 8: largest slot's share divided by the ideal 1/8 (1.00 = perfectly even)")
for _, m, v in skew:
    print(f"  {m:34s} {float(v):8.3f}")
for a, b in [(8, 9)]:
    c = cols[(a, b)]
    print(f"ratio: keys moved {a}->{b}, modulo / jump = {c[0] / c[2]:.1f}x  (jump moves {c[2]:.3f}, ideal {1 / b:.3f})")
    print(f"ratio: keys moved {a}->{b}, pg_hash / jump = {c[4] / c[2]:.1f}x")
PY

echo
BOUNDS_INT=$(bench_psql -At -c "SELECT percentile_disc(ARRAY[0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875]) WITHIN GROUP (ORDER BY id) FROM bench_map_rows")
BOUNDS_TEXT=$(bench_psql -At -c "SELECT percentile_disc(ARRAY[0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875]) WITHIN GROUP (ORDER BY k) FROM bench_map_rows")
bench_time "$RUNS" \
    "SELECT sum(0) FROM bench_map_rows" \
    "SELECT sum(slot_of(id, 8)) FROM bench_map_rows" \
    "SELECT sum(jump_slot(id, 8)) FROM bench_map_rows" \
    "SELECT sum(pg_hash_slot(id, 8)) FROM bench_map_rows" \
    "SELECT sum(range_slot(id, '$BOUNDS_INT'::bigint[])) FROM bench_map_rows" \
    "SELECT sum(slot_of(k, 8)) FROM bench_map_rows" \
    "SELECT sum(jump_slot(k, 8)) FROM bench_map_rows" \
    "SELECT sum(pg_hash_slot(k, 8)) FROM bench_map_rows" \
    "SELECT sum(range_slot(k, '$BOUNDS_TEXT'::text[])) FROM bench_map_rows" \
    "SELECT sum(abs(hashint8extended(id, 0) % 8)) FROM bench_map_rows" \
    "SELECT sum(abs(hashtextextended(k, 0) % 8)) FROM bench_map_rows"
bench_report "$ROWS" <<'PY'
rows = int(sys.argv[1])
bare = t[0]
inc = lambda x: (x - bare) * 1e6 / rows  # ns per row over the bare scan
names = ["bare scan", "slot_of(bigint, 8)", "jump_slot(bigint, 8)", "pg_hash_slot(bigint, 8)",
         "range_slot(bigint, 7 bounds)", "slot_of(text, 8)", "jump_slot(text, 8)",
         "pg_hash_slot(text, 8)", "range_slot(text, 7 bounds)",
         "abs(hashint8extended % 8)", "abs(hashtextextended % 8)"]
print(f"Per-row cost, {rows} rows, median of runs, increment over the bare scan")
for n, x in zip(names, t):
    print(f"  {n:30s} {x:9.1f} ms   {inc(x):7.1f} ns/row")
def r(label, a, b):
    print(f"ratio: {label:46s} = {inc(t[a]) / inc(t[b]):.2f}x")
r("jump_slot(bigint) / slot_of(bigint)", 2, 1)
r("pg_hash_slot(bigint) / slot_of(bigint)", 3, 1)
r("range_slot(bigint, 7 bounds) / slot_of(bigint)", 4, 1)
r("jump_slot(text) / slot_of(text)", 6, 5)
r("pg_hash_slot(text) / slot_of(text)", 7, 5)
r("range_slot(text, 7 bounds) / slot_of(text)", 8, 5)
r("pg_hash_slot(bigint) / built-in hashint8extended", 3, 9)
r("pg_hash_slot(text) / built-in hashtextextended", 7, 10)
PY
bench_psql -c "DROP TABLE bench_map_keys, bench_map_rows" >/dev/null
