-- Objects a user builds on pg_claim, and the results they give: run on the
-- old version before the update, and again after it (into results_after).
CREATE TABLE IF NOT EXISTS up_results (phase text, what text, result text);

CREATE TABLE IF NOT EXISTS up_items (
    id bigint PRIMARY KEY,
    email text NOT NULL,
    slot16 integer GENERATED ALWAYS AS (slot_of(email, 16)) STORED
);
INSERT INTO up_items (id, email)
SELECT g, 'user' || g || '@example.com' FROM generate_series(1, 5000) g
ON CONFLICT DO NOTHING;
CREATE INDEX IF NOT EXISTS up_items_slot ON up_items ((slot_of(id, 8)), id);
CREATE INDEX IF NOT EXISTS up_items_jump ON up_items ((jump_slot(email, 8)));
CREATE OR REPLACE VIEW up_view AS
    SELECT id, slot_of(id, 4) AS s4, jump_slot(id, 9) AS j9, pg_hash_slot(email, 5) AS h5 FROM up_items;
CREATE TABLE IF NOT EXISTS up_parts (id bigint, v text) PARTITION BY HASH (id);
CREATE TABLE IF NOT EXISTS up_parts_0 PARTITION OF up_parts FOR VALUES WITH (modulus 2, remainder 0);
CREATE TABLE IF NOT EXISTS up_parts_1 PARTITION OF up_parts FOR VALUES WITH (modulus 2, remainder 1);
INSERT INTO up_parts SELECT g, 'v' || g FROM generate_series(1, 1000) g WHERE NOT EXISTS (SELECT 1 FROM up_parts);
