-- A database owner who is not a superuser installs pg_claim (trusted), then
-- plants in public, the extension's schema, which it owns, overloads of the
-- helpers the lease and failure functions call, with argument types that a
-- loosely typed call would prefer. Calling every lease and failure function
-- as that owner runs none of them: the owner stays without SUPERUSER and
-- the planted functions record no call. (Every call is exact-typed and
-- schema-qualified; the broad test of every function: tests/hostile.)
SET client_min_messages = warning;
DROP DATABASE IF EXISTS lp_owned;
DROP ROLE IF EXISTS lp_owner;
RESET client_min_messages;
CREATE ROLE lp_owner LOGIN;
CREATE DATABASE lp_owned OWNER lp_owner;
SELECT current_database() AS regress_db \gset

\c lp_owned lp_owner
CREATE EXTENSION pg_claim;
CREATE TABLE planted_ran (fn text);
GRANT ALL ON planted_ran TO PUBLIC;
-- each planted function records its call and tries to make its caller's
-- current user (the owner's, or the superuser's in a SECURITY DEFINER
-- function) grant SUPERUSER to the owner
CREATE FUNCTION plant(fn text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.planted_ran VALUES (fn);
    BEGIN
        EXECUTE 'ALTER ROLE lp_owner SUPERUSER';
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
END $$;
CREATE FUNCTION public.lease_check(name text, slot integer, token integer, ttl interval) RETURNS void
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('lease_check(text,integer,integer,interval)'); END $$;
CREATE FUNCTION public.lease_check(name text, slot bigint, token bigint, ttl interval) RETURNS void
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('lease_check(text,bigint,bigint,interval)'); END $$;
CREATE FUNCTION public.lease_check(name varchar, slot integer, token bigint, ttl interval) RETURNS void
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('lease_check(varchar,integer,bigint,interval)'); END $$;
CREATE FUNCTION public.next_token(previous text) RETURNS bigint
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('next_token(text)'); RETURN 1; END $$;
CREATE FUNCTION public.next_token(previous integer) RETURNS bigint
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('next_token(integer)'); RETURN 1; END $$;
CREATE FUNCTION public.crc32(key varchar) RETURNS bigint
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('crc32(varchar)'); RETURN 1; END $$;
CREATE FUNCTION public.my_slot(name varchar) RETURNS integer
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('my_slot(varchar)'); RETURN 0; END $$;
CREATE FUNCTION public.failure_check(name text, item varchar) RETURNS void
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('failure_check(text,varchar)'); END $$;
CREATE FUNCTION public.pg_claim_need_read_committed(what varchar) RETURNS void
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('pg_claim_need_read_committed(varchar)'); END $$;
CREATE FUNCTION public.lease_holders(name varchar) RETURNS TABLE (slot integer)
    LANGUAGE plpgsql AS $$ BEGIN PERFORM public.plant('lease_holders(varchar)'); END $$;
-- an exact copy of an extension function cannot be created at all
CREATE FUNCTION public.next_token(previous bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';

-- every lease and failure function, as the owner
SELECT count(*) AS leased FROM claim_lease('lp', 2, 'w1');
SELECT count(*) AS again FROM claim_lease('lp', 2, 'w1');
SELECT renew_lease('lp', 0, (SELECT token FROM lease_holders('lp') WHERE slot = 0)) IS NOT NULL AS renewed;
SELECT fence('lp', 0, (SELECT token FROM lease_holders('lp') WHERE slot = 0));
SELECT lease_valid('lp', 0, (SELECT token FROM lease_holders('lp') WHERE slot = 0)) AS valid;
SELECT count(*) AS status_rows FROM slot_status('lp', 2);
SELECT release_lease('lp', 0, (SELECT token FROM lease_holders('lp') WHERE slot = 0)) AS released;
SELECT claim_slot('lp_s', 1) AS slot, my_token('lp_s') > 0 AS token, release_slot('lp_s') AS released;
SELECT record_failure('lp', '1', 'e') AS recorded, failure_due('lp', '1') AS due,
       (SELECT count(*) FROM failing_items('lp')) AS failing,
       (SELECT count(*) FROM item_failures('lp')) AS records,
       clear_failure('lp', '1') AS cleared;

SELECT rolsuper FROM pg_roles WHERE rolname = 'lp_owner';
SELECT count(*) AS planted_calls FROM planted_ran;

\c :regress_db postgres
SELECT rolsuper FROM pg_roles WHERE rolname = 'lp_owner';
DROP DATABASE lp_owned;
DROP ROLE lp_owner;
