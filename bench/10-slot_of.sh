#!/usr/bin/env bash
# Per-row cost of slot_of over a 2M-row table, text and bigint keys, as the
# increment over the bare scan, side by side with built-in equivalents:
#   text:   slot_of(k, 8)  vs  abs(hashtext(k) % 8)
#   bigint: slot_of(id, 8) vs  ((id % 8) + 8) % 8  (SQL's non-negative remainder)
# Target: slot_of's increment at most 1.5x the built-in's.
source "$(dirname "$0")/lib.sh"
ROWS="${BENCH_ROWS:-2000000}"
RUNS="${BENCH_RUNS:-7}"
REP=10
# The expression repeated REP times per row (PostgreSQL evaluates each copy), so
# its cost stands well above the noise of the scan itself on a shared machine.
rep() { local e="$1" out="$1" i; for ((i = 1; i < REP; i++)); do out="$out + $e"; done; printf '%s' "$out"; }
bench_setup <<SQL
DROP TABLE IF EXISTS bench_keys;
CREATE TABLE bench_keys AS
  SELECT g::bigint - ($ROWS / 2) AS id, 'customer-' || md5(g::text) AS k
  FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE bench_keys;
SQL
bench_time "$RUNS" \
    "SELECT count(*) FROM bench_keys WHERE k IS NOT NULL" \
    "SELECT count(*) FROM bench_keys WHERE $(rep 'slot_of(k, 8)') <> 3" \
    "SELECT count(*) FROM bench_keys WHERE $(rep 'abs(hashtext(k) % 8)') <> 3" \
    "SELECT count(*) FROM bench_keys WHERE id IS NOT NULL" \
    "SELECT count(*) FROM bench_keys WHERE $(rep 'slot_of(id, 8)') <> 3" \
    "SELECT count(*) FROM bench_keys WHERE $(rep '((id % 8) + 8) % 8')  <> 3" \
    "SELECT count(*) FROM bench_keys WHERE $(rep 'id % 8') <> 3"
bench_report "$((ROWS * REP))" <<'PY'
rows = int(sys.argv[1])  # evaluations: table rows x repetitions
def inc(x, bare):  # nanoseconds per row over the bare scan
    return (x - bare) * 1e6 / rows
rows_out = [
    ("text: bare scan (k IS NOT NULL)", t[0], t[0]),
    ("text: slot_of(k, 8)", t[1], t[0]),
    ("text: abs(hashtext(k) % 8)", t[2], t[0]),
    ("bigint: bare scan (id IS NOT NULL)", t[3], t[3]),
    ("bigint: slot_of(id, 8)", t[4], t[3]),
    ("bigint: ((id % 8) + 8) % 8", t[5], t[3]),
    ("bigint: id % 8 (may be negative)", t[6], t[3]),
]
print(f"slot_of cost per evaluation: {rows // 10} rows x 10 copies of the expression, median of interleaved runs, increment over the bare scan")
print("(each query: SELECT count(*) FROM bench_keys WHERE <expr> + <expr> + ... <> 3; parallelism and JIT off)")
for name, x, bare in rows_out:
    print(f"  {name:36s} {x:9.1f} ms  {inc(x, bare):7.1f} ns/eval")
rt = inc(t[1], t[0]) / max(inc(t[2], t[0]), 0.1)
rb = inc(t[4], t[3]) / max(inc(t[5], t[3]), 0.1)
print(f"ratio: slot_of(text) increment / abs(hashtext(k) % 8) increment = {rt:.2f}x (target <= 1.5x)")
print(f"ratio: slot_of(bigint) increment / ((id % 8) + 8) % 8 increment = {rb:.2f}x (target <= 1.5x)")
PY
bench_psql -c "DROP TABLE bench_keys" >/dev/null
