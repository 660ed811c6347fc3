-- my_items(..., route => column): the mapping applies to the route column
-- while key, after and batch page on the key, so every row of one customer
-- belongs to one slot and a worker reads them in key order. The same for
-- my_items_query, slot_counts and slot_skew, with every method; the index
-- to create is ((mapping(route, n)), key); a table hash-partitioned by the
-- route column is read one partition per slot with method pg_hash.

CREATE TABLE mr_orders (
    id bigint PRIMARY KEY,
    customer_id bigint,          -- nullable: rows without a customer belong to no slot
    customer_name text,
    placed date NOT NULL,
    amount numeric NOT NULL
);
-- stored in an order unrelated to the key; 200 customers, 5 rows without one
INSERT INTO mr_orders
SELECT g, CASE WHEN g % 1000 = 0 THEN NULL ELSE (g * 7919) % 200 END,
       'customer ' || ((g * 7919) % 200), date '2026-01-01' + g % 300, g % 97
FROM generate_series(1, 5000) g ORDER BY md5(g::text);
ANALYZE mr_orders;

-- Walks a share with after/batch the way a worker does; returns the keys
-- visited in order (stops after 10000 batches so a walk that does not
-- advance shows up as a wrong result instead of a hang).
CREATE FUNCTION mr_walk(slot integer, n integer, route text, method text, batch integer)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    last bigint := NULL;
    got bigint[] := '{}';
    page bigint[];
    i integer := 0;
BEGIN
    LOOP
        SELECT array_agg(id ORDER BY o) INTO page
        FROM (SELECT id, row_number() OVER () AS o
              FROM my_items(NULL::mr_orders, slot, n, route => route, method => method,
                            after => last::text, batch => batch)) s;
        EXIT WHEN page IS NULL;
        got := got || page;
        last := page[array_length(page, 1)];
        i := i + 1;
        IF i > 10000 THEN RAISE EXCEPTION 'paging does not advance'; END IF;
    END LOOP;
    RETURN got;
END $$;

-- The share's keys as the caller's own filter on the route column gives them, in key order.
CREATE FUNCTION mr_filter(slot integer, n integer, route text, fn text)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE got bigint[];
BEGIN
    EXECUTE format('SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM mr_orders WHERE %s(%I, $2) = $1', fn, route)
        INTO got USING slot, n;
    RETURN got;
END $$;

-- Every method, every slot, integer and text route columns: the walk in
-- batches of 37 equals the filter on the route column, each key once and in
-- key order; rows without a route are in no share.
SELECT t.route, t.method,
       bool_and(mr_walk(s, 4, t.route, t.method, 37) = mr_filter(s, 4, t.route, t.fn)) AS walk_equals_filter,
       sum(array_length(mr_walk(s, 4, t.route, t.method, 37), 1)) AS visited
FROM (VALUES
    ('customer_id', 'auto', 'slot_of'),
    ('customer_id', 'jump', 'jump_slot'),
    ('customer_id', 'pg_hash', 'pg_hash_slot'),
    ('customer_name', 'auto', 'slot_of'),
    ('customer_name', 'crc32', 'slot_of'),
    ('customer_name', 'jump', 'jump_slot'),
    ('placed', 'pg_hash', 'pg_hash_slot')) AS t(route, method, fn)
CROSS JOIN generate_series(0, 3) s
GROUP BY 1, 2 ORDER BY 1, 2;
-- crc32 on an integer route maps its decimal text form, as for a key
SELECT bool_and(mr_walk(s, 4, 'customer_id', 'crc32', 50)
                = (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM mr_orders
                   WHERE slot_of(customer_id::text, 4) = s)) AS crc32_walk_equals_filter
FROM generate_series(0, 3) s;

-- Every row of one customer is in one share.
SELECT count(DISTINCT s) AS slots_per_customer
FROM generate_series(0, 3) s
CROSS JOIN LATERAL my_items(NULL::mr_orders, s, 4, route => 'customer_id') m
GROUP BY m.customer_id ORDER BY 1 DESC LIMIT 1;
-- route => NULL is the default: the key
SELECT (SELECT array_agg(id ORDER BY id) FROM my_items(NULL::mr_orders, 1, 4, route => NULL))
     = (SELECT array_agg(id ORDER BY id) FROM mr_orders WHERE slot_of(id, 4) = 1) AS route_null_is_key;

-- The query: the mapping on the route column, paging on the key.
SELECT my_items_query('mr_orders'::regtype, 1, 4, route => 'customer_id', after => '100', batch => 10);
SELECT my_items_query('mr_orders'::regtype, 1, 4, route => 'customer_name', method => 'jump', batch => 10);

-- slot_counts and slot_skew count by the route column; rows without a route count nowhere.
SELECT c.slot, c.items = (SELECT count(*) FROM mr_orders WHERE slot_of(customer_id, 4) = c.slot) AS matches
FROM slot_counts('mr_orders', 4, route => 'customer_id') c ORDER BY 1;
SELECT slots, items FROM slot_skew('mr_orders', 4, route => 'customer_id', method => 'jump');
SELECT sum(items) FROM slot_counts('mr_orders', 4, method => 'pg_hash', route => 'placed');

-- Bad input: the same answers as for a bad key.
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ('SELECT * FROM my_items(NULL::mr_orders, 0, 4, route => ''customer'')'),
    ('SELECT * FROM my_items(NULL::mr_orders, 0, 4, route => ''Customer_Id'')'),
    ('SELECT * FROM my_items(NULL::mr_orders, 0, 4, route => ''amount'')'),
    ('SELECT * FROM my_items(NULL::mr_orders, 0, 4, route => ''placed'', method => ''jump'')'),
    ('SELECT my_items_query(''mr_orders''::regtype, 0, 4, route => ''nope'')'),
    ('SELECT * FROM slot_counts(''mr_orders'', 4, route => ''nope'')'),
    ('SELECT * FROM slot_counts(''mr_orders'', 4, route => ''amount'', method => ''crc32'')'),
    ('SELECT * FROM slot_counts(''mr_orders'', 4, key => ''nope'', route => ''customer_id'')'),
    ('SELECT * FROM slot_skew(''mr_orders'', 4, route => ''nope'')')
) AS v(t);

-- No SELECT on the route column: refused before any row is read.
CREATE ROLE mr_reader;
GRANT SELECT (id, customer_name, placed, amount) ON mr_orders TO mr_reader;
SET ROLE mr_reader;
SELECT pc_try('SELECT * FROM my_items(NULL::mr_orders, 0, 4, route => ''customer_id'', columns => ARRAY[''amount''])');
SELECT count(*) FROM my_items(NULL::mr_orders, 0, 4, route => 'customer_name', columns => ARRAY['amount']);
RESET ROLE;
REVOKE ALL ON mr_orders FROM mr_reader;
DROP ROLE mr_reader;

-- The index: without it the NOTICE names ((mapping(route, n)), key) ...
CREATE TABLE mr_big (id bigint PRIMARY KEY, customer_id bigint NOT NULL, payload text);
INSERT INTO mr_big SELECT g, g % 500, 'x' FROM generate_series(1, 20000) g ORDER BY md5(g::text);
ANALYZE mr_big;
SELECT count(*) FROM my_items(NULL::mr_big, 3, 8, route => 'customer_id', batch => 10);
CREATE INDEX mr_big_route ON mr_big ((slot_of(customer_id, 8)), id);
ANALYZE mr_big;
\c
-- ... and with it, no NOTICE, and the plan is a range scan of that index in key order
SELECT count(*) FROM my_items(NULL::mr_big, 3, 8, route => 'customer_id', batch => 10);
SELECT format('PREPARE mr_q(integer, integer, text, integer) AS %s',
              my_items_query('mr_big'::regtype, 3, 8, route => 'customer_id', after => '1000', batch => 50)) \gexec
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE mr_q(3, 8, '1000', 50);
RESET plan_cache_mode;
DEALLOCATE mr_q;
SELECT pg_stat_force_next_flush();
CREATE TEMP TABLE mr_before AS
    SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = 'mr_big';
SELECT count(*), bool_and(slot_of(customer_id, 8) = 3) AS all_slot_3, min(id) > 1000 AS after_1000
FROM my_items(NULL::mr_big, 3, 8, route => 'customer_id', after => '1000', batch => 50);
SELECT pg_stat_force_next_flush();
SELECT s.indexrelname, s.idx_scan - b.idx_scan > 0 AS used
FROM pg_stat_user_indexes s JOIN mr_before b USING (indexrelname)
WHERE s.relname = 'mr_big' ORDER BY 1;

-- A table hash-partitioned by the route column: with method pg_hash and n
-- the modulus, each slot is one partition, and only that one is read.
CREATE TABLE mr_hp (id bigint, customer_id bigint, payload text, PRIMARY KEY (id, customer_id))
    PARTITION BY HASH (customer_id);
SELECT format('CREATE TABLE mr_hp_%s PARTITION OF mr_hp FOR VALUES WITH (MODULUS 4, REMAINDER %s)', r, r)
FROM generate_series(0, 3) r \gexec
INSERT INTO mr_hp SELECT g, g % 300, 'p' FROM generate_series(1, 4000) g;
ANALYZE mr_hp;
SELECT my_items_query('mr_hp'::regtype, 2, 4, key => 'id', route => 'customer_id', method => 'pg_hash', after => '10', batch => 5);
SELECT pg_stat_force_next_flush();
CREATE TEMP TABLE mr_hp_before AS
    SELECT relname, seq_scan + coalesce(idx_scan, 0) AS scans FROM pg_stat_user_tables WHERE relname LIKE 'mr\_hp\__';
CREATE TEMP TABLE mr_hp_share AS
    SELECT id FROM my_items(NULL::mr_hp, 2, 4, key => 'id', route => 'customer_id', method => 'pg_hash');
SELECT pg_stat_force_next_flush();
SELECT s.relname, s.seq_scan + coalesce(s.idx_scan, 0) - b.scans > 0 AS read
FROM pg_stat_user_tables s JOIN mr_hp_before b USING (relname) ORDER BY 1;
SELECT (SELECT array_agg(id ORDER BY id) FROM mr_hp_share)
     = (SELECT array_agg(id ORDER BY id) FROM mr_hp WHERE pg_hash_slot(customer_id, 4) = 2) AS share_is_pg_hash_filter;
-- hash-partitioned by the route but mapped by the key: the parent, filtered
SELECT my_items_query('mr_hp'::regtype, 2, 4, key => 'id', method => 'pg_hash');
-- a nullable route column partitioned by it: rows without a route are left
-- out of the partition PostgreSQL routes them to
CREATE TABLE mr_hpn (id bigint NOT NULL, customer_id bigint) PARTITION BY HASH (customer_id);
SELECT format('CREATE TABLE mr_hpn_%s PARTITION OF mr_hpn FOR VALUES WITH (MODULUS 2, REMAINDER %s)', r, r)
FROM generate_series(0, 1) r \gexec
INSERT INTO mr_hpn SELECT g, CASE WHEN g % 10 = 0 THEN NULL ELSE g % 7 END FROM generate_series(1, 100) g;
SELECT my_items_query('mr_hpn'::regtype, 0, 2, key => 'id', route => 'customer_id', method => 'pg_hash');
SELECT count(*) FILTER (WHERE customer_id IS NULL) AS null_routes, count(*) AS rows
FROM generate_series(0, 1) s
CROSS JOIN LATERAL my_items(NULL::mr_hpn, s, 2, key => 'id', route => 'customer_id', method => 'pg_hash') m;

DROP TABLE mr_orders, mr_big, mr_hp, mr_hpn;
DROP FUNCTION mr_walk, mr_filter;
