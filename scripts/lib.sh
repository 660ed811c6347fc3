# Shared set-up for pg_claim's scripts (test, demo, bench). Source it; do not run it.
#
# Everything here is idempotent: on a fresh Debian 12 machine, as root, it installs
# what is missing (apt packages, cargo-pgrx 0.18.0, `cargo pgrx init` against the
# system PostgreSQL) and otherwise does nothing.
#
# The extension is never installed into the system PostgreSQL by these scripts
# (the `#[pg_test]` layer is the exception: cargo-pgrx installs its test build
# there). Instead, `pgc_build_install` assembles a private copy of the PostgreSQL
# installation under $PGC_WORK with the freshly built pg_claim overlaid; PostgreSQL
# finds its share and lib directories relative to its own binary, so servers
# started from that copy load this checkout's build and nothing else.

set -euo pipefail

PGC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The PostgreSQL major version, chosen here and nowhere else, and where
# Debian installs it.
PGC_PG_MAJOR="${PGC_PG_MAJOR:-15}"
PGC_PG_LIB="/usr/lib/postgresql/$PGC_PG_MAJOR"
PGC_PG_SHARE="/usr/share/postgresql/$PGC_PG_MAJOR"
PGC_PG_CONFIG="$PGC_PG_LIB/bin/pg_config"
PGC_PGXS="$PGC_PG_LIB/lib/pgxs"
PGC_FEATURE="pg$PGC_PG_MAJOR"
# What `cargo pgrx package` builds: the installation's paths under target/.
PGC_PKG="$PGC_ROOT/target/release/pg_claim-$PGC_FEATURE"
PGC_PGRX_VERSION=0.18.0
# One work area per checkout, outside the checkout so the unprivileged
# `postgres` user can read it whatever the checkout's permissions are.
PGC_ID="$(printf '%s' "$PGC_ROOT" | cksum | cut -d' ' -f1)"
PGC_WORK="${PGC_WORK:-/tmp/pg_claim-$PGC_ID}"
PGC_INST="$PGC_WORK/inst"
PGC_BIN="$PGC_INST$PGC_PG_LIB/bin"
PGC_SOCKDIR="$PGC_WORK/sock"
PGC_CLUSTERS=()

export PATH="$HOME/.cargo/bin:$PATH"

pgc_log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

pgc_as_postgres() { runuser -u postgres -- "$@"; }

pgc_ensure_deps() {
    local pkgs=("postgresql-$PGC_PG_MAJOR" "postgresql-server-dev-$PGC_PG_MAJOR" libclang-dev clang sudo
        "postgresql-$PGC_PG_MAJOR-pgq3")
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
    # Debian starts a default cluster on 5432 when postgresql-N is installed;
    # the scripts never use it, and leave it as they found it.
    if ! command -v cargo >/dev/null; then
        echo "pg_claim: cargo (Rust) is required; install it with rustup first" >&2
        exit 1
    fi
    if [ "$(cargo pgrx --version 2>/dev/null || true)" != "cargo-pgrx $PGC_PGRX_VERSION" ]; then
        pgc_log "installing cargo-pgrx $PGC_PGRX_VERSION (a few minutes, once)"
        cargo install cargo-pgrx --version "$PGC_PGRX_VERSION" --locked --force
    fi
    if ! grep -qs "^$PGC_FEATURE *= *\"$PGC_PG_CONFIG\"" "$HOME/.pgrx/config.toml"; then
        pgc_log "cargo pgrx init --$PGC_FEATURE $PGC_PG_CONFIG"
        cargo pgrx init "--$PGC_FEATURE" "$PGC_PG_CONFIG"
    fi
}

# Build the release extension and lay out the private installation.
pgc_build_install() {
    pgc_log "building pg_claim (release) and assembling a private PostgreSQL $PGC_PG_MAJOR installation"
    # a clean package: nothing left from a build of another version
    rm -rf "$PGC_PKG"
    (cd "$PGC_ROOT" && cargo pgrx package --pg-config "$PGC_PG_CONFIG" >/dev/null)
    mkdir -p "$PGC_WORK"
    chmod 755 "$PGC_WORK"
    if [ ! -x "$PGC_BIN/postgres" ]; then
        rm -rf "$PGC_INST.tmp"
        mkdir -p "$PGC_INST.tmp/usr/lib/postgresql" "$PGC_INST.tmp/usr/share/postgresql"
        cp -a "$PGC_PG_LIB" "$PGC_INST.tmp/usr/lib/postgresql/"
        cp -a "$PGC_PG_SHARE" "$PGC_INST.tmp/usr/share/postgresql/"
        rm -rf "$PGC_INST"
        mv "$PGC_INST.tmp" "$PGC_INST"
    fi
    rm -f "$PGC_INST$PGC_PG_SHARE"/extension/pg_claim*
    cp "$PGC_PKG$PGC_PG_SHARE"/extension/pg_claim* "$PGC_INST$PGC_PG_SHARE/extension/"
    # the frozen install scripts of released versions, for upgrade tests
    cp "$PGC_ROOT"/sql/pg_claim--*.sql "$PGC_INST$PGC_PG_SHARE/extension/"
    # a new file renamed into place: a backend that has the old library
    # loaded keeps its copy instead of seeing it rewritten under it
    cp "$PGC_PKG$PGC_PG_LIB"/lib/pg_claim.so "$PGC_INST$PGC_PG_LIB/lib/pg_claim.so.new"
    mv "$PGC_INST$PGC_PG_LIB/lib/pg_claim.so.new" "$PGC_INST$PGC_PG_LIB/lib/pg_claim.so"
    chmod -R a+rX "$PGC_INST"
}

# The files of pg_claim in the system PostgreSQL installation, if any.
pgc_system_files() {
    ls "$PGC_PG_SHARE"/extension/pg_claim* "$PGC_PG_LIB"/lib/pg_claim.so 2>/dev/null || true
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

pgc_cluster_stop_dir() {
    local data="$1"
    if [ -f "$data/postmaster.pid" ]; then
        pgc_as_postgres "$PGC_BIN/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
}

pgc_cleanup() {
    local d
    for d in "${PGC_CLUSTERS[@]}"; do
        pgc_cluster_stop_dir "$d"
        rm -rf "$d"
    done
    PGC_CLUSTERS=()
}
