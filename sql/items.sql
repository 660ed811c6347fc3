-- my_items (a version-1 C set-returning function, src/items/srf.rs),
-- my_items_query and slot_counts_query (version-1 C functions, src/items.rs),
-- and slot_counts and slot_skew, written around slot_counts_query.
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
    -- exact-typed (rel::oid): a slot_counts_query(regclass, ...) created in
    -- this schema would otherwise match better and run instead
    RETURN QUERY EXECUTE @extschema@.slot_counts_query(rel::pg_catalog.oid, n, key, method, route) USING n;
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
