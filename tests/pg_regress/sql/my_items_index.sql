-- my_items reads through the expression index on the slot, says so when there
-- is none, and on a table hash-partitioned by the key reads only one partition
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- no autovacuum: the plans and scan counts below follow this test's own ANALYZE
CREATE TABLE mi_idx (id bigint PRIMARY KEY, payload text NOT NULL) WITH (autovacuum_enabled = off);
-- rows stored in an order unrelated to the key, as in a table that has lived a while
INSERT INTO mi_idx SELECT g, repeat('x', 20) FROM generate_series(1, 20000) g ORDER BY md5(g::text);
ANALYZE mi_idx;

-- A large table without an index on the slot expression: a NOTICE with the
-- index to create (once per session, table and expression).
SELECT count(*) FROM my_items(NULL::mi_idx, 3, 8);
SELECT count(*) FROM my_items(NULL::mi_idx, 4, 8, after => '100', batch => 10);
SELECT count(*) FROM my_items(NULL::mi_idx, 4, 8, method => 'jump', batch => 10);

CREATE INDEX mi_idx_slot8 ON mi_idx ((slot_of(id, 8)), id);
ANALYZE mi_idx;
\c
-- a new session, and the index exists: no NOTICE
SELECT count(*) FROM my_items(NULL::mi_idx, 3, 8);
-- other n, other expression: the index does not serve it
SELECT count(*) FROM my_items(NULL::mi_idx, 3, 16, batch => 5);

-- The plan of the query my_items runs, with the arguments it binds: an index
-- range scan on (slot, id) that needs no sort.
SELECT format('PREPARE mi_q(integer, integer, text, integer) AS %s',
              my_items_query('mi_idx'::regtype, 3, 8, after => '1000', batch => 50)) \gexec
EXPLAIN (COSTS OFF) EXECUTE mi_q(3, 8, '1000', 50);
DEALLOCATE mi_q;

-- The index is really used by my_items: its scan counter grows.
SELECT pg_stat_force_next_flush();
CREATE TEMP TABLE mi_before AS
    SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = 'mi_idx';
SELECT count(*), min(id) > 1000 AS after_1000 FROM my_items(NULL::mi_idx, 3, 8, after => '1000', batch => 50);
SELECT pg_stat_force_next_flush();
SELECT s.indexrelname, s.idx_scan - b.idx_scan > 0 AS used
FROM pg_stat_user_indexes s JOIN mi_before b USING (indexrelname)
WHERE s.relname = 'mi_idx' ORDER BY 1;

-- A table hash-partitioned by the key, method pg_hash with n = the modulus:
-- the share is one partition, and my_items reads only that one.
CREATE TABLE mi_hp (id bigint PRIMARY KEY, payload text) PARTITION BY HASH (id);
SELECT format('CREATE TABLE mi_hp_%s PARTITION OF mi_hp FOR VALUES WITH (MODULUS 8, REMAINDER %s)', r, r)
FROM generate_series(0, 7) r \gexec
INSERT INTO mi_hp SELECT g, 'p' FROM generate_series(-20000, 20000) g;
ANALYZE mi_hp;
SELECT my_items_query('mi_hp'::regtype, 5, 8, method => 'pg_hash');
SELECT my_items_query('mi_hp'::regtype, 5, 8, method => 'pg_hash', after => '0', batch => 100);

SELECT pg_stat_force_next_flush();
CREATE TEMP TABLE mi_hp_before AS
    SELECT relname, seq_scan + coalesce(idx_scan, 0) AS scans FROM pg_stat_user_tables WHERE relname LIKE 'mi\_hp\__';
SELECT count(*) FROM my_items(NULL::mi_hp, 5, 8, method => 'pg_hash');
SELECT count(*) FROM my_items(NULL::mi_hp, 5, 8, method => 'pg_hash', after => '0', batch => 100);
SELECT pg_stat_force_next_flush();
SELECT s.relname, s.seq_scan + coalesce(s.idx_scan, 0) - b.scans > 0 AS read
FROM pg_stat_user_tables s JOIN mi_hp_before b USING (relname) ORDER BY 1;

-- the partition holds exactly the rows pg_hash_slot gives, and the paged
-- walk sees them in key order
SELECT (SELECT array_agg(id ORDER BY id) FROM my_items(NULL::mi_hp, 5, 8, method => 'pg_hash'))
     = (SELECT array_agg(id ORDER BY id) FROM mi_hp WHERE pg_hash_slot(id, 8) = 5) AS share_is_pg_hash_filter,
       (SELECT array_agg(id) FROM my_items(NULL::mi_hp, 5, 8, method => 'pg_hash', after => '0', batch => 100))
     = (SELECT array_agg(id ORDER BY id) FROM (SELECT id FROM mi_hp WHERE pg_hash_slot(id, 8) = 5 AND id > 0
                                               ORDER BY id LIMIT 100) s) AS page_is_first_100;
SELECT count(*) = (SELECT count(*) FROM mi_hp) AS all_rows_once, count(DISTINCT id) = count(*) AS none_twice
FROM generate_series(0, 7) s CROSS JOIN LATERAL my_items(NULL::mi_hp, s, 8, method => 'pg_hash') m;

-- n other than the modulus: the parent is filtered with pg_hash_slot (correct, not pruned)
SELECT my_items_query('mi_hp'::regtype, 1, 4, method => 'pg_hash');
SELECT (SELECT array_agg(id ORDER BY id) FROM my_items(NULL::mi_hp, 1, 4, method => 'pg_hash'))
     = (SELECT array_agg(id ORDER BY id) FROM mi_hp WHERE pg_hash_slot(id, 4) = 1) AS share_is_pg_hash_filter;
-- other methods on the partitioned table filter the parent too
SELECT my_items_query('mi_hp'::regtype, 1, 8);

DROP TABLE mi_idx, mi_hp;
