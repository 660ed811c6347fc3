#!/usr/bin/env bash
# Dynamic groups: how much work moves when members join, leave or die, for
#   claim_partitions(name, 256) + slot_of(key, 256) = ANY(my_partitions(name))
#   group_position(name) + slot_of(key, members) = index
# measured side by side on the same live members (real sessions through dblink),
# plus the per-call latency of claim_partitions, my_partitions and group_position.
# A key "moves" when the member that processes it changes; 100000 integer keys.
source "$(dirname "$0")/lib.sh"
P="${BENCH_PARTITIONS:-256}"
MAXM="${BENCH_MEMBERS:-8}"
CALLS="${BENCH_CALLS:-2000}"
CONN="host=$PGHOST port=$PGPORT user=$PGUSER dbname=postgres"
out="$BENCH_TMP/groups"

bench_setup <<SQL
CREATE EXTENSION IF NOT EXISTS dblink;
DROP TABLE IF EXISTS bench.group_keys;
CREATE TABLE bench.group_keys AS SELECT g AS k FROM generate_series(1, 100000) g;

-- Who processes each key now, under each scheme.
CREATE OR REPLACE FUNCTION bench.group_owners(p int)
RETURNS TABLE (k int, by_partitions int, by_modulo int) LANGUAGE sql AS \$\$
  WITH locks AS (
         SELECT (objid::bigint - 805306368)::int AS part, pid FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND mode = 'ExclusiveLock'
           AND classid = crc32('bench_g')::oid AND objid::bigint >= 805306368),
       mem AS (SELECT index, pid FROM group_members('bench_g')),
       m AS (SELECT count(*)::int AS n FROM mem)
  SELECT b.k, l.pid, mm.pid
  FROM bench.group_keys b CROSS JOIN m
  LEFT JOIN locks l ON l.part = slot_of(b.k, p)
  LEFT JOIN mem mm ON m.n > 0 AND mm.index = slot_of(b.k, greatest(m.n, 1))
\$\$;

-- Every member calls claim_partitions once, in rank order.
CREATE OR REPLACE FUNCTION bench.group_round(conns text[], p int) RETURNS void
LANGUAGE plpgsql AS \$\$
DECLARE c text;
BEGIN
  FOREACH c IN ARRAY conns LOOP
    PERFORM * FROM dblink(c, format('SELECT claim_partitions(%L, %s)', 'bench_g', p)) AS t(x int[]);
  END LOOP;
END \$\$;

-- Two rounds of claim_partitions, then what changed since g_before.
CREATE OR REPLACE FUNCTION bench.group_settle(conns text[], p int)
RETURNS TABLE (partitions_moved int, keys_moved_claim float8, keys_moved_modulo float8, converged boolean)
LANGUAGE plpgsql AS \$\$
BEGIN
  PERFORM bench.group_round(conns, p);
  PERFORM bench.group_round(conns, p);
  TRUNCATE g_after; INSERT INTO g_after SELECT * FROM bench.group_owners(p);
  RETURN QUERY
    SELECT (count(DISTINCT slot_of(a.k, p)) FILTER (WHERE a.by_partitions IS DISTINCT FROM b.by_partitions))::int,
           avg((a.by_partitions IS DISTINCT FROM b.by_partitions)::int)::float8,
           avg((a.by_modulo IS DISTINCT FROM b.by_modulo)::int)::float8,
           bool_and(a.by_partitions IS NOT NULL)
      FROM g_before b JOIN g_after a USING (k);
END \$\$;

CREATE OR REPLACE FUNCTION bench.group_movement(conninfo text, p int, maxm int)
RETURNS TABLE (event text, m_before int, m_after int, partitions_moved int, bound int,
               keys_moved_claim float8, keys_moved_modulo float8, converged boolean)
LANGUAGE plpgsql AS \$\$
DECLARE
  conns text[] := '{}';
  i int;
  victim text;
  vpid int;
  n int;
BEGIN
  CREATE TEMP TABLE IF NOT EXISTS g_before (k int, by_partitions int, by_modulo int);
  CREATE TEMP TABLE IF NOT EXISTS g_after (k int, by_partitions int, by_modulo int);
  FOR i IN 1 .. maxm + 1 LOOP
    -- i = 1 .. maxm: joins; maxm + 1: a leave; then a kill (below)
    TRUNCATE g_before; INSERT INTO g_before SELECT * FROM bench.group_owners(p);
    m_before := cardinality(conns);
    IF i <= maxm THEN
      event := 'join';
      PERFORM dblink_connect('bm' || i, conninfo || ' application_name=bench_member_' || i);
      PERFORM * FROM dblink('bm' || i, 'SELECT 1 FROM group_join(''bench_g'')') AS t(x int);
      conns := conns || ('bm' || i);
    ELSE
      event := 'leave';
      victim := conns[2];
      PERFORM * FROM dblink(victim, 'SELECT group_leave(''bench_g'')') AS t(x bool);
      PERFORM dblink_disconnect(victim);
      conns := array_remove(conns, victim);
    END IF;
    SELECT * INTO partitions_moved, keys_moved_claim, keys_moved_modulo, converged
      FROM bench.group_settle(conns, p);
    m_after := cardinality(conns);
    IF m_before = 0 THEN CONTINUE; END IF;
    bound := CASE WHEN event = 'join' THEN ceil(p::numeric / m_after)::int
                  ELSE ceil(p::numeric / m_before)::int END;
    RETURN NEXT;
  END LOOP;
  -- a kill: terminate the member at index 3, wait until it is gone
  TRUNCATE g_before; INSERT INTO g_before SELECT * FROM bench.group_owners(p);
  m_before := cardinality(conns);
  victim := conns[3];
  SELECT x INTO vpid FROM dblink(victim, 'SELECT pg_backend_pid()') AS t(x int);
  PERFORM pg_terminate_backend(vpid, 5000);
  PERFORM dblink_disconnect(victim);
  conns := array_remove(conns, victim);
  LOOP
    SELECT members INTO n FROM group_position('bench_g');
    EXIT WHEN n = cardinality(conns);
    PERFORM pg_sleep(0.001);
  END LOOP;
  SELECT * INTO partitions_moved, keys_moved_claim, keys_moved_modulo, converged
    FROM bench.group_settle(conns, p);
  event := 'kill'; m_after := cardinality(conns);
  bound := ceil(p::numeric / m_before)::int;
  RETURN NEXT;
  FOREACH victim IN ARRAY conns LOOP PERFORM dblink_disconnect(victim); END LOOP;
END \$\$;

-- Per-call latency at steady state (this session is a converged member).
CREATE OR REPLACE FUNCTION bench.group_latency(p int, calls int)
RETURNS TABLE (fn text, us_per_call float8) LANGUAGE plpgsql AS \$\$
DECLARE t0 timestamptz; i int;
BEGIN
  fn := 'claim_partitions'; t0 := clock_timestamp();
  FOR i IN 1 .. calls LOOP PERFORM claim_partitions('bench_g', p); END LOOP;
  us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / calls; RETURN NEXT;
  fn := 'my_partitions'; t0 := clock_timestamp();
  FOR i IN 1 .. calls LOOP PERFORM my_partitions('bench_g'); END LOOP;
  us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / calls; RETURN NEXT;
  fn := 'group_position'; t0 := clock_timestamp();
  FOR i IN 1 .. calls LOOP PERFORM * FROM group_position('bench_g'); END LOOP;
  us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / calls; RETURN NEXT;
  fn := 'pg_try_advisory_xact_lock'; t0 := clock_timestamp();
  FOR i IN 1 .. calls LOOP PERFORM pg_try_advisory_xact_lock(1, 1); END LOOP;
  us_per_call := extract(epoch FROM clock_timestamp() - t0) * 1e6 / calls; RETURN NEXT;
END \$\$;
SQL

bench_psql -At -F '|' >"$out" <<SQL
SELECT 'move', * FROM bench.group_movement('$CONN', $P, $MAXM);
-- latency with 7 other live members holding their shares
SELECT 'join', group_join('bench_g');
SELECT 'conn', dblink_connect('lat' || g, '$CONN'), (SELECT x FROM dblink('lat' || g, 'SELECT 1 FROM group_join(''bench_g'')') AS t(x int))
FROM generate_series(1, 7) g;
SELECT 'round', bench.group_round(ARRAY(SELECT 'lat' || g FROM generate_series(1, 7) g), $P), claim_partitions('bench_g', $P);
SELECT 'round', bench.group_round(ARRAY(SELECT 'lat' || g FROM generate_series(1, 7) g), $P), claim_partitions('bench_g', $P);
SELECT 'lat', * FROM bench.group_latency($P, $CALLS);
SELECT 'members', members FROM group_position('bench_g');
SQL

bench_psql -c "DROP TABLE bench.group_keys" >/dev/null

python3 - "$out" "$P" "$CALLS" <<'PY'
import sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1]) if l.strip()]
P, calls = int(sys.argv[2]), int(sys.argv[3])
print(f"dynamic groups: work moved per membership change, P = {P} partitions, 100000 keys")
print(f"  {'event':6s} {'members':>9s} {'partitions moved':>17s} {'bound':>6s} "
      f"{'keys moved: claim_partitions':>29s} {'group_position+modulo':>22s}  converged")
join_c, join_m = [], []
for r in rows:
    if r[0] != "move":
        continue
    ev, mb, ma, pm, b, kc, km, conv = r[1:9]
    kc, km = float(kc), float(km)
    if ev == "join":
        join_c.append(kc); join_m.append(km)
    print(f"  {ev:6s} {mb:>4s} -> {ma:<3s} {pm:>17s} {b:>6s} {kc*100:28.1f}% {km*100:21.1f}%  {conv}")
lat = {r[1]: float(r[2]) for r in rows if r[0] == "lat"}
members = [r[1] for r in rows if r[0] == "members"]
print(f"per-call latency, {calls} calls, steady state with {members[0] if members else '?'} members, P = {P}:")
for k, v in lat.items():
    print(f"  {k:26s} {v:8.1f} us")
mc, mm = sum(join_c) / len(join_c), sum(join_m) / len(join_m)
print(f"ratio: keys moved per join, claim_partitions / group_position+modulo = {mc/mm:.2f}x  "
      f"({mc*100:.1f}% vs {mm*100:.1f}% of keys, mean over joins)")
print(f"ratio: claim_partitions call / group_position call = {lat['claim_partitions']/lat['group_position']:.2f}x")
PY
