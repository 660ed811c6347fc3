-- The example schema of pg_claim's README, guides and example workers
-- (examples/*/worker.*): an outbox of e-mails that a fleet named 'mailer'
-- sends, split into 8 slots by id.
--
--   psql -d app -f examples/schema.sql
CREATE EXTENSION IF NOT EXISTS pg_claim;

CREATE TABLE outbox (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id bigint NOT NULL,
    recipient   text NOT NULL,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz              -- NULL: not sent yet
);

-- Each worker reads only the unsent messages of its own slots, in id order.
CREATE INDEX outbox_pending ON outbox ((slot_of(id, 8)), id) WHERE sent_at IS NULL;

-- A new message wakes the worker that serves its slot (docs/wake.md).
CREATE TRIGGER outbox_wake AFTER INSERT ON outbox
FOR EACH ROW EXECUTE FUNCTION notify_slot('mailer', '8', 'id');

-- The example workers' stand-in for a mail server: one row per message
-- delivered, written in the transaction that marks the message sent, so a
-- run can be checked (every message delivered exactly once).
CREATE TABLE deliveries (
    outbox_id    bigint NOT NULL,
    worker       text NOT NULL,
    delivered_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
