-- Generated SQL resolves to pg_claim's own functions whatever overloads
-- exist. A database owner who is not a superuser installs pg_claim (trusted)
-- into public, which it owns, and plants there overloads that match the
-- generated calls better than pg_claim's functions would if the calls were
-- not exact-typed: slot_of for varchar, char(n) and domain keys, jump_slot
-- for integer keys, slot_counts_query for a regclass, pg_hash_slot for
-- varchar (polymorphic: an exact overload wins, so my_items refuses with
-- 42723). Every planted function raises a NOTICE if it runs: none appears
-- below, and every share is the one pg_claim's own mapping gives.
-- Then: expression indexes built the natural way serve the exact-typed
-- share query, for every key type.
SET client_min_messages = warning;
DROP DATABASE IF EXISTS cap_owned;
DROP ROLE IF EXISTS cap_owner;
DROP ROLE IF EXISTS cap_worker;
RESET client_min_messages;
CREATE ROLE cap_owner LOGIN;
CREATE ROLE cap_worker LOGIN;
CREATE DATABASE cap_owned OWNER cap_owner;
SELECT current_database() AS regress_db \gset

\c cap_owned cap_owner
CREATE EXTENSION pg_claim;
CREATE DOMAIN cap_code AS text;
CREATE DOMAIN cap_num AS integer;
CREATE TABLE cap_v (k varchar(10) PRIMARY KEY);
CREATE TABLE cap_c (k char(6) PRIMARY KEY);
CREATE TABLE cap_d (k cap_code PRIMARY KEY);
CREATE TABLE cap_i (k integer PRIMARY KEY);
CREATE TABLE cap_n (k cap_num PRIMARY KEY);
INSERT INTO cap_v SELECT 'k' || g FROM generate_series(1, 20) g;
INSERT INTO cap_c SELECT 'k' || g FROM generate_series(1, 20) g;
INSERT INTO cap_d SELECT 'k' || g FROM generate_series(1, 20) g;
INSERT INTO cap_i SELECT g FROM generate_series(1, 20) g;
INSERT INTO cap_n SELECT g FROM generate_series(1, 20) g;
GRANT SELECT, INSERT ON cap_v, cap_c, cap_d, cap_i, cap_n TO cap_worker;

-- the planted overloads, in public (pg_claim's schema here)
CREATE FUNCTION public.slot_of(k varchar, n integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN RAISE NOTICE 'planted slot_of(varchar) ran as %', current_user; RETURN 0; END$$;
CREATE FUNCTION public.slot_of(k bpchar, n integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN RAISE NOTICE 'planted slot_of(bpchar) ran as %', current_user; RETURN 0; END$$;
CREATE FUNCTION public.slot_of(k cap_code, n integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN RAISE NOTICE 'planted slot_of(cap_code) ran as %', current_user; RETURN 0; END$$;
CREATE FUNCTION public.slot_of(k cap_num, n integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN RAISE NOTICE 'planted slot_of(cap_num) ran as %', current_user; RETURN 0; END$$;
CREATE FUNCTION public.jump_slot(k integer, n integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN RAISE NOTICE 'planted jump_slot(integer) ran as %', current_user; RETURN 0; END$$;
CREATE FUNCTION public.pg_hash_slot(k varchar, n integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN RAISE NOTICE 'planted pg_hash_slot(varchar) ran as %', current_user; RETURN 0; END$$;
CREATE FUNCTION public.slot_counts_query(rel regclass, n integer, key text, method text, route text)
RETURNS text LANGUAGE plpgsql AS
$$BEGIN RAISE NOTICE 'planted slot_counts_query ran as %', current_user;
        RETURN 'SELECT 0, 20::bigint'; END$$;

-- shares per slot of 4 as my_items and slot_counts give them, against the
-- extension's own mapping called exact-typed
CREATE FUNCTION cap_shares(tbl regclass, method text, mapped text)
RETURNS TABLE (via_my_items bigint[], via_slot_counts bigint[], expected bigint[])
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('SELECT array_agg((SELECT count(*) FROM my_items(NULL::%s, s, 4, method => %L)) ORDER BY s)
                    FROM generate_series(0, 3) s', tbl, method) INTO via_my_items;
    SELECT array_agg(items ORDER BY slot) INTO via_slot_counts FROM slot_counts(tbl, 4, method => method);
    EXECUTE format('SELECT array_agg((SELECT count(*) FROM %s WHERE %s = s) ORDER BY s)
                    FROM generate_series(0, 3) s', tbl, mapped) INTO expected;
    RETURN NEXT;
END $$;

SELECT 'cap_v' AS tbl, * FROM cap_shares('cap_v', 'auto', 'slot_of(k::text, 4)')
UNION ALL SELECT 'cap_c', * FROM cap_shares('cap_c', 'auto', 'slot_of(k::text, 4)')
UNION ALL SELECT 'cap_d', * FROM cap_shares('cap_d', 'auto', 'slot_of(k::text, 4)')
UNION ALL SELECT 'cap_n', * FROM cap_shares('cap_n', 'auto', 'slot_of(k::integer, 4)')
UNION ALL SELECT 'cap_i jump', * FROM cap_shares('cap_i', 'jump', 'jump_slot(k::bigint, 4)');
-- the queries call pg_claim's functions exact-typed
SELECT my_items_query('cap_v'::regtype, 1, 4) AS varchar_key;
SELECT my_items_query('cap_c'::regtype, 1, 4) AS char_key;
SELECT my_items_query('cap_n'::regtype, 1, 4) AS int_domain_key;
SELECT my_items_query('cap_i'::regtype, 1, 4, method => 'jump') AS jump_int_key;
SELECT slots, items, max_items FROM slot_skew('cap_v', 4);

-- pg_hash_slot is polymorphic: the planted exact overload would win, so
-- the call is refused, naming it
SELECT count(*) FROM my_items(NULL::cap_v, 0, 4, method => 'pg_hash');
SELECT * FROM slot_counts('cap_v', 4, method => 'pg_hash');
-- a key the overload takes through an implicit cast (a domain over text):
-- the call is ambiguous, refused too
SELECT count(*) AS pg_hash_text_domain FROM my_items(NULL::cap_d, 0, 4, method => 'pg_hash');

-- notify_slot maps the key itself: no SQL function runs per row
CREATE TRIGGER cap_v_wake AFTER INSERT ON cap_v FOR EACH ROW EXECUTE FUNCTION notify_slot('cap', '4', 'k');
CREATE TRIGGER cap_c_wake AFTER INSERT ON cap_c FOR EACH ROW EXECUTE FUNCTION notify_slot('cap', '4', 'k');
CREATE TRIGGER cap_n_wake AFTER INSERT ON cap_n FOR EACH ROW EXECUTE FUNCTION notify_slot('cap', '4', 'k', 'jump_slot');

-- the same as a worker role
\c cap_owned cap_worker
SELECT 'cap_v' AS tbl, * FROM cap_shares('cap_v', 'auto', 'slot_of(k::text, 4)')
UNION ALL SELECT 'cap_c', * FROM cap_shares('cap_c', 'auto', 'slot_of(k::text, 4)')
UNION ALL SELECT 'cap_i jump', * FROM cap_shares('cap_i', 'jump', 'jump_slot(k::bigint, 4)');
INSERT INTO cap_v VALUES ('w1');
INSERT INTO cap_c VALUES ('w1');
INSERT INTO cap_n VALUES (21);

-- and as a superuser
\c cap_owned postgres
SELECT 'cap_d' AS tbl, * FROM cap_shares('cap_d', 'auto', 'slot_of(k::text, 4)')
UNION ALL SELECT 'cap_n', * FROM cap_shares('cap_n', 'auto', 'slot_of(k::integer, 4)');
SELECT count(*) FROM my_items(NULL::cap_v, 0, 4, method => 'pg_hash');
INSERT INTO cap_d VALUES ('s1');
INSERT INTO cap_v VALUES ('s1');

\c :regress_db postgres
DROP DATABASE cap_owned;
DROP ROLE cap_owner, cap_worker;

-- Expression indexes built the natural way, slot_of(k, 8) whatever k's
-- type, serve the exact-typed share query: an index scan on it.
CREATE DOMAIN capx_dtext AS text;
CREATE DOMAIN capx_dint AS integer;
CREATE TABLE capx_varchar (k varchar(12) PRIMARY KEY, v int);
CREATE TABLE capx_char (k char(8) PRIMARY KEY, v int);
CREATE TABLE capx_domain (k capx_dtext PRIMARY KEY, v int);
CREATE TABLE capx_int_domain (k capx_dint PRIMARY KEY, v int);
CREATE TABLE capx_int (k integer PRIMARY KEY, v int);
CREATE TABLE capx_bigint (k bigint PRIMARY KEY, v int);
CREATE TABLE capx_uuid (k uuid PRIMARY KEY, v int);
CREATE TABLE capx_text (k text PRIMARY KEY, v int);
CREATE TABLE capx_jump_int (k integer PRIMARY KEY, v int);
SELECT format('INSERT INTO %I SELECT %s, g FROM generate_series(1, 2000) g', t, e)
FROM (VALUES ('capx_varchar', '''k'' || g'), ('capx_char', '''k'' || g'), ('capx_domain', '''k'' || g'),
             ('capx_int_domain', 'g'), ('capx_int', 'g'), ('capx_bigint', 'g'),
             ('capx_uuid', 'md5(g::text)::uuid'), ('capx_text', '''k'' || g'), ('capx_jump_int', 'g')) v(t, e) \gexec
SELECT format('CREATE INDEX ON %I ((%s(k, 8)), k)', t, CASE WHEN t = 'capx_jump_int' THEN 'jump_slot' ELSE 'slot_of' END)
FROM unnest('{capx_varchar,capx_char,capx_domain,capx_int_domain,capx_int,capx_bigint,capx_uuid,capx_text,capx_jump_int}'::text[]) t \gexec
SELECT format('ANALYZE %I', t)
FROM unnest('{capx_varchar,capx_char,capx_domain,capx_int_domain,capx_int,capx_bigint,capx_uuid,capx_text,capx_jump_int}'::text[]) t \gexec
SET enable_seqscan = off;
SET enable_bitmapscan = off;
CREATE FUNCTION capx_plan(t text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE line text;
BEGIN
    EXECUTE format('PREPARE capx_q(integer, integer, text, integer) AS %s',
                   my_items_query(t::regtype, 3, 8, after => NULL, batch => 50,
                                  method => CASE WHEN t = 'capx_jump_int' THEN 'jump' ELSE 'auto' END));
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) EXECUTE capx_q(3, 8, NULL, 50)' LOOP
        RETURN NEXT line;
    END LOOP;
    DEALLOCATE capx_q;
END $$;
SELECT t AS key_table, bool_or(p LIKE '%Index Scan using ' || t || '_slot_of_k_idx%'
                               OR p LIKE '%Index Scan using ' || t || '_jump_slot_k_idx%') AS slot_index_used
FROM unnest('{capx_varchar,capx_char,capx_domain,capx_int_domain,capx_int,capx_bigint,capx_uuid,capx_text,capx_jump_int}'::text[]) t,
     LATERAL capx_plan(t) p
GROUP BY t ORDER BY t;
-- and the share is the same as the filter's
SELECT bool_and((SELECT array_agg(k ORDER BY k) FROM my_items(NULL::capx_char, 3, 8))
                = (SELECT array_agg(k ORDER BY k) FROM capx_char WHERE slot_of(k, 8) = 3)) AS char_share;
RESET enable_seqscan;
RESET enable_bitmapscan;

-- A function created after a session cached its share query: the query is
-- written (and checked) again before it is planned again.
SELECT count(*) AS pg_hash_share FROM my_items(NULL::capx_varchar, 3, 8, method => 'pg_hash');
CREATE FUNCTION public.pg_hash_slot(k varchar, n integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN RAISE NOTICE 'planted pg_hash_slot(varchar) ran'; RETURN 3; END$$;
SET search_path = public, pg_temp;  -- a plan kept with the old path is analysed again
SELECT count(*) AS pg_hash_share FROM my_items(NULL::capx_varchar, 3, 8, method => 'pg_hash');
DROP FUNCTION public.pg_hash_slot(varchar, integer);
RESET search_path;
SELECT count(*) AS pg_hash_share FROM my_items(NULL::capx_varchar, 3, 8, method => 'pg_hash');
DROP TABLE capx_varchar, capx_char, capx_domain, capx_int_domain, capx_int, capx_bigint, capx_uuid, capx_text, capx_jump_int;
DROP DOMAIN capx_dtext, capx_dint;
DROP FUNCTION capx_plan(text);
