-- my_items: a worker's share of a table, for every key type and method
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE TABLE mi_int (id integer PRIMARY KEY, note text);
INSERT INTO mi_int SELECT g, 'n' || g FROM generate_series(-500, 500) g;
CREATE TABLE mi_big (id bigint PRIMARY KEY, note text);
INSERT INTO mi_big SELECT g * 7919 - 3000000, 'n' || g FROM generate_series(1, 800) g;
INSERT INTO mi_big VALUES (-9223372036854775808, 'min'), (9223372036854775807, 'max'), (-1, 'minus one');
CREATE TABLE mi_text (k text PRIMARY KEY, n integer);
INSERT INTO mi_text SELECT 'customer-' || md5(g::text), g FROM generate_series(1, 600) g;
INSERT INTO mi_text VALUES ('', 0), ('Grüße, 東京', -1), ('ünïcödé', -2);
CREATE TABLE mi_uuid (u uuid PRIMARY KEY, n integer);
INSERT INTO mi_uuid SELECT md5(g::text)::uuid, g FROM generate_series(1, 600) g;

-- the typed call: no column list, the row type is the table's
SELECT * FROM my_items(NULL::mi_int, 2, 8) ORDER BY id LIMIT 3;
SELECT pg_typeof(m) FROM my_items(NULL::mi_int, 2, 8) m LIMIT 1;

-- For a table, a key column, a method and the SQL filter that method means:
-- the n shares together are the whole table, each row exactly once, and each
-- share is exactly the rows the filter gives.
CREATE FUNCTION mi_check(rel regclass, key text, method text, filter text, n integer)
RETURNS TABLE (rows_total bigint, rows_in_shares bigint, distinct_rows bigint, shares_equal_filter boolean)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('SELECT count(*) FROM %s', rel) INTO rows_total;
    EXECUTE format(
        'SELECT count(*), count(DISTINCT m.%1$I)
         FROM generate_series(0, %4$s - 1) s
         CROSS JOIN LATERAL my_items(NULL::%2$s, s, %4$s, key => %1$L, method => %3$L) m',
        key, rel, method, n) INTO rows_in_shares, distinct_rows;
    EXECUTE format(
        'SELECT bool_and(a IS NOT DISTINCT FROM b) FROM (
             SELECT (SELECT array_agg(m.%1$I ORDER BY m.%1$I)
                     FROM my_items(NULL::%2$s, s, %4$s, key => %1$L, method => %3$L) m) AS a,
                    (SELECT array_agg(t.%1$I ORDER BY t.%1$I) FROM %2$s t
                     WHERE %5$s = s) AS b
             FROM generate_series(0, %4$s - 1) s) x',
        key, rel, method, n, replace(filter, 'N', n::text)) INTO shares_equal_filter;
    RETURN NEXT;
END $$;

SELECT c.rel, c.method, c.filter, n, r.*
FROM (VALUES
    ('mi_int', 'id', 'auto',    'slot_of(id, N)'),
    ('mi_int', 'id', 'crc32',   'crc32(id::text) % N'),
    ('mi_int', 'id', 'jump',    'jump_slot(id, N)'),
    ('mi_int', 'id', 'pg_hash', 'pg_hash_slot(id, N)'),
    ('mi_big', 'id', 'auto',    'slot_of(id, N)'),
    ('mi_big', 'id', 'auto',    '((id % N) + N) % N'),
    ('mi_big', 'id', 'crc32',   'slot_of(id::text, N)'),
    ('mi_big', 'id', 'jump',    'jump_slot(id, N)'),
    ('mi_big', 'id', 'pg_hash', 'pg_hash_slot(id, N)'),
    ('mi_text', 'k', 'auto',    'crc32(k) % N'),
    ('mi_text', 'k', 'crc32',   'slot_of(k, N)'),
    ('mi_text', 'k', 'jump',    'jump_slot(k, N)'),
    ('mi_text', 'k', 'pg_hash', 'pg_hash_slot(k, N)'),
    ('mi_uuid', 'u', 'auto',    'crc32(u::text) % N'),
    ('mi_uuid', 'u', 'crc32',   'slot_of(u, N)'),
    ('mi_uuid', 'u', 'jump',    'jump_slot(u, N)'),
    ('mi_uuid', 'u', 'pg_hash', 'pg_hash_slot(u, N)')
) AS c(rel, key, method, filter)
CROSS JOIN (VALUES (1), (3), (8)) AS ns(n)
CROSS JOIN LATERAL mi_check(c.rel::regclass, c.key, c.method, c.filter, ns.n) r
ORDER BY c.rel, c.method, c.filter, n;

-- every row of mi_big has a slot: the shares are not empty
SELECT s, count(m.id) > 50 AS has_rows FROM generate_series(0, 7) s
LEFT JOIN LATERAL my_items(NULL::mi_big, s, 8) m ON true GROUP BY s ORDER BY s;

-- A key that is not the primary key, given by name
SELECT count(*) FILTER (WHERE slot_of(note, 5) <> 4) AS wrong_slot, count(*) AS rows
FROM my_items(NULL::mi_int, 4, 5, key => 'note');

-- Keyset paging: walk a share in batches of `batch` rows with `after`.
CREATE FUNCTION mi_walk(rel anyelement, key text, slot integer, n integer, batch integer)
RETURNS TABLE (step integer, k text)
LANGUAGE plpgsql AS $$
DECLARE
    last text;
    got integer;
BEGIN
    step := 0;
    LOOP
        step := step + 1;
        got := 0;
        FOR k IN EXECUTE format(
                'SELECT m.%I::text FROM my_items($1, $2, $3, key => $4, after => $5, batch => $6) m', key)
            USING rel, slot, n, key, last, batch LOOP
            got := got + 1;
            last := k;
            RETURN NEXT;
        END LOOP;
        EXIT WHEN got < batch;
    END LOOP;
END $$;

-- bigint keys: every row of the share once, in key order, in ceil((rows + 1) / batch) calls
WITH walk AS (SELECT step, k::bigint AS id, row_number() OVER () AS pos FROM mi_walk(NULL::mi_big, 'id', 3, 8, 7)),
     share AS (SELECT id FROM mi_big WHERE slot_of(id, 8) = 3)
SELECT (SELECT count(*) FROM walk) AS walked,
       (SELECT count(DISTINCT id) FROM walk) AS distinct_walked,
       (SELECT count(*) FROM share) AS share_rows,
       (SELECT array_agg(id ORDER BY pos) FROM walk) = (SELECT array_agg(id ORDER BY id) FROM share) AS same_rows_in_key_order,
       (SELECT max(step) FROM walk) = (SELECT count(*) / 7 + 1 FROM share) AS calls_expected;

-- text keys: order and `after` comparisons use the column's own type and collation
WITH walk AS (SELECT k, row_number() OVER () AS pos FROM mi_walk(NULL::mi_text, 'k', 1, 3, 25)),
     share AS (SELECT k FROM mi_text WHERE slot_of(k, 3) = 1)
SELECT (SELECT count(*) FROM walk) = (SELECT count(*) FROM share) AS all_walked,
       (SELECT count(DISTINCT k) FROM walk) = (SELECT count(*) FROM walk) AS none_twice,
       (SELECT array_agg(k ORDER BY pos) FROM walk) = (SELECT array_agg(k ORDER BY k) FROM share) AS key_order;

-- uuid keys, jump method
WITH walk AS (SELECT k::uuid AS u, row_number() OVER () AS pos FROM mi_walk(NULL::mi_uuid, 'u', 0, 2, 100))
SELECT count(*) = (SELECT count(*) FROM mi_uuid WHERE slot_of(u, 2) = 0) AS all_walked,
       count(DISTINCT u) = count(*) AS none_twice,
       array_agg(u ORDER BY pos) = (SELECT array_agg(u ORDER BY u) FROM mi_uuid WHERE slot_of(u, 2) = 0) AS key_order
FROM walk;

-- one page
SELECT id FROM my_items(NULL::mi_int, 3, 8, after => '-100', batch => 4);
SELECT id FROM my_items(NULL::mi_int, 3, 8, after => '490');
-- a batch alone starts at the smallest key
SELECT id FROM my_items(NULL::mi_int, 0, 8, batch => 3);

-- the query my_items runs, for EXPLAIN or for running it yourself
SELECT my_items_query('mi_big'::regtype, 3, 8);
SELECT my_items_query('mi_big'::regtype, 3, 8, method => 'jump', after => '0', batch => 50);
SELECT my_items_query('mi_int'::regtype, 3, 8, method => 'crc32');
SELECT my_items_query('mi_text'::regtype, 3, 8, method => 'pg_hash', after => 'm');

-- my_items works whatever the search_path: its query names pg_claim's schema
CREATE SCHEMA mi_elsewhere;
CREATE TABLE mi_elsewhere."Odd ""Name"" Table" (id bigint PRIMARY KEY);
INSERT INTO mi_elsewhere."Odd ""Name"" Table" SELECT generate_series(1, 20);
SET search_path = mi_elsewhere;
SELECT array_agg(id ORDER BY id) FROM public.my_items(NULL::"Odd ""Name"" Table", 1, 4);
RESET search_path;

DROP SCHEMA mi_elsewhere CASCADE;
DROP FUNCTION mi_walk(anyelement, text, integer, integer, integer);
DROP FUNCTION mi_check(regclass, text, text, text, integer);
DROP TABLE mi_int, mi_big, mi_text, mi_uuid;
