#!/usr/bin/env bash
# Waking a slot's worker on new work (docs/wake.md): insert -> processed
# latency p50 / p99 of a fleet that LISTENs on notify_slot's per-slot
# channels (fallback poll 30 s) against a fleet that polls every second, side
# by side on the same insert moments, and the queries each idle fleet sends
# per minute. The client is bench/wake.py (psycopg 3); knobs there.
source "$(dirname "$0")/lib.sh"
python3 -c 'import psycopg' 2>/dev/null || { source "$BENCH_ROOT/scripts/lib.sh"; pgc_ensure_clients; }

bench_setup <<'SQL'
DROP TABLE IF EXISTS bench.wake_notify, bench.wake_poll;
SELECT release_slot('bench_wake_notify'), release_slot('bench_wake_poll');
CREATE TABLE bench.wake_notify (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id bigint NOT NULL,
    recipient text NOT NULL,
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz);
CREATE TABLE bench.wake_poll (LIKE bench.wake_notify INCLUDING ALL);
CREATE INDEX ON bench.wake_notify ((slot_of(id, 8)), id) WHERE sent_at IS NULL;
CREATE INDEX ON bench.wake_poll ((slot_of(id, 8)), id) WHERE sent_at IS NULL;
CREATE TRIGGER wake AFTER INSERT ON bench.wake_notify
FOR EACH ROW EXECUTE FUNCTION notify_slot('bench_wake_notify', '8', 'id');
SQL
python3 "$BENCH_DIR/wake.py"
