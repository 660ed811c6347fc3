-- pg_claim 0.2.0 -> 0.3.0, run by ALTER EXTENSION pg_claim UPDATE.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.2.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.3.0'" to load this file. \quit

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
