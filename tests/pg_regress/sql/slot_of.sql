-- slot_of and crc32 (README.md, docs/choosing-a-mapping.md)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- the CRC-32/ISO-HDLC check value, for text and bytea
SELECT crc32('123456789') AS check_value, crc32('\x313233343536373839'::bytea) AS same_bytes;
SELECT crc32('') AS empty, crc32('a') AS a, crc32('héllo') = crc32(convert_to('héllo', 'UTF8')) AS utf8_bytes;

-- integer keys: the non-negative remainder, for every integer width
SELECT k, slot_of(k::smallint, 3) AS int2, slot_of(k::integer, 3) AS int4, slot_of(k::bigint, 3) AS int8, k % 3 AS sql_mod
FROM (VALUES (-7), (-1), (0), (1), (7), (32767)) v(k);
SELECT slot_of((-9223372036854775808)::bigint, 3) AS int8_min,
       slot_of(9223372036854775807::bigint, 2147483647) AS int8_max,
       slot_of((-2147483648)::integer, 10) AS int4_min,
       slot_of((-32768)::smallint, 10) AS int2_min;

-- text, bytea and uuid keys: crc32 mod n
SELECT slot_of('123456789', 10) AS text_slot, 3421780262 % 10 AS expected;
SELECT slot_of('\x313233343536373839'::bytea, 10) AS bytea_slot;
SELECT slot_of('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, 1000)
     = crc32('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11') % 1000 AS uuid_is_crc32_of_text;
-- the uuid's text form is lowercase whatever the input's case
SELECT slot_of('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'::uuid, 1000)
     = slot_of('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 1000) AS uuid_lowercase;
SELECT slot_of('', 5) AS empty_key, slot_of('日本語', 1) AS n_is_one;

-- every result is in 0 .. n-1
SELECT bool_and(slot_of(g, 7) BETWEEN 0 AND 6)
   AND bool_and(slot_of(g::text, 7) BETWEEN 0 AND 6)
   AND bool_and(slot_of(md5(g::text)::uuid, 7) BETWEEN 0 AND 6) AS in_range
FROM generate_series(-1000, 1000) g;

-- STRICT: NULL in, NULL out
SELECT slot_of(NULL::text, 3) IS NULL AS null_key, slot_of(1, NULL) IS NULL AS null_n, crc32(NULL::text) IS NULL AS null_crc;

-- n < 1 is SQLSTATE 22023 with a hint
\set VERBOSITY default
SELECT slot_of(5, 0);
SELECT slot_of('abc', -3);
SELECT slot_of('abc'::bytea, 0);
\set VERBOSITY sqlstate
SELECT slot_of(5::bigint, -1);
SELECT slot_of('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, 0);
\set VERBOSITY default

-- planner markings: IMMUTABLE STRICT PARALLEL SAFE, no SET clause
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       p.provolatile AS vol, p.proisstrict AS strict, p.proparallel AS par, p.proconfig AS config
FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_claim'
WHERE p.proname IN ('slot_of', 'crc32')
ORDER BY 1, 2;
