-- Waking a slot's worker: slot_channel names, notify_slot set-ups that work
-- and bad ones (the notifications themselves: tests/isolation/specs/wake.spec,
-- where they are printed without the sender's pid).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

SELECT p.oid::regprocedure AS function, provolatile, prosecdef, proconfig
FROM pg_proc p WHERE proname IN ('slot_channel', 'notify_slot')
ORDER BY p.oid::regprocedure::text;

SELECT slot_channel('mailer', 3) AS plain, slot_channel('Mailer', 3) AS upper_case,
       slot_channel('mail-er', 0) AS dash, slot_channel(repeat('m', 50), 1048575) AS long_name,
       slot_channel(repeat('m', 46), 1048575) AS longest_plain,
       slot_channel(repeat('m', 47), 1048575) AS one_byte_more,
       slot_channel('a_1', 2) <> slot_channel('a', 12) AS distinct_channels;
SELECT pc_try($$SELECT slot_channel(NULL, 1)$$) AS null_name;
SELECT pc_try($$SELECT slot_channel('m', NULL)$$) AS null_slot;
SELECT pc_try($$SELECT slot_channel('m', -1)$$) AS negative_slot;
SELECT pc_try($$SELECT slot_channel('m', 1048576)$$) AS huge_slot;

CREATE TABLE outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id bigint NOT NULL,
    recipient text NOT NULL,
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz);
CREATE INDEX outbox_pending ON outbox ((slot_of(id, 8)), id) WHERE sent_at IS NULL;
CREATE TRIGGER outbox_wake AFTER INSERT ON outbox
FOR EACH ROW EXECUTE FUNCTION notify_slot('mailer', '8', 'id');

-- inserts through the trigger; a NULL key notifies nothing
INSERT INTO outbox (customer_id, recipient, body) VALUES (1, 'a@example.com', 'hi');
CREATE TABLE wk_text (k text, v int);
CREATE TRIGGER wk_text_wake AFTER INSERT OR UPDATE ON wk_text
FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', '4', 'k', 'jump_slot');
INSERT INTO wk_text VALUES ('abc', 1), (NULL, 2);
UPDATE wk_text SET v = v + 1;
SELECT count(*) AS rows_in FROM outbox, wk_text;

-- Bad trigger set-ups: SQLSTATE, message naming the value, hint.
CREATE TABLE wk_bad (id bigint);
CREATE TRIGGER t1 AFTER INSERT ON wk_bad FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', '8');
SELECT pc_try($$INSERT INTO wk_bad VALUES (1)$$) AS too_few_arguments;
DROP TRIGGER t1 ON wk_bad;
CREATE TRIGGER t1 AFTER INSERT ON wk_bad FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', 'eight', 'id');
SELECT pc_try($$INSERT INTO wk_bad VALUES (1)$$) AS bad_n;
DROP TRIGGER t1 ON wk_bad;
CREATE TRIGGER t1 AFTER INSERT ON wk_bad FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', '0', 'id');
SELECT pc_try($$INSERT INTO wk_bad VALUES (1)$$) AS zero_n;
DROP TRIGGER t1 ON wk_bad;
CREATE TRIGGER t1 AFTER INSERT ON wk_bad FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', '8', 'nope');
SELECT pc_try($$INSERT INTO wk_bad VALUES (1)$$) AS no_column;
DROP TRIGGER t1 ON wk_bad;
CREATE TRIGGER t1 AFTER INSERT ON wk_bad FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', '8', 'id', 'range_slot');
SELECT pc_try($$INSERT INTO wk_bad VALUES (1)$$) AS bad_mapping;
DROP TRIGGER t1 ON wk_bad;
CREATE TRIGGER t1 AFTER INSERT ON wk_bad FOR EACH STATEMENT EXECUTE FUNCTION notify_slot('wk', '8', 'id');
SELECT pc_try($$INSERT INTO wk_bad VALUES (1)$$) AS statement_level;
DROP TRIGGER t1 ON wk_bad;
-- a key column of a type neither mapping takes: 42804 naming the column
-- and the type, at the first row (PostgreSQL gives an extension no say at
-- CREATE TRIGGER)
CREATE TABLE wk_types (amount numeric, d date, ok varchar(10));
CREATE TRIGGER t1 AFTER INSERT ON wk_types FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', '8', 'amount');
SELECT pc_try($$INSERT INTO wk_types VALUES (1.5, NULL, 'a')$$) AS numeric_key;
DROP TRIGGER t1 ON wk_types;
CREATE TRIGGER t1 AFTER INSERT ON wk_types FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', '8', 'd', 'jump_slot');
SELECT pc_try($$INSERT INTO wk_types VALUES (1.5, NULL, 'a')$$) AS date_key;
-- the set-up is kept per trigger, and dropped when the table changes: a
-- column whose type changes is checked again
DROP TRIGGER t1 ON wk_types;
CREATE TRIGGER t1 AFTER INSERT ON wk_types FOR EACH ROW EXECUTE FUNCTION notify_slot('wk', '8', 'ok');
SELECT pc_try($$INSERT INTO wk_types VALUES (1.5, NULL, 'a')$$) AS varchar_key;
ALTER TABLE wk_types ALTER COLUMN ok TYPE numeric USING NULL;
SELECT pc_try($$INSERT INTO wk_types VALUES (1.5, NULL, 2)$$) AS altered_to_numeric;
ALTER TABLE wk_types RENAME COLUMN amount TO ok2;
ALTER TABLE wk_types RENAME COLUMN ok TO gone;
SELECT pc_try($$INSERT INTO wk_types VALUES (1.5, NULL, 2)$$) AS renamed_away;
SELECT count(*) AS rows_in FROM wk_types;
DROP TABLE wk_types;
SELECT pc_try($$SELECT notify_slot()$$) AS not_as_trigger;
SELECT count(*) AS rows_kept FROM wk_bad;
