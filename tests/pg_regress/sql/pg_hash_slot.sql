-- pg_hash_slot (README.md, docs/choosing-a-mapping.md). The slot is the remainder of the partition that
-- PostgreSQL's own PARTITION BY HASH (key) with MODULUS n routes the key to.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE TYPE phs_mood AS ENUM ('sad', 'ok', 'happy', 'ecstatic');
CREATE DOMAIN phs_code AS text CHECK (VALUE <> '');

-- For each key type and modulus: build a real hash-partitioned table, insert
-- keys, and compare the partition each row landed in (its remainder, read
-- back from the catalog) with pg_hash_slot, and with the server's own
-- satisfies_hash_partition. Returns one row per (type, modulus).
CREATE FUNCTION phs_check(typ text, key_sql text, moduli int[])
RETURNS TABLE (key_type text, modulus int, keys bigint, partitions_used bigint,
               all_match boolean, server_agrees boolean)
LANGUAGE plpgsql AS $$
DECLARE
    m int;
    r int;
BEGIN
    FOREACH m IN ARRAY moduli LOOP
        EXECUTE format('CREATE TABLE phs_t (k %s) PARTITION BY HASH (k)', typ);
        FOR r IN 0 .. m - 1 LOOP
            EXECUTE format('CREATE TABLE phs_t_%s PARTITION OF phs_t FOR VALUES WITH (MODULUS %s, REMAINDER %s)', r, m, r);
        END LOOP;
        EXECUTE format($i$INSERT INTO phs_t SELECT k FROM (%s) s(k)$i$, key_sql);
        RETURN QUERY EXECUTE format($q$
            SELECT %L::text, %s, count(*), count(DISTINCT t.tableoid),
                   bool_and(pg_hash_slot(t.k, %s) =
                            substring(pg_get_expr(c.relpartbound, c.oid) FROM 'remainder (\d+)')::int),
                   bool_and(satisfies_hash_partition('phs_t'::regclass, %s, pg_hash_slot(t.k, %s), t.k))
            FROM phs_t t JOIN pg_class c ON c.oid = t.tableoid$q$, typ, m, m, m, m);
        DROP TABLE phs_t;
    END LOOP;
END $$;

SELECT * FROM phs_check('integer', 'SELECT g FROM generate_series(-2000, 2000) g', '{1,2,3,4,7,16}');
SELECT * FROM phs_check('bigint', $$SELECT ('x' || substr(md5(g::text), 1, 16))::bit(64)::bigint FROM generate_series(1, 3000) g$$, '{2,5,8,13}');
SELECT * FROM phs_check('smallint', 'SELECT g::smallint FROM generate_series(-32768, 32767, 17) g', '{3,8}');
SELECT * FROM phs_check('text', $$SELECT 'customer-' || md5(g::text) || CASE WHEN g % 3 = 0 THEN 'ü日本' ELSE '' END FROM generate_series(1, 3000) g$$, '{2,4,7,10}');
SELECT * FROM phs_check('varchar(40)', $$SELECT left(md5(g::text), 1 + g % 39) FROM generate_series(1, 2000) g$$, '{3,6}');
SELECT * FROM phs_check('uuid', 'SELECT md5(g::text)::uuid FROM generate_series(1, 3000) g', '{2,4,9,16}');
SELECT * FROM phs_check('date', $$SELECT date '2000-01-01' + g FROM generate_series(-3000, 3000, 3) g$$, '{3,7,12}');
SELECT * FROM phs_check('numeric', 'SELECT (g * 1.37)::numeric(12,2) FROM generate_series(-1500, 1500) g', '{4,5,11}');
SELECT * FROM phs_check('timestamptz', $$SELECT timestamptz '2024-01-01 00:00+00' + g * interval '37 minutes 13.5 seconds' FROM generate_series(1, 2000) g$$, '{4,6}');
SELECT * FROM phs_check('bytea', 'SELECT decode(md5(g::text), ''hex'') FROM generate_series(1, 2000) g', '{3,8}');
SELECT * FROM phs_check('boolean', 'SELECT g % 2 = 0 FROM generate_series(1, 100) g', '{2,3}');
-- (an enum hashes its labels' OIDs, which differ from one CREATE TYPE to the next)
SELECT key_type, modulus, keys, all_match, server_agrees FROM phs_check('phs_mood', $$SELECT (enum_range(NULL::phs_mood))[1 + g % 4] FROM generate_series(1, 200) g$$, '{2,3}');
SELECT * FROM phs_check('phs_code', 'SELECT md5(g::text) FROM generate_series(1, 1000) g', '{5}');
SELECT * FROM phs_check('integer[]', 'SELECT ARRAY[g, g * 7, -g] FROM generate_series(1, 1000) g', '{3,4}');
-- a column with a non-deterministic collation: the call takes the column's
-- collation, as the partition key does, so keys equal under it share a slot
CREATE COLLATION phs_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
SELECT * FROM phs_check('text COLLATE phs_ci', $$SELECT CASE WHEN g % 2 = 0 THEN upper(md5(g::text)) ELSE md5(g::text) END FROM generate_series(1, 1000) g$$, '{3,5}');
SELECT pg_hash_slot('ABC'::text COLLATE phs_ci, 1000) = pg_hash_slot('abc'::text COLLATE phs_ci, 1000) AS ci_equal_keys_same_slot;
SELECT * FROM phs_check('float8', 'SELECT g / 7.0::float8 FROM generate_series(-1000, 1000) g', '{6}');

-- a literal hashes like a cast value; varchar hashes like text (its default hash opclass)
SELECT pg_hash_slot(42, 8) = pg_hash_slot(42::integer, 8) AS same_int,
       pg_hash_slot('abc'::text, 8) = pg_hash_slot('abc'::varchar, 8) AS text_and_varchar,
       pg_hash_slot(0::integer, 1) AS n_is_one,
       pg_hash_slot(NULL::integer, 4) IS NULL AS null_key,
       pg_hash_slot(1, NULL) IS NULL AS null_n;

-- every result is in 0 .. n-1, including the largest n
SELECT bool_and(pg_hash_slot(g, 7) BETWEEN 0 AND 6)
   AND bool_and(pg_hash_slot(g::text, 2147483647) BETWEEN 0 AND 2147483646) AS in_range
FROM generate_series(1, 10000) g;

-- the point of it: a worker's share of a hash-partitioned table is one partition,
-- and the planner prunes to it
CREATE TABLE phs_jobs (id bigint PRIMARY KEY, payload text) PARTITION BY HASH (id);
CREATE TABLE phs_jobs_0 PARTITION OF phs_jobs FOR VALUES WITH (MODULUS 4, REMAINDER 0);
CREATE TABLE phs_jobs_1 PARTITION OF phs_jobs FOR VALUES WITH (MODULUS 4, REMAINDER 1);
CREATE TABLE phs_jobs_2 PARTITION OF phs_jobs FOR VALUES WITH (MODULUS 4, REMAINDER 2);
CREATE TABLE phs_jobs_3 PARTITION OF phs_jobs FOR VALUES WITH (MODULUS 4, REMAINDER 3);
INSERT INTO phs_jobs SELECT g, 'job ' || g FROM generate_series(1, 1000) g;
SELECT pg_hash_slot(id, 4) AS slot, tableoid::regclass AS partition, count(*) > 0 AS has_rows
FROM phs_jobs GROUP BY 1, 2 ORDER BY 1;
-- the key's own partition is the one pg_hash_slot names
EXPLAIN (COSTS OFF) SELECT * FROM phs_jobs WHERE id = 17;
SELECT 'phs_jobs_' || pg_hash_slot(17::bigint, 4) AS partition_of_17;
DROP TABLE phs_jobs;

-- errors: n < 1 is SQLSTATE 22023; a type without a hash opclass is 42883
\set VERBOSITY default
SELECT pg_hash_slot(5, 0);
SELECT pg_hash_slot(point '(1,2)', 4);
SELECT pg_hash_slot('{"a": 1}'::json, 4);
\set VERBOSITY sqlstate
SELECT pg_hash_slot('abc'::text, -1);
SELECT pg_hash_slot(point '(1,2)', 4);
\set VERBOSITY default

-- planner markings: IMMUTABLE STRICT PARALLEL SAFE, no SET clause
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       p.provolatile, p.proisstrict, p.proparallel, p.proconfig
FROM pg_proc p WHERE p.proname = 'pg_hash_slot';

DROP FUNCTION phs_check(text, text, int[]);
DROP COLLATION phs_ci;
DROP DOMAIN phs_code;
DROP TYPE phs_mood;
