-- my_items and slot_counts on bad input: SQLSTATE, message and hint
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE TABLE mie_items (id bigint PRIMARY KEY, email text, amount numeric);
INSERT INTO mie_items SELECT g, 'u' || g || '@example.com', g FROM generate_series(1, 100) g;
CREATE TABLE mie_nopk (a integer, b text);
INSERT INTO mie_nopk SELECT g, g::text FROM generate_series(1, 10) g;
CREATE TABLE mie_pk2 (a integer, b integer, PRIMARY KEY (a, b));
CREATE VIEW mie_view AS SELECT * FROM mie_items;
CREATE TYPE mie_composite AS (x integer);

-- pc_try (0_setup.sql) shows each statement's SQLSTATE, message and hint
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    -- slot out of range, n invalid, NULLs
    ('SELECT * FROM my_items(NULL::mie_items, 8, 8)'),
    ('SELECT * FROM my_items(NULL::mie_items, -1, 8)'),
    ('SELECT * FROM my_items(NULL::mie_items, 0, 0)'),
    ('SELECT * FROM my_items(NULL::mie_items, NULL, 8)'),
    ('SELECT * FROM my_items(NULL::mie_items, 0, NULL)'),
    ('SELECT * FROM my_items(NULL::mie_items, 0, 8, batch => 0)'),
    -- no key to use
    ('SELECT * FROM my_items(NULL::mie_nopk, 0, 2)'),
    ('SELECT * FROM my_items(NULL::mie_pk2, 0, 2)'),
    -- unknown column (names are exact: no case folding)
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, key => ''mail'')'),
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, key => ''ID'')'),
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, key => ''ctid'')'),
    -- unsupported method
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, method => ''modulo'')'),
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, method => ''Jump'')'),
    -- a key type the method cannot map
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, key => ''amount'')'),
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, key => ''amount'', method => ''jump'')'),
    -- not a table''s row type
    ('SELECT * FROM my_items(NULL::mie_view, 0, 2)'),
    ('SELECT * FROM my_items(NULL::mie_composite, 0, 2)'),
    ('SELECT * FROM my_items(NULL::integer, 0, 2)'),
    ('SELECT * FROM my_items(NULL, 0, 2)'),
    -- an `after` that is not a value of the key''s type
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, after => ''ten'')'),
    -- slot_counts
    ('SELECT * FROM slot_counts(''mie_items'', 0)'),
    ('SELECT * FROM slot_counts(''mie_nopk'', 4)'),
    ('SELECT * FROM slot_counts(''mie_items'', 4, ''nope'')'),
    ('SELECT * FROM slot_counts(''mie_items'', 4, method => ''md5'')'),
    ('SELECT * FROM slot_counts(''mie_composite'', 4)'),
    -- these work: numeric keys with pg_hash, a key given for a table without a primary key
    ('SELECT * FROM my_items(NULL::mie_items, 0, 2, key => ''amount'', method => ''pg_hash'')'),
    ('SELECT * FROM my_items(NULL::mie_nopk, 0, 2, key => ''a'')')
) AS s(t);

-- my_items runs its query as the calling user: table privileges apply
CREATE ROLE mie_reader;
SET ROLE mie_reader;
SELECT pc_try('SELECT * FROM my_items(NULL::mie_items, 0, 2)') AS without_select_privilege;
RESET ROLE;
GRANT SELECT ON mie_items TO mie_reader;
SET ROLE mie_reader;
SELECT count(*) AS with_select_privilege FROM my_items(NULL::mie_items, 0, 2);
RESET ROLE;
REVOKE SELECT ON mie_items FROM mie_reader;
DROP ROLE mie_reader;

-- A table name with quotes and spaces, and a key column that needs quoting
CREATE TABLE "mie ""quoted"" table" ("Item Id" integer PRIMARY KEY, "Some Text" text);
INSERT INTO "mie ""quoted"" table" SELECT g, 'row ' || g FROM generate_series(1, 12) g;
SELECT * FROM my_items(NULL::"mie ""quoted"" table", 2, 5);
SELECT * FROM my_items(NULL::"mie ""quoted"" table", 2, 5, after => '2', batch => 1);
SELECT "Item Id" FROM my_items(NULL::"mie ""quoted"" table", 0, 2, key => 'Some Text', method => 'jump') ORDER BY 1;
SELECT * FROM slot_counts('"mie ""quoted"" table"', 5);
-- a key value that looks like SQL stays a value
SELECT count(*) FROM my_items(NULL::mie_items, 0, 2, key => 'email', after => $$'; DROP TABLE mie_items; --$$);
SELECT count(*) AS still_there FROM mie_items;

DROP TABLE "mie ""quoted"" table", mie_pk2, mie_nopk;
DROP VIEW mie_view;
DROP TABLE mie_items;
DROP TYPE mie_composite;
