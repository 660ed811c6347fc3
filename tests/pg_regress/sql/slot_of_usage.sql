-- slot_of where users put it: expression index, generated column, partial index, view
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE TABLE usage_items (id bigint PRIMARY KEY, email text NOT NULL, done boolean NOT NULL DEFAULT false);
INSERT INTO usage_items SELECT g, 'user' || g || '@example.com', g % 10 = 0 FROM generate_series(1, 20000) g;

-- an expression index on the slot, used by the worker's query
CREATE INDEX usage_items_slot ON usage_items ((slot_of(id, 8)), id);
ANALYZE usage_items;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM usage_items WHERE slot_of(id, 8) = 3 ORDER BY id LIMIT 50;
SELECT count(*) AS slot_3, count(*) FILTER (WHERE id % 8 = 3) AS agree FROM usage_items WHERE slot_of(id, 8) = 3;
RESET enable_seqscan;

-- a generated column storing each row's slot
CREATE TABLE usage_mail (id bigserial PRIMARY KEY, recipient text NOT NULL,
                         slot int GENERATED ALWAYS AS (slot_of(recipient, 16)) STORED);
INSERT INTO usage_mail (recipient) SELECT 'user' || g || '@example.com' FROM generate_series(1, 1000) g;
SELECT count(*) FILTER (WHERE slot = slot_of(recipient, 16)) AS consistent, count(DISTINCT slot) AS slots_used FROM usage_mail;
UPDATE usage_mail SET recipient = 'someone.else@example.com' WHERE id = 1;
SELECT slot = crc32('someone.else@example.com') % 16 AS recomputed FROM usage_mail WHERE id = 1;

-- a partial index: only the pending work of each slot
CREATE INDEX usage_items_pending ON usage_items ((slot_of(email, 4)), id) WHERE NOT done;
ANALYZE usage_items;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM usage_items WHERE slot_of(email, 4) = 2 AND NOT done ORDER BY id LIMIT 10;
RESET enable_bitmapscan;
RESET enable_seqscan;

-- a view giving each slot's share
CREATE VIEW usage_slot_3_of_8 AS SELECT * FROM usage_items WHERE slot_of(id, 8) = 3;
SELECT count(*) AS view_rows, min(id) AS first, bool_and(id % 8 = 3) AS all_slot_3 FROM usage_slot_3_of_8;
CREATE VIEW usage_shares AS SELECT slot_of(email, 4) AS slot, count(*) AS items FROM usage_items GROUP BY 1;
SELECT sum(items) AS total, count(*) AS slots FROM usage_shares;

DROP VIEW usage_shares, usage_slot_3_of_8;
DROP TABLE usage_items, usage_mail;
