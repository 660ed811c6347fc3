#!/usr/bin/env bash
# The cost of notify_slot per row (docs/wake.md): a 30,000-row INSERT
# (ids 1 .. 30,000, n = 8) into an outbox table with
#   - no trigger,
#   - a hand-written PL/pgSQL trigger:
#       PERFORM pg_notify('pg_claim_mailer_' || slot_of(NEW.id, 8), '');
#   - notify_slot('mailer', '8', 'id'),
# each case in its own committed transaction (the notifications are sent at
# commit), the three interleaved, BENCH_ROUNDS rounds (default 9); the
# median per case and notify_slot's ratio to the hand-written trigger.
# Target: within 1.5x of the hand-written trigger.
source "$(dirname "$0")/lib.sh"
ROUNDS="${BENCH_ROUNDS:-9}"
ROWS=30000

bench_setup <<'SQL'
DROP TABLE IF EXISTS bench.nc_none, bench.nc_hand, bench.nc_notify;
CREATE TABLE bench.nc_none (
    id bigint PRIMARY KEY,
    recipient text NOT NULL,
    body text NOT NULL,
    sent_at timestamptz);
CREATE TABLE bench.nc_hand (LIKE bench.nc_none INCLUDING ALL);
CREATE TABLE bench.nc_notify (LIKE bench.nc_none INCLUDING ALL);
CREATE OR REPLACE FUNCTION bench.nc_hand_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pg_claim_mailer_' || slot_of(NEW.id, 8), '');
    RETURN NEW;
END $$;
CREATE TRIGGER wake AFTER INSERT ON bench.nc_hand
FOR EACH ROW EXECUTE FUNCTION bench.nc_hand_wake();
CREATE TRIGGER wake AFTER INSERT ON bench.nc_notify
FOR EACH ROW EXECUTE FUNCTION notify_slot('mailer', '8', 'id');
SQL

# one psql session: per round and case, TRUNCATE, then the timed INSERT as
# its own transaction (\timing reports the INSERT's round trip)
{
    echo '\timing on'
    for r in $(seq 0 "$ROUNDS"); do
        for t in none hand notify; do
            echo "TRUNCATE bench.nc_$t;"
            echo "\\echo case $t round $r"
            echo "INSERT INTO bench.nc_$t SELECT g, 'x@example.com', 'hello' FROM generate_series(1, $ROWS) g;"
        done
    done
} | bench_psql >"$BENCH_TMP/out"

# round 0 warms up and is left out
python3 - "$BENCH_TMP/out" "$ROWS" "$ROUNDS" <<'PY'
import re, statistics, sys
times = {"none": [], "hand": [], "notify": []}
case = None
for line in open(sys.argv[1]):
    m = re.match(r"case (\w+) round (\d+)", line)
    if m:
        case = (m.group(1), int(m.group(2)))
        continue
    m = re.match(r"Time: ([\d.]+) ms", line)
    if m and case:
        # the first time after the marker is the INSERT's
        if case[1] > 0:
            times[case[0]].append(float(m.group(1)))
        case = None
med = {k: statistics.median(v) for k, v in times.items()}
rows, rounds = int(sys.argv[2]), int(sys.argv[3])
print(f"notify_slot cost, {rows:,}-row INSERT, n = 8, median of {rounds} rounds:")
print(f"  no trigger           {med['none']:8.1f} ms")
print(f"  hand-written trigger {med['hand']:8.1f} ms  ({med['hand'] / med['none']:.2f}x no trigger)")
print(f"  notify_slot          {med['notify']:8.1f} ms  ({med['notify'] / med['none']:.2f}x no trigger, "
      f"{med['notify'] / med['hand']:.2f}x the hand-written trigger; target <= 1.5x)")
PY
