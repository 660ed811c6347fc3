-- pg_claim 0.2.0 -> 0.3.0, run by ALTER EXTENSION pg_claim UPDATE.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.2.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.3.0'" to load this file. \quit
