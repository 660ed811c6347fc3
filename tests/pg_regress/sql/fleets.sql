-- Seeing the fleet: slot_backlog (pending rows per slot and the oldest),
-- define_fleet / drop_fleet, and the views fleet_slots and fleets, with
-- every error. (docs/my_items.md, "Backlog and fleets"; the attacker roles
-- are in tests/security, dump and restore in tests/dump.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;
SET TimeZone = 'UTC';

SELECT p.oid::regprocedure AS function, provolatile, proparallel, proisstrict, prosecdef
FROM pg_proc p
WHERE proname IN ('slot_backlog', 'slot_backlog_query', 'define_fleet', 'drop_fleet',
                  'pg_claim_fleet_slots', 'pg_claim_fleet_put', 'pg_claim_fleet_drop',
                  'pg_claim_fleet_failures_query')
ORDER BY p.oid::regprocedure::text;
SELECT c.relname, c.relkind, c.reloptions FROM pg_class c
WHERE c.relname IN ('fleet_slots', 'fleets', 'pg_claim_fleets') ORDER BY 1;

-- A table of 2,000 jobs, one in ten pending (done = false); a second pending
-- form on the same rows (sent_at IS NULL), a route column and a timestamp.
CREATE TABLE fl_jobs (
    id bigint PRIMARY KEY, customer integer, code text NOT NULL,
    created_at timestamptz NOT NULL, queued_at timestamp,
    done boolean NOT NULL DEFAULT false, sent_at timestamptz, n_int integer NOT NULL DEFAULT 0);
INSERT INTO fl_jobs (id, customer, code, created_at, queued_at, done, sent_at)
SELECT g, g % 13, 'c' || g, '2026-01-01'::timestamptz + g * interval '1 minute',
       '2026-01-01'::timestamp + g * interval '1 minute',
       g % 10 <> 0, CASE WHEN g % 10 <> 0 THEN '2026-02-01'::timestamptz END
FROM generate_series(1, 2000) g;
CREATE INDEX fl_jobs_pending ON fl_jobs ((slot_of(id, 8)), id) WHERE NOT done;
ANALYZE fl_jobs;

-- Every slot, empty ones included; the same as the hand-written count.
SELECT * FROM slot_backlog('fl_jobs', 8, 'done', age => 'created_at');
SELECT * FROM slot_backlog('fl_jobs', 3, 'sent_at');
SELECT bool_and(b.backlog = coalesce(h.c, 0)) AS same_as_hand_written, sum(b.backlog) AS total
FROM slot_backlog('fl_jobs', 7, 'done') b
LEFT JOIN (SELECT slot_of(id, 7) AS s, count(*) AS c FROM fl_jobs WHERE NOT done GROUP BY 1) h
  ON h.s = b.slot;
-- every method and the route column, against their mapping functions
SELECT m.method, bool_and(b.backlog = (SELECT count(*) FROM fl_jobs j WHERE NOT j.done AND
          CASE m.method WHEN 'auto' THEN slot_of(j.customer, 5)
                        WHEN 'crc32' THEN slot_of(j.customer::text, 5)
                        WHEN 'jump' THEN jump_slot(j.customer, 5)
                        ELSE pg_hash_slot(j.customer, 5) END = b.slot)) AS same
FROM unnest(ARRAY['auto', 'crc32', 'jump', 'pg_hash']) m(method),
     LATERAL slot_backlog('fl_jobs', 5, 'done', route => 'customer', method => m.method) b
GROUP BY m.method ORDER BY m.method;
SELECT bool_and(b.backlog = (SELECT count(*) FROM fl_jobs WHERE NOT done AND slot_of(code, 4) = b.slot))
    AS text_key
FROM slot_backlog('fl_jobs', 4, 'done', key => 'code') b;
-- oldest: the smallest age among the slot's pending rows; a timestamp column
-- is read in the session's time zone
SELECT bool_and(b.oldest = (SELECT min(created_at) FROM fl_jobs WHERE NOT done AND slot_of(id, 6) = b.slot))
    AS oldest_right,
    bool_and(b.oldest = q.oldest) AS timestamp_column_same
FROM slot_backlog('fl_jobs', 6, 'done', age => 'created_at') b
JOIN slot_backlog('fl_jobs', 6, 'done', age => 'queued_at') q USING (slot);

-- It reads only the pending rows, through the partial index.
CREATE FUNCTION fl_plan(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE line text;
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
        RETURN NEXT line;
    END LOOP;
END $$;
SELECT bool_or(line ~ 'Index.* Scan on fl_jobs_pending') AS partial_index,
       NOT bool_or(line ~ 'Seq Scan') AS no_seq_scan
FROM fl_plan(replace(slot_backlog_query('fl_jobs'::regclass, 8, 'done'), '$1', '8')) line;
SELECT slot_backlog_query('fl_jobs'::regclass, 8, 'sent_at', route => 'customer', age => 'queued_at');

-- Bad input: SQLSTATE, message naming the value, hint.
CREATE TABLE fl_nokey (a int, b int);
CREATE VIEW fl_view AS SELECT * FROM fl_jobs;
SELECT pc_try(stmt) FROM unnest(ARRAY[
    $$SELECT * FROM slot_backlog(NULL, 8, 'done')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', NULL, 'done')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 0, 'done')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 1048577, 'done')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, NULL)$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, 'finished')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, 'code')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, 'done', age => 'customer')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, 'done', age => 'born')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, 'done', key => 'nope')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, 'done', route => 'nope')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, 'done', method => 'modulo')$$,
    $$SELECT * FROM slot_backlog('fl_jobs', 8, 'done', route => 'created_at')$$,
    $$SELECT * FROM slot_backlog('fl_nokey', 8, 'b')$$,
    $$SELECT * FROM slot_backlog('pg_class_oid_index', 8, 'b')$$
]) stmt;
-- a view is counted like a table
SELECT sum(backlog) FROM slot_backlog('fl_view', 4, 'done', key => 'id');

-- Defined fleets.
SELECT define_fleet('fl_mailer', 'fl_jobs', 4, 'done', age => 'created_at');
SELECT define_fleet('fl_routed', 'fl_jobs', 3, 'sent_at', route => 'customer', method => 'jump');
SELECT define_fleet('fl_plain', 'fl_jobs', 2);
SELECT name, tbl, n, pending, key, route, method, age, owner = current_user::regrole AS mine
FROM pg_claim_fleets ORDER BY name;
SELECT pc_try(stmt) FROM unnest(ARRAY[
    $$SELECT define_fleet(NULL, 'fl_jobs', 4)$$,
    $$SELECT define_fleet(repeat('x', 1025), 'fl_jobs', 4)$$,
    $$SELECT define_fleet('fl_x', NULL, 4)$$,
    $$SELECT define_fleet('fl_x', 'fl_jobs', NULL)$$,
    $$SELECT define_fleet('fl_x', 'fl_jobs', 0)$$,
    $$SELECT define_fleet('fl_x', 'fl_jobs', 4, 'nope')$$,
    $$SELECT define_fleet('fl_x', 'fl_jobs', 4, age => 'created_at')$$,
    $$SELECT define_fleet('fl_x', 'fl_jobs', 4, 'done', age => 'code')$$,
    $$SELECT define_fleet('fl_x', 'fl_jobs', 4, method => 'nope')$$,
    $$SELECT define_fleet('fl_x', 'fl_nokey', 4, route => 'a')$$,
    $$SELECT drop_fleet(NULL)$$
]) stmt;
SELECT count(*) AS no_fleet_x FROM pg_claim_fleets WHERE name = 'fl_x';

-- Holders, modes and failures per slot: a session holds slot 0 of fl_mailer,
-- a lease slot 1 of fl_routed; two items of fl_mailer are failing, one is
-- dead, one failure record is not a key at all.
SELECT claim_slot('fl_mailer', 4) AS session_slot;
SELECT slot AS leased_slot, token > 0 AS has_token FROM claim_lease('fl_routed', 3, 'w1');
SELECT record_failure('fl_mailer', '10', 'boom'), record_failure('fl_mailer', '20', 'boom'),
       record_failure('fl_mailer', '30', 'boom', max_attempts => 1),
       record_failure('fl_mailer', 'not-a-number', 'boom'),
       record_failure('fl_routed', '10', 'boom', max_attempts => 1);
SELECT fleet, slot, pending, oldest, holder = 'pid ' || pg_backend_pid() AS my_session,
       CASE WHEN mode = 'lease' THEN holder END AS lease_holder, mode,
       token IS NOT NULL AS token, since IS NOT NULL AS since, unserved_since, failing, dead
FROM fleet_slots ORDER BY fleet, slot;
-- the failures land in the slots of their keys
SELECT slot_of(10, 4) AS slot_of_10, slot_of(20, 4) AS slot_of_20, slot_of(30, 4) AS slot_of_30,
       jump_slot((SELECT customer FROM fl_jobs WHERE id = 10), 3) AS routed_slot_of_10;
SELECT * FROM fleets ORDER BY fleet;
-- a released lease: unserved since its release
SELECT release_lease('fl_routed', l.slot, l.token) FROM lease_holders('fl_routed') l;
SELECT slot, holder, mode, unserved_since IS NOT NULL AS unserved_since_known
FROM fleet_slots WHERE fleet = 'fl_routed' ORDER BY slot;
SELECT release_slot('fl_mailer');

-- Replacing a definition: the views follow; drop_fleet is true once.
SELECT define_fleet('fl_plain', 'fl_jobs', 3, 'sent_at', key => 'code');
SELECT fleet, n, pending_column, key, unserved, pending FROM fleets WHERE fleet = 'fl_plain';
SELECT drop_fleet('fl_plain') AS dropped, drop_fleet('fl_plain') AS again;

-- A table the caller cannot read: pending and oldest NULL, never an error.
-- A dropped table: the same. A role may not replace or drop another
-- role's definition unless it has that role's privileges.
SET client_min_messages = warning;
DROP ROLE IF EXISTS fl_alice;
DROP ROLE IF EXISTS fl_bob;
RESET client_min_messages;
CREATE ROLE fl_alice;
CREATE ROLE fl_bob;
CREATE TABLE fl_secret (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
INSERT INTO fl_secret SELECT g, false FROM generate_series(1, 10) g;
GRANT SELECT ON fl_secret TO fl_alice;
GRANT SELECT (id) ON fl_jobs TO fl_bob;
CREATE TABLE fl_bobs (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
GRANT SELECT ON fl_bobs TO fl_bob;
SET ROLE fl_alice;
SELECT define_fleet('fl_secret', 'fl_secret', 2, 'done');
SELECT fleet, pending FROM fleets WHERE fleet = 'fl_secret';
RESET ROLE;
SET ROLE fl_bob;
SELECT pc_try($$SELECT define_fleet('fl_secret', 'fl_bobs', 2, 'done')$$);
SELECT pc_try($$SELECT define_fleet('fl_jobs_bob', 'fl_jobs', 2, 'done')$$);
SELECT pc_try($$SELECT define_fleet('fl_bob', 'fl_secret', 2, 'done')$$);
SELECT pc_try($$SELECT drop_fleet('fl_secret')$$);
SELECT fleet, slot, pending, oldest FROM fleet_slots WHERE fleet IN ('fl_secret', 'fl_mailer') ORDER BY 1, 2;
SELECT fleet, holders, unserved, pending, oldest, failing, dead FROM fleets ORDER BY fleet;
RESET ROLE;
GRANT fl_alice TO fl_bob;
SET ROLE fl_bob;
SELECT define_fleet('fl_secret', 'fl_secret', 3, 'done');
SELECT owner, n FROM pg_claim_fleets WHERE name = 'fl_secret';
SELECT drop_fleet('fl_secret');
RESET ROLE;
DROP VIEW fl_view;
SELECT define_fleet('fl_gone', 'fl_nokey', 2, 'b', key => 'a');
DROP TABLE fl_nokey;
SELECT fleet, tbl IS NOT NULL AS tbl, pending, oldest, unserved FROM fleets WHERE fleet = 'fl_gone';
SELECT drop_fleet('fl_gone');

SELECT drop_fleet('fl_mailer'), drop_fleet('fl_routed');
SELECT clear_failure('fl_mailer', '10', '20', '30', 'not-a-number'), clear_failure('fl_routed', '10');
REVOKE ALL ON fl_jobs FROM fl_bob;
DROP TABLE fl_jobs, fl_secret, fl_bobs;
DROP FUNCTION fl_plan(text);
DROP ROLE fl_alice;
DROP ROLE fl_bob;
