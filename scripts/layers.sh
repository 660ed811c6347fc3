# The layers of scripts/test: one function per layer, each taking the test
# names of its kind (pg_regress tests, isolation specs, cargo test filters, ...)
# as arguments. Sourced by scripts/test after scripts/lib.sh; not run alone.
# A layer that cannot run here (a component not installed) prints one line
# saying why and returns $PGC_SKIPPED.

PGC_SKIPPED=77

clippy() {
    cargo clippy --workspace --all-targets --no-default-features --features "$PGC_FEATURE pg_test" -- -D warnings
}

pgtest() {
    # cargo-pgrx runs initdb as the postgres user, which must be able to
    # create the data directory itself.
    local parent="$PGC_WORK/pgrx-test"
    local data="$parent/data"
    mkdir -p "$PGC_WORK"
    chmod 755 "$PGC_WORK"
    rm -rf "$parent"
    install -d -o postgres -m 700 "$parent"
    # cargo-pgrx installs its test build (with the schema `tests` and its
    # functions) into the installation of the pg_config its PGRX_HOME names,
    # with `sudo cp` over the files there: a library rewritten in place under
    # every server that has it mapped. So it gets a private copy of the
    # installation of its own, which only its test server runs from, named
    # in a private PGRX_HOME; the files of its last run are removed first, so
    # that each file it installs is a new one.
    local inst="$PGC_WORK/pgrx-inst-$PGC_PG_MAJOR"
    pgc_pgrx_home "$inst"
    rm -f "$inst$PGC_PG_SHARE"/extension/pg_claim* "$inst$PGC_PG_PKGLIB"/pg_claim.so
    local rc=0 system
    system="$(pgc_system_files | xargs -r stat -c '%n %i %s %y %z')"
    # --profile pgtest (Cargo.toml): cargo test and cargo-pgrx's build of
    # the library for the test server (which gets the profile it is given)
    # use one profile; with the dev-dependencies' features that pg_test adds
    # to the library's build (Cargo.toml), that build reuses every
    # dependency of the tests' build. Under the default profiles (`test`
    # for cargo test, `dev` for the library) it built pgrx-pg-sys (its
    # bindings generated again), pgrx and their dependencies a second time.
    PGRX_HOME="$PGC_PGRX_HOME" cargo pgrx test "$PGC_FEATURE" "$@" --profile pgtest --runas postgres --pgdata "$data" || rc=$?
    rm -rf "$parent"
    if [ "$(pgc_system_files | xargs -r stat -c '%n %i %s %y %z')" != "$system" ]; then
        echo "pg_claim: pg_claim's files in the system PostgreSQL changed during the layer" >&2
        rc=1
    fi
    return $rc
}

# regress_suite RUNNER DIR KIND [TEST...]: the given tests, or every test, of
# tests/DIR (sql/*.sql or specs/*.spec) through PostgreSQL's pg_regress or
# pg_isolation_regress.
regress_suite() {
    local runner="$1" dir="$2" kind="$3"
    shift 3
    local out="$PGC_WORK/$dir-out-$PGC_PG_MAJOR"
    rm -rf "$out"
    mkdir -p "$out"
    local tests="$*"
    [ -n "$tests" ] || tests=$(cd "tests/$dir/$kind" && ls | sed 's/\.[a-z]*$//' | sort | tr '\n' ' ')
    # shellcheck disable=SC2086
    if ! "$PGC_PGXS/src/test/$runner" \
        --bindir="$PGC_BIN" --host="$PGHOST" --port="$PGPORT" --user=postgres \
        --inputdir="tests/$dir" --outputdir="$out" \
        --dbname="pg_claim_$dir" $tests; then
        cat "$out/regression.diffs" >&2 || true
        return 1
    fi
}

# The release package holds the extension and nothing of the test build.
release_package() {
    local sql
    sql=$(ls "$PGC_PKG$PGC_PG_SHARE"/extension/pg_claim--*.sql)
    if grep -nE 'CREATE SCHEMA|\btests\.|pg_test' $sql; then
        echo "pg_claim: the release install script contains test objects" >&2
        return 1
    fi
    psql -X -q -v ON_ERROR_STOP=1 -d postgres <<'SQL'
CREATE DATABASE pg_claim_package;
\c pg_claim_package
CREATE EXTENSION pg_claim;
DO $$
DECLARE bad text;
BEGIN
    SELECT string_agg(pg_describe_object(d.classid, d.objid, d.objsubid), ', ') INTO bad
    FROM pg_depend d
    WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
      AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_claim')
      AND (d.classid = 'pg_namespace'::regclass
           OR (d.classid = 'pg_proc'::regclass
               AND (SELECT pronamespace FROM pg_proc WHERE oid = d.objid)
                   <> (SELECT extnamespace FROM pg_extension WHERE extname = 'pg_claim')));
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'objects outside the extension schema: %', bad;
    END IF;
END $$;
\c postgres
DROP DATABASE pg_claim_package;
SQL
}

# The Debian package (scripts/package --deb) installed with apt-get into the
# system's PostgreSQL, a smoke test and an update from 0.1.0 on a cluster of
# the system's binaries, then purged (tests/package/deb.sh). Where Debian has
# no postgresql-N package, the package is built and inspected, and the layer
# says so and is skipped.
deb_package() { tests/package/deb.sh --pg "$PGC_PG_MAJOR" "$@"; }

# The sql blocks of README.md and docs/*.md, each file's in order in a
# database of its own with the fixtures of tests/docs/fixtures.sql; a block
# marked <!-- not run: REASON --> is skipped and counted. Test names: files.
# Then the project layout of docs/architecture.md against the tree, the
# relative links and #anchors between the pages, and the README's quick
# start against the Python library's (tests/docs/test_layout.py, no server).
docs_examples() {
    local f docs=()
    for f in "$@"; do docs+=(--doc "$f"); done
    pytests tests/docs -- "${docs[@]}"
}

sessions() {
    PG_CLAIM_TEST_DSN="host=$PGHOST port=$PGPORT user=postgres dbname=postgres" \
        cargo test -p pg_claim_sessions --profile tools --no-fail-fast -- --test-threads=1 "$@"
}

# Lease fleets of the worker libraries in Python (pg_claim.Worker) and
# Node.js (pg-claim), 12 clients through a real PgBouncer in transaction mode
# with a pool of 4: a SIGKILLed holder, two holders SIGSTOPped past the TTL
# and resumed (their late writes refused, their tokens refused in SQL), every
# item exactly once; and what claim_slot does through that pooler.
# Then wake-up by LISTEN through session and transaction mode, and a session
# pool smaller than the fleet, seen in slot_status (tests/pooler/test_wake.py).
# Test names: words of test names.
pooler() {
    pgc_pgbouncer_start 4 &&
        pytests tests/pooler/test_claim_slot.py tests/pooler/test_fleets.py tests/pooler/test_wake.py -- "$@"
}

# Elastic fleets (claim_leases, tests/pooler/test_elastic.py) through PgBouncer
# in transaction mode: Python and Node holders (the worker libraries in lease
# mode) join, leave, are killed and stopped past the ttl; the shares
# balance, a join moves at most ceil(n/H) slots, stale tokens are refused by
# fence and no late write lands, each customer's items in key order, every
# item exactly once. Then a tenant's k slots (slot_of_spread) held by k
# different holders of a claim_leases fleet (tests/pooler/test_tenants.py),
# and balancing by remaining work (tests/pooler/test_balance.py): uneven
# slots, a SIGSTOP past the ttl, a SIGKILL and a join; holders finish
# together, every item once, in key order per customer.
elastic() {
    pgc_pgbouncer_start 4 && pytests tests/pooler/test_elastic.py tests/pooler/test_tenants.py tests/pooler/test_balance.py -- "$@"
}

# The Node.js worker library (clients/node, pg-claim): its declarations
# (tsc --strict), its unit tests and its tests against the server and a
# PgBouncer in transaction mode (node --test clients/node/test, four files at
# a time: each has a database of its own); then a fleet
# of its workers in lease mode through that PgBouncer with a join, SIGSTOP
# past the ttl, SIGKILL, a leave, two joins, a poison item and a server
# restart: every item exactly once, the poison item dead after its attempts,
# SIGTERM stops every worker within 15 s (tests/libs/test_node_fleet.py).
libs_node() {
    pgc_pgbouncer_start 4 &&
        (cd clients/node && npm run --silent typecheck && node --test --test-concurrency=4 test/) &&
        PGC_DATA="${PGC_CLUSTERS[-1]}" PGC_BIN="$PGC_BIN" pytests tests/libs/test_node_fleet.py -- "$@"
}

# An online resize of a library fleet (tests/libs/test_resize.py): Python and
# Node.js workers through PgBouncer in transaction mode drain an ordered
# outbox of 1,000 customers x 50 while resize_fleet takes the fleet 8 -> 32
# -> 12, a worker killed with SIGKILL and one joining at each change: every
# message once, in order per customer, each by the slot of its phase's n,
# and the customers that moved within 10% of the jump mapping's expectation.
# Then a fleet capped at 3 holders (tests/libs/test_cap.py): five workers, a
# kill, a pause past the ttl and a join, never more than 3 holders at once
# (sampled every 20 ms), the standbys taking over, every message once.
resize() {
    pgc_pgbouncer_start 8 && pytests tests/libs/test_resize.py tests/libs/test_cap.py -- "$@"
}

# The Python worker library (clients/python): pytest on its pure parts and
# on both modes against the server (through PgBouncer for the pooler checks),
# then a fleet of its workers through PgBouncer in transaction mode with
# joins, a leave, SIGSTOP past the ttl, SIGKILL, a poison item and a restart
# of the server: every row exactly once, every worker gone within 15 s of
# SIGTERM (tests/libs/test_python_fleet.py). Test names: pytest -k words.
libs_python() {
    pgc_ensure_python_libs || return 1
    pgc_pgbouncer_start 4 || return 1
    local k=()
    (($# == 0)) || k=(-k "$*")
    # two modules at a time (pytest-xdist), each worker with a database of its own
    PYTHONPATH="$PGC_ROOT/clients/python/src" python3 -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
        --durations=8 "${k[@]}" clients/python/tests &&
        PGC_DATA="${PGC_CLUSTERS[-1]}" PGC_BIN="$PGC_BIN" pytests tests/libs/test_python_fleet.py
}

# pg-claim web (clients/python, pg_claim/_web*.py) in Debian's Chromium
# headless through Selenium, against a fleet of pg_claim.Worker processes
# through PgBouncer in transaction mode (the server reads through it too):
# the pages equal the views, a killed worker's slots move on the page while
# it updates itself, actions work with --allow-actions and are refused
# without it or without the CSRF token, planted <script> in names, holders,
# items and errors never runs, JavaScript off still shows the page, the
# portable edition (tests/web/test_web.py).
web() {
    pgc_pgbouncer_start 8 && pytests tests/web -- "$@"
}

# contrib/prometheus against Debian's prometheus-postgres-exporter: two
# fleets (session and lease holders, failing and dead items), every exported
# value checked against the views and the tables, the fleets changed and
# scraped again, a role without SELECT on a table; promtool lints the scrape,
# checks contrib/prometheus/alerts.yml and runs its unit tests
# (tests/exporter/).
exporter() { pytests tests/exporter -- "$@"; }

# The example workers (examples/) in Python, Node.js, Java and Ruby, 4 of each
# on the example schema: a server restart mid-run, a failing message retried
# and set aside, a wake-up by NOTIFY, SIGTERM and --exit-when-empty, every
# message exactly once; and docs/workers.md shows their loops verbatim.
loops() {
    PGC_DATA="${PGC_CLUSTERS[-1]}" PGC_BIN="$PGC_BIN" pytests tests/loops -- "$@"
}

# Bad input for every function of the extension, found in the catalog
# (tests/hostile/test_matrix.py): the generated matrix, whose table must be
# the one in docs/reliability.md (on 15, where the docs' table comes from),
# then 5,000 random calls (the seed is printed; --seed N); no call may crash
# its backend, raise XX000, hang, or end in an undocumented SQLSTATE or in an
# error of pg_claim's without a hint, and the server log must show none
# either. --update-doc docs/reliability.md rewrites the table.
hostile() {
    local check=()
    [ "$PGC_PG_MAJOR" != 15 ] || check=(--check-doc docs/reliability.md)
    pytests tests/hostile/test_matrix.py -- --calls 5000 "${check[@]}" "$@"
}

# plant: the installing owner plants look-alikes of every function in every
# schema it can create in (tests/hostile/test_plant.py). security: other roles
# attack leases, names, grants and tables (tests/security/, each promise of
# docs/security.md); test names: words of test names (or -k EXPR).
plant() { pytests tests/hostile/test_plant.py -- "$@"; }
security() { pytests tests/security -- "$@"; }

# The portable edition (docs/portable.md): the file of scripts/portable
# installed by a database owner that is not a superuser, on a server of a
# copy of the PostgreSQL installation without pg_claim's files; its mappings
# compared with the extension's on the test cluster, its claims, leases,
# failures, my_items and notify_slot against real sessions, other roles and
# planted look-alikes (tests/portable/test_portable.py); every mapping on every
# hashable key type against the extension's and the partition the server
# routes a row to, in plain and parallel plans (tests/portable/test_mappings.py);
# the file run over earlier builds (tests/portable/test_upgrade.py); the
# bad-input matrix and a random caller of tests/hostile/test_matrix.py on its
# functions; the promises
# of docs/security.md that apply to it (tests/security/ with
# PGC_SECURITY_PORTABLE); then the pg_regress tests and isolation specs that
# apply to it (tests/portable/test_regress.py: one test each, its work
# directory left in $PGC_WORK/portable-regress-N). Test names: words of the
# pytest tests' names (a pg_regress test's or spec's name among them). A
# subshell: the test cluster stays for the next layers.
portable_edition() (
    PGC_CLUSTERS=()
    trap pgc_cleanup EXIT
    local ext_host="$PGHOST" ext_port="$PGPORT" sql inst="$PGC_WORK/inst-portable-$PGC_PG_MAJOR"
    sql=$(python3 scripts/portable --out "$PGC_WORK/portable" | sed -n 1p) || return 1
    chmod -R a+rX "$PGC_WORK/portable"
    [ -x "$inst$PGC_PG_LIB/bin/postgres" ] || pgc_copy_installation "$inst"
    rm -f "$inst$PGC_PG_SHARE"/extension/pg_claim* "$inst$PGC_PG_PKGLIB"/pg_claim.so
    chmod -R a+rX "$inst"
    PGC_BIN="$inst$PGC_PG_LIB/bin"
    pgc_cluster_start "portable-$PGC_PG_MAJOR" 2>/dev/null
    # in one pytest run: the edition against the extension (test_portable.py); every mapping
    # of both editions against each other and the partition routing, plain and parallel
    # (test_mappings.py); the file over each earlier build kept in tests/portable/releases/:
    # the catalog of a fresh install (test_upgrade.py); its public functions against the
    # hostile matrix and a random caller; the promises of docs/security.md that apply to it;
    # the pg_regress tests of tests/portable/regress.txt and the isolation specs of
    # isolation.txt through pg_regress and pg_isolation_regress (test_regress.py)
    PGC_EXT_HOST="$ext_host" PGC_EXT_PORT="$ext_port" PGC_PORTABLE_SQL="$sql" \
        PGC_HOSTILE_PORTABLE="$sql" PGC_SECURITY_PORTABLE="$sql" PGC_BIN="$PGC_BIN" \
        PGC_PG_REGRESS="$PGC_PGXS/src/test/regress/pg_regress" \
        PGC_PORTABLE_REGRESS_DIR="$PGC_WORK/portable-regress-$PGC_PG_MAJOR" pytests \
        tests/portable/test_portable.py tests/portable/test_mappings.py tests/portable/test_upgrade.py \
        tests/hostile/test_matrix.py tests/security tests/portable/test_regress.py -- \
        --server-log "$PGC_WORK/pg/server-portable-$PGC_PG_MAJOR.log" --calls 3000 "$@"
)

# The demo end to end on a smaller table: workers, standbys, a killed worker,
# the takeover and the exactly-once check of the processing log (it exits
# non-zero when any item was processed twice or not at all).
demo_e2e() {
    cargo test -p pg_claim_support -p pg_claim_demo -p pg_claim_bench --profile tools &&
        cargo build --profile tools --quiet -p pg_claim_demo --bin pg_claim_demo &&
        PGDATABASE=postgres target/tools/pg_claim_demo --items 40000 </dev/null
}

# A fleet that cannot serve every slot (4 workers + 2 standbys, 8 slots): the
# demo shows the unserved slots from slot_status and fails (after demo_e2e,
# which builds it).
demo_gap() {
    local out
    if out=$(PGDATABASE=postgres target/tools/pg_claim_demo --items 8000 --slots 8 --no-kill </dev/null); then
        echo "demo: 6 sessions for 8 slots passed instead of failing" >&2
        return 1
    fi
    grep -q "UNSERVED  slot_status('demo', 8) shows slots \[6, 7\]" <<<"$out" ||
        { echo "demo: no UNSERVED line for slots 6 and 7:" >&2; echo "$out" >&2; return 1; }
}

# The lease demo through PgBouncer in transaction mode (scripts/demo
# --pooler): 3 workers share 8 slots with
# claim_leases by remaining work (at least one slot given back on a weight
# report), a fourth joins, one pauses past its TTL and its late write is
# rejected, one leaves with max => 0; every item exactly once.
demo_pooler() {
    local out rc=0 want missing=
    cargo build --profile tools --quiet -p pg_claim_demo --bin pg_claim_demo || return 1
    pgc_pgbouncer_start 3 || return 1
    out=$(PGDATABASE=postgres target/tools/pg_claim_demo --leases --items 40000 \
        --worker-dsn "host=127.0.0.1 port=$PGC_POOLER_PORT user=postgres dbname=postgres" </dev/null) || rc=$?
    printf '%s\n' "$out" | grep -vE '^\[ *[0-9.]+s\] +(slot|progress)' | tail -30
    for want in "JOIN worker-3" "LEAVE worker-" "REJECTED worker-" "live leases after max => 0 +0" \
        "wanted by a holder with less work \(report_backlog\): [1-9]" "VERDICT: PASS"; do
        grep -qE "$want" <<<"$out" || { missing="$want"; break; }
    done
    if ((rc != 0)) || [ -n "$missing" ]; then
        # the whole run, events and shares included, for the failure's cause
        { echo "demo --pooler: exit $rc${missing:+, no line matching '$missing'}; its whole output:"
          printf '%s\n' "$out"; } >&2
        return 1
    fi
}

# Native sharding (docs/scale-out.md): the test cluster as the coordinator of
# two shard servers started from the same installation, a hash-partitioned
# table whose partitions are postgres_fdw foreign tables (and one local), a
# fleet with a killed worker, exactly once. PostgreSQL 16's installation has
# no postgres_fdw: the layer says so and passes.
shards_fdw() {
    if [ ! -f "$PGC_INST$PGC_PG_SHARE/extension/postgres_fdw.control" ]; then
        echo "shards: skipped, PostgreSQL $PGC_PG_MAJOR's installation has no postgres_fdw"
        return "$PGC_SKIPPED"
    fi
    (
        # the shard servers only: the test cluster stays for the next layers
        PGC_CLUSTERS=()
        trap pgc_cleanup EXIT
        coord="$PGPORT" ports=()
        for s in a b; do
            pgc_cluster_start "shard-$s-$PGC_PG_MAJOR" 2>/dev/null
            ports+=("$PGPORT")
        done
        PGPORT="$coord" PGC_SHARD_PORTS="${ports[*]}" pytests tests/shards -- "$@"
    )
}

# Citus (docs/scale-out.md): a coordinator and two worker nodes with Citus
# preloaded, a table distributed so that each slot's share is one shard,
# router queries, claims on the coordinator, exactly once. Runs where
# Citus is installed (pgc_citus_dir in scripts/lib.sh, PostgreSQL 15); says
# so otherwise.
citus_layer() {
    if ! pgc_citus_installed; then
        echo "citus: skipped, Citus is not installed for PostgreSQL $PGC_PG_MAJOR (expected in $(pgc_citus_dir), see docs/scale-out.md)"
        return "$PGC_SKIPPED"
    fi
    (
        PGC_CLUSTERS=()
        trap pgc_cleanup EXIT
        pgc_citus_start "citus-coordinator" "citus-worker-1" "citus-worker-2"
        PGPORT="${PGC_CITUS_PORTS[0]}" PGC_CITUS_WORKERS="${PGC_CITUS_PORTS[*]:1}" pytests tests/citus -- "$@"
    )
}

# The fault fleet (tests/faults/test_faults.py) on a cluster of its own,
# which it stops, kills, fails over to a promoted replica and cuts off behind
# a silent partition; test names: the faults (cancels, lock-table,
# partition, restart, backend-kill, sigstop, failover). soak: the same fleet
# under random faults for two minutes (tests/faults/test_soak.py). A
# subshell, so that the cluster of the other layers stays as it is.
faults() { fault_fleet test_faults.py "$@"; }
soak() { fault_fleet test_soak.py --soak 2 "$@"; }
fault_fleet() (
    local module="$1"
    shift
    PGC_CLUSTERS=() PGC_POOLERS=()
    trap pgc_cleanup EXIT
    pgc_faults_cluster_start "faults-$PGC_PG_MAJOR"
    pytests "tests/faults/$module" -- -s "$@"
)


dump_across() {
    pgc_use_pg 15
    pgc_cluster_start dump-from-15 2>/dev/null
    local from_port="$PGPORT" from_bin="$PGC_BIN" rc=0
    pgc_use_pg 18
    pgc_cluster_start dump-into-18 2>/dev/null
    PGC_DUMP_FROM_PORT="$from_port" PGC_DUMP_FROM_BIN="$from_bin" PGC_BIN="$PGC_BIN" tests/dump/run.sh || rc=$?
    pgc_cleanup
    return $rc
}

# Errors with RUST_BACKTRACE in the server's environment (tests/backtrace):
# a cluster of its own, which the test restarts with it set (the clusters of
# pgc_cluster_start run without it).
backtrace() (
    PGC_CLUSTERS=()
    trap pgc_cleanup EXIT
    pgc_cluster_start "backtrace-$PGC_PG_MAJOR"
    PGC_BIN="$PGC_BIN" tests/backtrace/run.sh "$PGC_WORK/pg/data-backtrace-$PGC_PG_MAJOR"
)

# ALTER EXTENSION pg_claim UPDATE from the given earlier releases (default:
# every one whose install script is kept), against a fresh install of
# this version (tests/upgrade/releases).
upgrades() {
    local v versions=("$@")
    if ((!${#versions[@]})); then
        mapfile -t versions < <(ls tests/upgrade/releases | sed -n 's/^pg_claim--\([0-9.]*\)\.sql$/\1/p' | sort -V)
    fi
    for v in "${versions[@]}"; do
        pgc_log "upgrade from $v"
        tests/upgrade/run.sh "$v" || return 1
    done
}

# The first PostgreSQL version's fmt check, whole-workspace clippy.
rustfmt_check() { cargo fmt --all -- --check; }
