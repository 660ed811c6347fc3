#!/usr/bin/env bash
# The binary package of scripts/package, as a user installs it:
#
#   tests/package/run.sh [--pg 15|16|18]
#
# Builds the tarball, validates its META.json (tests/package/meta.py), runs its
# install.sh against a fresh private copy of the PostgreSQL installation (never
# the system one, which is checked to be unchanged), and on a throwaway cluster
# of that copy: CREATE EXTENSION pg_claim, the version, and a query. Also checks
# that install.sh refuses the pg_config of another PostgreSQL major version.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
trap pgc_cleanup EXIT

log="$PGC_WORK/package-$PGC_PG_MAJOR.log"
out="$PGC_WORK/package-$PGC_PG_MAJOR"
mkdir -p "$PGC_WORK"
rm -rf "$out"
tarball=$("$PGC_ROOT/scripts/package" --pg "$PGC_PG_MAJOR" --out "$out" 2>"$log" | tail -1) ||
    { cat "$log" >&2; exit 1; }
name=$(basename "$tarball" .tar.gz)
tar -C "$out" -xzf "$tarball"
python3 "$PGC_ROOT/tests/package/meta.py" "$PGC_ROOT/META.json" "$out/$name/extension/pg_claim.control"
cmp -s "$PGC_ROOT/META.json" "$out/$name/META.json" || { echo "package: META.json differs from the checkout's" >&2; exit 1; }

# the system installation unchanged while this runs: the layers that install
# into it (unit, deb) take this lock, one checkout at a time on a machine
exec 9>/tmp/pg_claim-system-install.lock
flock 9
system_before=$(pgc_system_files | xargs -r sha256sum)

# a fresh copy of the installation without pg_claim, and the package's
# install.sh given its pg_config
inst="$PGC_WORK/package-inst-$PGC_PG_MAJOR"
pgc_copy_installation "$inst"
rm -f "$inst$PGC_PG_SHARE"/extension/pg_claim* "$inst$PGC_PG_PKGLIB"/pg_claim.so
chmod 755 "$PGC_WORK"
major="$PGC_PG_MAJOR" other=15
[ "$major" != 15 ] || other=18
pgc_use_pg "$other"
if [ -x "$PGC_PG_CONFIG" ]; then
    if "$out/$name/install.sh" "$PGC_PG_CONFIG" >"$log" 2>&1; then
        echo "package: install.sh accepted the pg_config of PostgreSQL $other" >&2
        exit 1
    fi
    grep -q "built for PostgreSQL" "$log" || { cat "$log" >&2; exit 1; }
fi
pgc_use_pg "$major"
PGC_INST="$inst"
PGC_BIN="$inst$PGC_PG_LIB/bin"
"$out/$name/install.sh" "$PGC_BIN/pg_config" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
chmod -R a+rX "$inst"
cmp -s "$out/$name/lib/pg_claim.so" "$inst$PGC_PG_PKGLIB/pg_claim.so" || { echo "package: the library was not installed" >&2; exit 1; }

pgc_cluster_start "package-$PGC_PG_MAJOR" 2>/dev/null
version=$(sed -n 's/^version *= *"\(.*\)"$/\1/p' "$PGC_ROOT/Cargo.toml" | head -1)
got=$(psql -X -q -At -v ON_ERROR_STOP=1 -d postgres <<'SQL'
CREATE EXTENSION pg_claim;
SELECT extversion FROM pg_extension WHERE extname = 'pg_claim';
SELECT slot_of('user' || g || '@example.com', 8) FROM generate_series(1, 5) g ORDER BY g;
SQL
)
expected=$(printf '%s\n' "$version" "$(python3 -c 'import zlib
for g in range(1, 6): print(zlib.crc32(f"user{g}@example.com".encode()) % 8)')")
[ "$got" = "$expected" ] || { printf 'package: unexpected results:\n%s\nexpected:\n%s\n' "$got" "$expected" >&2; exit 1; }

system_after=$(pgc_system_files | xargs -r sha256sum)
[ "$system_before" = "$system_after" ] || { echo "package: the system PostgreSQL installation changed" >&2; exit 1; }
pgc_cleanup
rm -rf "$inst" "$out" "$log"
echo "package: $name.tar.gz installed with its install.sh into a private copy of PostgreSQL $PGC_PG_MAJOR; CREATE EXTENSION gives $version, slot_of agrees with zlib; install.sh refuses another major version"
