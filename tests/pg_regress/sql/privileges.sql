-- my_items, my_items_query and slot_counts read a table with the caller's
-- privileges and row-level security, on every method and path; generated SQL
-- cannot be captured through search_path; table names are never spliced in.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP ROLE IF EXISTS pv_alice;
DROP ROLE IF EXISTS pv_bob;
DROP ROLE IF EXISTS pv_mallory;
RESET client_min_messages;
CREATE ROLE pv_alice;
CREATE ROLE pv_bob;
CREATE ROLE pv_mallory;


-- A hash-partitioned table with row-level security on the parent: each role
-- sees its own rows.
CREATE TABLE pv_docs (id integer, owner name, body text) PARTITION BY HASH (id);
CREATE TABLE pv_docs0 PARTITION OF pv_docs FOR VALUES WITH (modulus 2, remainder 0);
CREATE TABLE pv_docs1 PARTITION OF pv_docs FOR VALUES WITH (modulus 2, remainder 1);
INSERT INTO pv_docs SELECT g, CASE WHEN g % 3 = 0 THEN 'pv_bob' ELSE 'pv_alice' END, 'body ' || g
FROM generate_series(1, 100) g;
ALTER TABLE pv_docs ENABLE ROW LEVEL SECURITY;
CREATE POLICY pv_own ON pv_docs USING (owner = current_user);
GRANT SELECT ON pv_docs, pv_docs0, pv_docs1 TO pv_alice, pv_bob;

-- As each role, for every method and slot: the share equals the role's own
-- filter on the parent, and holds none of the other role's rows.
SET ROLE pv_alice;
SELECT m.method, s AS slot,
       (SELECT count(*) FROM my_items(NULL::pv_docs, s, 2, key => 'id', method => m.method)) AS share,
       (SELECT count(*) FROM pv_docs WHERE CASE m.method WHEN 'pg_hash' THEN pg_hash_slot(id, 2)
                                                        WHEN 'jump' THEN jump_slot(id, 2)
                                                        ELSE slot_of(id, 2) END = s) AS own_filter,
       (SELECT count(*) FROM my_items(NULL::pv_docs, s, 2, key => 'id', method => m.method)
        WHERE owner <> current_user) AS others_rows
FROM (VALUES ('auto'), ('jump'), ('pg_hash')) m(method), generate_series(0, 1) s
ORDER BY 1, 2;
SELECT * FROM slot_counts('pv_docs', 2, 'id', 'pg_hash');
RESET ROLE;

-- SELECT on the parent only: the same query on the parent works, so my_items
-- works too (it never reads the partition directly).
REVOKE SELECT ON pv_docs0, pv_docs1 FROM pv_alice;
SET ROLE pv_alice;
SELECT pc_try('SELECT count(*) FROM pv_docs0') AS partition_directly;
SELECT s AS slot,
       (SELECT count(*) FROM my_items(NULL::pv_docs, s, 2, key => 'id', method => 'pg_hash')) AS share,
       (SELECT count(*) FROM pv_docs WHERE pg_hash_slot(id, 2) = s) AS own_filter
FROM generate_series(0, 1) s;
RESET ROLE;

-- Row-level security on a partition only: a query on the parent does not
-- apply it, so neither does the share.
ALTER TABLE pv_docs DISABLE ROW LEVEL SECURITY;
ALTER TABLE pv_docs0 ENABLE ROW LEVEL SECURITY;
CREATE POLICY pv_none ON pv_docs0 USING (false);
GRANT SELECT ON pv_docs0, pv_docs1 TO pv_alice;
SET ROLE pv_alice;
SELECT s AS slot,
       (SELECT count(*) FROM my_items(NULL::pv_docs, s, 2, key => 'id', method => 'pg_hash')) AS share,
       (SELECT count(*) FROM pv_docs WHERE pg_hash_slot(id, 2) = s) AS own_filter
FROM generate_series(0, 1) s;
RESET ROLE;

-- No SELECT at all: every function refuses with 42501 before reading.
CREATE TABLE pv_private (id bigint PRIMARY KEY, secret text, salary numeric);
INSERT INTO pv_private SELECT g, 'secret ' || g, g * 1000 FROM generate_series(1, 10) g;
SET ROLE pv_mallory;
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ('SELECT * FROM my_items(NULL::pv_private, 0, 2)'),
    ('SELECT my_items_query(''pv_private''::regtype, 0, 2)'),
    ('SELECT * FROM slot_counts(''pv_private'', 2)'),
    ('SELECT * FROM slot_skew(''pv_private'', 2)')) v(t);
-- and takes no lock on the table it may not read
BEGIN;
SELECT pc_try('SELECT my_items_query(''pv_private''::regtype, 0, 2)') LIKE '42501%' AS refused;
SELECT count(*) AS locks_on_table FROM pg_locks WHERE relation = 'pv_private'::regclass AND pid = pg_backend_pid();
COMMIT;
RESET ROLE;

-- Column privileges: a role that may read only some columns names them;
-- the other columns come back NULL.
GRANT SELECT (id, secret) ON pv_private TO pv_bob;
SET ROLE pv_bob;
SELECT pc_try('SELECT * FROM my_items(NULL::pv_private, 0, 2)') AS all_columns;
SELECT id, secret, salary FROM my_items(NULL::pv_private, 0, 2, columns => ARRAY['secret']) ORDER BY id;
SELECT pc_try('SELECT * FROM my_items(NULL::pv_private, 0, 2, columns => ARRAY[''salary''])') AS listed_without_privilege;
SELECT my_items_query('pv_private'::regtype, 0, 2, columns => ARRAY['secret']);
SELECT * FROM slot_counts('pv_private', 2);
RESET ROLE;
GRANT SELECT (secret) ON pv_private TO pv_alice;
SET ROLE pv_alice;
-- without SELECT on the key, a share cannot be selected
SELECT pc_try('SELECT * FROM my_items(NULL::pv_private, 0, 2, columns => ARRAY[''secret''])') AS no_key_privilege;
RESET ROLE;
SELECT pc_try('SELECT * FROM my_items(NULL::pv_private, 0, 2, columns => ARRAY[''nope''])') AS unknown_column;
SELECT pc_try('SELECT * FROM my_items(NULL::pv_private, 0, 2, columns => ARRAY[NULL])') AS null_column;

-- search_path capture: an operator of the key's type in a schema earlier in
-- the caller's path must not be used by the generated query. For an enum key
-- even an implicit pg_catalog does not help: an exact match beats anyenum.
CREATE TYPE pv_mood AS ENUM ('sad', 'ok', 'happy', 'elated');
CREATE TABLE pv_moods (m pv_mood PRIMARY KEY, n integer);
INSERT INTO pv_moods VALUES ('sad', 1), ('ok', 2), ('happy', 3), ('elated', 4);
CREATE TABLE pv_nums (id integer PRIMARY KEY);
INSERT INTO pv_nums SELECT generate_series(1, 20);
CREATE SCHEMA pv_evil;
CREATE TABLE pv_evil.calls (who name);
CREATE FUNCTION pv_evil.gt(pv_mood, pv_mood) RETURNS boolean LANGUAGE sql AS
    'INSERT INTO pv_evil.calls VALUES (current_user) RETURNING true';
CREATE OPERATOR pv_evil.> (LEFTARG = pv_mood, RIGHTARG = pv_mood, FUNCTION = pv_evil.gt);
-- and, for a caller whose path names pg_catalog after it, the integer
-- operators the generated queries use
CREATE FUNCTION pv_evil.int_gt(integer, integer) RETURNS boolean LANGUAGE sql AS
    'INSERT INTO pv_evil.calls VALUES (current_user) RETURNING true';
CREATE OPERATOR pv_evil.> (LEFTARG = integer, RIGHTARG = integer, FUNCTION = pv_evil.int_gt);
CREATE FUNCTION pv_evil.int_eq(integer, integer) RETURNS boolean LANGUAGE sql AS
    'INSERT INTO pv_evil.calls VALUES (current_user) RETURNING true';
CREATE OPERATOR pv_evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = pv_evil.int_eq);
CREATE FUNCTION pv_evil.int_minus(integer, integer) RETURNS integer LANGUAGE sql AS
    'INSERT INTO pv_evil.calls VALUES (current_user) RETURNING 1';
CREATE OPERATOR pv_evil.- (LEFTARG = integer, RIGHTARG = integer, FUNCTION = pv_evil.int_minus);
SET search_path = pv_evil, public;
SELECT m FROM my_items(NULL::pv_moods, 0, 1, key => 'm', method => 'pg_hash', after => 'ok', batch => 10);
SET search_path = pv_evil, pg_catalog, public;
SELECT array_agg(id) FROM my_items(NULL::pv_nums, 1, 4, after => '5', batch => 3);
SELECT * FROM slot_counts('pv_nums', 4);
SELECT slots, items, max_over_mean FROM slot_skew('pv_nums', 4);
SELECT claim_slot('pv_held', 2) AS claimed;
SELECT slot, pid = pg_backend_pid() AS is_me FROM slot_holders('pv_held');
SELECT release_slot('pv_held') AS released;
SELECT count(*) AS captured_calls FROM pv_evil.calls;
RESET search_path;

-- Table and column names that look like SQL are quoted, never spliced in.
CREATE TABLE "pv_x""; DROP TABLE pv_moods; --" ("id""; --" integer PRIMARY KEY);
INSERT INTO "pv_x""; DROP TABLE pv_moods; --" SELECT generate_series(1, 6);
SELECT count(*) FROM my_items(NULL::"pv_x""; DROP TABLE pv_moods; --", 1, 2);
SELECT * FROM slot_counts('"pv_x""; DROP TABLE pv_moods; --"', 2);
SELECT my_items_query('"pv_x""; DROP TABLE pv_moods; --"'::regtype, 1, 2, after => '1', batch => 2);
SELECT count(*) AS moods_still_there FROM pv_moods;

SET client_min_messages = warning;
DROP TABLE "pv_x""; DROP TABLE pv_moods; --", pv_moods, pv_nums, pv_docs, pv_private;
DROP SCHEMA pv_evil CASCADE;
DROP TYPE pv_mood;
DROP ROLE pv_alice;
DROP ROLE pv_bob;
DROP ROLE pv_mallory;
