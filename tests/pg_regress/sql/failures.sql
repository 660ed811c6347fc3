-- Failing items: attempts, back-off, set aside, clearing, the listing, bad
-- input, privileges; and one poison item in a share of 10,000 walked by a
-- session-mode worker: every other item done once, the poison one attempted
-- exactly max_attempts times and then set aside; the same in lease mode with
-- a back-off.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP ROLE IF EXISTS fl_worker;
RESET client_min_messages;

-- The functions and their markings.
SELECT p.oid::regprocedure AS function, provolatile, prosecdef, proconfig
FROM pg_proc p
WHERE proname IN ('record_failure', 'failure_due', 'failing_items', 'clear_failure', 'item_failures', 'has_failures')
ORDER BY p.oid::regprocedure::text;

-- Attempts and back-off: backoff, 2 x backoff, then set aside at max_attempts.
SELECT record_failure('fl', '7', 'boom 1', 3, '10 seconds') AS first,
       failure_due('fl', '7') AS due_at_once, ARRAY(SELECT failing_items('fl')) AS skipped;
SELECT attempts, state, last_error, retry_at - last_failed_at AS wait
FROM item_failures('fl');
SELECT record_failure('fl', '7', 'boom 2', 3, '10 seconds') AS second;
SELECT attempts, state, last_error, retry_at - last_failed_at AS wait,
       first_failed_at < last_failed_at AS first_kept
FROM item_failures('fl');
SELECT record_failure('fl', '7', 'boom 3', 3, '10 seconds') AS third;
SELECT attempts, state, last_error, retry_at FROM item_failures('fl');
SELECT failure_due('fl', '7') AS dead_is_not_due, ARRAY(SELECT failing_items('fl')) AS skipped;
-- a dead item stays dead
SELECT record_failure('fl', '7', 'boom 4', 3, '10 seconds') AS again, attempts
FROM item_failures('fl');
-- max_attempts 1: dead at the first failure; backoff is capped at 1 day
SELECT record_failure('fl', 'a', 'x', 1) AS one_attempt;
SELECT record_failure('fl', 'b', '', 1000, '1 day') AS r1, record_failure('fl', 'b', '', 1000, '1 day') AS r2;
SELECT item, state, retry_at - last_failed_at AS wait FROM item_failures('fl') WHERE item = 'b';
-- backoff 0: due again at once
SELECT record_failure('fl', 'c', 'x', 5, '0') AS zero_backoff, failure_due('fl', 'c') AS due;
SELECT item, state FROM item_failures('fl') ORDER BY item;
-- other names are separate
SELECT ARRAY(SELECT failing_items('fl_other')) AS other_name, failure_due('fl_other', '7') AS other_due;
-- clearing: how many records went; a cleared dead item is due again
SELECT clear_failure('fl', '7', 'nope') AS cleared, failure_due('fl', '7') AS due_again;
SELECT clear_failure('fl', VARIADIC ARRAY['a', 'b', 'c']) AS cleared_array,
       clear_failure('fl', VARIADIC '{}'::text[]) AS cleared_nothing;
SELECT count(*) AS left_over FROM item_failures('fl');
-- has_failures: whether a name has any record (due, waiting or dead)
SELECT has_failures('fl') AS fl_has, has_failures('fl_none') AS none_has;
SELECT record_failure('fl_has', 'x', 'due', 3, '0') AS due_one, has_failures('fl_has') AS with_a_due_one;
SELECT clear_failure('fl_has', 'x') AS cleared, has_failures('fl_has') AS after_clearing;
SELECT record_failure('fl_has', 'y', 'dead', 1) AS dead_one, has_failures('fl_has') AS with_a_dead_one;
SELECT pc_try($$SELECT has_failures(NULL)$$) AS null_name;
SELECT pc_try($$SELECT has_failures(repeat('n', 1025))$$) AS long_name;

-- The records of given items only (a worker's batch): the same columns and
-- states as item_failures(name), no record of another item or name; a key
-- without a record, a repeated key, an empty array: nothing for them.
SELECT count(record_failure('fl_keys', g::text, 'dead ' || g, 1)) AS dead FROM generate_series(1, 2000) g;
SELECT record_failure('fl_keys', 'r', 'waits', 3, '1 hour') AS r,
       record_failure('fl_keys', 'd', 'due', 3, '0') AS d,
       record_failure('fl_other_keys', '5', 'other name', 1) AS other;
SELECT item, state, attempts, last_error, retry_at IS NULL AS no_retry
FROM item_failures('fl_keys', 'r', 'd', '5', '5', 'no record', '2001');
SELECT (SELECT array_agg(x ORDER BY x.item) FROM item_failures('fl_keys', 'r', 'd', '5', '1999') x)
     = (SELECT array_agg(y ORDER BY y.item) FROM item_failures('fl_keys') y
        WHERE y.item IN ('r', 'd', '5', '1999')) AS same_as_the_whole_listing;
SELECT count(*) AS from_an_array FROM item_failures('fl_keys', VARIADIC ARRAY(SELECT g::text FROM generate_series(1, 100) g));
SELECT count(*) AS from_no_keys FROM item_failures('fl_keys', VARIADIC '{}'::text[]);
-- read through the primary key: a batch's records, not every one of the name
-- (this backend's counts of the table, before and after the call)
BEGIN;
SELECT seq_scan AS seq_before, idx_tup_fetch AS fetched_before
FROM pg_stat_xact_user_tables WHERE relid = 'pg_claim_failures'::regclass \gset
SELECT count(*) AS two FROM item_failures('fl_keys', '17', '1700');
SELECT seq_scan - :seq_before AS seq_scans, idx_tup_fetch - :fetched_before AS fetched_by_index
FROM pg_stat_xact_user_tables WHERE relid = 'pg_claim_failures'::regclass;
COMMIT;
SELECT clear_failure('fl_keys', VARIADIC ARRAY(SELECT item FROM item_failures('fl_keys'))) AS cleared,
       clear_failure('fl_other_keys', '5') AS cleared_other;

-- Bad input: SQLSTATE, message naming the value, hint.
SELECT pc_try($$SELECT record_failure(NULL, '1', 'e')$$) AS null_name;
SELECT pc_try($$SELECT record_failure('fl', NULL, 'e')$$) AS null_item;
SELECT pc_try($$SELECT record_failure('fl', '1', NULL)$$) AS null_error;
SELECT pc_try($$SELECT record_failure(repeat('n', 1025), '1', 'e')$$) AS long_name;
SELECT pc_try($$SELECT record_failure('fl', repeat('7', 70000), 'e')$$) AS long_item;
SELECT pc_try($$SELECT record_failure('fl', '1', 'e', NULL)$$) AS null_max;
SELECT pc_try($$SELECT record_failure('fl', '1', 'e', 3, NULL)$$) AS null_backoff;
SELECT pc_try($$SELECT record_failure('fl', '1', 'e', 0)$$) AS zero_max;
SELECT pc_try($$SELECT record_failure('fl', '1', 'e', 1001)$$) AS huge_max;
SELECT pc_try($$SELECT record_failure('fl', '1', 'e', 3, '-1 second')$$) AS negative_backoff;
SELECT pc_try($$SELECT record_failure('fl', '1', 'e', 3, '25 hours')$$) AS long_backoff;
SELECT pc_try($$SELECT failure_due(NULL, '1')$$) AS due_null_name;
SELECT pc_try($$SELECT failure_due('fl', NULL)$$) AS due_null_item;
SELECT pc_try($$SELECT failing_items(NULL)$$) AS items_null_name;
SELECT pc_try($$SELECT clear_failure(NULL, '1')$$) AS clear_null_name;
SELECT pc_try($$SELECT clear_failure('fl', VARIADIC NULL::text[])$$) AS clear_null_items;
SELECT pc_try($$SELECT clear_failure('fl', '1', NULL)$$) AS clear_null_element;
SELECT pc_try($$SELECT * FROM item_failures(NULL)$$) AS list_null_name;
SELECT pc_try($$SELECT * FROM item_failures(NULL, '1')$$) AS keyed_null_name;
SELECT pc_try($$SELECT * FROM item_failures('fl', VARIADIC NULL::text[])$$) AS keyed_null_items;
SELECT pc_try($$SELECT * FROM item_failures('fl', '1', NULL)$$) AS keyed_null_element;
SELECT count(*) AS nothing_recorded_by_bad_calls FROM item_failures('fl');

-- Privileges: the table is the functions' alone.
CREATE ROLE fl_worker;
SET ROLE fl_worker;
SELECT pc_try($$SELECT * FROM pg_claim_failures$$) AS read_table;
SELECT pc_try($$INSERT INTO pg_claim_failures VALUES ('fl', 'x', 1, '', now(), now(), NULL)$$) AS write_table;
SELECT record_failure('fl', 'by role', 'e') AS through_function,
       clear_failure('fl', 'by role') AS cleared_through_function;
RESET ROLE;
DROP ROLE fl_worker;

-- One poison item in a share of 10,000 (the rows of slot 0 of 4), walked by
-- a claim_slot worker in batches, each item in its own subtransaction.
CREATE TABLE fl_outbox (id bigint PRIMARY KEY, sent_at timestamptz);
INSERT INTO fl_outbox (id)
SELECT g FROM generate_series(1, 60000) g WHERE slot_of(g::bigint, 4) = 0 ORDER BY g LIMIT 10000;
CREATE INDEX ON fl_outbox ((slot_of(id, 4)), id) WHERE sent_at IS NULL;
CREATE TABLE fl_attempts (id bigint NOT NULL);
CREATE TABLE fl_poison AS SELECT id FROM fl_outbox ORDER BY id OFFSET 4321 LIMIT 1;
CREATE FUNCTION fl_send(item bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF item = (SELECT id FROM fl_poison) THEN
        RAISE EXCEPTION 'cannot deliver message %', item;
    END IF;
END $$;
SELECT count(*) AS share, count(*) FILTER (WHERE slot_of(id, 4) = 0) AS of_slot_0 FROM fl_outbox;
SELECT claim_slot('fl_walk', 4) AS slot;
DO $$
DECLARE
    r record;
    fetched int;
    batches int := 0;
BEGIN
    LOOP
        fetched := 0;
        FOR r IN SELECT id FROM fl_outbox
                 WHERE slot_of(id, 4) = my_slot('fl_walk') AND sent_at IS NULL
                   AND id::text NOT IN (SELECT failing_items('fl_walk'))
                 ORDER BY id LIMIT 500
        LOOP
            fetched := fetched + 1;
            INSERT INTO fl_attempts VALUES (r.id);
            BEGIN
                PERFORM fl_send(r.id);
                UPDATE fl_outbox SET sent_at = now() WHERE id = r.id;
            EXCEPTION WHEN OTHERS THEN
                PERFORM record_failure('fl_walk', r.id::text, SQLERRM, 4, '0');
            END;
        END LOOP;
        EXIT WHEN fetched = 0;
        batches := batches + 1;
        IF batches > 1000 THEN
            RAISE EXCEPTION 'the walk does not end';
        END IF;
    END LOOP;
END $$;
SELECT release_slot('fl_walk');
-- every other item done exactly once, the poison one attempted 4 times
SELECT count(*) FILTER (WHERE n = 1) AS once, count(*) FILTER (WHERE n > 1) AS more,
       (SELECT count(*) FROM fl_outbox WHERE sent_at IS NULL) AS not_sent,
       (SELECT n FROM (SELECT id, count(*) AS n FROM fl_attempts GROUP BY id) c
        WHERE id = (SELECT id FROM fl_poison)) AS poison_attempts
FROM (SELECT id, count(*) AS n FROM fl_attempts GROUP BY id) c;
SELECT item = (SELECT id::text FROM fl_poison) AS is_poison, state, attempts,
       last_error = 'cannot deliver message ' || item AS error_recorded
FROM item_failures('fl_walk');

-- The same in lease mode (a claim_lease worker, each write fenced), with a
-- back-off: a share of 2,000 (slot 0 of 2), a poison item, max_attempts 3.
-- The walk goes on past the held-back item; when only held-back items are
-- left it waits for the earliest retry_at (polled, with a deadline).
CREATE TABLE fl_lease_outbox (id bigint PRIMARY KEY, sent_at timestamptz);
INSERT INTO fl_lease_outbox (id)
SELECT g FROM generate_series(1, 10000) g WHERE slot_of(g::bigint, 2) = 0 ORDER BY g LIMIT 2000;
CREATE TABLE fl_lease_attempts (id bigint NOT NULL);
CREATE TABLE fl_lease_poison AS SELECT id FROM fl_lease_outbox ORDER BY id OFFSET 1500 LIMIT 1;
SELECT slot FROM claim_lease('fl_lease', 2, 'worker-1', '1 hour');
DO $$
DECLARE
    r record;
    fetched int;
    tok bigint := (SELECT token FROM lease_holders('fl_lease') WHERE slot = 0);
    deadline timestamptz := clock_timestamp() + interval '60 seconds';
BEGIN
    LOOP
        fetched := 0;
        FOR r IN SELECT id FROM fl_lease_outbox
                 WHERE slot_of(id, 2) = 0 AND sent_at IS NULL
                   AND id::text NOT IN (SELECT failing_items('fl_lease'))
                 ORDER BY id LIMIT 300
        LOOP
            fetched := fetched + 1;
            INSERT INTO fl_lease_attempts VALUES (r.id);
            BEGIN
                PERFORM fence('fl_lease', 0, tok);
                IF r.id = (SELECT id FROM fl_lease_poison) THEN
                    RAISE EXCEPTION 'cannot deliver message %', r.id;
                END IF;
                UPDATE fl_lease_outbox SET sent_at = now() WHERE id = r.id;
            EXCEPTION WHEN OTHERS THEN
                PERFORM record_failure('fl_lease', r.id::text, SQLERRM, 3, '20 milliseconds');
            END;
        END LOOP;
        IF fetched = 0 THEN
            -- nothing due: done unless an item waits for its retry
            EXIT WHEN NOT EXISTS (SELECT 1 FROM item_failures('fl_lease') WHERE state <> 'dead');
            IF clock_timestamp() > deadline THEN
                RAISE EXCEPTION 'the retries did not come due';
            END IF;
            PERFORM pg_sleep(0.01);
        END IF;
    END LOOP;
END $$;
SELECT count(*) FILTER (WHERE n = 1) AS once, count(*) FILTER (WHERE n > 1) AS more,
       (SELECT count(*) FROM fl_lease_outbox WHERE sent_at IS NULL) AS not_sent,
       (SELECT count(*) FROM fl_lease_attempts WHERE id = (SELECT id FROM fl_lease_poison)) AS poison_attempts
FROM (SELECT id, count(*) AS n FROM fl_lease_attempts GROUP BY id) c;
SELECT item = (SELECT id::text FROM fl_lease_poison) AS is_poison, state, attempts,
       last_failed_at - first_failed_at >= interval '60 milliseconds' AS backed_off
FROM item_failures('fl_lease');
