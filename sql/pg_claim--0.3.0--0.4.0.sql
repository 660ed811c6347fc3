-- pg_claim 0.3.0 -> 0.4.0, run by ALTER EXTENSION pg_claim UPDATE.
-- History, append-only: a released step is never edited; a change goes in a new step.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.3.0 stay valid.

-- ==== items ====
-- slot_counts calls slot_counts_query exact-typed (rel::oid): with rel as a
-- regclass, a slot_counts_query(regclass, ...) created in pg_claim's schema
-- matched better and ran instead. (The body is that of sql/items.sql.)
CREATE OR REPLACE FUNCTION @extschema@.slot_counts(
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

-- notify_slot becomes a C trigger function (src/wake.rs): the same
-- arguments and channels, about the cost of a hand-written pg_notify
-- trigger, and no SQL function resolved per row. Triggers that use it keep
-- working (same function, replaced in place).
CREATE OR REPLACE FUNCTION @extschema@.notify_slot()
RETURNS trigger
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_claim_notify_slot';
