#!/usr/bin/env bash
# The cost of fencing and of the table's layout, through a transaction-mode
# pooler: W pgbench clients (simple protocol) mark a table's rows done in
# batches of 50, one statement per batch, through one PgBouncer
# (pool_mode = transaction, P server connections), n = W slots, client c
# serving slot c, with these schemes (one pgbench script each):
#   ranges        each client its own contiguous id range, no hash, no lease:
#                 the baseline;
#   share         UPDATE t ... WHERE id IN (SELECT id FROM t WHERE
#                 slot_of(id, W) = c AND NOT done ORDER BY id LIMIT 50), the
#                 index ((slot_of(id, W)), id) WHERE NOT done;
#   fenced        share + AND lease_valid(name, c, token);
#   fenced_fence  SELECT fence(name, c, token) \; share, one message, one
#                 transaction;
#   part          t hash-partitioned with modulus W: the client updates its
#                 slot's partition (slot_partition) directly;
#   part_fenced   part + AND lease_valid(name, c, token);
#   parent        UPDATE parent ... WHERE id IN (SELECT id FROM
#                 my_items(NULL::parent, c, W, method => 'pg_hash',
#                 batch => 50, pending => 'done'));
#   queue         UPDATE ... FROM (the next 50 not done, FOR UPDATE SKIP
#                 LOCKED): any client takes any row.
# and, only when named in BENCH_LIMIT_SCHEMES, two parts of fenced_fence:
#   lock_only     SELECT pg_advisory_xact_lock_shared(...) \; share: a
#                 shared transaction-level advisory lock of the kind fence
#                 takes (in the fence lock's key range), alone;
#   select_1      SELECT 1 \; share: a second statement in the message.
# The controls share_again and part_again run share's and part's statements
# on tables of their own, built like theirs; their ratios to share and part
# are what the tables and the machine alone make of two identical schemes:
# the noise a fenced / unfenced ratio is read against.
# Leases are claimed before the runs (ttl 1 hour, slot c for client c), so
# every fenced statement passes its check. The points (W, P) are (8, 8),
# (32, 32) and (128, 64); at each point the schemes run in turn, R rounds,
# the order rotated every round, each run T seconds against a table vacuumed
# right before it (the previous run's dead rows gone); items/s are the rows
# marked done over pgbench's measured time. Reported: the medians, the
# ratios to ranges, and the fenced / unfenced ratios (median of the rounds'
# ratios: each round runs both side by side); and the CPU time per item of
# the server connections, PgBouncer and pgbench (/proc/PID/schedstat, and
# time(1) for pgbench), which the machine's other load changes far less
# than items/s, with the ratios of items per CPU second. Writes
# docs/limit-throughput.svg (BENCH_LIMIT_OUT).
#
# Every scheme works on its own table of BENCH_LIMIT_ROWS rows, built again
# at every point from the same rows in the same order (the share schemes'
# with the index ((slot_of(id, W)), id) WHERE NOT done, the partitioned
# schemes' hash-partitioned with modulus W), so that no scheme's run changes
# the table another scheme runs on: a scheme and its fenced twin meet the
# same table state round after round. Every table is built again before
# every round (BENCH_LIMIT_FRESH), so that every run meets a table whose
# rows are all pending. Autovacuum is off for these tables, a
# CHECKPOINT precedes every run, and the server runs with shared_buffers =
# 2GB for the duration (then restarted with its own setting): a run pays
# for neither an autovacuum nor another run's dirty pages.
#
# Knobs (environment): BENCH_LIMIT_ROWS (2000000), BENCH_LIMIT_SECONDS (2 per
# run), BENCH_LIMIT_ROUNDS (5), BENCH_LIMIT_PAIRS ("8:8 32:32 128:64"),
# BENCH_LIMIT_SCHEMES (all of the above but lock_only and select_1, in
# that order), BENCH_LIMIT_OUT
# (docs), BENCH_LIMIT_FRESH (1, the default: every table built again
# before every round, so that every run meets a table whose rows are all
# pending; 0: only when a run could drain a table, quicker, but a table's
# later runs are slower, up to 3x at W = 128, as its updated rows' new
# versions spread over more pages, and a round's ratios then depend on
# the order of its runs), BENCH_LIMIT_PROFILE (schemes to run once more under perf at every
# point, printing where the server's CPU went: under the check, parsing,
# planning, executing, committing, taking locks; BENCH_LIMIT_PROFILE_DIR:
# where to keep each profile's whole perf report). Where the server loads
# pg_stat_statements, each scheme's server time per batch statement is
# printed too.
source "$(dirname "$0")/lib.sh"
# PgBouncer in transaction mode in front of this cluster (pgc_pgbouncer_start)
source "$BENCH_ROOT/scripts/lib.sh"

# For this benchmark only, a buffer pool that holds every scheme's table
# (about 200 MB each at the default size, nine of them): shared_buffers set
# to 2GB and the server restarted, reset and restarted again at the end, so
# that a run does not write out the pages the runs before it dirtied
data_dir=$(bench_psql -At -c "SHOW data_directory")
restart() {
    pgc_as_postgres "$PGC_BIN/pg_ctl" -D "$data_dir" -l "$data_dir/log-restarts" -w -t 60 -m fast restart >/dev/null
}
bench_psql -c "ALTER SYSTEM SET shared_buffers = '2GB'" >/dev/null
restart
trap 'bench_psql -c "ALTER SYSTEM RESET shared_buffers" >/dev/null; restart; pgc_cleanup; rm -rf "$BENCH_TMP"' EXIT

rows="${BENCH_LIMIT_ROWS:-2000000}"
secs="${BENCH_LIMIT_SECONDS:-2}"
rounds="${BENCH_LIMIT_ROUNDS:-5}"
pairs="${BENCH_LIMIT_PAIRS:-8:8 32:32 128:64}"
fresh="${BENCH_LIMIT_FRESH:-1}"
read -r -a schemes <<<"$(tr ',' ' ' <<<"${BENCH_LIMIT_SCHEMES:-ranges,share,share_again,fenced,fenced_fence,part,part_again,part_fenced,parent,queue}")"
out_dir="${BENCH_LIMIT_OUT:-docs}"
batch=50
pgbench="$PGC_BIN/pgbench"
plot="$(bench_rust limit_plot)"

bench_setup <<'SQL'
SELECT 1;
SQL
pgss=$(bench_psql -At -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_stat_statements'
    AND current_setting('shared_preload_libraries') ~ 'pg_stat_statements'")
if [ "$pgss" = 1 ]; then
    bench_psql -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null 2>&1
fi

# rows marked done in each table when its scheme's last run ended
declare -A done_before

# table_of SCHEME: the table a scheme works on
table_of() { echo "bench.limit_$1"; }

# build W: the schemes' tables for W slots, every row pending (and counted
# so in done_before)
build() {
    local w="$1" s t
    for s in "${schemes[@]}"; do done_before[$(table_of "$s")]=0; done
    {
        echo "SET client_min_messages = warning;"
        echo "DROP TABLE IF EXISTS bench.limit_rows;"
        echo "CREATE TABLE bench.limit_rows AS SELECT g::bigint AS id, md5(g::text) AS payload FROM generate_series(1, $rows) g;"
        for s in "${schemes[@]}"; do
            t=$(table_of "$s")
            echo "DROP TABLE IF EXISTS $t;"
            case "$s" in
            part | part_again | part_fenced | parent)
                echo "CREATE TABLE $t (id bigint PRIMARY KEY, payload text NOT NULL, done boolean NOT NULL DEFAULT false) PARTITION BY HASH (id);"
                echo "SELECT format('CREATE TABLE %s_%s PARTITION OF $t FOR VALUES WITH (MODULUS $w, REMAINDER %s)', '$t', r, r) FROM generate_series(0, $w - 1) r \\gexec"
                echo "INSERT INTO $t (id, payload) SELECT id, payload FROM bench.limit_rows ORDER BY id;"
                echo "CREATE INDEX ON $t (id) WHERE NOT done;" ;;
            *)
                echo "CREATE TABLE $t (id bigint PRIMARY KEY, payload text NOT NULL, done boolean NOT NULL DEFAULT false);"
                echo "INSERT INTO $t (id, payload) SELECT id, payload FROM bench.limit_rows ORDER BY id;"
                case "$s" in
                ranges | queue) echo "CREATE INDEX ON $t (id) WHERE NOT done;" ;;
                *) echo "CREATE INDEX ON $t ((slot_of(id, $w)), id) WHERE NOT done;" ;;
                esac ;;
            esac
            echo "VACUUM ANALYZE $t;"
        done
        echo "DROP TABLE bench.limit_rows;"
        # no autovacuum in the middle of a run: each run's table is vacuumed
        # right before it
        echo "SELECT format('ALTER TABLE %s SET (autovacuum_enabled = false)', c.oid::regclass) FROM pg_class c WHERE c.relnamespace = 'bench'::regnamespace AND c.relkind = 'r' AND c.relname LIKE 'limit\_%' \\gexec"
    } | bench_psql >/dev/null
}

# leases W: a live lease of slot c for holder "client c", c = 0 .. W-1, of
# the name limit_W (each point its own n)
leases() {
    local w="$1"
    bench_psql -At <<SQL >/dev/null
SET client_min_messages = warning;
DELETE FROM pg_claim_leases WHERE name = 'limit_$w';
SELECT format('SELECT slot FROM claim_lease(%L, %s, %L, ''1 hour'')', 'limit_$w', $w, 'client ' || c)
FROM generate_series(0, $w - 1) c \\gexec
SQL
    local ok
    ok=$(bench_psql -At -c "SELECT count(*) FROM lease_holders('limit_$w') WHERE holder = 'client ' || slot AND NOT expired")
    [ "$ok" = "$w" ] || { echo "limit: $ok of $w leases of limit_$w claimed as expected" >&2; exit 1; }
    # the tokens, where a client's first transaction looks its own up: a
    # primary-key read, which costs the server next to nothing (a
    # lease_holders call per client and run would cost the fenced schemes
    # about 3% of the server's time at W = 128)
    bench_psql -q <<SQL
DROP TABLE IF EXISTS bench.limit_tokens;
CREATE TABLE bench.limit_tokens (slot integer PRIMARY KEY, token bigint NOT NULL);
INSERT INTO bench.limit_tokens SELECT slot, token FROM lease_holders('limit_$w');
SQL
}

# script SCHEME W: the pgbench script of a scheme at W slots (client
# :client_id serves slot :client_id; :w, :rows and :ready = 0 come from -D;
# the lease name is written into the statement, as a worker passes its own)
script() {
    local t share_where="slot_of(id, :w) = :client_id AND NOT done ORDER BY id LIMIT $batch"
    t=$(table_of "$1")
    # the first transaction of a client looks up its token and partition
    case "$1" in
    fenced | fenced_fence | part_fenced)
        printf '%s\n' '\if :ready = 0' \
            "SELECT token FROM bench.limit_tokens WHERE slot = :client_id \\gset" ;;&
    part | part_again | part_fenced)
        [ "$1" = part_fenced ] || echo '\if :ready = 0'
        echo "SELECT slot_partition('$t', :client_id, :w) AS part \\gset" ;;&
    fenced | fenced_fence | part | part_again | part_fenced)
        printf '%s\n' '\set ready 1' '\endif' ;;
    esac
    case "$1" in
    ranges)
        printf '%s\n' '\set lo :client_id * (:rows / :w) + 1' '\set hi :lo + :rows / :w - 1'
        echo "UPDATE $t SET done = true WHERE id IN (SELECT id FROM $t WHERE id BETWEEN :lo AND :hi AND NOT done ORDER BY id LIMIT $batch);" ;;
    share | share_again)
        echo "UPDATE $t SET done = true WHERE id IN (SELECT id FROM $t WHERE $share_where);" ;;
    fenced)
        echo "UPDATE $t SET done = true WHERE id IN (SELECT id FROM $t WHERE $share_where) AND lease_valid('limit_$2', :client_id, :token);" ;;
    fenced_fence)
        echo "SELECT fence('limit_$2', :client_id, :token) \\; UPDATE $t SET done = true WHERE id IN (SELECT id FROM $t WHERE $share_where);" ;;
    lock_only)
        echo "SELECT pg_advisory_xact_lock_shared(12345, 271581184 + :client_id) \\; UPDATE $t SET done = true WHERE id IN (SELECT id FROM $t WHERE $share_where);" ;;
    select_1)
        echo "SELECT 1 \\; UPDATE $t SET done = true WHERE id IN (SELECT id FROM $t WHERE $share_where);" ;;
    part | part_again)
        echo "UPDATE :part SET done = true WHERE id IN (SELECT id FROM :part WHERE NOT done ORDER BY id LIMIT $batch);" ;;
    part_fenced)
        echo "UPDATE :part SET done = true WHERE id IN (SELECT id FROM :part WHERE NOT done ORDER BY id LIMIT $batch) AND lease_valid('limit_$2', :client_id, :token);" ;;
    parent)
        echo "UPDATE $t SET done = true WHERE id IN (SELECT id FROM my_items(NULL::$t, :client_id, :w, method => 'pg_hash', batch => $batch, pending => 'done'));" ;;
    queue)
        echo "UPDATE $t i SET done = true FROM (SELECT id FROM $t WHERE NOT done ORDER BY id LIMIT $batch FOR UPDATE SKIP LOCKED) c WHERE i.id = c.id;" ;;
    *)
        echo "limit: unknown scheme $1" >&2
        exit 1 ;;
    esac
}

# the rows marked done in each table, and the most one run marked
# cpu_read: "pid nanoseconds kind" of CPU time so far (/proc/PID/schedstat)
# of the server connections (kind server) and of PgBouncer (pooler)
cpu_read() {
    local pid
    for pid in $(bench_psql -At -c "SELECT pid FROM pg_stat_activity
        WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"); do
        [ ! -r "/proc/$pid/schedstat" ] || echo "$pid $(cut -d' ' -f1 "/proc/$pid/schedstat") server"
    done
    pid=$(cat "${PGC_POOLERS[-1]}/pgbouncer.pid")
    echo "$pid $(cut -d' ' -f1 "/proc/$pid/schedstat") pooler"
}

most=0
count_done() { bench_psql -At -c "SELECT count(*) FROM $1 WHERE done"; }
# low_table: whether a table has fewer than twice the most a run marked
# still pending
low_table() {
    local s
    for s in "${schemes[@]}"; do
        ((rows - done_before[$(table_of "$s")] >= 2 * most)) || return 0
    done
    return 1
}

# settle SCHEME: the scheme's table vacuumed and the previous run's dirty
# pages written out, before a run rather than by it
settle() { bench_psql -c "VACUUM $(table_of "$1")" -c "CHECKPOINT" >/dev/null; }

# pgbench_cmd SCHEME W PORT: sets cmd to the pgbench command line of a run
# of the scheme with W clients for $secs s against PORT
pgbench_cmd() {
    cmd=("$pgbench" -n -M simple -c "$2" -j 2 -T "$secs" -D w="$2" -D rows="$rows" -D ready=0 -D token=0 -D part=none
        -h 127.0.0.1 -p "$3" -f "$BENCH_TMP/$1.sql" postgres)
}

# run SCHEME W PORT: vacuums the scheme's table, runs the scheme with W
# clients for $secs s against PORT and writes items/s and the server's mean
# ms per batch (or -) to $BENCH_TMP/run
run() {
    local scheme="$1" w="$2" port="$3" t done_ tps xacts ms=-
    t=$(table_of "$scheme")
    settle "$scheme"
    [ "$pgss" != 1 ] || bench_psql -c "SELECT pg_stat_statements_reset()" >/dev/null
    cpu_read >"$BENCH_TMP/cpu.before"
    pgbench_cmd "$scheme" "$w" "$port"
    /usr/bin/time -f '%U %S' -o "$BENCH_TMP/cpu.client" "${cmd[@]}" >"$BENCH_TMP/pgbench.out" 2>&1 ||
        { cat "$BENCH_TMP/pgbench.out" >&2; return 1; }
    cpu_read >"$BENCH_TMP/cpu.after"
    done_=$(count_done "$t")
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$BENCH_TMP/pgbench.out")
    xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$BENCH_TMP/pgbench.out")
    if [ "$pgss" = 1 ]; then
        # the batch's statements (fence and UPDATE are two; one UPDATE per
        # partition), not the clients' first look-ups
        ms=$(bench_psql -At -c "SELECT round((sum(total_exec_time)
                / nullif(sum(calls) FILTER (WHERE query ~* '^ *update'), 0))::numeric, 3)
            FROM pg_stat_statements WHERE query ~* '^ *(select fence|update)' AND query !~* 'set done = false'")
    fi
    python3 -c "
d = $done_ - ${done_before[$t]}
if d > 0.9 * ($rows - ${done_before[$t]}): raise SystemExit('limit: $scheme drained its table; lower BENCH_LIMIT_SECONDS or raise BENCH_LIMIT_ROWS')
if d < 0.9 * $batch * ($xacts - $w): raise SystemExit(f'limit: $scheme marked {d} rows in $xacts batches: statements wrote short batches')
cpu = {'server': 0, 'pooler': 0}
before = {l.split()[0]: int(l.split()[1]) for l in open('$BENCH_TMP/cpu.before')}
for l in open('$BENCH_TMP/cpu.after'):
    pid, ns, kind = l.split()
    cpu[kind] += int(ns) - before.get(pid, 0)
client = sum(map(float, open('$BENCH_TMP/cpu.client').read().split()[-2:])) * 1e9
print(round($tps * d / $xacts), '${ms:--}', *(f'{v / d / 1000:.2f}' for v in (cpu['server'], cpu['pooler'], client)))" >"$BENCH_TMP/run"
    ((done_ - done_before[$t] <= most)) || most=$((done_ - done_before[$t]))
    done_before[$t]=$done_
}

: >"$BENCH_TMP/results"
echo "fencing and layouts through PgBouncer (transaction mode): $rows rows, batches of $batch, one statement each, n = W, $secs s per run, $rounds rounds, the schemes interleaved, shared_buffers $(bench_psql -At -c "SHOW shared_buffers")"
# profile SCHEME W P PORT: one more run of the scheme under perf (every
# CPU, DWARF call graphs) and, of the server processes' samples, the share
# spent in (under) the check and in the stages of a statement: where the
# time of a fenced statement goes, which the throughput ratios, noisy on a
# shared machine, cannot say
profile() {
    local scheme="$1" w="$2" p="$3" port="$4"
    settle "$scheme"
    pgbench_cmd "$scheme" "$w" "$port"
    perf record -a --call-graph dwarf,16384 -F 999 -o "$BENCH_TMP/perf.data" -- "${cmd[@]}" >/dev/null 2>&1 ||
        { echo "limit: perf record failed for $scheme" >&2; return 1; }
    perf report -i "$BENCH_TMP/perf.data" --children --sort sym -q --comm postgres -g none 2>/dev/null >"$BENCH_TMP/perf.txt"
    [ -z "${BENCH_LIMIT_PROFILE_DIR:-}" ] || { mkdir -p "$BENCH_LIMIT_PROFILE_DIR" && cp "$BENCH_TMP/perf.txt" "$BENCH_LIMIT_PROFILE_DIR/$scheme-$w.txt"; }
    python3 -c "
import collections, sys
want = {'lease_valid_wrapper': 'lease_valid', 'fence_wrapper': 'fence', 'pg_parse_query': 'parse',
        'pg_analyze_and_rewrite_fixedparams': 'analyze', 'pg_plan_queries': 'plan',
        'standard_ExecutorRun': 'execute', 'CommitTransactionCommand': 'commit',
        'LockAcquireExtended': 'LockAcquire'}
got = collections.Counter()
for line in sys.stdin:
    f = line.split()
    if len(f) >= 4 and f[-1] in want:
        got[want[f[-1]]] += float(f[0].rstrip('%'))
print('profile: $scheme at W=$w P=$p, % of the server processes\' CPU samples, inclusive: '
      + ', '.join(f'{k} {got[k]:.2f}' for k in want.values()))" <"$BENCH_TMP/perf.txt"
}

read -r -a profiled <<<"$(tr ',' ' ' <<<"${BENCH_LIMIT_PROFILE:-}")"
if ((${#profiled[@]})) && ! command -v perf >/dev/null; then
    echo "limit: BENCH_LIMIT_PROFILE needs perf (apt-get install linux-perf)" >&2
    exit 1
fi
for pair in $pairs; do
    w="${pair%%:*}"
    p="${pair##*:}"
    pgc_log "limit: building the tables for W = $w"
    build "$w"
    leases "$w"
    for s in "${schemes[@]}"; do script "$s" "$w" >"$BENCH_TMP/$s.sql"; done
    pgc_pgbouncer_start "$p" >/dev/null 2>&1
    # open the pool's P server connections before timing
    echo 'SELECT pg_sleep(0.01);' >"$BENCH_TMP/warm.sql"
    "$pgbench" -n -M simple -c "$w" -j 2 -T 1 -h 127.0.0.1 -p "$PGC_POOLER_PORT" -f "$BENCH_TMP/warm.sql" postgres >/dev/null 2>&1
    for ((r = 0; r < rounds; r++)); do
        # when a table has fewer than twice the most a run marked still
        # pending, every table is built again before the round: the schemes
        # stay on tables in the same state (an UPDATE of every row back to
        # pending would leave each table twice its size, and a scheme whose
        # table was reset in another round than its twin's would meet
        # another table state)
        if ((r > 0)) && { [ "$fresh" = 1 ] || low_table; }; then
            pgc_log "limit: every table built again (every row pending) before round $((r + 1)) at W = $w"
            build "$w"
        fi
        n=${#schemes[@]}
        for ((k = 0; k < n; k++)); do
            s="${schemes[$(((k + r) % n))]}"
            run "$s" "$w" "$PGC_POOLER_PORT"
            echo "$w $p $r $s $(cat "$BENCH_TMP/run")" >>"$BENCH_TMP/results"
        done
    done
    for s in "${profiled[@]}"; do profile "$s" "$w" "$p" "$PGC_POOLER_PORT"; done
    pgc_cleanup
done

python3 - "$BENCH_TMP/results" "$BENCH_TMP/plot.in" "$rows" "$secs" "$rounds" "$(nproc)" "${schemes[*]}" <<'PY'
import os, sys
from collections import defaultdict
path, plot_in, rows, secs, rounds, cores, schemes = sys.argv[1:]
schemes = schemes.split()
rate = defaultdict(dict)   # (w, p) -> scheme -> [items/s by round]
ms = defaultdict(dict)
cpu = defaultdict(dict)    # (w, p) -> scheme -> {round: (server, pooler, client) us per item}
for line in open(path):
    w, p, r, s, v, m, *c = line.split()
    rate[(int(w), int(p))].setdefault(s, {})[int(r)] = float(v)
    ms[(int(w), int(p))].setdefault(s, []).append(m)
    cpu[(int(w), int(p))].setdefault(s, {})[int(r)] = tuple(map(float, c))
def median(xs):
    xs = sorted(xs)
    return xs[(len(xs) - 1) // 2]
label = {
    "ranges": "ranges (own id range, no hash, no fence)",
    "share": "share (slot_of index, unfenced)",
    "fenced": "share + AND lease_valid(...)",
    "fenced_fence": "share + SELECT fence(...), one transaction",
    "part": "own partition (slot_partition), unfenced",
    "part_fenced": "own partition + AND lease_valid(...)",
    "parent": "parent + my_items(method => 'pg_hash')",
    "queue": "FOR UPDATE SKIP LOCKED queue",
    "lock_only": "share + a shared advisory lock first",
    "select_1": "share + SELECT 1 first",
    "share_again": "share again, a table of its own (control)",
    "part_again": "own partition again, a table of its own (control)",
}
color = {"ranges": "#444444", "share": "#1f77b4", "fenced": "#17becf", "fenced_fence": "#9467bd",
         "part": "#2ca02c", "part_fenced": "#bcbd22", "parent": "#ff7f0e", "queue": "#d62728",
         "lock_only": "#000000", "select_1": "#888888", "share_again": "#aec7e8", "part_again": "#98df8a"}
say = print
for (w, p), by in sorted(rate.items()):
    base = by.get("ranges")
    say(f"W = {w} clients, P = {p} server connections:")
    say(f"  {'scheme':46} {'items/s':>10} {'/ ranges':>9}  {'each round':26} {'CPU us/item: server+pooler+client':>34} {'server ms/batch':>15}")
    for s in schemes:
        if s not in by:
            continue
        v = median(list(by[s].values()))
        ratio = f"{v / median(list(base.values())):.2f}x" if base else "-"
        rs = ", ".join(f"{by[s][r]:.0f}" for r in sorted(by[s]))
        m = [float(x) for x in ms[(w, p)][s] if x not in ("-", "")]
        mtxt = f"{median(m):.3f}" if m else "-"
        c = [median([cpu[(w, p)][s][r][k] for r in cpu[(w, p)][s]]) for k in range(3)]
        ctxt = f"{sum(c):.2f} = {c[0]:.2f}+{c[1]:.2f}+{c[2]:.2f}"
        say(f"  {label[s]:46} {v:10.0f} {ratio:>9}  {rs:26} {ctxt:>34} {mtxt:>15}")
    def paired(a, b):
        if a not in by or b not in by:
            return None
        rs = [by[a][r] / by[b][r] for r in sorted(by[a]) if r in by[b]]
        ca, cb = cpu[(w, p)][a], cpu[(w, p)][b]
        # items per CPU second, a against b: what the throughput ratio is
        # on a machine whose cores the benchmark alone saturates
        cs = [sum(cb[r]) / sum(ca[r]) for r in sorted(ca) if r in cb]
        return median(rs), rs, median(cs)
    for a, b, what, target in (
        ("fenced", "share", "AND lease_valid(...) / unfenced share", 0.95),
        ("fenced_fence", "share", "SELECT fence(...) per transaction / unfenced share", 0.95),
        ("part_fenced", "part", "own partition + lease_valid / own partition unfenced", 0.95),
        ("share_again", "share", "share again (control) / share", None),
        ("lock_only", "share", "a shared advisory lock first / share", None),
        ("select_1", "share", "SELECT 1 first / share", None),
        ("part_again", "part", "own partition again (control) / own partition", None),
        ("part", "share", "own partition / share of the whole table", None),
        ("parent", "part", "parent + my_items / own partition", None),
        ("share", "ranges", "share / ranges", None),
        ("queue", "ranges", "queue / ranges", None),
    ):
        got = paired(a, b)
        if got is None:
            continue
        m, rs, c = got
        t = f"  (target >= {target}x: {'met' if m >= target else 'NOT met'})" if target else ""
        say(f"ratio: {what} at W={w} P={p} = {m:.2f}x{t}  (each round: {', '.join(f'{x:.2f}' for x in rs)};"
            f" items per CPU second: {c:.2f}x)")
# the plot's input: title, subtitle, then one line per scheme
points = sorted(rate)
sys.stdout = open(plot_in, "w")
print(f"Items/s vs clients W through PgBouncer, n = W ({int(rows):,} rows, 50 per batch, {cores} cores)")
print(f"P = {', '.join(str(p) for _, p in points)} server connections at W = {', '.join(str(w) for w, _ in points)}; median of {rounds} interleaved rounds of {secs} s")
for s in schemes:
    pts = [(w, median(list(rate[(w, p)][s].values()))) for (w, p) in points if s in rate[(w, p)]]
    if pts:
        print("\t".join([label[s], color[s], " ".join(f"{w}:{v:.0f}" for w, v in pts)]))
PY
mkdir -p "$out_dir"
"$plot" <"$BENCH_TMP/plot.in" >"$out_dir/limit-throughput.svg"
echo "plot written to $out_dir/limit-throughput.svg"
