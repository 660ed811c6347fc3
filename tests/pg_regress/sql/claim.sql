SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- The claiming functions and their markings.
SELECT p.oid::regprocedure AS function, provolatile, proisstrict, proparallel
FROM pg_proc p
WHERE proname IN ('claim_slot', 'release_slot', 'my_slot', 'slot_holders')
ORDER BY p.oid::regprocedure::text;

-- Nothing held yet.
SELECT my_slot('rg_mailer') IS NULL AS holds_none;

-- The first claim of an empty name gets the lowest slot; a re-claim returns it again.
SELECT claim_slot('rg_mailer', 3) AS first_claim;
SELECT claim_slot('rg_mailer', 3) AS reclaim;
SELECT claim_slot('rg_mailer', 3, '10 s') AS reclaim_standby_form;
SELECT my_slot('rg_mailer');

-- Exactly three locks, never stacked, all keyed by crc32(name): the slot
-- (exclusive), the "claimers" lock 0x10000000 = 268435456 and the n record
-- 0x10000000 + 3 = 268435459 (both shared).
SELECT objid, objsubid, mode, granted
FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid()
  AND classid = crc32('rg_mailer')::oid
ORDER BY objid;

SELECT slot, pid = pg_backend_pid() AS is_me, application_name, state
FROM slot_holders('rg_mailer');

-- Claiming enables the dead-client check for this session.
SHOW client_connection_check_interval;

-- my_slot is STABLE, so an expression index on the slot serves a worker's share.
CREATE TABLE rg_claim_items (id int PRIMARY KEY);
INSERT INTO rg_claim_items SELECT g FROM generate_series(1, 300) g;
CREATE INDEX rg_claim_items_slot ON rg_claim_items (slot_of(id, 3));
ANALYZE rg_claim_items;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT id FROM rg_claim_items WHERE slot_of(id, 3) = my_slot('rg_mailer');
RESET enable_seqscan;
SELECT count(*) AS my_share, min(id), max(id)
FROM rg_claim_items WHERE slot_of(id, 3) = my_slot('rg_mailer');

-- Errors.
SELECT claim_slot('rg_mailer', 4);
SELECT claim_slot('rg_other', 0);
SELECT claim_slot('rg_other', -1, '1 s');
SELECT claim_slot('rg_other', 1048577);
SELECT claim_slot(NULL, 4);
SELECT claim_slot('rg_other', NULL);
SELECT claim_slot('rg_other', 4, NULL);
SELECT claim_slot('rg_other', 4, '-5 s');
-- None of the failed claims left a lock behind: only rg_mailer's three remain.
SELECT count(*) AS advisory_locks,
       count(*) FILTER (WHERE classid = crc32('rg_mailer')::oid) AS of_rg_mailer
FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid();

-- The readers are STRICT: NULL in, NULL out.
SELECT my_slot(NULL) IS NULL AS my_slot_null, release_slot(NULL) IS NULL AS release_null;
SELECT count(*) FROM slot_holders(NULL);

-- Release: true once, then false.
SELECT release_slot('rg_mailer') AS released, release_slot('rg_mailer') AS again,
       my_slot('rg_mailer') IS NULL AS holds_none;
SELECT count(*) FROM slot_holders('rg_mailer');

-- A rollback does not release a session-level claim.
BEGIN;
SELECT claim_slot('rg_tx', 2);
ROLLBACK;
SELECT my_slot('rg_tx') AS still_held_after_rollback;
SELECT release_slot('rg_tx');

-- The key layout is public: a slot locked with a plain two-int4 advisory lock
-- (key1 = crc32(name) as a signed int4, key2 = slot) counts as held.
SELECT pg_advisory_lock(
         (crc32('rg_raw') - CASE WHEN crc32('rg_raw') >= 2147483648 THEN 4294967296 ELSE 0 END)::int4,
         0);
SELECT claim_slot('rg_raw', 2) AS skips_slot_0;
SELECT release_slot('rg_raw');
SELECT claim_slot('rg_raw', 1) AS all_held;
SELECT claim_slot('rg_raw', 1, '50 ms') AS standby_timed_out;
SELECT pg_advisory_unlock_all();
SELECT claim_slot('rg_raw', 1) AS now_free;
SELECT release_slot('rg_raw');

DROP TABLE rg_claim_items;
