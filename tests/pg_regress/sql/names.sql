-- Names never share slots in silence: the name registry (docs/claiming.md,
-- "Names and lock keys") and one mode per name (claim_slot or claim_lease).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP ROLE IF EXISTS nm_worker;
RESET client_min_messages;
SELECT current_database() AS regress_db \gset

-- Two names with one crc32, i.e. one first lock key.
SELECT crc32('uablaijhsa') AS crc_a, crc32('pfcxpytzcn') AS crc_b;

-- The registry and its internal function are not for roles to touch.
SELECT p.oid::regprocedure AS internal_function, prosecdef,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_execute
FROM pg_proc p WHERE proname IN ('pg_claim_register_name', 'pg_claim_leased') ORDER BY p.proname;
SELECT has_table_privilege('public', 'pg_claim_names', 'SELECT') AS public_may_read;
-- and pg_dump keeps it
SELECT array(SELECT c::regclass::text FROM unnest(extconfig) c ORDER BY 1) AS dumped FROM pg_extension WHERE extname = 'pg_claim';

-- The first claim of a name registers it.
SELECT claim_slot('uablaijhsa', 4) AS fleet_a_slot;
SELECT name, key = (crc32(name)::bit(32))::integer AS key_is_crc32, first_claimed_at <= now() AS dated
FROM pg_claim_names WHERE name IN ('uablaijhsa', 'pfcxpytzcn');
-- The session that holds the name's slot gets the same 42710 for the
-- colliding name as any other session.
SELECT pc_try($$SELECT claim_slot('pfcxpytzcn', 4)$$) AS colliding_in_holding_session;
SELECT release_slot('uablaijhsa');

-- In another session, the colliding name is refused in every mode, with
-- both names in the message, and takes no lock.
\c :regress_db
SELECT pc_try($$SELECT claim_slot('pfcxpytzcn', 4)$$) AS claim_slot;
SELECT pc_try($$SELECT claim_slot('pfcxpytzcn', 4, '1 s')$$) AS claim_slot_wait;
SELECT pc_try($$SELECT claim_slots('pfcxpytzcn', 4, 2)$$) AS claim_slots;
SELECT pc_try($$SELECT claim_slots('pfcxpytzcn', 4, 2, '1 s')$$) AS claim_slots_wait;
SELECT pc_try($$SELECT group_join('pfcxpytzcn')$$) AS group_join;
SELECT pc_try($$SELECT claim_partitions('pfcxpytzcn', 8)$$) AS claim_partitions;
SELECT pc_try($$SELECT * FROM claim_lease('pfcxpytzcn', 4, 'h1')$$) AS claim_lease;
SELECT count(*) AS locks_taken FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid();
-- The first name still works, in every mode, in any session.
SELECT claim_slot('uablaijhsa', 4) AS fleet_a_slot;
SELECT group_join('uablaijhsa');
SELECT claim_partitions('uablaijhsa', 8) AS partitions;
-- The readers of the refused name never show the other fleet's sessions.
SELECT count(*) AS holders_of_a FROM slot_holders('uablaijhsa');
SELECT count(*) AS holders_shown FROM slot_holders('pfcxpytzcn');
SELECT slot, state, holder FROM slot_status('pfcxpytzcn', 4);
SELECT count(*) AS members_shown FROM group_members('pfcxpytzcn');
SELECT * FROM group_position('pfcxpytzcn');
SELECT group_leave('uablaijhsa'), release_slot('uablaijhsa');

-- A read-only transaction only checks: a new name is not registered, a
-- colliding one is still refused.
BEGIN READ ONLY;
SELECT claim_slot('nm_read_only', 2) AS read_only_claim;
SELECT pc_try($$SELECT claim_slot('pfcxpytzcn', 4)$$) AS read_only_collision;
COMMIT;
SELECT count(*) AS registered_read_only FROM pg_claim_names WHERE name = 'nm_read_only';
SELECT release_slot('nm_read_only');

-- A registration rolled back with its transaction while the session kept
-- its claim (a session-level lock) is made again by the next claim_slot.
BEGIN;
SELECT claim_slot('nm_rolled_back', 2) AS claimed_in_transaction;
ROLLBACK;
SELECT count(*) AS registered_after_rollback FROM pg_claim_names WHERE name = 'nm_rolled_back';
SELECT claim_slot('nm_rolled_back', 2) AS reclaim;
SELECT count(*) AS registered_after_reclaim FROM pg_claim_names WHERE name = 'nm_rolled_back';
SELECT release_slot('nm_rolled_back');

-- Roles may claim names without any privilege on the registry.
CREATE ROLE nm_worker;
SET ROLE nm_worker;
SELECT claim_slot('nm_by_worker', 2) AS worker_claim, release_slot('nm_by_worker');
SELECT pc_try($$SELECT public.pg_claim_register_name('x')$$) AS direct_call;
SELECT pc_try($$SELECT pg_claim_register_name('x'::text)$$) AS direct_call;
SELECT pc_try($$SELECT count(*) FROM pg_claim_names$$) AS read_registry;
RESET ROLE;
SELECT count(*) AS registered_by_worker FROM pg_claim_names WHERE name = 'nm_by_worker';

-- One mode per name. A live lease: claim_slot is refused and takes nothing.
SELECT slot FROM claim_lease('nm_leased', 2, 'nm-host:1:a', '1 minute');
SELECT pc_try($$SELECT claim_slot('nm_leased', 2)$$) AS claim_slot_of_leased;
SELECT pc_try($$SELECT claim_slots('nm_leased', 2, 2)$$) AS claim_slots_of_leased;
SELECT count(*) AS locks_taken FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND classid = crc32('nm_leased')::oid;
-- an expired lease blocks nothing
SELECT slot FROM claim_lease('nm_expired', 2, 'nm-host:1:a', '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT claim_slot('nm_expired', 2) AS claim_after_expiry, release_slot('nm_expired');
-- released, the name can be claimed with claim_slot
SELECT release_lease('nm_leased', slot, token)
FROM lease_holders('nm_leased');
SELECT claim_slot('nm_leased', 2) AS claim_after_release;
-- and while a session holds a slot, claim_lease is refused
SELECT pc_try($$SELECT * FROM claim_lease('nm_leased', 2, 'nm-host:2:b')$$) AS lease_of_claimed;
SELECT release_slot('nm_leased');

\c :regress_db
DROP ROLE nm_worker;
DELETE FROM pg_claim_names WHERE name LIKE 'nm\_%' OR name IN ('uablaijhsa', 'pfcxpytzcn');
