-- pg_claim 0.5.0 -> 0.6.0, run by ALTER EXTENSION pg_claim UPDATE.
-- History, append-only: a released step is never edited; a change goes in a new step.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.5.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.6.0'" to load this file. \quit

-- ==== fleet views ====
-- (the bodies are those of sql/fleets.sql)



-- ==== leases ====
-- (the bodies are those of sql/leases.sql, sql/leases_fleet.sql and
-- sql/slot_partition.sql)



-- ==== end ====
