-- pg_claim 0.2.0 -> 0.3.0, run by ALTER EXTENSION pg_claim UPDATE.
-- History, append-only: a released step is never edited; a change goes in a new step.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.2.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.3.0'" to load this file. \quit

-- Lease names: at most 1024 bytes. A longer name used to reach the primary
-- key of pg_claim_leases and fail there (54000, with a hint about indexes);
-- lease_check now refuses it with 22023 and a hint, and my_token checks its
-- name the same way. (The bodies are those of sql/leases.sql.)
CREATE OR REPLACE FUNCTION @extschema@.lease_check(name text, slot integer, token bigint, ttl interval)
RETURNS void LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'The name identifies the worker fleet, e.g. claim_lease(''mailer'', 8, ''worker-1''); a NULL name is usually an unset variable in the client.';
    END IF;
    -- names are keys of pg_claim_leases' primary key, whose entries must fit
    -- in a third of a page
    IF pg_catalog.octet_length(name) > 1024 THEN
        RAISE EXCEPTION 'name must be at most 1024 bytes, got % bytes (starting "%")',
            pg_catalog.octet_length(name), pg_catalog.left(name, 20)
            USING ERRCODE = '22023',
            HINT = 'The name identifies the worker fleet: use a short name such as ''mailer''.';
    END IF;
    IF slot IS NULL OR token IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN slot IS NULL THEN 'slot' ELSE 'token' END
            USING ERRCODE = '22004',
            HINT = 'Pass the slot and token claim_lease returned.';
    END IF;
    IF slot < 0 OR slot >= 1048576 THEN
        RAISE EXCEPTION 'slot must be between 0 and 1048575, got %', slot USING ERRCODE = '22023',
            HINT = 'Pass the slot claim_lease returned.';
    END IF;
    IF ttl IS NULL THEN
        RAISE EXCEPTION 'ttl must not be null' USING ERRCODE = '22004',
            HINT = 'Pass how long the lease lasts without a renewal, e.g. interval ''30 seconds''.';
    END IF;
    IF ttl <= interval '0' OR ttl > interval '1 day' THEN
        RAISE EXCEPTION 'ttl must be more than 0 and at most 1 day, got %', ttl USING ERRCODE = '22023',
            HINT = 'A lease lasts ttl without a renewal: choose a few times the renew period, e.g. 30 seconds renewed every 10.';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.my_token(name text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s integer;
    me text;
    r record;
    had_row boolean;
BEGIN
    IF name IS NULL THEN
        RETURN NULL;
    END IF;
    -- the name's checks (its length), as for a lease
    PERFORM @extschema@.lease_check(name, 0, 0, interval '1 second');
    s := @extschema@.my_slot(name);
    IF s IS NULL THEN
        RETURN NULL;
    END IF;
    me := 'session ' || pg_catalog.pg_backend_pid() || ' '
          || (SELECT extract(epoch FROM a.backend_start)
              FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a);
    SELECT l.holder, l.token, l.session INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = my_token.name AND l.slot = s;
    had_row := FOUND;
    IF had_row AND r.holder = me AND r.session THEN
        RETURN r.token;
    END IF;
    IF EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
               WHERE l.name = my_token.name AND NOT l.session AND l.holder IS NOT NULL) THEN
        RAISE EXCEPTION 'name "%" is leased with claim_lease; it cannot also be claimed with claim_slot', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
    END IF;
    IF had_row THEN
        -- the slot changed hands: wait for the previous holder's fenced
        -- transactions, then record this session with a greater token
        PERFORM 1 FROM @extschema@.pg_claim_leases l WHERE l.name = my_token.name AND l.slot = s FOR UPDATE;
        UPDATE @extschema@.pg_claim_leases l
        SET holder = me, session = true, n = NULL, token = @extschema@.next_token(l.token),
            acquired_at = pg_catalog.clock_timestamp(), expires_at = NULL
        WHERE l.name = my_token.name AND l.slot = s
        RETURNING l.token INTO r;
        RETURN r.token;
    END IF;
    INSERT INTO @extschema@.pg_claim_leases AS l (name, slot, holder, session, token, acquired_at)
    VALUES (my_token.name, s, me, true, @extschema@.next_token(NULL), pg_catalog.clock_timestamp())
    ON CONFLICT ON CONSTRAINT pg_claim_leases_pkey DO UPDATE
        SET holder = excluded.holder, session = true, n = NULL,
            token = @extschema@.next_token(l.token), acquired_at = excluded.acquired_at,
            expires_at = NULL
    RETURNING l.token INTO r;
    RETURN r.token;
END $$;

-- ---------------------------------------------------------------------------
-- my_items, my_items_query, slot_counts, slot_skew: new arguments `route`
-- (map a column other than the key to the slot, page on the key) and, for
-- my_items and my_items_query, `pending` (only the rows a boolean or
-- nullable column marks as pending, so a partial index serves the share).
-- A function's arguments are part of its identity: the old signatures are
-- dropped and the new ones created, with their comments. my_items_query and
-- slot_counts_query become version-1 C functions named pg_claim_<name>; the
-- library still exports the C names 0.2.0 declared (my_items_query_wrapper,
-- slot_counts_query_wrapper) and reads only the arguments a call passes, so
-- a database still at 0.2.0 works with this library until it is updated.
-- ---------------------------------------------------------------------------
DROP FUNCTION @extschema@.slot_skew(regclass, integer, text, text);
DROP FUNCTION @extschema@.slot_counts(regclass, integer, text, text);
DROP FUNCTION @extschema@.slot_counts_query(oid, integer, text, text);
DROP FUNCTION @extschema@.my_items(anyelement, integer, integer, text, text, text, integer, text[]);
DROP FUNCTION @extschema@.my_items_query(oid, integer, integer, text, text, text, integer, text[]);

CREATE FUNCTION @extschema@.my_items_query(
    rel oid, slot integer, n integer,
    key text DEFAULT NULL, method text DEFAULT 'auto',
    after text DEFAULT NULL, batch integer DEFAULT NULL, columns text[] DEFAULT NULL,
    route text DEFAULT NULL, pending text DEFAULT NULL)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_my_items_query';

CREATE FUNCTION @extschema@.slot_counts_query(
    rel oid, n integer, key text DEFAULT NULL, method text DEFAULT 'auto',
    route text DEFAULT NULL)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_slot_counts_query';

CREATE FUNCTION @extschema@.my_items(
    rel anyelement, slot integer, n integer,
    key text DEFAULT NULL, method text DEFAULT 'auto',
    after text DEFAULT NULL, batch integer DEFAULT NULL, columns text[] DEFAULT NULL,
    route text DEFAULT NULL, pending text DEFAULT NULL)
RETURNS SETOF anyelement
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_my_items';
COMMENT ON FUNCTION @extschema@.my_items(anyelement, integer, integer, text, text, text, integer, text[], text, text) IS
    'the rows of a table whose key (or route column) maps to slot of n: SELECT * FROM my_items(NULL::tbl, slot, n)';

CREATE FUNCTION @extschema@.slot_counts(
    rel regclass, n integer, key text DEFAULT NULL, method text DEFAULT 'auto',
    route text DEFAULT NULL)
RETURNS TABLE (slot integer, items bigint)
LANGUAGE plpgsql STABLE
AS $body$
BEGIN
    RETURN QUERY EXECUTE @extschema@.slot_counts_query(rel, n, key, method, route) USING n;
END
$body$;
COMMENT ON FUNCTION @extschema@.slot_counts(regclass, integer, text, text, text) IS
    'rows per slot 0 .. n-1 (0 for empty slots) of a table split by key (or route column)';

CREATE FUNCTION @extschema@.slot_skew(
    rel regclass, n integer, key text DEFAULT NULL, method text DEFAULT 'auto',
    route text DEFAULT NULL)
RETURNS TABLE (slots integer, items bigint, min_items bigint, max_items bigint,
               mean_items numeric, max_over_mean numeric)
LANGUAGE sql STABLE
AS $body$
    SELECT pg_catalog.count(*)::integer, pg_catalog.sum(c.items)::bigint,
           pg_catalog.min(c.items), pg_catalog.max(c.items),
           pg_catalog.round(pg_catalog.avg(c.items), 2),
           CASE WHEN pg_catalog.sum(c.items) OPERATOR(pg_catalog.>) 0
                THEN pg_catalog.round(pg_catalog.max(c.items) OPERATOR(pg_catalog./) pg_catalog.avg(c.items), 3) END
    FROM @extschema@.slot_counts(rel, n, key, method, route) AS c
$body$;
COMMENT ON FUNCTION @extschema@.slot_skew(regclass, integer, text, text, text) IS
    'how even a split is: smallest, largest and mean slot, and largest / mean';

-- ---------------------------------------------------------------------------
-- Fleets smaller than n, failing items, wake-up (docs/claiming.md "Fleet size",
-- docs/failures.md, docs/wake.md): claim_slots, my_slots, slot_status,
-- the failure table and its functions, slot_channel and notify_slot.

CREATE FUNCTION @extschema@."claim_slots"(
	"name" TEXT,
	"n" INT,
	"max" INT
) RETURNS INT[]
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'claim_slots_wrapper';

CREATE FUNCTION @extschema@."claim_slots"(
	"name" TEXT,
	"n" INT,
	"max" INT,
	"wait" interval
) RETURNS INT[]
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'claim_slots_wait_wrapper';

CREATE FUNCTION @extschema@."my_slots"(
	"name" TEXT
) RETURNS INT[]
STRICT STABLE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'my_slots_wrapper';

-- slot_status (docs/claiming.md): every slot of a name, served or not, in
-- every mode. Session claims come from the lock table (as slot_holders), leases
-- and my_token's records from lease_holders (SECURITY DEFINER); the function
-- itself runs with the caller's rights, so pg_stat_activity's privacy rules
-- apply to the holders' backend_start.
CREATE FUNCTION @extschema@.slot_status(name text, n integer)
RETURNS TABLE (slot integer, state text, holder text, token bigint, since timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'The name identifies the worker fleet, e.g. slot_status(''mailer'', 8).';
    END IF;
    IF n IS NULL THEN
        RAISE EXCEPTION 'n must not be null' USING ERRCODE = '22004',
            HINT = 'Pass the n the workers of the name use, e.g. slot_status(''mailer'', 8).';
    END IF;
    IF n < 1 OR n > 1048576 THEN
        RAISE EXCEPTION 'n must be between 1 and 1048576, got %', n USING ERRCODE = '22023',
            HINT = 'Pass the n the workers of the name use, e.g. slot_status(''mailer'', 8).';
    END IF;
    RETURN QUERY
    WITH sessions AS (
        SELECT DISTINCT l.objid::bigint::integer AS slot, l.pid
        FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
          AND l.mode = 'ExclusiveLock'
          AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                            WHERE d.datname = pg_catalog.current_database())
          AND l.classid = @extschema@.crc32(slot_status.name)::oid
          AND l.objid::bigint < slot_status.n
    ),
    records AS (
        SELECT h.slot, h.holder, h.token, h.acquired_at, h.expires_at, h.expired
        FROM @extschema@.lease_holders(slot_status.name) h
        WHERE h.slot < slot_status.n
    ),
    held AS (
        SELECT s.slot, 'session'::text AS state, 'pid ' || s.pid AS holder,
               r.token, coalesce(r.acquired_at, a.backend_start) AS since
        FROM sessions s
        LEFT JOIN LATERAL pg_catalog.pg_stat_get_activity(s.pid) a ON true
        LEFT JOIN records r ON r.slot = s.slot AND r.expires_at IS NULL
             AND r.holder = 'session ' || s.pid || ' ' || extract(epoch FROM a.backend_start)
        UNION ALL
        SELECT r.slot, 'lease', r.holder, r.token, r.acquired_at
        FROM records r
        WHERE r.expires_at IS NOT NULL AND NOT r.expired
    )
    SELECT h.slot, h.state, h.holder, h.token, h.since FROM held h
    UNION ALL
    SELECT g, 'unserved', r.holder, r.token, r.expires_at
    FROM pg_catalog.generate_series(0, slot_status.n - 1) g
    LEFT JOIN records r ON r.slot = g AND r.expires_at IS NOT NULL AND r.expired
    WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.slot = g)
    ORDER BY 1, 2;
END $$;
COMMENT ON FUNCTION @extschema@.slot_status(text, integer) IS
    'every slot 0 .. n-1 of name: held by a session, leased, or unserved (with the last lease''s expiry when known)';

-- Failing items (docs/failures.md): each failed attempt of an item recorded
-- with its error, retries held back with exponential back-off on the
-- server's clock, and the item set aside ("dead") after max_attempts, so a
-- share goes on past a poison item. The table is written only through the
-- SECURITY DEFINER functions below; each is one statement, so they work
-- inside any transaction and through a transaction-mode pooler.

CREATE TABLE @extschema@.pg_claim_failures (
    name            text        NOT NULL,
    item            text        NOT NULL,
    attempts        integer     NOT NULL,
    last_error      text        NOT NULL,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    -- when the item may be processed again; NULL: dead (set aside)
    retry_at        timestamptz,
    PRIMARY KEY (name, item)
);
REVOKE ALL ON @extschema@.pg_claim_failures FROM PUBLIC;
COMMENT ON TABLE @extschema@.pg_claim_failures IS
    'pg_claim''s failed items: attempts, last error, next retry or set aside; written only through record_failure and clear_failure';

-- The checks every failure function shares.
CREATE FUNCTION @extschema@.failure_check(name text, item text)
RETURNS void LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'The name identifies the worker fleet, e.g. record_failure(''mailer'', id::text, error); a NULL name is usually an unset variable in the client.';
    END IF;
    IF item IS NULL THEN
        RAISE EXCEPTION 'item must not be null' USING ERRCODE = '22004',
            HINT = 'Pass the failing item''s key as text, e.g. id::text.';
    END IF;
    -- both are the key of pg_claim_failures' primary key, whose entries must
    -- fit in a third of a page
    IF pg_catalog.octet_length(name) > 1024 THEN
        RAISE EXCEPTION 'name must be at most 1024 bytes, got % bytes (starting "%")',
            pg_catalog.octet_length(name), pg_catalog.left(name, 20)
            USING ERRCODE = '22023',
            HINT = 'The name identifies the worker fleet: use a short name such as ''mailer''.';
    END IF;
    IF pg_catalog.octet_length(item) > 1024 THEN
        RAISE EXCEPTION 'item must be at most 1024 bytes, got % bytes (starting "%")',
            pg_catalog.octet_length(item), pg_catalog.left(item, 20)
            USING ERRCODE = '22023',
            HINT = 'Pass the item''s key as text, e.g. id::text; record a longer key by a digest of it, e.g. md5(key).';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.failure_check(text, text) FROM PUBLIC;

CREATE FUNCTION @extschema@.record_failure(
    name text, item text, error text,
    max_attempts integer DEFAULT 5, backoff interval DEFAULT '10 seconds')
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    retry_ timestamptz;
BEGIN
    PERFORM @extschema@.failure_check(name, item);
    IF error IS NULL THEN
        RAISE EXCEPTION 'error must not be null' USING ERRCODE = '22004',
            HINT = 'Pass the error text of the failed attempt (an empty string if there is none).';
    END IF;
    IF max_attempts IS NULL OR backoff IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN max_attempts IS NULL THEN 'max_attempts' ELSE 'backoff' END
            USING ERRCODE = '22004',
            HINT = 'Leave the argument out for its default (5 attempts, 10 seconds), or pass a value.';
    END IF;
    IF max_attempts < 1 OR max_attempts > 1000 THEN
        RAISE EXCEPTION 'max_attempts must be between 1 and 1000, got %', max_attempts
            USING ERRCODE = '22023',
            HINT = 'max_attempts counts every attempt, the first included: after that many failures the item is set aside.';
    END IF;
    IF backoff < interval '0' OR backoff > interval '1 day' THEN
        RAISE EXCEPTION 'backoff must be between 0 and 1 day, got %', backoff USING ERRCODE = '22023',
            HINT = 'The first retry waits backoff, each further one twice as long (at most 1 day), e.g. interval ''10 seconds''.';
    END IF;
    -- attempts k (after this failure) waits backoff * 2^(k-1), at most 1 day;
    -- a dead item (retry_at NULL) stays dead
    INSERT INTO @extschema@.pg_claim_failures AS f
        (name, item, attempts, last_error, first_failed_at, last_failed_at, retry_at)
    VALUES (record_failure.name, record_failure.item, 1, pg_catalog.left(error, 10000), now_, now_,
            CASE WHEN max_attempts > 1 THEN now_ + LEAST(backoff, interval '1 day') END)
    ON CONFLICT ON CONSTRAINT pg_claim_failures_pkey DO UPDATE
        SET attempts = f.attempts + 1, last_error = excluded.last_error, last_failed_at = now_,
            retry_at = CASE WHEN f.retry_at IS NOT NULL AND f.attempts + 1 < max_attempts
                            THEN now_ + LEAST(
                                backoff * pg_catalog.power(2, LEAST(f.attempts, 20))::float8,
                                interval '1 day') END
    RETURNING f.retry_at INTO retry_;
    RETURN CASE WHEN retry_ IS NULL THEN 'dead' ELSE 'retry' END;
END $$;
COMMENT ON FUNCTION @extschema@.record_failure(text, text, text, integer, interval) IS
    'record a failed attempt of item of name with its error: ''retry'' (held back with exponential back-off) or ''dead'' (set aside after max_attempts attempts)';

CREATE FUNCTION @extschema@.failure_due(name text, item text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL OR item IS NULL THEN
        PERFORM @extschema@.failure_check(name, item);
    END IF;
    RETURN NOT EXISTS (
        SELECT 1 FROM @extschema@.pg_claim_failures f
        WHERE f.name = failure_due.name AND f.item = failure_due.item
          AND (f.retry_at IS NULL OR f.retry_at > pg_catalog.clock_timestamp()));
END $$;
COMMENT ON FUNCTION @extschema@.failure_due(text, text) IS
    'whether item of name may be processed now: no failure recorded, or not dead and its back-off over';

CREATE FUNCTION @extschema@.failing_items(name text)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.failure_check(name, '');
    RETURN QUERY
    SELECT f.item FROM @extschema@.pg_claim_failures f
    WHERE f.name = failing_items.name
      AND (f.retry_at IS NULL OR f.retry_at > pg_catalog.clock_timestamp())
    ORDER BY f.item;
END $$;
COMMENT ON FUNCTION @extschema@.failing_items(text) IS
    'the items of name to skip now: set aside (dead) or waiting for their retry; use as key::text NOT IN (SELECT failing_items(name))';

CREATE FUNCTION @extschema@.clear_failure(name text, VARIADIC items text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    removed integer;
BEGIN
    PERFORM @extschema@.failure_check(name, '');
    IF items IS NULL OR pg_catalog.array_position(items, NULL) IS NOT NULL THEN
        RAISE EXCEPTION '%', CASE WHEN items IS NULL THEN 'items must not be null'
                                  ELSE 'items must not contain null (element '
                                       || pg_catalog.array_position(items, NULL) || ')' END
            USING ERRCODE = '22004',
            HINT = 'Pass the keys of the items as text, e.g. clear_failure(''mailer'', ''42'') or clear_failure(''mailer'', VARIADIC ids::text[]).';
    END IF;
    DELETE FROM @extschema@.pg_claim_failures f
    WHERE f.name = clear_failure.name AND f.item = ANY (items);
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END $$;
COMMENT ON FUNCTION @extschema@.clear_failure(text, text[]) IS
    'forget the failures of the given items of name (after a success, or to retry a dead item): how many records were removed';

CREATE FUNCTION @extschema@.item_failures(name text)
RETURNS TABLE (item text, state text, attempts integer, last_error text,
               first_failed_at timestamptz, last_failed_at timestamptz, retry_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.failure_check(name, '');
    RETURN QUERY
    SELECT f.item,
           CASE WHEN f.retry_at IS NULL THEN 'dead'
                WHEN f.retry_at > pg_catalog.clock_timestamp() THEN 'retry'
                ELSE 'due' END,
           f.attempts, f.last_error, f.first_failed_at, f.last_failed_at, f.retry_at
    FROM @extschema@.pg_claim_failures f
    WHERE f.name = item_failures.name
    ORDER BY f.item;
END $$;
COMMENT ON FUNCTION @extschema@.item_failures(text) IS
    'the failure records of name: item, state (retry, due or dead), attempts, last error, first and last failure, next retry';

-- Waking a slot's worker (docs/wake.md): a per-slot LISTEN/NOTIFY channel,
-- and a row trigger function that notifies the channel of each new row's
-- slot. Notifications are hints: workers also poll, slowly.

CREATE FUNCTION @extschema@.slot_channel(name text, slot integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL OR slot IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN name IS NULL THEN 'name' ELSE 'slot' END
            USING ERRCODE = '22004',
            HINT = 'Pass the name of the fleet and a slot, e.g. slot_channel(''mailer'', my_slot(''mailer'')).';
    END IF;
    IF slot < 0 OR slot > 1048575 THEN
        RAISE EXCEPTION 'slot must be between 0 and 1048575, got %', slot USING ERRCODE = '22023',
            HINT = 'Pass a slot the worker holds, e.g. my_slot(''mailer'').';
    END IF;
    -- a lower-case identifier stays readable (unquoted in LISTEN); the slot
    -- is the part after the last underscore, so these never collide
    IF name ~ '^[a-z][a-z0-9_]*$' AND 10 + pg_catalog.octet_length(name) + pg_catalog.length(slot::text) <= 63 THEN
        RETURN 'pg_claim_' || name || '_' || slot;
    END IF;
    RETURN 'pg_claim__' || pg_catalog.lpad(pg_catalog.to_hex(@extschema@.crc32(name)), 8, '0') || '_' || slot;
END $$;
COMMENT ON FUNCTION @extschema@.slot_channel(text, integer) IS
    'the LISTEN/NOTIFY channel of slot of name, at most 63 bytes and usable unquoted';

-- EXECUTE FUNCTION notify_slot(name, n, column [, mapping])
CREATE FUNCTION @extschema@.notify_slot()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n_ integer;
    col text;
    mapping text;
    s integer;
BEGIN
    IF TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('INSERT', 'UPDATE') THEN
        RAISE EXCEPTION 'notify_slot must be a FOR EACH ROW trigger on INSERT or UPDATE, not % on %', TG_LEVEL, TG_OP
            USING ERRCODE = '39P01',
            HINT = 'CREATE TRIGGER ... AFTER INSERT ON tbl FOR EACH ROW EXECUTE FUNCTION notify_slot(''mailer'', ''8'', ''id'').';
    END IF;
    IF TG_NARGS NOT IN (3, 4) THEN
        RAISE EXCEPTION 'notify_slot takes 3 or 4 trigger arguments (name, n, column [, mapping]), got %', TG_NARGS
            USING ERRCODE = '22023',
            HINT = 'EXECUTE FUNCTION notify_slot(''mailer'', ''8'', ''id'') or notify_slot(''mailer'', ''8'', ''id'', ''jump_slot'').';
    END IF;
    IF TG_ARGV[1] !~ '^[0-9]{1,7}$' OR TG_ARGV[1]::integer NOT BETWEEN 1 AND 1048576 THEN
        RAISE EXCEPTION 'n must be an integer between 1 and 1048576, got "%"', TG_ARGV[1]
            USING ERRCODE = '22023',
            HINT = 'The second trigger argument is the n the workers use, e.g. ''8''.';
    END IF;
    n_ := TG_ARGV[1]::integer;
    col := TG_ARGV[2];
    mapping := coalesce(TG_ARGV[3], 'slot_of');
    IF mapping NOT IN ('slot_of', 'jump_slot') THEN
        RAISE EXCEPTION 'mapping must be slot_of or jump_slot, got "%"', mapping USING ERRCODE = '22023',
            HINT = 'Use the mapping of the workers'' walk; leave the fourth argument out for slot_of.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                   WHERE a.attrelid = TG_RELID AND a.attname = col AND a.attnum > 0
                     AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'table %.% has no column "%"', TG_TABLE_SCHEMA, TG_TABLE_NAME, col
            USING ERRCODE = '42703',
            HINT = 'The third trigger argument is the key column the workers'' slot_of uses, e.g. ''id''.';
    END IF;
    EXECUTE pg_catalog.format('SELECT @extschema@.%I(($1).%I, $2)', mapping, col) INTO s USING NEW, n_;
    IF s IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify(@extschema@.slot_channel(TG_ARGV[0], s), '');
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION @extschema@.notify_slot() IS
    'row trigger notify_slot(name, n, column [, mapping]): NOTIFY slot_channel(name, mapping(NEW.column, n)) for each new row';

