#!/usr/bin/env bash
# claim_leases by count and by weight, and the lease table's layout, side by
# side: the server's CPU time of one call of a random live holder of M
# holders (32 by default) of n = 1024 slots, on a direct connection, one
# client, a stable fleet (nothing changes hands).
#
# Two names laid out alike by the holders' own calls: bench_count, where no
# weight was ever reported (the count planner), and bench_weight, where
# every slot's holder reported its remaining work with report_backlog (the
# weighted planner, docs/leases.md "Balancing"). The weighted planner reads
# no item table: its cost does not depend on the pending rows.
#
# Each name twice: in the database postgres (this version's layout: no index
# on a lease's expiry, pages with room, so that a renewal is a HOT update:
# sql/leases_fleet.sql) and in the database bench_expiry, where the index on
# (name, expires_at) and the full pages of 0.5.0 are put back. Rounds of
# BENCH_PERCALL_CALLS calls (400) alternate between the two, in turn first;
# the figures are the medians of BENCH_PERCALL_ROUNDS rounds (6). Then a
# joiner's first call by weight, which marks slots of the heaviest holders
# (the mean over ten calls a round: /proc's CPU time ticks every 10 ms).
#
# Knobs (environment): BENCH_HOLDERS (32), BENCH_PERCALL_ROUNDS,
# BENCH_PERCALL_CALLS.
source "$(dirname "$0")/lib.sh"

m="${BENCH_HOLDERS:-32}"
n=1024

bench_psql -c "DROP DATABASE IF EXISTS bench_expiry" -c "CREATE DATABASE bench_expiry" >/dev/null 2>&1
fleet_sql() {
    cat <<SQL
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DELETE FROM pg_claim_leases WHERE name IN ('bench_count', 'bench_weight');
DELETE FROM pg_claim_lease_members WHERE name IN ('bench_count', 'bench_weight');
$1
DO \$\$ BEGIN
    FOR r IN 1 .. 3 LOOP
        FOR h IN 1 .. $m LOOP
            PERFORM count(*) FROM claim_leases('bench_count', $n, 'h' || h, ttl => '1 hour');
            PERFORM count(*) FROM claim_leases('bench_weight', $n, 'h' || h, ttl => '1 hour');
        END LOOP;
    END LOOP;
END \$\$;
-- uneven weights, so that the fleet is not balanced by count alone; a
-- fleet left as the holders' calls balance it by weight
SELECT count(report_backlog('bench_weight', slot, token, (slot * 7919) % 1000))
FROM lease_holders('bench_weight') WHERE NOT expired;
DO \$\$ BEGIN
    FOR r IN 1 .. 3 LOOP
        FOR h IN 1 .. $m LOOP
            PERFORM count(*) FROM claim_leases('bench_weight', $n, 'h' || h, ttl => '1 hour');
        END LOOP;
    END LOOP;
END \$\$;
VACUUM ANALYZE pg_claim_leases;
VACUUM ANALYZE pg_claim_lease_members;
SQL
}
fleet_sql "" | bench_psql >/dev/null
fleet_sql "CREATE INDEX pg_claim_leases_expiry ON pg_claim_leases (name, expires_at);
ALTER TABLE pg_claim_leases RESET (fillfactor);
ALTER TABLE pg_claim_lease_members RESET (fillfactor);" | psql -X -q -v ON_ERROR_STOP=1 -d bench_expiry >/dev/null
trap 'bench_psql -c "DELETE FROM pg_claim_leases WHERE name IN ('"'bench_count', 'bench_weight'"'); DELETE FROM pg_claim_lease_members WHERE name IN ('"'bench_count', 'bench_weight'"')" -c "DROP DATABASE IF EXISTS bench_expiry" >/dev/null; rm -rf "$BENCH_TMP"' EXIT

python3 - "$m" "$n" <<'PY'
import os, statistics, sys, time
import psycopg
m, n = int(sys.argv[1]), int(sys.argv[2])
rounds = int(os.environ.get("BENCH_PERCALL_ROUNDS", "6"))
calls = int(os.environ.get("BENCH_PERCALL_CALLS", "400"))
layouts = {"postgres": "no expiry index, fillfactor 50", "bench_expiry": "index on (name, expires_at)"}

def used(pid):
    """The backend's user + system CPU time so far, in seconds, from /proc
    (which a busy machine inflates less than the wall)."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def run(db, name):
    """(server CPU, wall) per call, in microseconds."""
    with psycopg.connect(dbname=db, autocommit=True) as c:
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        q = f"SELECT count(*) FROM claim_leases('{name}', {n}, %s, ttl => '1 hour')"
        c.execute(q, ("h1",))
        t0, w0 = used(pid), time.monotonic()
        for i in range(calls):
            c.execute(q, (f"h{1 + i % m}",))
        return (used(pid) - t0) / calls * 1e6, (time.monotonic() - w0) / calls * 1e6

res = {}
for r in range(rounds):
    for name in ("bench_count", "bench_weight"):
        for db in (list(layouts) if r % 2 == 0 else list(reversed(layouts))):
            res.setdefault((name, db), []).append(run(db, name))
print(f"claim_leases, one call of a random live holder of {m} holders of {n} slots (direct connection,"
      f" one client; medians of {rounds} alternating rounds of {calls} calls)")
print(f"{'planner':<8} {'layout':<32} {'server CPU':>12} {'wall':>10}")
for name in ("bench_count", "bench_weight"):
    for db, what in layouts.items():
        cpu = statistics.median(x for x, _ in res[(name, db)])
        wall = statistics.median(y for _, y in res[(name, db)])
        print(f"{name[6:]:<8} {what:<32} {cpu:9.0f} us {wall:7.0f} us")
    ratios = [a[0] / b[0] for a, b in zip(res[(name, "postgres")], res[(name, "bench_expiry")])]
    label = "ratio, this layout / 0.5.0's"
    print(f"{name[6:]:<8} {label:<32} {statistics.median(ratios):11.2f}x"
          f"   (rounds {min(ratios):.2f}x to {max(ratios):.2f}x)")

# a joiner's call by weight: it marks slots of the heaviest holders (one read
# of that holder's slots per mark); its marks and membership are undone
# after each call, so that every call is a joiner's first
with psycopg.connect(dbname="postgres", autocommit=True) as c:
    pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
    c.execute("UPDATE pg_claim_leases SET acquired_at = acquired_at - interval '1 minute' WHERE name = 'bench_weight'")
    cpu, marks = [], []
    for i in range(rounds * 10):
        t0 = used(pid)
        c.execute(f"SELECT count(*) FROM claim_leases('bench_weight', {n}, 'joiner', ttl => '1 hour')")
        cpu.append((used(pid) - t0) * 1e6)
        marks.append(c.execute("SELECT count(*) FROM pg_claim_leases WHERE name = 'bench_weight'"
                               " AND wanted_by = 'joiner'").fetchone()[0])
        c.execute("UPDATE pg_claim_leases SET wanted_by = NULL WHERE name = 'bench_weight' AND wanted_by = 'joiner'")
        c.execute("DELETE FROM pg_claim_lease_members WHERE name = 'bench_weight' AND holder = 'joiner'")
print(f"{'weight':<8} {'a joiner that marks':<32} {statistics.mean(cpu):9.0f} us"
      f"   ({statistics.median(marks):.0f} marks a call, mean of {len(cpu)} calls)")
PY
