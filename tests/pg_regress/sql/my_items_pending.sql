-- my_items(..., pending => column): only the rows a column marks as pending
-- (a nullable column such as sent_at: IS NULL; a boolean flag such as done:
-- NOT done), so that the work table's partial index serves the share and
-- batch counts pending rows; the NOTICE suggests that partial index.

-- The outbox of the README and the guides (as mp_outbox), with its partial index.
CREATE TABLE mp_outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id bigint NOT NULL,
    recipient text NOT NULL,
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz
);
CREATE INDEX mp_outbox_pending ON mp_outbox ((slot_of(id, 8)), id) WHERE sent_at IS NULL;
-- 20000 messages, all but every 25th sent
INSERT INTO mp_outbox (customer_id, recipient, body, sent_at)
SELECT g % 300, 'r' || g || '@example.com', 'hello',
       CASE WHEN g % 25 <> 0 THEN timestamptz '2026-01-01' END
FROM generate_series(1, 20000) g;
ANALYZE mp_outbox;

-- No NOTICE (the partial index serves the share), and batch counts pending rows.
SELECT count(*) AS rows, bool_and(sent_at IS NULL) AS all_pending, bool_and(slot_of(id, 8) = 3) AS all_slot_3
FROM my_items(NULL::mp_outbox, 3, 8, pending => 'sent_at', batch => 50);
SELECT array_agg(id) = (SELECT array_agg(id ORDER BY id) FROM
                          (SELECT id FROM mp_outbox WHERE slot_of(id, 8) = 3 AND sent_at IS NULL AND id > 1000
                           ORDER BY id LIMIT 20) s) AS page_is_first_20_pending
FROM my_items(NULL::mp_outbox, 3, 8, pending => 'sent_at', after => '1000', batch => 20);
-- the whole pending share, every slot: each pending row once
SELECT count(*) = (SELECT count(*) FROM mp_outbox WHERE sent_at IS NULL) AS all_pending_once,
       count(DISTINCT id) = count(*) AS none_twice
FROM generate_series(0, 7) s CROSS JOIN LATERAL my_items(NULL::mp_outbox, s, 8, pending => 'sent_at') m;

-- The query and its plan: the partial index, a range scan in key order.
SELECT my_items_query('mp_outbox'::regtype, 3, 8, pending => 'sent_at', after => '1000', batch => 50);
SELECT format('PREPARE mp_q(integer, integer, text, integer) AS %s',
              my_items_query('mp_outbox'::regtype, 3, 8, pending => 'sent_at', after => '1000', batch => 50)) \gexec
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE mp_q(3, 8, '1000', 50);
RESET plan_cache_mode;
DEALLOCATE mp_q;
SELECT pg_stat_force_next_flush();
CREATE TEMP TABLE mp_before AS
    SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = 'mp_outbox';
SELECT count(*) FROM my_items(NULL::mp_outbox, 3, 8, pending => 'sent_at', after => '1000', batch => 50);
SELECT pg_stat_force_next_flush();
SELECT s.indexrelname, s.idx_scan - b.idx_scan > 0 AS used
FROM pg_stat_user_indexes s JOIN mp_before b USING (indexrelname)
WHERE s.relname = 'mp_outbox' ORDER BY 1;

-- A worker's loop: mark each batch sent; the next batch starts at the next
-- pending rows, and the walk ends with every row of the slot sent.
DO $$
DECLARE got integer; i integer := 0;
BEGIN
    LOOP
        WITH batch AS (SELECT id FROM my_items(NULL::mp_outbox, 5, 8, pending => 'sent_at', batch => 100)),
             sent AS (UPDATE mp_outbox SET sent_at = now() WHERE id IN (SELECT id FROM batch) RETURNING 1)
        SELECT count(*) INTO got FROM sent;
        EXIT WHEN got = 0;
        i := i + 1;
        IF i > 100 THEN RAISE EXCEPTION 'the pending share does not shrink'; END IF;
    END LOOP;
END $$;
SELECT count(*) FILTER (WHERE sent_at IS NULL) AS pending_in_slot_5
FROM mp_outbox WHERE slot_of(id, 8) = 5;

-- Routed by customer and pending: the NOTICE names the partial index of
-- exactly the query's predicate; with that index there is none.
SELECT count(*) FROM my_items(NULL::mp_outbox, 1, 8, route => 'customer_id', pending => 'sent_at', batch => 10);
CREATE INDEX mp_outbox_customer_pending ON mp_outbox ((slot_of(customer_id, 8)), id) WHERE sent_at IS NULL;
\c
SELECT count(*) FROM my_items(NULL::mp_outbox, 1, 8, route => 'customer_id', pending => 'sent_at', batch => 10);
-- a full index on the slot serves the pending rows too: no NOTICE
CREATE INDEX mp_outbox_slot16 ON mp_outbox ((slot_of(id, 16)), id);
SELECT count(*) FROM my_items(NULL::mp_outbox, 1, 16, pending => 'sent_at', batch => 10);
-- a partial index of another predicate does not: the NOTICE
CREATE INDEX mp_outbox_old ON mp_outbox ((slot_of(id, 4)), id) WHERE created_at < '2020-01-01';
SELECT count(*) FROM my_items(NULL::mp_outbox, 1, 4, pending => 'sent_at', batch => 10);

-- A boolean flag: pending rows are NOT done (rows whose flag is NULL are
-- not pending, as for a partial index WHERE NOT done).
CREATE TABLE mp_jobs (id bigint PRIMARY KEY, done boolean, payload text);
INSERT INTO mp_jobs SELECT g, CASE WHEN g % 100 = 0 THEN NULL ELSE g % 3 = 0 END, 'x'
FROM generate_series(1, 20000) g;
ANALYZE mp_jobs;
SELECT count(*) FROM my_items(NULL::mp_jobs, 0, 4, pending => 'done', batch => 10);
CREATE INDEX mp_jobs_todo ON mp_jobs ((slot_of(id, 4)), id) WHERE NOT done;
\c
SELECT count(*) FROM my_items(NULL::mp_jobs, 0, 4, pending => 'done', batch => 10);
SELECT my_items_query('mp_jobs'::regtype, 0, 4, pending => 'done', batch => 10);
SELECT (SELECT array_agg(id ORDER BY id) FROM my_items(NULL::mp_jobs, 2, 4, pending => 'done'))
     = (SELECT array_agg(id ORDER BY id) FROM mp_jobs WHERE slot_of(id, 4) = 2 AND NOT done) AS share_is_not_done;
-- with pg_hash on a table hash-partitioned by the key, the one partition, pending rows only
CREATE TABLE mp_hp (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false) PARTITION BY HASH (id);
SELECT format('CREATE TABLE mp_hp_%s PARTITION OF mp_hp FOR VALUES WITH (MODULUS 4, REMAINDER %s)', r, r)
FROM generate_series(0, 3) r \gexec
INSERT INTO mp_hp SELECT g, g % 2 = 0 FROM generate_series(1, 1000) g;
SELECT my_items_query('mp_hp'::regtype, 1, 4, method => 'pg_hash', pending => 'done', batch => 10);
SELECT (SELECT array_agg(id ORDER BY id) FROM my_items(NULL::mp_hp, 1, 4, method => 'pg_hash', pending => 'done'))
     = (SELECT array_agg(id ORDER BY id) FROM mp_hp WHERE pg_hash_slot(id, 4) = 1 AND NOT done) AS share_is_not_done;

-- Bad input: SQLSTATE, message and hint.
CREATE TABLE mp_quoted ("Sent At" timestamptz, id integer PRIMARY KEY);
INSERT INTO mp_quoted VALUES (NULL, 1), (now(), 2), (NULL, 3);
SELECT id FROM my_items(NULL::mp_quoted, 0, 1, pending => 'Sent At') ORDER BY id;
SELECT my_items_query('mp_quoted'::regtype, 0, 1, pending => 'Sent At');
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ('SELECT * FROM my_items(NULL::mp_outbox, 0, 8, pending => ''sent'')'),
    ('SELECT * FROM my_items(NULL::mp_outbox, 0, 8, pending => ''sent_at IS NULL'')'),
    ('SELECT * FROM my_items(NULL::mp_outbox, 0, 8, pending => ''created_at'')'),
    ('SELECT * FROM my_items(NULL::mp_outbox, 0, 8, pending => ''id'')'),
    ('SELECT my_items_query(''mp_outbox''::regtype, 0, 8, pending => ''"sent_at"'')')
) AS v(t);
CREATE ROLE mp_reader;
GRANT SELECT (id, customer_id, recipient, body, created_at) ON mp_outbox TO mp_reader;
SET ROLE mp_reader;
SELECT pc_try('SELECT * FROM my_items(NULL::mp_outbox, 0, 8, pending => ''sent_at'', columns => ARRAY[''body''])');
RESET ROLE;
REVOKE ALL ON mp_outbox FROM mp_reader;
DROP ROLE mp_reader;

DROP TABLE mp_outbox, mp_jobs, mp_hp, mp_quoted;
