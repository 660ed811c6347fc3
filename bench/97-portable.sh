#!/usr/bin/env bash
# The portable edition (docs/portable.md) next to the extension, in one
# database: the extension in public, the file of scripts/portable in the
# schema claim_portable, the same calls of each interleaved.
#   slot_of per evaluation (text and bigint keys), jump_slot (bigint): 10
#   copies of the call per row, as bench/10-slot_of.sh
#   my_items: one batch of 100 after a key, each edition's expression index
#   claim_slot + release_slot, 200 per query
#   claim_lease of 200 names by one holder (after the warm-up: renewals),
#   fence on those 200 leases
#   the pooler drain: 8 pgbench clients through PgBouncer (transaction mode,
#   8 server connections), client c holding the lease of slot c of 8, each
#   batch one message: fence, then UPDATE ... WHERE id IN (SELECT id FROM
#   my_items(..., pending => 'done', batch => 50)); each edition drains its
#   own copy of a table, reset before each measurement; BENCH_DRAIN_ROUNDS
#   (3) rounds of BENCH_DRAIN_SECONDS (3) s each, the editions in turn, each
#   first in every other round
# Ratios: portable / extension (1.0x: as fast).
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"
trap 'pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT
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
SQL
# rep EXPR: EXPR + EXPR + ... (10 copies, each evaluated)
rep() { local out="$1" i; for ((i = 1; i < 10; i++)); do out="$out + $1"; done; printf '%s' "$out"; }
lease_q() { # lease_q SCHEMA: claim_lease of CALLS names, one call each
    echo "SELECT count(*) FROM generate_series(1, $CALLS) g, LATERAL $1.claim_lease('bench_l_' || g, 4, 'h1') c"
}
fence_q() { # fence_q SCHEMA: fence on each of those leases with its token
    echo "SELECT count($1.fence(l.name, l.slot, l.token)) FROM $1.pg_claim_leases l WHERE l.name LIKE 'bench\_l\_%'"
}
bench_time "$RUNS" \
    "SELECT count(*) FROM bench_pk WHERE k IS NOT NULL" \
    "SELECT count(*) FROM bench_pk WHERE $(rep 'public.slot_of(k, 8)') <> 3" \
    "SELECT count(*) FROM bench_pk WHERE $(rep 'claim_portable.slot_of(k, 8)') <> 3" \
    "SELECT count(*) FROM bench_pk WHERE $(rep 'public.slot_of(id, 8)') <> 3" \
    "SELECT count(*) FROM bench_pk WHERE $(rep 'claim_portable.slot_of(id, 8)') <> 3" \
    "SELECT count(*) FROM bench_pk WHERE $(rep 'public.jump_slot(id, 1000)') <> 3" \
    "SELECT count(*) FROM bench_pk WHERE $(rep 'claim_portable.jump_slot(id, 1000)') <> 3" \
    "SELECT count(*) FROM public.my_items(NULL::bench_items_ext, 3, 8, after => '100000', batch => 100)" \
    "SELECT count(*) FROM claim_portable.my_items(NULL::bench_items_port, 3, 8, after => '100000', batch => 100)" \
    "SELECT count(*) FROM generate_series(1, $CALLS) WHERE public.claim_slot('bench_c_e', 8) IS NOT NULL AND public.release_slot('bench_c_e')" \
    "SELECT count(*) FROM generate_series(1, $CALLS) WHERE claim_portable.claim_slot('bench_c_p', 8) IS NOT NULL AND claim_portable.release_slot('bench_c_p')" \
    "$(lease_q public)" \
    "$(lease_q claim_portable)" \
    "$(fence_q public)" \
    "$(fence_q claim_portable)"
bench_report "$ROWS" "$CALLS" <<'PY'
rows, calls = int(sys.argv[1]), int(sys.argv[2])
bare = t[0]
def per_row(x):  # ns per evaluation: 10 copies of the expression per row
    return (x - bare) * 1e6 / rows / 10
print(f"portable edition next to the extension: {rows} rows per scan, 10 copies of the mapping per row, {calls} calls per query, medians of interleaved runs")
pairs = [  # (what, unit, extension, portable)
    ("slot_of(text) per evaluation", "ns over the bare scan", per_row(t[1]), per_row(t[2])),
    ("slot_of(bigint) per evaluation", "ns over the bare scan", per_row(t[3]), per_row(t[4])),
    ("jump_slot(bigint, 1000) per evaluation", "ns over the bare scan", per_row(t[5]), per_row(t[6])),
    ("my_items batch of 100", "ms", t[7], t[8]),
    ("claim_slot + release_slot", "us per pair", t[9] * 1000 / calls, t[10] * 1000 / calls),
    ("claim_lease (renewal)", "us per call", t[11] * 1000 / calls, t[12] * 1000 / calls),
    ("fence", "us per call", t[13] * 1000 / calls, t[14] * 1000 / calls),
]
print(f"  {'':60s} {'extension':>10s} {'portable':>10s}")
for name, unit, e, p in pairs:
    print(f"  {name + ', ' + unit:60s} {e:10.1f} {p:10.1f}")
for name, unit, e, p in pairs:
    print(f"ratio: portable / extension, {name} = {p / max(e, 0.001):.1f}x")
PY

# The pooler drain
drain_rounds="${BENCH_DRAIN_ROUNDS:-3}"
drain_secs="${BENCH_DRAIN_SECONDS:-3}"
bench_psql >/dev/null <<'SQL'
SET client_min_messages = warning;
DROP TABLE IF EXISTS drain_ext, drain_port;
CREATE TABLE drain_ext (id bigint PRIMARY KEY, body text, done boolean NOT NULL DEFAULT false);
INSERT INTO drain_ext (id, body) SELECT g, md5(g::text) FROM generate_series(1, 1000000) g;
CREATE TABLE drain_port (LIKE drain_ext INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES);
INSERT INTO drain_port SELECT * FROM drain_ext;
CREATE INDEX ON drain_ext ((public.slot_of(id, 8)), id) WHERE NOT done;
CREATE INDEX ON drain_port ((claim_portable.slot_of(id, 8)), id) WHERE NOT done;
VACUUM ANALYZE drain_ext, drain_port;
SELECT count(*) FROM generate_series(0, 7) c, LATERAL public.claim_lease('drain', 8, 'client ' || c, '1 hour') l;
SELECT count(*) FROM generate_series(0, 7) c, LATERAL claim_portable.claim_lease('drain', 8, 'client ' || c, '1 hour') l;
SQL
for e in ext:public port:claim_portable; do
    t="drain_${e%%:*}" schema="${e##*:}"
    printf '%s\n' '\if :ready = 0' \
        "SELECT token FROM $schema.lease_holders('drain') WHERE slot = :client_id \\gset" \
        '\set ready 1' '\endif' \
        "SELECT $schema.fence('drain', :client_id, :token) \\; UPDATE $t SET done = true WHERE id IN (SELECT id FROM $schema.my_items(NULL::$t, :client_id, 8, pending => 'done', batch => 50));" \
        >"$BENCH_TMP/drain_$t.sql"
done
pgc_pgbouncer_start 8 >/dev/null 2>&1
: >"$BENCH_TMP/drain"
for ((r = 0; r < drain_rounds; r++)); do
    order="drain_ext drain_port"
    ((r % 2)) && order="drain_port drain_ext" # each edition first in turn
    for t in $order; do
        # every measurement starts from the same state: nothing done, no dead rows
        bench_psql -q -c "UPDATE $t SET done = false WHERE done" -c "VACUUM ANALYZE $t"
        before=$(bench_psql -At -c "SELECT count(*) FROM $t WHERE done")
        "$PGC_BIN/pgbench" -n -M simple -c 8 -j 2 -T "$drain_secs" -D ready=0 -D token=0 \
            -h 127.0.0.1 -p "$PGC_POOLER_PORT" -f "$BENCH_TMP/drain_$t.sql" postgres >"$BENCH_TMP/pgbench.out" 2>&1 ||
            { cat "$BENCH_TMP/pgbench.out" >&2; exit 1; }
        after=$(bench_psql -At -c "SELECT count(*) FROM $t WHERE done")
        echo "$t $(( (after - before) / drain_secs ))" >>"$BENCH_TMP/drain"
    done
done
python3 - "$BENCH_TMP/drain" "$drain_rounds" "$drain_secs" <<'PY'
import statistics, sys
rate = {}
for line in open(sys.argv[1]):
    t, v = line.split()
    rate.setdefault(t, []).append(int(v))
e, p = statistics.median(rate["drain_ext"]), statistics.median(rate["drain_port"])
print(f"pooler drain: 8 clients through PgBouncer (transaction mode, 8 server connections), fence + my_items batch of 50 + UPDATE per message, medians of {sys.argv[2]} rounds of {sys.argv[3]} s")
print(f"  extension {e:.0f} items/s (each round: {', '.join(map(str, rate['drain_ext']))}), portable {p:.0f} items/s (each round: {', '.join(map(str, rate['drain_port']))})")
print(f"ratio: portable / extension, pooler drain items/s = {p / max(e, 1):.2f}x")
PY
bench_psql -c "SET client_min_messages = warning" -c "DROP TABLE bench_pk, bench_items_ext, bench_items_port, drain_ext, drain_port" \
    -c "DELETE FROM public.pg_claim_leases WHERE name = 'drain'" -c "DROP SCHEMA claim_portable CASCADE" >/dev/null
