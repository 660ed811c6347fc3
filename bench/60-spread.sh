#!/usr/bin/env bash
# spread_agg over a million jobs: cost against array_agg of the same input
# (both with the same ORDER BY), scaling with input size (time per job should
# stay flat: the algorithm is linear), and the spacing it achieves: how often
# two jobs of one group land closer than `feeders` apart (only in the tail).
source "$(dirname "$0")/lib.sh"
ROWS="${BENCH_ROWS:-1000000}"
NGROUPS="${BENCH_GROUPS:-10000}"
RUNS="${BENCH_RUNS:-5}"
FEEDERS="${BENCH_FEEDERS:-16}"
bench_setup <<SQL
DROP TABLE IF EXISTS bench_spread;
SELECT setseed(0.42);
-- skewed group sizes: customer k has weight ~ 1/k^(2/3) (a few big ones, a long tail)
CREATE TABLE bench_spread AS
  SELECT g AS seq, g::bigint * 7 AS id,
         'customer-' || floor($NGROUPS * random() ^ 3)::int AS customer
  FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE bench_spread;
SQL

echo "spread_agg, $ROWS jobs in $(bench_psql -At -c "SELECT count(DISTINCT customer) FROM bench_spread") groups (skewed sizes), feeders = $FEEDERS, median of $RUNS runs"
BENCH_SETTINGS="SET work_mem = '1GB';" bench_time "$RUNS" \
    "SELECT count(*) FROM bench_spread" \
    "SELECT array_length(array_agg(id ORDER BY seq), 1) FROM bench_spread" \
    "SELECT array_length(spread_agg(id, customer, $FEEDERS ORDER BY seq), 1) FROM bench_spread" \
    "SELECT array_length(spread_agg(id, customer, $FEEDERS, true ORDER BY seq), 1) FROM bench_spread" \
    "SELECT array_length(array_agg(id), 1) FROM bench_spread" \
    "SELECT array_length(spread_agg(id, customer, $FEEDERS), 1) FROM bench_spread" \
    "SELECT array_length(array_agg(id ORDER BY seq), 1) FROM bench_spread WHERE seq <= $ROWS / 4" \
    "SELECT array_length(spread_agg(id, customer, $FEEDERS ORDER BY seq), 1) FROM bench_spread WHERE seq <= $ROWS / 4" \
    "SELECT array_length(array_agg(id ORDER BY seq), 1) FROM bench_spread WHERE seq <= $ROWS / 2" \
    "SELECT array_length(spread_agg(id, customer, $FEEDERS ORDER BY seq), 1) FROM bench_spread WHERE seq <= $ROWS / 2"
bench_report "$ROWS" <<'PY'
rows = int(sys.argv[1])
names = ["bare scan (count)", "array_agg(id ORDER BY seq)", "spread_agg(id, customer, F ORDER BY seq)",
         "  ... largest_first", "array_agg(id)", "spread_agg(id, customer, F)"]
for n, x in zip(names, t):
    print(f"  {n:44s} {x:8.1f} ms")
print("  scaling (ms, ns per job over the bare scan share):")
scan = t[0]
for frac, a, s in [(0.25, t[6], t[7]), (0.5, t[8], t[9]), (1.0, t[1], t[2])]:
    n = int(rows * frac)
    print(f"    {n:8d} jobs: array_agg {a:8.1f} ms ({(a - scan * frac) * 1e6 / n:6.0f} ns/job)   "
          f"spread_agg {s:8.1f} ms ({(s - scan * frac) * 1e6 / n:6.0f} ns/job)")
print(f"ratio: spread_agg / array_agg, same ORDER BY, {rows} jobs = {t[2] / t[1]:.2f}x")
print(f"ratio: spread_agg / array_agg, no ORDER BY, {rows} jobs   = {t[5] / t[4]:.2f}x")
print(f"ratio: spread_agg time per job, {rows} / {rows // 4} jobs   = "
      f"{(t[2] / rows) / (t[7] / (rows // 4)):.2f}x  (1.0 = linear)")
PY

echo "spacing: consecutive jobs of one group closer than feeders apart in the output"
for largest in false true; do
bench_psql -At -F ' ' <<SQL
SET work_mem = '1GB';
WITH o AS (
    SELECT u.id, u.pos
    FROM unnest((SELECT spread_agg(id, customer, $FEEDERS, $largest ORDER BY seq) FROM bench_spread))
         WITH ORDINALITY AS u(id, pos)
), x AS (
    SELECT o.pos, o.pos - lag(o.pos) OVER (PARTITION BY b.customer ORDER BY o.pos) AS gap
    FROM o JOIN bench_spread b USING (id)
)
SELECT format('  largest_first=%-5s feeders=%s: %s of %s pairs closer than %s (%s%%), min gap %s, first close pair at position %s of %s',
              '$largest', $FEEDERS, count(*) FILTER (WHERE gap < $FEEDERS), count(gap), $FEEDERS,
              round(100.0 * count(*) FILTER (WHERE gap < $FEEDERS) / greatest(count(gap), 1), 3),
              min(gap), min(pos) FILTER (WHERE gap < $FEEDERS), count(*))
FROM x;
SQL
done
bench_psql -c "DROP TABLE bench_spread" >/dev/null
