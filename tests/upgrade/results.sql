-- The results of the objects in objects.sql, recorded under :'phase'. Index
-- scans are forced so that an index whose values changed would show.
SET enable_seqscan = off;
INSERT INTO up_results
SELECT :'phase', 'slot index, slot 3 of 8',
       (SELECT md5(string_agg(id::text, ',' ORDER BY id)) FROM up_items WHERE slot_of(id, 8) = 3);
INSERT INTO up_results
SELECT :'phase', 'jump index, slot 5 of 8',
       (SELECT md5(string_agg(id::text, ',' ORDER BY id)) FROM up_items WHERE jump_slot(email, 8) = 5);
INSERT INTO up_results
SELECT :'phase', 'generated column', (SELECT md5(string_agg(slot16::text, ',' ORDER BY id)) FROM up_items);
INSERT INTO up_results
SELECT :'phase', 'view', (SELECT md5(string_agg(concat_ws(':', id, s4, j9, h5), ',' ORDER BY id)) FROM up_view);
INSERT INTO up_results
SELECT :'phase', 'pg_hash_slot routes as the partitions',
       (SELECT bool_and(pg_hash_slot(id, 2) = CASE tableoid WHEN 'up_parts_0'::regclass THEN 0 ELSE 1 END)::text FROM up_parts);
INSERT INTO up_results
SELECT :'phase', 'range_slot', range_slot(42, ARRAY[10, 20, 50])::text;
INSERT INTO up_results
SELECT :'phase', 'spread_agg', (SELECT spread_agg(g, (g % 3)::text, 2 ORDER BY g)::text FROM generate_series(1, 9) g);
INSERT INTO up_results
SELECT :'phase', 'indexes valid', (SELECT bool_and(indisvalid)::text FROM pg_index WHERE indrelid = 'up_items'::regclass);
RESET enable_seqscan;
