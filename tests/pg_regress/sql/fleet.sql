-- Fleets smaller than n, in one session: claim_slots takes its own slot and
-- the unserved ones up to max, my_slots lists them, slot_status shows every
-- slot in both modes (session claims, live and expired leases), bad input.
-- (Several sessions: sessions/tests/claim_slots.rs.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

SELECT p.oid::regprocedure AS function, provolatile, proparallel, proisstrict, prosecdef
FROM pg_proc p WHERE proname IN ('claim_slots', 'my_slots', 'slot_status')
ORDER BY p.oid::regprocedure::text;

-- Alone: the own slot and the unserved ones up to max.
SELECT claim_slots('fs', 6, 4) AS held, my_slot('fs') AS own, my_slots('fs') AS all_held;
SELECT slot, state, holder = 'pid ' || pg_backend_pid() AS me, token, since IS NOT NULL AS since_known
FROM slot_status('fs', 6);
-- again: the same; a larger max takes more; a smaller one gives the highest back
SELECT claim_slots('fs', 6, 4) AS same, claim_slots('fs', 6, 6) AS more, claim_slots('fs', 6, 2) AS fewer;
SELECT count(*) AS slot_locks FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND pid = pg_backend_pid()
  AND classid = crc32('fs')::oid AND mode = 'ExclusiveLock';
-- claim_slot and claim_slots agree: the own slot, the n check
SELECT claim_slot('fs', 6) AS own_again;
SELECT pc_try($$SELECT claim_slots('fs', 5, 2)$$) AS other_n;
-- my_token records the own slot: slot_status shows its token and since
SELECT my_token('fs') > 0 AS token_recorded;
SELECT slot, state, token = my_token('fs') AS my_token_shown,
       since = (SELECT acquired_at FROM lease_holders('fs') WHERE slot = 0) AS since_from_record
FROM slot_status('fs', 6) WHERE slot = 0;
SELECT release_slot('fs') AS released, my_slots('fs') AS none_left, my_slot('fs') AS no_own;
SELECT array_agg(state ORDER BY slot) AS all_unserved FROM slot_status('fs', 6);
SELECT my_slots('fs_never') AS never_claimed;

-- Leases: live, expired (unserved since its expiry, last holder shown), never leased.
SELECT slot FROM claim_lease('fs_lease', 3, 'w1', '1 hour');
SELECT slot FROM claim_lease('fs_lease', 3, 'w2', '1 millisecond');
SELECT pg_sleep(0.01);
SELECT slot, state, holder, token IS NOT NULL AS has_token,
       since = (SELECT CASE WHEN state = 'lease' THEN acquired_at ELSE expires_at END
                FROM lease_holders('fs_lease') h WHERE h.slot = s.slot) AS since_right
FROM slot_status('fs_lease', 3) s;
-- a released lease: unserved since its release, its last holder shown
SELECT release_lease('fs_lease', 0, (SELECT token FROM lease_holders('fs_lease') WHERE slot = 0));
SELECT slot, state, holder, since IS NOT NULL AND since <= now() AS since_release
FROM slot_status('fs_lease', 3) WHERE slot = 0;

-- Bad input: SQLSTATE, message naming the value, hint.
SELECT pc_try($$SELECT claim_slots(NULL, 8, 8)$$) AS null_name;
SELECT pc_try($$SELECT claim_slots('fs', NULL, 8)$$) AS null_n;
SELECT pc_try($$SELECT claim_slots('fs', 8, NULL)$$) AS null_max;
SELECT pc_try($$SELECT claim_slots('fs', 0, 1)$$) AS zero_n;
SELECT pc_try($$SELECT claim_slots('fs', 8, 0)$$) AS zero_max;
SELECT pc_try($$SELECT claim_slots('fs', 8, 9)$$) AS max_over_n;
SELECT pc_try($$SELECT claim_slots('fs', 8, 8, NULL)$$) AS null_wait;
SELECT pc_try($$SELECT claim_slots('fs', 8, 8, '-1 s')$$) AS negative_wait;
SELECT my_slots(NULL) AS strict_my_slots;
SELECT pc_try($$SELECT * FROM slot_status(NULL, 8)$$) AS status_null_name;
SELECT pc_try($$SELECT * FROM slot_status('fs', NULL)$$) AS status_null_n;
SELECT pc_try($$SELECT * FROM slot_status('fs', 0)$$) AS status_zero_n;
SELECT pc_try($$SELECT * FROM slot_status('fs', 1048577)$$) AS status_huge_n;
SELECT count(*) AS nothing_held_after_bad_calls FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND pid = pg_backend_pid() AND classid = crc32('fs')::oid;
