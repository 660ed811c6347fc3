-- Tenants: slot_of_spread (a tenant's rows over at most k slots spaced n/k
-- apart) and my_items_fair (a slot's tenants taken in turn)

-- stored vectors (computed with Python's zlib.crc32): a mapping's values
-- never change between versions
SELECT t, k, n, kk, slot_of_spread(t, k, n, kk) AS got, want, slot_of_spread(t, k, n, kk) = want AS same
FROM (VALUES ('acme', 'order-1', 8, 4, 4), ('acme', 'order-2', 8, 4, 0), ('globex', 'o-77', 16, 4, 14),
             ('initech', 'x', 10, 3, 8), ('ünïcødé', '😀', 64, 8, 24), ('acme', '', 1, 1, 0))
     AS v(t, k, n, kk, want);
SELECT slot_of_spread(42::bigint, 7::bigint, 8, 2) AS int_int_6,
       slot_of_spread(-5, -3, 8, 4) AS negative_5,
       slot_of_spread(9000000000, 123, 1000, 7) AS big_568,
       slot_of_spread('t', 9223372036854775807, 2147483647, 2) AS largest_n_1164597928,
       slot_of_spread(12, 'k', 12, 12) AS k_equals_n_1,
       slot_of_spread(NULL::text, 'k', 8, 2) AS null_tenant,
       slot_of_spread('t', 'k', 8, NULL) AS null_k;

-- the arithmetic as documented, on many keys
SELECT bool_and(slot_of_spread(t, k, 24, 5) = (crc32(t) % 24 + (crc32(k) % 5) * (24 / 5)) % 24) AS documented
FROM (SELECT 'tenant-' || (g % 97) AS t, md5(g::text) AS k FROM generate_series(1, 5000) g) s;

-- a mapping: IMMUTABLE PARALLEL SAFE, no SET clause (inlined)
SELECT p.oid::regprocedure, provolatile, proparallel, proconfig IS NULL AS no_set
FROM pg_proc p WHERE proname = 'slot_of_spread' ORDER BY 1::text;

-- the spread: every tenant on at most k slots, k of them when it has
-- enough keys, spaced n/k apart from its base slot; one key on one slot
CREATE TABLE ten_rows AS
SELECT 'tenant-' || t AS tenant, o AS order_id
FROM generate_series(1, 60) t, generate_series(1, 200) o;
SELECT max(slots) AS most_slots, min(slots) AS fewest_slots, bool_and(spaced) AS spaced_n_over_k
FROM (SELECT tenant, count(DISTINCT slot_of_spread(tenant, order_id, 16, 4)) AS slots,
             bool_and((slot_of_spread(tenant, order_id, 16, 4) - slot_of(tenant, 16) + 16) % 4 = 0) AS spaced
      FROM ten_rows GROUP BY tenant) s;
SELECT count(*) AS keys_on_two_slots FROM (
    SELECT tenant, order_id % 5 FROM ten_rows GROUP BY 1, 2
    HAVING count(DISTINCT slot_of_spread(tenant, order_id % 5, 16, 4)) > 1) s;
-- k = 1: slot_of of the tenant; k = n: every slot reachable
SELECT bool_and(slot_of_spread(tenant, order_id, 16, 1) = slot_of(tenant, 16)) AS k1_is_slot_of,
       count(DISTINCT slot_of_spread(tenant, order_id, 16, 16)) AS k16_slots
FROM ten_rows;
-- where users put it: a generated column and an expression index
ALTER TABLE ten_rows ADD COLUMN slot int GENERATED ALWAYS AS (slot_of_spread(tenant, order_id, 16, 4)) STORED;
CREATE INDEX ten_rows_slot ON ten_rows ((slot_of_spread(tenant, order_id, 16, 4)), tenant, order_id);
ANALYZE ten_rows;
SELECT count(*) FILTER (WHERE slot = slot_of_spread(tenant, order_id, 16, 4)) = count(*) AS generated_agrees FROM ten_rows;
EXPLAIN (COSTS OFF) SELECT order_id FROM ten_rows WHERE slot_of_spread(tenant, order_id, 16, 4) = 3 AND tenant = 'tenant-7';

-- fairness: one large tenant's backlog and small tenants behind it in the
-- same slot (slot 1 of 4): my_items_fair takes them in turn
CREATE TABLE fair_items (id bigint PRIMARY KEY, tenant text NOT NULL, done boolean NOT NULL DEFAULT false);
CREATE TEMP TABLE fair_tenants AS
SELECT t FROM (SELECT 'small-' || g AS t FROM generate_series(1, 200) g) s WHERE slot_of(t, 4) = 1 ORDER BY t LIMIT 3;
INSERT INTO fair_items SELECT g, 'big', false FROM generate_series(1, 20000) g;
INSERT INTO fair_items SELECT 100000 + row_number() OVER (), t, false FROM fair_tenants, generate_series(1, 3);
-- rows of other slots
INSERT INTO fair_items SELECT 200000 + g, 'other-' || g, false FROM generate_series(1, 400) g WHERE slot_of('other-' || g, 4) <> 1;
SELECT slot_of('big', 4) AS big_slot, count(*) AS small_tenants FROM fair_tenants;
CREATE INDEX fair_items_fair ON fair_items ((slot_of(tenant, 4)), tenant, id) WHERE NOT done;
ANALYZE fair_items;
-- my_items in key order: only the large tenant
SELECT DISTINCT tenant FROM my_items(NULL::fair_items, 1, 4, route => 'tenant', batch => 8, pending => 'done');
-- my_items_fair: every small tenant's first row in the first batch, each
-- tenant's rows in key order
SELECT tenant, id FROM my_items_fair(NULL::fair_items, 1, 4, fair => 'tenant', batch => 8, pending => 'done');
UPDATE fair_items SET done = true
WHERE id IN (SELECT id FROM my_items_fair(NULL::fair_items, 1, 4, fair => 'tenant', batch => 8, pending => 'done'));
SELECT tenant, id FROM my_items_fair(NULL::fair_items, 1, 4, fair => 'tenant', batch => 8, pending => 'done');
UPDATE fair_items SET done = true
WHERE id IN (SELECT id FROM my_items_fair(NULL::fair_items, 1, 4, fair => 'tenant', batch => 8, pending => 'done'));
SELECT count(*) FILTER (WHERE tenant LIKE 'small-%' AND NOT done) AS small_left_after_two_batches,
       count(*) FILTER (WHERE tenant = 'big' AND done) AS big_done
FROM fair_items;
-- the plan: index probes only (a loose index scan over the tenants, then
-- each tenant's first rows), no scan of the slot
SELECT my_items_fair_query('fair_items'::regclass, 1, 4, fair => 'tenant', batch => 8, pending => 'done') AS q \gset
PREPARE fair_q(int) AS :q;
-- (the plan's nodes and conditions; sort keys and window clauses, which
-- PostgreSQL 18 prints otherwise, left out)
CREATE FUNCTION ten_plan(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
    FOR l IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
        IF l !~ '^\s*(Sort Key|Presorted Key|Window):' THEN
            RETURN NEXT l;
        END IF;
    END LOOP;
END $$;
SELECT ten_plan AS "QUERY PLAN" FROM ten_plan('EXECUTE fair_q(1)');
DROP FUNCTION ten_plan(text);
DEALLOCATE fair_q;
SELECT count(*) AS same_rows FROM (
    SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => 'tenant', batch => 8, pending => 'done')) s;

-- with spread: the slot expression is slot_of_spread(route, spread_key, n, k)
CREATE TABLE fair_spread (id bigint PRIMARY KEY, tenant text NOT NULL, order_id bigint NOT NULL, done boolean NOT NULL DEFAULT false);
INSERT INTO fair_spread SELECT g, 'tenant-' || (g % 5), g / 3, false FROM generate_series(1, 3000) g;
SELECT s, count(*) = (SELECT count(*) FROM fair_spread WHERE slot_of_spread(tenant, order_id, 8, 2) = s) AS whole_slot_when_large_batch,
       bool_and(slot_of_spread(tenant, order_id, 8, 2) = s) AS only_its_slot
FROM generate_series(0, 7) s
CROSS JOIN LATERAL my_items_fair(NULL::fair_spread, s, 8, fair => 'tenant', spread => 2, spread_key => 'order_id',
                                 batch => 3000, pending => 'done') f
GROUP BY s ORDER BY s;

-- bad input: SQLSTATE, message naming the value, hint
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ('SELECT slot_of_spread(''a'', ''b'', 8, 0)'),
    ('SELECT slot_of_spread(''a'', ''b'', 8, 9)'),
    ('SELECT slot_of_spread(1, 2, 0, 1)'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => ''customer'')'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => ''tenant'', route => ''Tenant'')'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => ''tenant'', spread => 2, spread_key => ''order_id'')'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => ''tenant'', spread => 5)'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => ''tenant'', spread_key => ''id'')'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => ''tenant'', pending => ''sent_at'')'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => ''tenant'', pending => ''id'')'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 4, 4, fair => ''tenant'')'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => ''tenant'', batch => 0)'),
    ('SELECT * FROM my_items_fair(NULL::fair_items, 1, 4, fair => NULL)'),
    ('SELECT * FROM my_items_fair(NULL::int, 1, 4, fair => ''tenant'')')
) AS v(t);

-- exact-typed calls: a varchar tenant column is passed as text, so a
-- look-alike slot_of(varchar, integer) planted in pg_claim's schema, and a
-- text > operator planted in a schema searched before pg_catalog, never run
CREATE TABLE fair_vc (id bigint PRIMARY KEY, tenant varchar(20) NOT NULL, done boolean NOT NULL DEFAULT false);
INSERT INTO fair_vc SELECT g, 't' || (g % 5), false FROM generate_series(1, 200) g;
CREATE FUNCTION slot_of(key varchar, n integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN RAISE EXCEPTION 'planted slot_of ran'; END$$;
CREATE SCHEMA fair_plant;
CREATE FUNCTION fair_plant.gt(a text, b text) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN RAISE EXCEPTION 'planted > ran'; END$$;
CREATE OPERATOR fair_plant.> (LEFTARG = text, RIGHTARG = text, FUNCTION = fair_plant.gt);
SET search_path = fair_plant, public, pg_catalog;
SELECT position('(x.tenant)::pg_catalog.text' IN my_items_fair_query('fair_vc'::regclass, 0, 4, fair => 'tenant')) > 0
    AS tenant_cast_to_text;
SELECT count(*) = (SELECT count(*) FROM fair_vc WHERE slot_of(tenant::text, 4) = 0 AND NOT done)
    AS whole_slot_no_plant_ran
FROM my_items_fair(NULL::fair_vc, 0, 4, fair => 'tenant', batch => 1000, pending => 'done');
RESET search_path;
DROP OPERATOR fair_plant.> (text, text);
DROP SCHEMA fair_plant CASCADE;
DROP FUNCTION slot_of(varchar, integer);
DROP TABLE fair_vc;

DROP TABLE ten_rows, fair_items, fair_spread;
