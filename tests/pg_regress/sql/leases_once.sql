-- The fenced statement's natural form, `... WHERE <share> AND
-- lease_valid(name, slot, token)`: lease_valid is STABLE, so with constant
-- arguments or parameters the plan evaluates it once, before the first row
-- (a One-Time Filter), whatever the number of rows; a stale token writes no
-- row, in every isolation level, with a custom or a generic plan.
-- (docs/leases.md, "lease_valid"; the races: tests/isolation/specs/leases_fleet.spec.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;
CREATE TABLE lo_items (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
INSERT INTO lo_items (id) SELECT g FROM generate_series(1, 1000) g;
SELECT slot, token AS tok FROM claim_lease('lo', 2, 'w', '1 hour') \gset
-- the stale token: one before the current one
SELECT :tok - 1 AS stale \gset

EXPLAIN (COSTS OFF)
UPDATE lo_items SET done = true WHERE slot_of(id, 2) = 0 AND lease_valid('lo', 0, 42);

BEGIN ISOLATION LEVEL READ COMMITTED;
UPDATE lo_items SET done = true WHERE slot_of(id, 2) = :slot AND lease_valid('lo', :slot, :stale);
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
UPDATE lo_items SET done = true WHERE slot_of(id, 2) = :slot AND lease_valid('lo', :slot, :stale);
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
UPDATE lo_items SET done = true WHERE slot_of(id, 2) = :slot AND lease_valid('lo', :slot, :stale);
COMMIT;
SELECT count(*) FILTER (WHERE done) AS written_with_stale_token FROM lo_items;

-- a generic plan with the token as a parameter
SET plan_cache_mode = force_generic_plan;
PREPARE lo_write(integer, bigint) AS
    UPDATE lo_items SET done = true WHERE slot_of(id, 2) = $1 AND lease_valid('lo', $1, $2);
EXPLAIN (COSTS OFF) EXECUTE lo_write(0, 42);
EXECUTE lo_write(:slot, :stale);
SELECT count(*) FILTER (WHERE done) AS written_with_stale_token FROM lo_items;
EXECUTE lo_write(:slot, :tok);
SELECT count(*) FILTER (WHERE done) AS written, count(*) FILTER (WHERE slot_of(id, 2) = :slot) AS share
FROM lo_items;
RESET plan_cache_mode;

-- an expired lease's token writes nothing either
SELECT slot AS s2, token AS tok2 FROM claim_lease('lo', 2, 'brief', '10 milliseconds') \gset
SELECT pg_sleep(0.05);
UPDATE lo_items SET done = true WHERE slot_of(id, 2) = :s2 AND lease_valid('lo', :s2, :tok2);
SELECT count(*) FILTER (WHERE done AND slot_of(id, 2) = :s2) AS written_with_expired_token FROM lo_items;

-- A check of a slot the session does not know reads the rows of the slots
-- around it (256 on either side) and remembers them: behind a transaction
-- pooler one server connection checks many workers' slots in turn. 600
-- slots checked in one transaction take three reads of the primary key;
-- a stale token is still refused, each one after a read of its slot's row.
CREATE TEMP TABLE lo_tokens AS SELECT slot, token FROM claim_leases('lo_many', 600, 'worker', 600, '1 hour');
SELECT count(*) AS claimed FROM lo_tokens;
-- (the counter also holds this session's reads not yet reported: the
-- reads are the differences within one transaction)
BEGIN;
SELECT pg_stat_get_xact_numscans('pg_claim_leases_pkey'::regclass) AS r0 \gset
SELECT count(*) FILTER (WHERE lease_valid('lo_many', slot, token)) AS passed,
       pg_stat_get_xact_numscans('pg_claim_leases_pkey'::regclass) - :r0 AS reads
FROM lo_tokens;
SELECT pg_stat_get_xact_numscans('pg_claim_leases_pkey'::regclass) AS r1 \gset
SELECT count(*) FILTER (WHERE lease_valid('lo_many', slot, token - 1)) AS stale_passed,
       pg_stat_get_xact_numscans('pg_claim_leases_pkey'::regclass) - :r1 AS reads
FROM lo_tokens;
COMMIT;
