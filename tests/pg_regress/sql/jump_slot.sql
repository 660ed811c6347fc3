-- jump_slot (README.md, docs/choosing-a-mapping.md). Lamping–Veach jump consistent hash of the key's 64
-- bits (bigint) or of crc32 of the key (text, bytea, uuid's text form).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- the published test vectors
SELECT jump_slot(10863919174838991, 11) AS vector_1_is_6, jump_slot(2202, 100001) AS vector_2_is_15018;
SELECT jump_slot(0, 1) AS n1, jump_slot(-1, 1) AS n1_neg, jump_slot(256, 1024) AS k256_n1024;

-- A reference written here from the paper, in exact numeric arithmetic for the
-- 64-bit multiply and float8 for the division, as the C code does.
CREATE FUNCTION js_ref(key bigint, n int) RETURNS int
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    k numeric := CASE WHEN key < 0 THEN key + 18446744073709551616 ELSE key END;
    b bigint := -1;
    j float8 := 0;
BEGIN
    WHILE j < n LOOP
        b := j::bigint;
        k := mod(k * 2862933555777941757 + 1, 18446744073709551616);
        j := trunc((b + 1)::float8 * (2147483648::float8 / (trunc(k / 8589934592) + 1)::float8));
    END LOOP;
    RETURN b;
END $$;

-- random 64-bit keys (from md5, negative ones included) against the reference
SELECT count(*) AS keys, count(*) FILTER (WHERE k < 0) > 0 AS has_negative,
       bool_and(jump_slot(k, n) = js_ref(k, n)) AS matches_reference
FROM (SELECT ('x' || substr(md5(g::text), 1, 16))::bit(64)::bigint AS k,
             (ARRAY[1, 2, 3, 10, 97, 1000, 65536, 2147483647])[1 + g % 8] AS n
      FROM generate_series(1, 4000) g) s;
SELECT jump_slot((-9223372036854775808)::bigint, 1000) = js_ref((-9223372036854775808)::bigint, 1000) AS int8_min,
       jump_slot(9223372036854775807, 1000) = js_ref(9223372036854775807, 1000) AS int8_max;

-- text, bytea and uuid keys hash crc32 of their bytes (uuid: its text form)
SELECT bool_and(jump_slot(t, 37) = jump_slot(crc32(t), 37)) AS text_is_crc32,
       bool_and(jump_slot(convert_to(t, 'UTF8'), 37) = jump_slot(crc32(t), 37)) AS bytea_is_crc32,
       bool_and(jump_slot(md5(t)::uuid, 37) = jump_slot(crc32(md5(t)::uuid::text), 37)) AS uuid_is_crc32_of_text
FROM (SELECT md5(g::text) || CASE WHEN g % 2 = 0 THEN 'é😀' ELSE '' END AS t FROM generate_series(1, 2000) g) s;
SELECT jump_slot('123456789', 11) = jump_slot(3421780262, 11) AS check_value;

-- every result is in 0 .. n-1
SELECT bool_and(jump_slot(g, 7) BETWEEN 0 AND 6)
   AND bool_and(jump_slot(g::text, 2147483647) BETWEEN 0 AND 2147483646) AS in_range
FROM generate_series(1, 10000) g;

-- Resizing n -> n+1 over 200k keys: jump moves about 1/(n+1) of the keys, all
-- of them into the new slot n; modulo (slot_of) moves about n/(n+1). The
-- tolerance is 0.005 (about 4 standard deviations at n = 1).
CREATE TABLE js_keys AS
SELECT ('x' || substr(md5(g::text), 1, 16))::bit(64)::bigint AS k FROM generate_series(1, 200000) g;
SELECT n,
       abs(jump_moved - 1.0 / (n + 1)) < 0.005 AS jump_moves_1_in_n_plus_1,
       jump_into_new_slot_only,
       abs(mod_moved - n::numeric / (n + 1)) < 0.005 AS modulo_moves_n_in_n_plus_1,
       jump_moved < mod_moved OR n = 1 AS jump_moves_less
FROM (SELECT n,
             avg((jump_slot(k, n) <> jump_slot(k, n + 1))::int) AS jump_moved,
             bool_and(jump_slot(k, n) = jump_slot(k, n + 1) OR jump_slot(k, n + 1) = n) AS jump_into_new_slot_only,
             avg((slot_of(k, n) <> slot_of(k, n + 1))::int) AS mod_moved
      FROM js_keys, unnest(ARRAY[1, 2, 4, 8, 15, 63, 100]) n GROUP BY n) s
ORDER BY n;
-- shrinking n+1 -> n moves only the keys of the removed slot
SELECT bool_and(jump_slot(k, 9) = jump_slot(k, 8) OR jump_slot(k, 9) = 8) AS shrink_moves_only_last_slot
FROM js_keys;
-- and the split is even: every slot of 10 holds 10% of the keys within 0.5%
SELECT bool_and(abs(c / 200000.0 - 0.1) < 0.005) AS even_split
FROM (SELECT jump_slot(k, 10) AS s, count(*) AS c FROM js_keys GROUP BY 1) s;
DROP TABLE js_keys;

-- errors: n < 1 is SQLSTATE 22023 with a hint
\set VERBOSITY default
SELECT jump_slot(5, 0);
SELECT jump_slot('abc', -3);
\set VERBOSITY sqlstate
SELECT jump_slot('abc'::bytea, 0);
SELECT jump_slot('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, 0);
\set VERBOSITY default
SELECT jump_slot(NULL::bigint, 3) IS NULL AS null_key, jump_slot(1, NULL) IS NULL AS null_n;

-- planner markings: IMMUTABLE STRICT PARALLEL SAFE, no SET clause
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       p.provolatile, p.proisstrict, p.proparallel, p.proconfig
FROM pg_proc p WHERE p.proname = 'jump_slot' ORDER BY args;

DROP FUNCTION js_ref(bigint, int);
