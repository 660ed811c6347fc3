-- slot_counts: rows per slot, empty slots included; slot_skew: how even the split is
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE TABLE sc_items (id bigint PRIMARY KEY, email text, tenant integer);
INSERT INTO sc_items SELECT g, 'user' || g || '@example.com', CASE WHEN g % 10 < 7 THEN 1 ELSE g % 10 END
FROM generate_series(1, 1000) g;
INSERT INTO sc_items VALUES (-1, NULL, NULL), (-2, NULL, NULL);

SELECT * FROM slot_counts('sc_items', 4);
-- every slot 0 .. n-1 is listed, even with no rows
SELECT * FROM slot_counts('sc_items', 12, 'tenant');
-- rows whose key is NULL belong to no slot: they are not counted
SELECT sum(items) AS counted, (SELECT count(*) FROM sc_items) AS rows FROM slot_counts('sc_items', 12, 'tenant');

-- slot_counts equals GROUP BY over the mapping function, for every method
SELECT m.method, bool_and(c.items = coalesce(g.items, 0)) AS equal, sum(c.items) AS total
FROM (VALUES ('auto', 'slot_of'), ('crc32', 'crc32'), ('jump', 'jump_slot'), ('pg_hash', 'pg_hash_slot')) AS m(method, fn)
CROSS JOIN LATERAL slot_counts('sc_items', 7, 'email', m.method) c
LEFT JOIN LATERAL (
    SELECT count(*) AS items FROM sc_items t
    WHERE CASE m.fn WHEN 'slot_of' THEN slot_of(t.email, 7)
                    WHEN 'crc32' THEN (crc32(t.email) % 7)::integer
                    WHEN 'jump_slot' THEN jump_slot(t.email, 7)
                    ELSE pg_hash_slot(t.email, 7) END = c.slot) g ON true
GROUP BY m.method ORDER BY 1;

-- the skew at a glance: largest slot over the mean
SELECT * FROM slot_skew('sc_items', 4);
SELECT * FROM slot_skew('sc_items', 12, 'tenant');
SELECT slots, items, min_items, max_items FROM slot_skew('sc_items', 8, 'email', 'jump');

-- views can be counted (no index needed)
CREATE VIEW sc_view AS SELECT id, email FROM sc_items WHERE id > 500;
SELECT * FROM slot_counts('sc_view', 3, 'id');
-- an empty table: every slot 0, no ratio
CREATE TABLE sc_empty (id integer PRIMARY KEY);
SELECT * FROM slot_counts('sc_empty', 3);
SELECT * FROM slot_skew('sc_empty', 3);

DROP VIEW sc_view;
DROP TABLE sc_items, sc_empty;
