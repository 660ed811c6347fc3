-- Leases across changes of n, mixed modes, isolation levels and calendar
-- intervals: a holder holds at most one slot of a name and is never stuck
-- when n changes; records of sessions that no longer hold their slot and
-- expired leases block nothing; a name that a session holds with claim_slot
-- cannot be leased; REPEATABLE READ and SERIALIZABLE are refused at once
-- with 0A000; an interval that mixes months and days is judged by its real
-- length. (docs/leases.md; races: tests/isolation/specs/lease_modes.spec)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;
CREATE TABLE lm_got (who text, slot integer, token bigint);

-- n changes 4 -> 2 -> 4: each holder keeps one slot, every claim succeeds
SELECT w, (SELECT slot FROM claim_lease('lm_n', 4, w, '1 second')) AS slot
FROM unnest(ARRAY['h0', 'h1', 'h2', 'h3']) w;
SELECT pg_sleep(1.1);
SELECT w, (SELECT slot FROM claim_lease('lm_n', 2, w, '1 second')) AS slot
FROM unnest(ARRAY['h3', 'h2']) w;
SELECT pg_sleep(1.1);
SELECT w, (SELECT slot FROM claim_lease('lm_n', 4, w)) AS slot
FROM unnest(ARRAY['h3', 'h2', 'h1', 'h0']) w;
SELECT w, (SELECT slot FROM claim_lease('lm_n', 4, w)) AS again
FROM unnest(ARRAY['h3', 'h2', 'h1', 'h0']) w;
SELECT holder, count(*) AS slots FROM lease_holders('lm_n') GROUP BY holder ORDER BY holder;

-- claim_lease does not walk 0 .. n-1: a big n costs what a small one does
SELECT slot FROM claim_lease('lm_big', 1048576, 'b0');
SELECT slot FROM claim_lease('lm_big', 1048576, 'b1');

-- my_token's record of a session that released its slot blocks no lease
SELECT claim_slot('lm_s', 2) AS slot, my_token('lm_s') > 0 AS token;
SELECT release_slot('lm_s');
SELECT slot, holder FROM lease_holders('lm_s');
SELECT slot FROM claim_lease('lm_s', 2, 'lessee');
-- and an expired lease blocks no my_token
SELECT count(*) AS leased FROM claim_lease('lm_e', 1, 'brief', '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT claim_slot('lm_e', 1) AS slot, my_token('lm_e') > 0 AS token;
SELECT release_slot('lm_e');

-- a name a session holds with claim_slot cannot be leased, with or without
-- a my_token record; the internal check claim_slot makes sees live leases
SELECT claim_slot('lm_mix', 2) AS slot;
SELECT pc_try($$SELECT * FROM claim_lease('lm_mix', 2, 'lessee')$$) AS lease_a_claimed_name;
SELECT release_slot('lm_mix');
SELECT slot FROM claim_lease('lm_mix', 2, 'lessee');
SELECT pg_claim_leased('lm_mix') AS leased, pg_claim_leased('lm_nothing') AS nothing_leased;
-- claim_lease holds the name's mutex only for its statement, also when it
-- fails
SELECT count(*) AS mutex_held FROM pg_locks
WHERE locktype = 'advisory' AND objid = 269484034 AND pid = pg_backend_pid();
SELECT pc_try($$SELECT * FROM claim_lease('lm_mix', 3, 'other n')$$) AS other_n;
SELECT count(*) AS mutex_held_after_error FROM pg_locks
WHERE locktype = 'advisory' AND objid = 269484034 AND pid = pg_backend_pid();

-- REPEATABLE READ and SERIALIZABLE: refused at once with 0A000 by the
-- functions that write; fence and lease_valid work
INSERT INTO lm_got SELECT 'iso', slot, token FROM claim_lease('lm_iso', 1, 'iso');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ($$SELECT * FROM claim_lease('lm_iso', 1, 'iso')$$),
    ($$SELECT renew_lease('lm_iso', 0, 1)$$),
    ($$SELECT release_lease('lm_iso', 0, 1)$$)
) v(t);
SELECT fence('lm_iso', 0, (SELECT token FROM lm_got WHERE who = 'iso')),
       lease_valid('lm_iso', 0, (SELECT token FROM lm_got WHERE who = 'iso')) AS valid;
COMMIT;
SET default_transaction_isolation = 'serializable';
SELECT pc_try($$SELECT * FROM claim_lease('lm_iso', 1, 'iso')$$) AS autocommit_serializable;
SELECT claim_slot('lm_iso_s', 1) AS slot;
SELECT pc_try($$SELECT my_token('lm_iso_s')$$) AS my_token_writes;
RESET default_transaction_isolation;
SELECT my_token('lm_iso_s') > 0 AS recorded;
SET default_transaction_isolation = 'repeatable read';
SELECT my_token('lm_iso_s') > 0 AS reading_works;
RESET default_transaction_isolation;
SELECT release_slot('lm_iso_s');

-- intervals that mix months and days: judged by their real length from now
-- (the outcome depends on the calendar: shown as whether it matches)
SELECT ttl,
       pc_try(format('SELECT * FROM claim_lease(%L, 1, %L, %L)', 'lm_cal', 'c', ttl)) LIKE '22023:%'
         = (now() + ttl::interval <= now() OR now() + ttl::interval > now() + interval '1 day')
         AS judged_by_real_length
FROM unnest(ARRAY['-1 mon 31 days', '1 mon -29 days', '-1 mon 30 days 1 hour', '1 mon -30 days 1 hour']) ttl;
SELECT pc_try($$SELECT * FROM claim_lease('lm_cal', 1, 'c', '-1 mon 25 days')$$) AS negative;
SELECT pc_try($$SELECT renew_lease('lm_cal', 0, 1, '1 mon')$$) AS a_month;
DELETE FROM pg_claim_leases WHERE name = 'lm_cal';

DELETE FROM pg_claim_leases WHERE name LIKE 'lm%';
DROP TABLE lm_got;
