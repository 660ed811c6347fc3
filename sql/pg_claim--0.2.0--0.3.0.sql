-- pg_claim 0.2.0 -> 0.3.0, run by ALTER EXTENSION pg_claim UPDATE.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.2.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.3.0'" to load this file. \quit

-- Lease names: at most 1024 bytes. A longer name used to reach the primary
-- key of pg_claim_leases and fail there (54000, with a hint about indexes);
-- lease_check now refuses it with 22023 and a hint, and my_token checks its
-- name the same way. (The bodies are those of sql/leases.sql.)
CREATE OR REPLACE FUNCTION @extschema@.lease_check(name text, slot integer, token bigint, ttl interval)
RETURNS void LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'The name identifies the worker fleet, e.g. claim_lease(''mailer'', 8, ''worker-1''); a NULL name is usually an unset variable in the client.';
    END IF;
    -- names are keys of pg_claim_leases' primary key, whose entries must fit
    -- in a third of a page
    IF pg_catalog.octet_length(name) > 1024 THEN
        RAISE EXCEPTION 'name must be at most 1024 bytes, got % bytes (starting "%")',
            pg_catalog.octet_length(name), pg_catalog.left(name, 20)
            USING ERRCODE = '22023',
            HINT = 'The name identifies the worker fleet: use a short name such as ''mailer''.';
    END IF;
    IF slot IS NULL OR token IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN slot IS NULL THEN 'slot' ELSE 'token' END
            USING ERRCODE = '22004',
            HINT = 'Pass the slot and token claim_lease returned.';
    END IF;
    IF slot < 0 OR slot >= 1048576 THEN
        RAISE EXCEPTION 'slot must be between 0 and 1048575, got %', slot USING ERRCODE = '22023',
            HINT = 'Pass the slot claim_lease returned.';
    END IF;
    IF ttl IS NULL THEN
        RAISE EXCEPTION 'ttl must not be null' USING ERRCODE = '22004',
            HINT = 'Pass how long the lease lasts without a renewal, e.g. interval ''30 seconds''.';
    END IF;
    IF ttl <= interval '0' OR ttl > interval '1 day' THEN
        RAISE EXCEPTION 'ttl must be more than 0 and at most 1 day, got %', ttl USING ERRCODE = '22023',
            HINT = 'A lease lasts ttl without a renewal: choose a few times the renew period, e.g. 30 seconds renewed every 10.';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.my_token(name text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s integer;
    me text;
    r record;
    had_row boolean;
BEGIN
    IF name IS NULL THEN
        RETURN NULL;
    END IF;
    -- the name's checks (its length), as for a lease
    PERFORM @extschema@.lease_check(name, 0, 0, interval '1 second');
    s := @extschema@.my_slot(name);
    IF s IS NULL THEN
        RETURN NULL;
    END IF;
    me := 'session ' || pg_catalog.pg_backend_pid() || ' '
          || (SELECT extract(epoch FROM a.backend_start)
              FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a);
    SELECT l.holder, l.token, l.session INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = my_token.name AND l.slot = s;
    had_row := FOUND;
    IF had_row AND r.holder = me AND r.session THEN
        RETURN r.token;
    END IF;
    IF EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
               WHERE l.name = my_token.name AND NOT l.session AND l.holder IS NOT NULL) THEN
        RAISE EXCEPTION 'name "%" is leased with claim_lease; it cannot also be claimed with claim_slot', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
    END IF;
    IF had_row THEN
        -- the slot changed hands: wait for the previous holder's fenced
        -- transactions, then record this session with a greater token
        PERFORM 1 FROM @extschema@.pg_claim_leases l WHERE l.name = my_token.name AND l.slot = s FOR UPDATE;
        UPDATE @extschema@.pg_claim_leases l
        SET holder = me, session = true, n = NULL, token = @extschema@.next_token(l.token),
            acquired_at = pg_catalog.clock_timestamp(), expires_at = NULL
        WHERE l.name = my_token.name AND l.slot = s
        RETURNING l.token INTO r;
        RETURN r.token;
    END IF;
    INSERT INTO @extschema@.pg_claim_leases AS l (name, slot, holder, session, token, acquired_at)
    VALUES (my_token.name, s, me, true, @extschema@.next_token(NULL), pg_catalog.clock_timestamp())
    ON CONFLICT ON CONSTRAINT pg_claim_leases_pkey DO UPDATE
        SET holder = excluded.holder, session = true, n = NULL,
            token = @extschema@.next_token(l.token), acquired_at = excluded.acquired_at,
            expires_at = NULL
    RETURNING l.token INTO r;
    RETURN r.token;
END $$;

-- ---------------------------------------------------------------------------
-- my_items, my_items_query, slot_counts, slot_skew: new arguments `route`
-- (map a column other than the key to the slot, page on the key) and, for
-- my_items and my_items_query, `pending` (only the rows a boolean or
-- nullable column marks as pending, so a partial index serves the share).
-- A function's arguments are part of its identity: the old signatures are
-- dropped and the new ones created, with their comments. my_items_query and
-- slot_counts_query become version-1 C functions named pg_claim_<name>; the
-- library still exports the C names 0.2.0 declared (my_items_query_wrapper,
-- slot_counts_query_wrapper) and reads only the arguments a call passes, so
-- a database still at 0.2.0 works with this library until it is updated.
-- ---------------------------------------------------------------------------
DROP FUNCTION @extschema@.slot_skew(regclass, integer, text, text);
DROP FUNCTION @extschema@.slot_counts(regclass, integer, text, text);
DROP FUNCTION @extschema@.slot_counts_query(oid, integer, text, text);
DROP FUNCTION @extschema@.my_items(anyelement, integer, integer, text, text, text, integer, text[]);
DROP FUNCTION @extschema@.my_items_query(oid, integer, integer, text, text, text, integer, text[]);

CREATE FUNCTION @extschema@.my_items_query(
    rel oid, slot integer, n integer,
    key text DEFAULT NULL, method text DEFAULT 'auto',
    after text DEFAULT NULL, batch integer DEFAULT NULL, columns text[] DEFAULT NULL,
    route text DEFAULT NULL, pending text DEFAULT NULL)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_my_items_query';

CREATE FUNCTION @extschema@.slot_counts_query(
    rel oid, n integer, key text DEFAULT NULL, method text DEFAULT 'auto',
    route text DEFAULT NULL)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_slot_counts_query';

CREATE FUNCTION @extschema@.my_items(
    rel anyelement, slot integer, n integer,
    key text DEFAULT NULL, method text DEFAULT 'auto',
    after text DEFAULT NULL, batch integer DEFAULT NULL, columns text[] DEFAULT NULL,
    route text DEFAULT NULL, pending text DEFAULT NULL)
RETURNS SETOF anyelement
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_my_items';
COMMENT ON FUNCTION @extschema@.my_items(anyelement, integer, integer, text, text, text, integer, text[], text, text) IS
    'the rows of a table whose key (or route column) maps to slot of n: SELECT * FROM my_items(NULL::tbl, slot, n)';

CREATE FUNCTION @extschema@.slot_counts(
    rel regclass, n integer, key text DEFAULT NULL, method text DEFAULT 'auto',
    route text DEFAULT NULL)
RETURNS TABLE (slot integer, items bigint)
LANGUAGE plpgsql STABLE
AS $body$
BEGIN
    RETURN QUERY EXECUTE @extschema@.slot_counts_query(rel, n, key, method, route) USING n;
END
$body$;
COMMENT ON FUNCTION @extschema@.slot_counts(regclass, integer, text, text, text) IS
    'rows per slot 0 .. n-1 (0 for empty slots) of a table split by key (or route column)';

CREATE FUNCTION @extschema@.slot_skew(
    rel regclass, n integer, key text DEFAULT NULL, method text DEFAULT 'auto',
    route text DEFAULT NULL)
RETURNS TABLE (slots integer, items bigint, min_items bigint, max_items bigint,
               mean_items numeric, max_over_mean numeric)
LANGUAGE sql STABLE
AS $body$
    SELECT pg_catalog.count(*)::integer, pg_catalog.sum(c.items)::bigint,
           pg_catalog.min(c.items), pg_catalog.max(c.items),
           pg_catalog.round(pg_catalog.avg(c.items), 2),
           CASE WHEN pg_catalog.sum(c.items) OPERATOR(pg_catalog.>) 0
                THEN pg_catalog.round(pg_catalog.max(c.items) OPERATOR(pg_catalog./) pg_catalog.avg(c.items), 3) END
    FROM @extschema@.slot_counts(rel, n, key, method, route) AS c
$body$;
COMMENT ON FUNCTION @extschema@.slot_skew(regclass, integer, text, text, text) IS
    'how even a split is: smallest, largest and mean slot, and largest / mean';
