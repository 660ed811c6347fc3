-- slot_partition: the partition of a table hash-partitioned with modulus n
-- that holds a slot's rows (pg_hash_slot(key, n) = slot), and a clear error
-- for every table it cannot answer for. (docs/my_items.md, "Hash partitions".)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE TABLE sp_events (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false) PARTITION BY HASH (id);
SELECT format('CREATE TABLE sp_events_%s PARTITION OF sp_events FOR VALUES WITH (MODULUS 4, REMAINDER %s)', r, r)
FROM generate_series(0, 3) r \gexec
INSERT INTO sp_events (id) SELECT g FROM generate_series(1, 2000) g;

-- each slot's partition holds exactly the rows with pg_hash_slot(id, 4) = slot
SELECT s, slot_partition('sp_events', s, 4) AS part FROM generate_series(0, 3) s;
SELECT s, (SELECT count(*) FROM sp_events WHERE pg_hash_slot(id, 4) = s) AS share,
       (SELECT count(*) FROM sp_events e WHERE e.tableoid = slot_partition('sp_events', s, 4)
          AND pg_hash_slot(id, 4) = s) AS in_partition
FROM generate_series(0, 3) s;
-- a worker writes its slot's partition directly
SELECT format('UPDATE %s SET done = true', slot_partition('sp_events', 2, 4)) \gexec
SELECT count(*) FILTER (WHERE done) = count(*) FILTER (WHERE pg_hash_slot(id, 4) = 2) AS only_slot_2,
       count(*) FILTER (WHERE done AND pg_hash_slot(id, 4) <> 2) AS others_written
FROM sp_events;

-- Tables it cannot answer for, and bad input.
CREATE TABLE sp_plain (id bigint);
CREATE TABLE sp_range (id bigint) PARTITION BY RANGE (id);
CREATE TABLE sp_two (a int, b int) PARTITION BY HASH (a, b);
CREATE TABLE sp_mixed (id bigint) PARTITION BY HASH (id);
CREATE TABLE sp_mixed_0 PARTITION OF sp_mixed FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE sp_mixed_1 PARTITION OF sp_mixed FOR VALUES WITH (MODULUS 4, REMAINDER 1);
CREATE TABLE sp_multi (id bigint) PARTITION BY HASH (id);
CREATE TABLE sp_multi_0 PARTITION OF sp_multi FOR VALUES WITH (MODULUS 2, REMAINDER 0) PARTITION BY HASH (id);
CREATE TABLE sp_multi_1 PARTITION OF sp_multi FOR VALUES WITH (MODULUS 2, REMAINDER 1);
CREATE TABLE sp_gap (id bigint) PARTITION BY HASH (id);
CREATE TABLE sp_gap_0 PARTITION OF sp_gap FOR VALUES WITH (MODULUS 2, REMAINDER 0);
-- hashed by an expression: its partitions do not hold pg_hash_slot(id, n)'s rows
CREATE TABLE sp_expr (id bigint) PARTITION BY HASH ((id + 1));
CREATE TABLE sp_expr_0 PARTITION OF sp_expr FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE sp_expr_1 PARTITION OF sp_expr FOR VALUES WITH (MODULUS 2, REMAINDER 1);
INSERT INTO sp_expr SELECT g FROM generate_series(1, 100) g;
SELECT count(*) FILTER (WHERE pg_hash_slot(id, 2) <> (tableoid = 'sp_expr_1'::regclass)::int) AS rows_elsewhere
FROM sp_expr;
SELECT pc_try($$SELECT slot_partition('sp_plain', 0, 4)$$) AS not_partitioned;
SELECT pc_try($$SELECT slot_partition('sp_range', 0, 4)$$) AS range_partitioned;
SELECT pc_try($$SELECT slot_partition('sp_two', 0, 4)$$) AS two_columns;
SELECT pc_try($$SELECT slot_partition('sp_expr', 0, 2)$$) AS expression;
SELECT pc_try($$SELECT slot_partition('sp_mixed', 0, 2)$$) AS other_modulus;
SELECT pc_try($$SELECT slot_partition('sp_events', 0, 8)$$) AS n_is_not_the_modulus;
SELECT pc_try($$SELECT slot_partition('sp_multi', 1, 2)$$) AS multi_level;
SELECT pc_try($$SELECT slot_partition('sp_gap', 1, 2)$$) AS missing_partition;
SELECT pc_try($$SELECT slot_partition('sp_events', 4, 4)$$) AS slot_too_big;
SELECT pc_try($$SELECT slot_partition('sp_events', -1, 4)$$) AS negative_slot;
SELECT pc_try($$SELECT slot_partition('sp_events', 0, 0)$$) AS zero_n;
SELECT pc_try($$SELECT slot_partition(NULL, 0, 4)$$) AS null_tbl;
SELECT pc_try($$SELECT slot_partition('sp_events', NULL, 4)$$) AS null_slot;

-- Privileges and row-level security: the caller's own, on the partition.
-- A table with row-level security whose partition does not apply it is
-- refused; a role with rights on the table but not on the partition is
-- told so by PostgreSQL when it reads the partition.
CREATE ROLE sp_reader;
GRANT SELECT ON sp_events TO sp_reader;
SET ROLE sp_reader;
SELECT slot_partition('sp_events', 1, 4) AS part;
SELECT pc_try(format('SELECT count(*) FROM %s', slot_partition('sp_events', 1, 4))) AS read_partition;
RESET ROLE;
ALTER TABLE sp_events ENABLE ROW LEVEL SECURITY;
SELECT pc_try($$SELECT slot_partition('sp_events', 1, 4)$$) AS parent_rls_only;
ALTER TABLE sp_events_1 ENABLE ROW LEVEL SECURITY;
SELECT slot_partition('sp_events', 1, 4) AS both_rls;
ALTER TABLE sp_events DISABLE ROW LEVEL SECURITY;
ALTER TABLE sp_events_1 DISABLE ROW LEVEL SECURITY;
DROP OWNED BY sp_reader;
DROP ROLE sp_reader;
