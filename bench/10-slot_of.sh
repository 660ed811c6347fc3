#!/usr/bin/env bash
# Per-row cost of slot_of over a 2M-row table, text and bigint keys, as the
# increment over the bare scan, side by side with built-in equivalents:
#   text:   slot_of(k, 8)  vs  abs(hashtext(k) % 8)
#   bigint: slot_of(id, 8) vs  ((id % 8) + 8) % 8  (SQL's non-negative remainder)
# Target: slot_of's increment at most 1.5x the built-in's.
set -euo pipefail
ROWS="${BENCH_ROWS:-2000000}"
RUNS="${BENCH_RUNS:-7}"
psql -X -q -v ON_ERROR_STOP=1 -d postgres <<SQL >/dev/null
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP TABLE IF EXISTS bench_keys;
CREATE TABLE bench_keys AS
  SELECT g::bigint - ($ROWS / 2) AS id, 'customer-' || md5(g::text) AS k
  FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE bench_keys;
SQL
psql -X -q -v ON_ERROR_STOP=1 -d postgres -f "$(dirname "$0")/common.sql" >/dev/null
psql -X -q -At -F '|' -v ON_ERROR_STOP=1 -d postgres <<SQL >"${TMPDIR:-/tmp}/bench-slot_of.$$"
SET max_parallel_workers_per_gather = 0;
SET jit = off;
SELECT * FROM bench.time_queries(ARRAY[
  'SELECT sum(0) FROM bench_keys',
  'SELECT sum(slot_of(k, 8)) FROM bench_keys',
  'SELECT sum(abs(hashtext(k) % 8)) FROM bench_keys',
  'SELECT sum(slot_of(id, 8)) FROM bench_keys',
  'SELECT sum(((id % 8) + 8) % 8) FROM bench_keys',
  'SELECT sum(id % 8) FROM bench_keys'
], $RUNS);
SQL
python3 - "$ROWS" "${TMPDIR:-/tmp}/bench-slot_of.$$" <<'PY'
import sys
rows = int(sys.argv[1])
t = [float(l.split("|")[1]) for l in open(sys.argv[2]) if l.strip()]
bare = t[0]
def inc(x):  # nanoseconds per row over the bare scan
    return (x - bare) * 1e6 / rows
names = ["bare scan", "slot_of(text)", "abs(hashtext(k) % 8)", "slot_of(bigint)",
         "((id % 8) + 8) % 8", "id % 8"]
print(f"slot_of per-row cost, {rows} rows, median of runs, increment over the bare scan")
for n, x in zip(names, t):
    print(f"  {n:24s} {x:9.1f} ms   {inc(x):7.1f} ns/row")
rt = inc(t[1]) / inc(t[2])
rb = inc(t[3]) / inc(t[4])
print(f"ratio: slot_of(text) / hashtext-based      = {rt:.2f}x  (target <= 1.5x)")
print(f"ratio: slot_of(bigint) / SQL non-negative mod = {rb:.2f}x  (target <= 1.5x)")
print(f"ratio: slot_of(bigint) / plain id % 8       = {inc(t[3]) / inc(t[5]):.2f}x  (SQL's % can be negative)")
PY
rm -f "${TMPDIR:-/tmp}/bench-slot_of.$$"
psql -X -q -d postgres -c "DROP TABLE bench_keys" >/dev/null
