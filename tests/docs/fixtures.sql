-- What the ```sql examples of README.md and docs/*.md assume exists, for
-- tests/docs/test_examples.py: each section from its '-- for:' line runs in the
-- database of the files it names, after CREATE EXTENSION pg_claim and before
-- the file's first block. A line '-- include: PATH' in a section stands for
-- that file of the repository. Keep it to what the examples use.
--
-- Roles of the cluster that examples grant to (created NOLOGIN when missing,
-- dropped at the end when the run created them), and roles that an example
-- creates (dropped before and after a run):
-- roles: worker worker_a worker_b
-- leftover roles: mailer_fleet

-- The example of the README and every guide: the outbox of e-mails, sent by
-- the fleet 'mailer' in 8 slots (examples/schema.sql), with some messages.
-- for: README.md docs/claiming.md docs/failures.md docs/groups.md docs/leases.md docs/migrating.md docs/my_items.md docs/ordered.md docs/wake.md
-- include: examples/schema.sql
INSERT INTO outbox (customer_id, recipient, body)
SELECT g % 100, 'user' || g || '@example.com', 'hello' FROM generate_series(1, 1000) g;

-- The table of my_items' examples, made again in the doc's own block.
-- for: docs/my_items.md
CREATE TABLE items (id bigint PRIMARY KEY, email text NOT NULL, done boolean NOT NULL DEFAULT false);
INSERT INTO items SELECT g, 'user' || g || '@example.com', false FROM generate_series(1, 1000) g;

-- The demo's work table and processing log (demo/src/table.rs).
-- for: docs/demo.md
CREATE TABLE work_items (id bigint PRIMARY KEY, payload text NOT NULL, done boolean NOT NULL DEFAULT false);
CREATE TABLE processing_log (item_id bigint NOT NULL, slot integer NOT NULL,
                             worker_pid integer NOT NULL, processed_at timestamptz NOT NULL);

-- A table the workers read, for the privilege examples.
-- for: docs/security.md
CREATE TABLE jobs (id bigint PRIMARY KEY, payload text);

-- docs/wake.md creates the example schema's trigger itself.
-- for: docs/wake.md
DROP TRIGGER outbox_wake ON outbox;

-- docs/operations.md: the example outbox with its 1,000 messages.
-- for: docs/operations.md
-- include: examples/schema.sql
INSERT INTO outbox (customer_id, recipient, body)
SELECT g % 100, 'user' || g || '@example.com', 'hello' FROM generate_series(1, 1000) g;
