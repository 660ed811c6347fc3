#!/usr/bin/env bash
# claim_leases by count and by weight, side by side: the time of one call of
# a random live holder of M holders (32 by default) of n = 1024 slots, on a
# direct connection, one client, a stable fleet (nothing changes hands).
# Two names laid out alike by the holders' own calls: bench_count, where no
# weight was ever reported (the count planner), and bench_weight, where
# every slot's holder reported its remaining work with report_backlog (the
# weighted planner, docs/leases.md "Balancing"). The weighted planner reads
# no item table: its cost does not depend on the pending rows.
#
# Knobs (environment): BENCH_HOLDERS (32), BENCH_PERCALL_SECONDS (2 per
# run, 3 runs).
source "$(dirname "$0")/lib.sh"

m="${BENCH_HOLDERS:-32}"
n=1024

bench_setup <<SQL
SET client_min_messages = warning;
DELETE FROM pg_claim_leases WHERE name IN ('bench_count', 'bench_weight');
DELETE FROM pg_claim_lease_members WHERE name IN ('bench_count', 'bench_weight');
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
trap 'bench_psql -c "DELETE FROM pg_claim_leases WHERE name IN ('"'bench_count', 'bench_weight'"'); DELETE FROM pg_claim_lease_members WHERE name IN ('"'bench_count', 'bench_weight'"')" >/dev/null; rm -rf "$BENCH_TMP"' EXIT

# cpu NAME: the server's CPU time per call (the backend's user + system
# time from /proc, over 500 calls of one connection), which a busy machine
# inflates less than the wall time
cpu() {
    python3 - "$1" "$m" "$n" <<'PY'
import os, sys, psycopg
name, m, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with psycopg.connect("dbname=postgres", autocommit=True) as c:
    pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
    def used():
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    q = f"SELECT count(*) FROM claim_leases('bench_{name}', {n}, %s, ttl => '1 hour')"
    c.execute(q, ("h1",))
    t0 = used()
    for i in range(500):
        c.execute(q, (f"h{1 + i % m}",))
    print(round((used() - t0) / 500 * 1e6))
PY
}

echo "claim_leases, one call of a random live holder of $m holders of $n slots (direct connection, one client: wall time the median of 3 runs of ${BENCH_PERCALL_SECONDS:-2} s; server CPU over 500 calls)"
printf '%-10s %12s %14s\n' planner "per call" "server CPU"
for name in count weight; do
    call=$(printf '%s\n' "\\set h random(1, $m)" \
        "SELECT count(*) FROM claim_leases('bench_$name', $n, 'h' || :h, ttl => '1 hour');")
    printf '%-10s %9s us %11s us\n' "$name" "$(bench_percall "$name" "$call")" "$(cpu "$name")"
done
