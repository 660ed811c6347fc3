-- my_items on keys whose type has a modifier, NULL keys, custom hash operator
-- classes and collations: a share is exactly the rows of the caller's own
-- SELECT ... WHERE <mapping>(key, n) = slot, on every method and path, and
-- paging with after/batch visits each of them once.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- Walks a share with after/batch the way a worker does and returns the keys
-- visited, in order, as text; stops after 10000 batches so a paging loop
-- that never advances shows up as a wrong result instead of a hang.
CREATE FUNCTION mk_walk(rel regclass, slot integer, n integer, key text, method text, batch integer)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    last text := NULL;
    got text[] := '{}';
    page text[];
    i integer := 0;
BEGIN
    LOOP
        EXECUTE format('SELECT array_agg(k ORDER BY o) FROM (SELECT %I::text AS k, row_number() OVER () AS o
                        FROM my_items(NULL::%s, $1, $2, key => $3, method => $4, after => $5, batch => $6)) s',
                       key, rel)
            INTO page USING slot, n, key, method, last, batch;
        EXIT WHEN page IS NULL;
        got := got || page;
        last := page[array_length(page, 1)];
        i := i + 1;
        IF i > 10000 THEN RAISE EXCEPTION 'paging of % does not advance', rel; END IF;
    END LOOP;
    RETURN got;
END $$;

-- The share as the caller's own filter gives it, in key order, as text.
CREATE FUNCTION mk_filter(rel regclass, slot integer, n integer, key text, fn text)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE got text[];
BEGIN
    EXECUTE format('SELECT coalesce(array_agg(%1$I::text ORDER BY %1$I), ''{}'') FROM %2$s WHERE %3$s(%1$I, $2) = $1',
                   key, rel, fn)
        INTO got USING slot, n;
    RETURN got;
END $$;

-- Keys with a type modifier: char(5), varchar(8), time(2), numeric(7,2),
-- timestamp(0). The after cast keeps the modifier (char(5), not char(1)).
CREATE TABLE mk_char (code char(5) PRIMARY KEY, v integer);
INSERT INTO mk_char SELECT lpad(g::text, 5, '0'), g FROM generate_series(1, 200) g;
CREATE TABLE mk_varchar (code varchar(8) PRIMARY KEY);
INSERT INTO mk_varchar SELECT 'k' || g FROM generate_series(1, 200) g;
CREATE TABLE mk_time (t time(2) PRIMARY KEY);
INSERT INTO mk_time SELECT time '00:00' + g * interval '1.25 s' FROM generate_series(0, 199) g;
CREATE TABLE mk_num (x numeric(7,2) PRIMARY KEY);
INSERT INTO mk_num SELECT g / 4.0 FROM generate_series(1, 200) g;
CREATE TABLE mk_ts (t timestamp(0) PRIMARY KEY);
INSERT INTO mk_ts SELECT timestamp '2026-01-01' + g * interval '1 hour' FROM generate_series(1, 200) g;

-- The reproduction: after '00003' in batches of 3 starts at 00004.
SELECT code FROM my_items(NULL::mk_char, 0, 1, after => '00003', batch => 3);
SELECT my_items_query('mk_char'::regtype, 0, 1, after => '00003', batch => 3);

-- Every slot of every table and method: the walk in batches of 7 equals the
-- filter, each key once.
SELECT t.rel, t.method,
       bool_and(mk_walk(t.rel, s, 4, t.key, t.method, 7) = mk_filter(t.rel, s, 4, t.key, t.fn)) AS walk_equals_filter,
       sum(array_length(mk_walk(t.rel, s, 4, t.key, t.method, 7), 1)) AS visited
FROM (VALUES
    ('mk_char'::regclass, 'code', 'auto', 'slot_of'),
    ('mk_char', 'code', 'jump', 'jump_slot'),
    ('mk_char', 'code', 'pg_hash', 'pg_hash_slot'),
    ('mk_varchar', 'code', 'auto', 'slot_of'),
    ('mk_varchar', 'code', 'pg_hash', 'pg_hash_slot'),
    ('mk_time', 't', 'pg_hash', 'pg_hash_slot'),
    ('mk_num', 'x', 'pg_hash', 'pg_hash_slot'),
    ('mk_ts', 't', 'pg_hash', 'pg_hash_slot')) AS t(rel, key, method, fn)
CROSS JOIN generate_series(0, 3) s
GROUP BY 1, 2 ORDER BY t.rel::text, t.method;

-- A hash-partitioned table with NULL keys: the partition that PostgreSQL
-- routes NULL keys to is read without them (NULL keys belong to no slot).
CREATE TABLE mk_hp (id integer, note text) PARTITION BY HASH (id);
CREATE TABLE mk_hp0 PARTITION OF mk_hp FOR VALUES WITH (modulus 2, remainder 0);
CREATE TABLE mk_hp1 PARTITION OF mk_hp FOR VALUES WITH (modulus 2, remainder 1);
INSERT INTO mk_hp SELECT g, 'n' || g FROM generate_series(1, 100) g;
INSERT INTO mk_hp VALUES (NULL, 'null key'), (NULL, 'another null key');
SELECT my_items_query('mk_hp'::regtype, 0, 2, key => 'id', method => 'pg_hash');
SELECT s AS slot,
       (SELECT count(*) FROM my_items(NULL::mk_hp, s, 2, key => 'id', method => 'pg_hash')) AS share,
       (SELECT count(*) FROM mk_hp WHERE pg_hash_slot(id, 2) = s) AS filter,
       (SELECT count(*) FROM my_items(NULL::mk_hp, s, 2, key => 'id', method => 'pg_hash') WHERE id IS NULL) AS null_keys
FROM generate_series(0, 1) s;
SELECT * FROM slot_counts('mk_hp', 2, 'id', 'pg_hash');

-- A custom hash operator class on the partition key: PostgreSQL routes by
-- it, pg_hash_slot by the type's default class, so the share is read
-- through the table with the filter, never as a partition.
CREATE FUNCTION mk_odd_hash(integer, bigint) RETURNS bigint LANGUAGE sql IMMUTABLE STRICT
    AS 'SELECT ($1::bigint * 7 + 1) # $2';
CREATE OPERATOR CLASS mk_int_ops FOR TYPE integer USING hash AS
    OPERATOR 1 =, FUNCTION 2 mk_odd_hash(integer, bigint);
CREATE TABLE mk_custom (id integer PRIMARY KEY) PARTITION BY HASH (id mk_int_ops);
CREATE TABLE mk_custom0 PARTITION OF mk_custom FOR VALUES WITH (modulus 2, remainder 0);
CREATE TABLE mk_custom1 PARTITION OF mk_custom FOR VALUES WITH (modulus 2, remainder 1);
INSERT INTO mk_custom SELECT generate_series(1, 100);
SELECT my_items_query('mk_custom'::regtype, 0, 2, method => 'pg_hash');
SELECT s AS slot,
       (SELECT array_agg(id ORDER BY id) FROM my_items(NULL::mk_custom, s, 2, method => 'pg_hash'))
         = (SELECT array_agg(id ORDER BY id) FROM mk_custom WHERE pg_hash_slot(id, 2) = s) AS share_equals_filter,
       (SELECT count(*) FROM my_items(NULL::mk_custom, s, 2, method => 'pg_hash')) AS share,
       (SELECT count(*) FROM ONLY mk_custom0) AS partition_0
FROM generate_series(0, 1) s;

-- A partition key with another collation than the column: the same.
CREATE TABLE mk_coll (k text COLLATE "C") PARTITION BY HASH (k COLLATE "POSIX");
CREATE TABLE mk_coll0 PARTITION OF mk_coll FOR VALUES WITH (modulus 2, remainder 0);
CREATE TABLE mk_coll1 PARTITION OF mk_coll FOR VALUES WITH (modulus 2, remainder 1);
INSERT INTO mk_coll SELECT 'k' || g FROM generate_series(1, 50) g;
SELECT my_items_query('mk_coll'::regtype, 1, 2, key => 'k', method => 'pg_hash') LIKE '%FROM public.mk_coll WHERE%' AS reads_the_table;

-- The shortcut, where it is the same set: one partition, without NULL keys.
CREATE TABLE mk_plain (id integer, v text) PARTITION BY HASH (id);
CREATE TABLE mk_plain0 PARTITION OF mk_plain FOR VALUES WITH (modulus 2, remainder 0);
CREATE TABLE mk_plain1 PARTITION OF mk_plain FOR VALUES WITH (modulus 2, remainder 1);
SELECT my_items_query('mk_plain'::regtype, 1, 2, key => 'id', method => 'pg_hash', after => '5', batch => 10);

DROP TABLE mk_char, mk_varchar, mk_time, mk_num, mk_ts, mk_hp, mk_custom, mk_coll, mk_plain;
DROP OPERATOR CLASS mk_int_ops USING hash;
DROP OPERATOR FAMILY mk_int_ops USING hash;
DROP FUNCTION mk_odd_hash(integer, bigint), mk_walk(regclass, integer, integer, text, text, integer),
    mk_filter(regclass, integer, integer, text, text);
