#!/usr/bin/env bash
# The cost of slot_backlog: the pending rows per slot of a 1,000,000-row
# table with 20,000 pending rows (sent_at IS NULL), through slot_backlog and
# through the hand-written count over the same partial index
# ((slot_of(id, 16)), id) WHERE sent_at IS NULL, side by side in one pgbench
# script, with the simple and the prepared protocol. Then the same with the
# oldest pending row (age => 'created_at' against min(created_at)), which
# reads the heap. Target: slot_backlog at most 1.5x the hand-written query.
source "$(dirname "$0")/lib.sh"
ROWS="${BENCH_BL_ROWS:-1000000}"
PENDING="${BENCH_BL_PENDING:-20000}"
SECONDS_PER_TURN="${BENCH_SECONDS:-10}"
PGBENCH="$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)"

bench_setup <<SQL
DROP TABLE IF EXISTS bench_bl;
CREATE TABLE bench_bl (id bigint PRIMARY KEY, payload text NOT NULL, created_at timestamptz NOT NULL,
                       sent_at timestamptz);
-- about PENDING rows, spread over the table and the slots, are pending
INSERT INTO bench_bl
SELECT g, md5(g::text), '2026-01-01'::timestamptz + g * interval '1 second',
       CASE WHEN abs(hashint8(g)) % ($ROWS / $PENDING) = 0 THEN NULL ELSE now() END
FROM generate_series(1, $ROWS) g;
CREATE INDEX bench_bl_pending ON bench_bl ((slot_of(id, 16)), id) WHERE sent_at IS NULL;
VACUUM ANALYZE bench_bl;
SQL
pending=$(bench_psql -At -c "SELECT count(*) FROM bench_bl WHERE sent_at IS NULL")
same=$(bench_psql -At -c "SELECT bool_and(b.backlog = coalesce(h.c, 0)) AND count(*) = 16
    FROM slot_backlog('bench_bl', 16, 'sent_at') b
    LEFT JOIN (SELECT slot_of(id, 16) AS s, count(*) AS c FROM bench_bl WHERE sent_at IS NULL GROUP BY 1) h ON h.s = b.slot")
[ "$same" = t ] || { echo "bench backlog: slot_backlog and the hand-written count differ" >&2; exit 1; }

# script AGE: the pgbench script of one case
script() {
    if [ "$1" = age ]; then
        cat <<'SQL'
SELECT * FROM slot_backlog('bench_bl', 16, 'sent_at', age => 'created_at');
SELECT slot_of(id, 16), count(*), min(created_at) FROM bench_bl WHERE sent_at IS NULL GROUP BY 1;
SQL
    else
        cat <<'SQL'
SELECT * FROM slot_backlog('bench_bl', 16, 'sent_at');
SELECT slot_of(id, 16), count(*) FROM bench_bl WHERE sent_at IS NULL GROUP BY 1;
SQL
    fi
}

load=$(cut -d' ' -f1-3 /proc/loadavg)
for case in count age; do
    script "$case" >"$BENCH_TMP/$case.sql"
    for mode in simple prepared; do
        # warm: the table's pages and the index in shared_buffers
        "$PGBENCH" -n -c 1 -j 1 -T 2 -M "$mode" -f "$BENCH_TMP/$case.sql" postgres >/dev/null 2>&1
        "$PGBENCH" -n -r -c 1 -j 1 -T "$SECONDS_PER_TURN" -M "$mode" -f "$BENCH_TMP/$case.sql" postgres 2>/dev/null |
            awk '/SELECT \* FROM slot_backlog/ {m=$1} /SELECT slot_of/ {h=$1} END {print m, h}' \
                >"$BENCH_TMP/lat-$case-$mode"
    done
done

# the plan of each: slot_backlog's query (n in place of its parameter) and
# the hand-written one
scan_of() { grep -o '[A-Za-z ]*Scan[a-z ]* on [a-z_]*' | sed 's/^ *//' | paste -sd, -; }
q=$(bench_psql -At -c "SELECT replace(slot_backlog_query('bench_bl'::regclass, 16, 'sent_at'), '\$1', '16')")
plans="slot_backlog: $(bench_psql -At -c "EXPLAIN (COSTS OFF) $q" | scan_of)"
plans+="; hand-written: $(bench_psql -At -c "EXPLAIN (COSTS OFF) SELECT slot_of(id, 16), count(*) FROM bench_bl WHERE sent_at IS NULL GROUP BY 1" | scan_of)"

: >"$BENCH_TMP/times"  # no bench_time medians here
bench_report "$BENCH_TMP" "$ROWS" "$pending" "$SECONDS_PER_TURN" "$plans" "$load" <<'PY'
tmp, rows, pending, secs, plans, load = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
print(f"slot_backlog cost: {pending} pending rows (sent_at IS NULL) of {rows}, n = 16, partial index ((slot_of(id, 16)), id) WHERE sent_at IS NULL")
print(f"  pgbench -r, 1 client, {secs} s per case, both queries in turn, mean latency per statement")
print(f"  plans: {plans}")
print(f"  load average before the runs: {load}")
for case, what in (("count", "pending rows per slot"), ("age", "and the oldest (age => 'created_at' vs min(created_at))")):
    for mode in ("simple", "prepared"):
        mi, hw = map(float, open(f"{tmp}/lat-{case}-{mode}").read().split())
        print(f"ratio: slot_backlog / hand-written GROUP BY, {what}, {mode} protocol = {mi/hw:.2f}x"
              f"  ({mi:.2f} ms vs {hw:.2f} ms; target <= 1.5x)")
PY
bench_psql -c "DROP TABLE bench_bl" >/dev/null
