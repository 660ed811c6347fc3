-- Bounds and failures half-way: a full shared lock table (53200) leaves no
-- claim half-made, one session cannot take more than
-- pg_claim.max_locks_per_session locks (53400), absurd waits and unknown oids
-- are clean errors, and the pg_claim.* prefix is reserved.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP ROLE IF EXISTS lm_worker;
RESET client_min_messages;


-- pg_claim's locks of a name held by this session
CREATE FUNCTION lm_locks(name text) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 2 AND pid = pg_backend_pid() AND classid = crc32(name)::oid
$$;

-- Fills the shared lock table with advisory locks (key1 = 7), then frees one
-- entry at a time and calls `stmt` after each, until it succeeds. After every
-- failure with out of shared memory (53200), `check` must be true: nothing
-- half-made. Returns the number of failures and whether every check held.
CREATE FUNCTION lm_fill_and_try(stmt text, check_after_failure text, check_after_success text,
                                OUT failures integer, OUT consistent boolean, OUT succeeded boolean)
LANGUAGE plpgsql AS $$
DECLARE
    filled integer := 0;
    ok boolean;
BEGIN
    failures := 0; consistent := true; succeeded := false;
    BEGIN
        LOOP
            PERFORM pg_advisory_lock(7, filled + 1);
            filled := filled + 1;
        END LOOP;
    EXCEPTION WHEN out_of_memory THEN NULL;
    END;
    WHILE filled > 0 LOOP
        BEGIN
            EXECUTE stmt;
            succeeded := true;
        EXCEPTION WHEN out_of_memory THEN
            failures := failures + 1;
        END;
        EXECUTE CASE WHEN succeeded THEN check_after_success ELSE check_after_failure END INTO ok;
        consistent := consistent AND ok;
        EXIT WHEN succeeded;
        PERFORM pg_advisory_unlock(7, filled);
        filled := filled - 1;
    END LOOP;
    WHILE filled > 0 LOOP
        PERFORM pg_advisory_unlock(7, filled);
        filled := filled - 1;
    END LOOP;
END $$;

-- claim_slot: after a failure the session holds none of the name's locks
-- and no slot; after the success, the slot and its two records.
SELECT failures > 0 AS failed_first, consistent, succeeded
FROM lm_fill_and_try($$SELECT claim_slot('lm_full', 2)$$,
    $$SELECT my_slot('lm_full') IS NULL AND lm_locks('lm_full') = 0$$,
    $$SELECT my_slot('lm_full') = 0 AND lm_locks('lm_full') = 3$$);
SELECT release_slot('lm_full') AS released, lm_locks('lm_full') AS locks_left;
-- nothing recorded n = 2 behind the session's back: another n is accepted
-- now that no one claims the name
SELECT claim_slot('lm_full', 5) AS claim_with_other_n;
SELECT release_slot('lm_full');

-- claim_partitions: after a failure the session is not a member and holds no
-- partition (my_partitions agrees with the lock table); after the success,
-- membership, its count record and all 8 partitions.
SELECT failures > 0 AS failed_first, consistent, succeeded
FROM lm_fill_and_try($$SELECT claim_partitions('lm_group', 8)$$,
    $$SELECT my_partitions('lm_group') = '{}' AND lm_locks('lm_group') = 0$$,
    $$SELECT my_partitions('lm_group') = '{0,1,2,3,4,5,6,7}' AND lm_locks('lm_group') = 10$$);
SELECT group_leave('lm_group') AS left_group, lm_locks('lm_group') AS locks_left;

-- pg_claim.max_locks_per_session bounds what one session holds through
-- pg_claim; the refused call takes nothing.
SET pg_claim.max_locks_per_session = 20;
SELECT pc_try($$SELECT claim_partitions('lm_budget', 64)$$) AS too_many_partitions;
SELECT lm_locks('lm_budget') AS locks_after_refusal, my_partitions('lm_budget') AS partitions;
SELECT claim_partitions('lm_budget', 16) AS sixteen_fit;
SELECT pc_try($$SELECT claim_slot('lm_budget_slot', 2)$$) AS one_claim_too_many;
SELECT lm_locks('lm_budget_slot') AS slot_locks;
SELECT group_leave('lm_budget');
SELECT claim_slot('lm_budget_slot', 2) AS fits_after_leaving;
SELECT release_slot('lm_budget_slot');
-- locks released behind pg_claim's back stop counting
SELECT claim_partitions('lm_budget', 16) IS NOT NULL AS claimed;
SELECT pg_advisory_unlock_all();
SELECT claim_partitions('lm_budget2', 16) IS NOT NULL AS claimed_after_unlock_all;
SELECT group_leave('lm_budget2');
-- claim_slots is refused up front when max slots and the claim's two
-- records would not fit, and takes nothing (20 = 18 slots + 2 records)
SELECT pc_try($$SELECT claim_slots('lm_budget_slots', 64, 19)$$) AS max_too_large;
SELECT pc_try($$SELECT claim_slots('lm_budget_slots', 64, 19, '1 s')$$) AS max_too_large_standby;
SELECT lm_locks('lm_budget_slots') AS slots_locks;
SELECT cardinality(claim_slots('lm_budget_slots', 64, 18)) AS max_that_fits;
SELECT release_slot('lm_budget_slots');
RESET pg_claim.max_locks_per_session;
SHOW pg_claim.max_locks_per_session;
SELECT pc_try($$SELECT claim_slots('lm_budget_slots', 1048576, 1048576)$$) AS max_of_2_20;
-- only a superuser may raise it
CREATE ROLE lm_worker;
SET ROLE lm_worker;
SELECT pc_try($$SET pg_claim.max_locks_per_session = 100000$$) AS raise_as_worker;
RESET ROLE;

-- The default bound stops one session from filling the lock table.
SELECT pc_try($$SELECT claim_partitions('lm_greedy_' || g, 4096) FROM generate_series(1, 3) g$$) AS greedy;
SELECT count(*) AS greedy_locks_left FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();

-- The prefix is reserved: a misspelled setting is an error.
SELECT pc_try($$SET pg_claim.nonexistent = 1$$) AS misspelled;
SELECT pc_try($$SET pg_claim.client_connection_check_intervall = 1$$) AS misspelled_too;

-- A wait too long for the clock waits until cancelled (no overflow).
SELECT pg_advisory_lock(crc32('lm_wait')::bit(32)::integer, 0);
SET statement_timeout = '200ms';
SELECT pc_try($$SELECT claim_slot('lm_wait', 1, '300000 years')$$) AS centuries;
SELECT pc_try($$SELECT claim_slot('lm_wait', 1, interval '178000000 years')$$) AS longest_interval;
RESET statement_timeout;
SELECT lm_locks('lm_wait') AS only_the_plain_lock;
SELECT pg_advisory_unlock_all();

-- my_items_query with an oid that is not a type, or is no row type.
CREATE TABLE lm_items (id integer PRIMARY KEY);
SELECT pc_try(format('SELECT my_items_query(%s, 0, 8)', 'lm_items'::regclass::oid::bigint))
    LIKE '42704: type with oid % does not exist%' AS table_oid_is_no_type;
SELECT pc_try($$SELECT my_items_query(0, 0, 8)$$) AS oid_zero;
SELECT pc_try($$SELECT my_items_query(4294967295, 0, 8)$$) AS oid_max;
SELECT pc_try($$SELECT my_items_query('integer'::regtype, 0, 8)$$) AS not_a_row_type;
SELECT pc_try($$SELECT * FROM slot_counts(4294967295, 8)$$) AS unknown_relation;

-- slot_counts lists every slot, so n is bounded (the work is the table's
-- size plus n).
SELECT pc_try($$SELECT * FROM slot_counts('lm_items', 2147483647)$$) AS huge_n;
SELECT count(*) AS slots_listed FROM slot_counts('lm_items', 1048576);

DROP TABLE lm_items;
DROP FUNCTION lm_locks(text), lm_fill_and_try(text, text, text);
DROP ROLE lm_worker;
