-- Failing items (docs/failures.md): each failed attempt of an item recorded
-- with its error, retries held back with exponential back-off on the
-- server's clock, and the item set aside ("dead") after max_attempts, so a
-- share goes on past a poison item. The table is written only through the
-- SECURITY DEFINER functions below; each is one statement, so they work
-- inside any READ COMMITTED transaction and through a transaction-mode
-- pooler (record_failure and clear_failure refuse REPEATABLE READ and
-- SERIALIZABLE with 0A000). Every call of an extension function from them
-- is schema-qualified and exact-typed. The records are part of a dump
-- (pg_extension_config_dump): a restore keeps what was set aside.

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
SELECT pg_catalog.pg_extension_config_dump('@extschema@.pg_claim_failures', '');

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

-- The items of clear_failure and item_failures(name, items), checked as
-- failure_check checks one item; fn names the caller in the hint.
CREATE FUNCTION @extschema@.failure_items_check(fn text, name text, items text[])
RETURNS void LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    long_ text;
BEGIN
    PERFORM @extschema@.failure_check(name, ''::text);
    IF items IS NULL OR pg_catalog.array_position(items, NULL) IS NOT NULL THEN
        RAISE EXCEPTION '%', CASE WHEN items IS NULL THEN 'items must not be null'
                                  ELSE 'items must not contain null (element '
                                       || pg_catalog.array_position(items, NULL) || ')' END
            USING ERRCODE = '22004',
            HINT = pg_catalog.format('Pass the keys of the items as text, e.g. %s(''mailer'', ''42'') or %s(''mailer'', VARIADIC ids::text[]).', fn, fn);
    END IF;
    SELECT i INTO long_ FROM pg_catalog.unnest(items) i WHERE pg_catalog.octet_length(i) > 1024 LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.failure_check(name, long_);
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.failure_items_check(text, text, text[]) FROM PUBLIC;

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
    PERFORM @extschema@.pg_claim_need_read_committed('record_failure'::text);
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
    -- judged by its real length from now: an interval that mixes months
    -- with days ('1 mon -29 days') is as long as the calendar makes it today
    IF (extract(month FROM backoff) <> 0 OR extract(year FROM backoff) <> 0)
       AND (now_ + backoff < now_ OR now_ + backoff > now_ + interval '1 day') THEN
        RAISE EXCEPTION 'backoff must be between 0 and 1 day, got % (% from now)', backoff, (now_ + backoff) - now_
            USING ERRCODE = '22023',
            HINT = 'The first retry waits backoff, each further one twice as long (at most 1 day), e.g. interval ''10 seconds''.';
    END IF;
    IF extract(month FROM backoff) <> 0 OR extract(year FROM backoff) <> 0 THEN
        -- its real length, in days and time
        backoff := (now_ + backoff) - now_;
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
    IF name IS NULL OR item IS NULL
       OR pg_catalog.octet_length(name) > 1024 OR pg_catalog.octet_length(item) > 1024 THEN
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
    PERFORM @extschema@.failure_check(name, ''::text);
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
    PERFORM @extschema@.pg_claim_need_read_committed('clear_failure'::text);
    PERFORM @extschema@.failure_items_check('clear_failure'::text, name, items);
    DELETE FROM @extschema@.pg_claim_failures f
    WHERE f.name = clear_failure.name AND f.item = ANY (items);
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END $$;
COMMENT ON FUNCTION @extschema@.clear_failure(text, text[]) IS
    'forget the failures of the given items of name (after a success, or to retry a dead item): how many records were removed';

-- The state of a failure record whose next retry is retry_at: dead (set
-- aside: no retry), retry (held back until retry_at) or due. A SQL function
-- that the planner inlines into item_failures' queries.
CREATE FUNCTION @extschema@.pg_claim_failure_state(retry_at timestamptz) RETURNS text
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT CASE WHEN retry_at IS NULL THEN 'dead'
                WHEN retry_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() THEN 'retry'
                ELSE 'due' END
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_failure_state(timestamptz) FROM PUBLIC;

CREATE FUNCTION @extschema@.item_failures(name text)
RETURNS TABLE (item text, state text, attempts integer, last_error text,
               first_failed_at timestamptz, last_failed_at timestamptz, retry_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.failure_check(name, ''::text);
    RETURN QUERY
    SELECT f.item,
           @extschema@.pg_claim_failure_state(f.retry_at),
           f.attempts, f.last_error, f.first_failed_at, f.last_failed_at, f.retry_at
    FROM @extschema@.pg_claim_failures f
    WHERE f.name = item_failures.name
    ORDER BY f.item;
END $$;
COMMENT ON FUNCTION @extschema@.item_failures(text) IS
    'the failure records of name: item, state (retry, due or dead), attempts, last error, first and last failure, next retry';

-- The failure records of the given items only (a worker's batch): each read
-- through the primary key (name, item), whatever else is kept for the name.
CREATE FUNCTION @extschema@.item_failures(name text, VARIADIC items text[])
RETURNS TABLE (item text, state text, attempts integer, last_error text,
               first_failed_at timestamptz, last_failed_at timestamptz, retry_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- failure_items_check only when one of its checks can fail (a worker
    -- calls this once per batch: the nested call cost a fifth of it)
    IF name IS NULL OR items IS NULL OR pg_catalog.octet_length(name) > 1024
       OR pg_catalog.array_position(items, NULL) IS NOT NULL
       OR pg_catalog.octet_length(pg_catalog.array_to_string(items, '')) > 1024 THEN
        PERFORM @extschema@.failure_items_check('item_failures'::text, name, items);
    END IF;
    RETURN QUERY
    SELECT f.item,
           @extschema@.pg_claim_failure_state(f.retry_at),
           f.attempts, f.last_error, f.first_failed_at, f.last_failed_at, f.retry_at
    FROM (SELECT DISTINCT k.i FROM pg_catalog.unnest(items) k(i)) k
    -- one look-up of the primary key per item, whatever the table's
    -- statistics say (LIMIT keeps the planner from joining the whole table)
    CROSS JOIN LATERAL (
        SELECT f0.* FROM @extschema@.pg_claim_failures f0
        WHERE f0.name = item_failures.name AND f0.item = k.i LIMIT 1) f
    ORDER BY f.item;
END $$;
COMMENT ON FUNCTION @extschema@.item_failures(text, text[]) IS
    'the failure records of the given items of name (the others are not read): item, state (retry, due or dead), attempts, last error, first and last failure, next retry';

-- Whether name has any failure record (due, waiting or dead): one look-up of
-- the primary key's first column. A worker asks it now and then to leave
-- the failure records out of its fetch while the name has none.
CREATE FUNCTION @extschema@.has_failures(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL OR pg_catalog.octet_length(name) > 1024 THEN
        PERFORM @extschema@.failure_check(name, ''::text);
    END IF;
    RETURN EXISTS (SELECT 1 FROM @extschema@.pg_claim_failures f WHERE f.name = has_failures.name);
END $$;
COMMENT ON FUNCTION @extschema@.has_failures(text) IS
    'whether name has any failure record (due, waiting or dead)';
