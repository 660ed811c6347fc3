#!/usr/bin/env bash
# The Debian package of scripts/package --deb, as a user installs it:
#
#   tests/package/deb.sh [--pg 15|16|18]        (as root)
#
# Builds postgresql-N-pg-claim_VERSION_ARCH.deb and checks its control fields and
# its file list (the library, the control file, the install script and every
# upgrade script of sql/, the copyright and changelog). Then, where Debian's
# server package postgresql-N is installed or installable: installs the package
# with apt-get into the system PostgreSQL, which must hold no pg_claim before,
# verifies its files (dpkg -V), and on a throwaway cluster of the system's
# binaries runs CREATE EXTENSION pg_claim and a smoke test (a claim, a mapping,
# my_items, a lease), then ALTER EXTENSION pg_claim UPDATE from 0.1.0 through
# the upgrade scripts the package ships (0.5.0 is the first version packaged
# for Debian, so there is no earlier .deb to upgrade from: the 0.1.0 database
# is created from the frozen install script of tests/upgrade/releases, copied
# in for the CREATE and removed before the update), compared object by object
# with a fresh install. Finally apt-get purge, and no file of the package may
# be left. Elsewhere (Debian 12 packages only PostgreSQL 15) it says why it
# did not install, and is counted as skipped.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

N="$PGC_PG_MAJOR"
pkg="postgresql-$N-pg-claim"
syslib="/usr/lib/postgresql/$N/lib"
sysext="/usr/share/postgresql/$N/extension"
fail() { echo "deb: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "installs a package into the system: run as root"

out="$PGC_WORK/deb-$N"
log="$PGC_WORK/deb-$N.log"
rm -rf "$out"
mkdir -p "$out"
chmod 755 "$PGC_WORK" "$out"
deb=$("$PGC_ROOT/scripts/package" --pg "$N" --deb --out "$out" 2>"$log" | tail -1) ||
    { cat "$log" >&2; fail "scripts/package --deb failed"; }
version=$(sed -n 's/^version *= *"\(.*\)"$/\1/p' "$PGC_ROOT/Cargo.toml" | head -1)
arch=$(dpkg --print-architecture)
[ "$(basename "$deb")" = "${pkg}_${version}_$arch.deb" ] || fail "unexpected file name $deb"

# the control fields and the file list
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = "$pkg" ] && [ "$(field Version)" = "$version" ] && [ "$(field Section)" = database ] ||
    fail "control fields: $(dpkg-deb -f "$deb" Package Version Section | tr '\n' ' ')"
[[ ", $(field Depends), " == *", postgresql-$N, "* ]] || fail "Depends has no postgresql-$N: $(field Depends)"
expected=$( {
    echo "$syslib/pg_claim.so"
    echo "$sysext/pg_claim.control"
    echo "$sysext/pg_claim--$version.sql"
    for f in "$PGC_ROOT"/sql/pg_claim--*--*.sql; do echo "$sysext/$(basename "$f")"; done
    echo "/usr/share/doc/$pkg/changelog.Debian.gz"
    echo "/usr/share/doc/$pkg/copyright"
} | LC_ALL=C sort)
files=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $6 }' | LC_ALL=C sort)
[ "$files" = "$expected" ] || { diff <(echo "$expected") <(echo "$files") >&2; fail "the package's files differ from the expected list (above: < expected, > packaged)"; }
grep -q '^License: PostgreSQL$' <(dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/share/doc/$pkg/copyright") ||
    fail "the copyright file names no PostgreSQL License"

if ! dpkg -s "postgresql-$N" >/dev/null 2>&1 &&
    ! apt-cache policy "postgresql-$N" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    echo "deb: skipped the install: $(basename "$deb") built with its $(echo "$files" | wc -l) files and control fields checked, but Debian's server package postgresql-$N is neither installed nor in this machine's apt sources"
    rm -rf "$out" "$log"
    exit "${PGC_SKIPPED:-77}"
fi

# The system installation is shared with the #[pg_test] layer (scripts/layers.sh):
# one at a time on this machine.
exec 9>/tmp/pg_claim-system-install.lock
flock 9
# pg_claim's files in the system PostgreSQL N
system_files() { ls -d "$syslib"/pg_claim* "$sysext"/pg_claim* 2>/dev/null || true; }
if dpkg -s "$pkg" >/dev/null 2>&1 || [ -n "$(system_files)" ]; then
    echo "deb: the system PostgreSQL $N already has pg_claim:" >&2
    system_files >&2
    dpkg -s "$pkg" 2>/dev/null | grep -E '^(Status|Version):' >&2 || true
    fail "remove it first (apt-get purge $pkg, or delete the files listed), then run again"
fi
old_script="$sysext/pg_claim--0.1.0.sql"
installed=0
cleanup() {
    pgc_cleanup
    rm -f "$old_script"
    if ((installed)) && dpkg -s "$pkg" >/dev/null 2>&1; then
        echo "deb: removing $pkg after a failure" >&2
        apt-get purge -y -q -o DPkg::Lock::Timeout=120 "$pkg" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT
apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=120 "$@" >"$log" 2>&1 || { cat "$log" >&2; fail "apt-get $* failed"; }; }

installed=1
apt_get install "$deb"
dpkg -s "$pkg" | grep -q '^Status: install ok installed' || fail "$pkg is not installed after apt-get install"
bad=$(dpkg -V "$pkg") || true
[ -z "$bad" ] || fail "dpkg -V $pkg: $bad"
mapfile -t paths < <(dpkg -L "$pkg")

# a throwaway cluster of the system's binaries
PGC_BIN="/usr/lib/postgresql/$N/bin"
pgc_cluster_start "deb-$N" 2>/dev/null
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
got=$(q -d postgres <<'SQL'
CREATE EXTENSION pg_claim;
SELECT extversion FROM pg_extension WHERE extname = 'pg_claim';
SELECT claim_slot('deb', 4, '0 s');
SELECT my_slot('deb');
SELECT slot_of('user1@example.com', 8);
CREATE TABLE deb_items (id bigint PRIMARY KEY, payload text);
INSERT INTO deb_items SELECT g, 'item ' || g FROM generate_series(1, 100) g;
SELECT count(*), min(id), max(id) FROM my_items(NULL::deb_items, 3, 8, batch => 1000);
SELECT slot, lease_valid('deb_lease', slot, token) FROM claim_lease('deb_lease', 4, 'holder-1');
SQL
)
# slot_of: zlib's CRC-32 of the text mod 8; ids 3, 11, ..., 99 in slot 3
want=$(printf '%s\n' "$version" 0 0 "$(python3 -c 'import zlib; print(zlib.crc32(b"user1@example.com") % 8)')" "13|3|99" "0|t")
[ "$got" = "$want" ] || fail "unexpected smoke test results:
$got
expected:
$want"

# ALTER EXTENSION UPDATE from 0.1.0 through the shipped upgrade scripts
cp "$PGC_ROOT/tests/upgrade/releases/pg_claim--0.1.0.sql" "$old_script"
chmod 644 "$old_script"
for db in deb_up deb_fresh; do q -d postgres -c "CREATE DATABASE $db"; done
q -d deb_up -c "CREATE EXTENSION pg_claim VERSION '0.1.0'"
rm -f "$old_script"
q -d deb_up -c "ALTER EXTENSION pg_claim UPDATE"
up=$(q -d deb_up -c "SELECT extversion FROM pg_extension WHERE extname = 'pg_claim'")
[ "$up" = "$version" ] || fail "ALTER EXTENSION pg_claim UPDATE from 0.1.0 gave $up, not $version"
q -d deb_fresh -c "CREATE EXTENSION pg_claim"
q -d deb_up -f "$PGC_ROOT/tests/upgrade/catalog.sql" >"$out/up.catalog"
q -d deb_fresh -f "$PGC_ROOT/tests/upgrade/catalog.sql" >"$out/fresh.catalog"
diff -u "$out/fresh.catalog" "$out/up.catalog" >&2 || fail "0.1.0 updated to $version differs from a fresh install (diff above)"
objects=$(wc -l <"$out/fresh.catalog")
pgc_cleanup

# removal leaves none of the package's files
apt_get purge "$pkg"
installed=0
! dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install' || fail "$pkg is still installed after apt-get purge"
left=()
for p in "${paths[@]}"; do
    [ -d "$p" ] && [ "$p" != "/usr/share/doc/$pkg" ] && continue
    [ ! -e "$p" ] || left+=("$p")
done
((${#left[@]} == 0)) || fail "left after apt-get purge: ${left[*]}"
[ -z "$(system_files)" ] || fail "pg_claim files left in the system PostgreSQL $N: $(system_files | tr '\n' ' ')"
rm -rf "$out" "$log"
echo "deb: $(basename "$deb") installed with apt-get into the system PostgreSQL $N (dpkg -V clean); CREATE EXTENSION gives $version, a claim, slot_of, my_items and a lease as expected; 0.1.0 updated through the shipped scripts equals a fresh install ($objects objects); purged, none of its ${#paths[@]} paths left"
