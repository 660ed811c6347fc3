#!/usr/bin/env bash
# The portable edition (docs/portable.md) next to the extension, in one
# database: the extension in public, the file of scripts/portable in the
# schema claim_portable, the same calls of each interleaved.
#   slot_of per row (text and bigint keys), jump_slot per row (bigint)
#   my_items: one batch of 100 after a key, each edition's expression index
#   claim_slot + release_slot, 200 per query
#   claim_lease by one holder (the renewal path), fence, 200 per query
# Ratios: portable / extension (1.0x: as fast).
source "$(dirname "$0")/lib.sh"
ROWS="${BENCH_ROWS:-20000}"
RUNS="${BENCH_RUNS:-7}"
CALLS=200
python3 scripts/portable --out "$BENCH_TMP" >/dev/null
bench_setup <<SQL
DROP SCHEMA IF EXISTS claim_portable CASCADE;
CREATE SCHEMA claim_portable;
SET search_path = claim_portable;
\i $BENCH_TMP/pg_claim_portable--$(sed -n 's/^version *= *"\(.*\)"$/\1/p' Cargo.toml | head -1).sql
RESET search_path;
DROP TABLE IF EXISTS bench_pk, bench_items_ext, bench_items_port;
CREATE TABLE bench_pk AS
  SELECT g::bigint - ($ROWS / 2) AS id, 'customer-' || md5(g::text) AS k FROM generate_series(1, $ROWS) g;
CREATE TABLE bench_items_ext (id bigint PRIMARY KEY, body text);
CREATE TABLE bench_items_port (id bigint PRIMARY KEY, body text);
INSERT INTO bench_items_ext SELECT g, md5(g::text) FROM generate_series(1, 200000) g;
INSERT INTO bench_items_port SELECT * FROM bench_items_ext;
CREATE INDEX ON bench_items_ext ((public.slot_of(id, 8)), id);
CREATE INDEX ON bench_items_port ((claim_portable.slot_of(id, 8)), id);
VACUUM ANALYZE bench_pk, bench_items_ext, bench_items_port;
SELECT public.claim_lease('bench_lease_e', 4, 'h1'), claim_portable.claim_lease('bench_lease_p', 4, 'h1');
SQL
fence_q() { # fence_q SCHEMA NAME: CALLS fences with the current token of slot 0
    echo "SELECT count($1.fence('$2', 0, t.token)) FROM generate_series(1, $CALLS), (SELECT token FROM $1.lease_holders('$2') WHERE slot = 0) t"
}
bench_time "$RUNS" \
    "SELECT count(*) FROM bench_pk WHERE k IS NOT NULL" \
    "SELECT count(*) FROM bench_pk WHERE public.slot_of(k, 8) <> 3" \
    "SELECT count(*) FROM bench_pk WHERE claim_portable.slot_of(k, 8) <> 3" \
    "SELECT count(*) FROM bench_pk WHERE public.slot_of(id, 8) <> 3" \
    "SELECT count(*) FROM bench_pk WHERE claim_portable.slot_of(id, 8) <> 3" \
    "SELECT count(*) FROM bench_pk WHERE public.jump_slot(id, 1000) <> 3" \
    "SELECT count(*) FROM bench_pk WHERE claim_portable.jump_slot(id, 1000) <> 3" \
    "SELECT count(*) FROM public.my_items(NULL::bench_items_ext, 3, 8, after => '100000', batch => 100)" \
    "SELECT count(*) FROM claim_portable.my_items(NULL::bench_items_port, 3, 8, after => '100000', batch => 100)" \
    "SELECT count(*) FROM generate_series(1, $CALLS) WHERE public.claim_slot('bench_c_e', 8) IS NOT NULL AND public.release_slot('bench_c_e')" \
    "SELECT count(*) FROM generate_series(1, $CALLS) WHERE claim_portable.claim_slot('bench_c_p', 8) IS NOT NULL AND claim_portable.release_slot('bench_c_p')" \
    "SELECT count(*) FROM generate_series(1, $CALLS), LATERAL public.claim_lease('bench_lease_e', 4, 'h1') c" \
    "SELECT count(*) FROM generate_series(1, $CALLS), LATERAL claim_portable.claim_lease('bench_lease_p', 4, 'h1') c" \
    "$(fence_q public bench_lease_e)" \
    "$(fence_q claim_portable bench_lease_p)"
bench_report "$ROWS" "$CALLS" <<'PY'
rows, calls = int(sys.argv[1]), int(sys.argv[2])
bare = t[0]
def per_row(x):
    return (x - bare) * 1e6 / rows
print(f"portable edition next to the extension: {rows} rows per scan, {calls} calls per query, medians of interleaved runs")
pairs = [
    ("slot_of(text) per row, ns over the bare scan", per_row(t[1]), per_row(t[2])),
    ("slot_of(bigint) per row, ns over the bare scan", per_row(t[3]), per_row(t[4])),
    ("jump_slot(bigint, 1000) per row, ns over the bare scan", per_row(t[5]), per_row(t[6])),
    ("my_items batch of 100, ms", t[7], t[8]),
    ("claim_slot + release_slot, us per pair", t[9] * 1000 / calls, t[10] * 1000 / calls),
    ("claim_lease (same holder: renewal), us per call", t[11] * 1000 / calls, t[12] * 1000 / calls),
    ("fence, us per call", t[13] * 1000 / calls, t[14] * 1000 / calls),
]
print(f"  {'':52s} {'extension':>10s} {'portable':>10s}")
for name, e, p in pairs:
    print(f"  {name:52s} {e:10.1f} {p:10.1f}")
for name, e, p in pairs:
    print(f"ratio: portable / extension, {name.split(',')[0]} = {p / max(e, 0.001):.1f}x")
PY
bench_psql -c "DROP TABLE bench_pk, bench_items_ext, bench_items_port" -c "DROP SCHEMA claim_portable CASCADE" >/dev/null
