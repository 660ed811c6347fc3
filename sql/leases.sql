-- Leases and fencing tokens (docs/leases.md).
--
-- A lease is a row of @extschema@.pg_claim_leases: who holds slot `slot` of `name`
-- until `expires_at` on the database server's clock, with a fencing token
-- that strictly increases for the slot at every change of holder. Each
-- function is one statement, so it works inside any transaction and through
-- a transaction-mode pooler. The functions are SECURITY DEFINER with a fixed
-- search_path: the table is written only through them.
--
-- Row locks carry the fencing guarantee:
--   fence / lease_valid         FOR KEY SHARE on the slot's row, to the end
--                               of the caller's transaction
--   renew_lease                 UPDATE of expires_at only (FOR NO KEY UPDATE),
--                               which does not conflict with KEY SHARE
--   a change of holder          FOR UPDATE first, which conflicts with KEY
--   (claim_lease, my_token,     SHARE: claim_lease skips a slot that a fenced
--   release_lease)              transaction holds, my_token and release_lease
--                               wait for it
-- so a slot cannot change hands while a transaction that passed fence with
-- the slot's token is open.
--
-- Tokens are max(previous token of the slot + 1, microseconds since the epoch
-- on the server's clock): they increase at every change of holder, and a
-- token issued after a crash, a restore of a base backup or a failover to a
-- replica is greater than every token issued before it, as long as the
-- server's clock does not go back.

CREATE TABLE @extschema@.pg_claim_leases (
    name        text        NOT NULL,
    slot        integer     NOT NULL,
    -- the n of the lease's claimer (NULL for a session claim's record)
    n           integer,
    -- the lease holder's name, or the session that holds the slot with
    -- claim_slot ('session <pid> <backend start, seconds since the epoch>',
    -- whatever the session's DateStyle and TimeZone); NULL: free
    holder      text,
    -- a session claim's record (my_token), not a lease
    session     boolean     NOT NULL DEFAULT false,
    token       bigint      NOT NULL,
    acquired_at timestamptz,
    -- NULL for session records: they last as long as the session's claim
    expires_at  timestamptz,
    PRIMARY KEY (name, slot)
);
REVOKE ALL ON @extschema@.pg_claim_leases FROM PUBLIC;
COMMENT ON TABLE @extschema@.pg_claim_leases IS
    'pg_claim''s leases and fencing tokens; written only through claim_lease, renew_lease, release_lease and my_token';

-- The next token of a slot whose current token is `previous` (NULL: none).
CREATE FUNCTION @extschema@.next_token(previous bigint) RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT greatest(coalesce(previous, 0) + 1,
                    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
$$;
REVOKE ALL ON FUNCTION @extschema@.next_token(bigint) FROM PUBLIC;

-- Argument checks shared by the lease functions; each raises with a
-- SQLSTATE, a message naming the value and a hint.
CREATE FUNCTION @extschema@.lease_check(name text, slot integer, token bigint, ttl interval)
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
REVOKE ALL ON FUNCTION @extschema@.lease_check(text, integer, bigint, interval) FROM PUBLIC;

CREATE FUNCTION @extschema@.claim_lease(
    name text, n integer, holder text, ttl interval DEFAULT '30 seconds')
RETURNS TABLE (slot integer, token bigint, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ timestamptz;
    r record;
    s integer;
BEGIN
    PERFORM @extschema@.lease_check(name, 0, 0, ttl);
    IF n IS NULL THEN
        RAISE EXCEPTION 'n must not be null' USING ERRCODE = '22004',
            HINT = 'The argument n is the number of slots (workers) of the name: pass the same n from every worker.';
    END IF;
    IF n < 1 OR n > 1048576 THEN
        RAISE EXCEPTION 'n must be between 1 and 1048576, got %', n USING ERRCODE = '22023',
            HINT = 'The argument n is the number of slots (workers) of the name: pass the same n from every worker.';
    END IF;
    IF holder IS NULL OR holder = '' THEN
        RAISE EXCEPTION 'holder must not be %', CASE WHEN holder IS NULL THEN 'null' ELSE 'empty' END
            USING ERRCODE = CASE WHEN holder IS NULL THEN '22004' ELSE '22023' END,
            HINT = 'The holder names this worker, the same on every call, e.g. its host name and process id.';
    END IF;
    -- D3 (claim branch): the name registry, before the name mutex: a
    -- claim_slot registering the name holds its row until its transaction
    -- ends and then takes the mutex (the other order deadlocks, 40P01)
    PERFORM @extschema@.pg_claim_register_name(name::pg_catalog.text);
    -- One claimer of a name at a time, to the end of the calling transaction
    -- (the statement itself, through a pooler or in autocommit).
    PERFORM pg_catalog.pg_advisory_xact_lock(
        (@extschema@.crc32(name)::bit(32))::integer, 269484034);
    now_ := pg_catalog.clock_timestamp();
    -- D4 (claim branch): a session holds a slot of the name with claim_slot
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks k
               WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
                 AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                   WHERE d.datname = pg_catalog.current_database())
                 AND k.classid = (@extschema@.crc32(name)::pg_catalog.oid)
                 AND k.objid < 1048576::pg_catalog.oid AND k.mode = 'ExclusiveLock') THEN
        RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
    END IF;

    IF EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l WHERE l.name = claim_lease.name AND l.session) THEN
        RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
    END IF;
    -- live leases of another n
    SELECT l.n, l.holder INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = claim_lease.name AND l.holder IS NOT NULL AND l.expires_at > now_
      AND l.n <> claim_lease.n
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'n = % does not match n = % used by the live leases of "%" (for example holder "%")',
            claim_lease.n, r.n, name, r.holder
            USING ERRCODE = '55000',
            HINT = 'All workers of one name must use the same n. Use the same n, or let the leases of the other n expire or be released first (SELECT * FROM lease_holders(name)).';
    END IF;

    -- the same holder again: the same slot and token, the expiry extended
    -- (also when it expired and no one took it meanwhile)
    UPDATE @extschema@.pg_claim_leases l SET expires_at = now_ + ttl, n = claim_lease.n
    WHERE l.name = claim_lease.name AND l.holder = claim_lease.holder AND NOT l.session
      AND l.slot < claim_lease.n
    RETURNING l.slot, l.token, l.expires_at INTO r;
    IF FOUND THEN
        slot := r.slot; token := r.token; expires_at := r.expires_at;
        RETURN NEXT;
        RETURN;
    END IF;

    -- the lowest slot that is free or whose lease expired; a slot whose row a
    -- fenced transaction holds is skipped, never waited for
    FOR r IN
        SELECT l.slot FROM @extschema@.pg_claim_leases l
        WHERE l.name = claim_lease.name AND l.slot < claim_lease.n
          AND (l.holder IS NULL OR l.expires_at <= now_)
        ORDER BY l.slot
        FOR UPDATE SKIP LOCKED
    LOOP
        -- a slot without a row below it is lower still
        SELECT g INTO s FROM pg_catalog.generate_series(0, r.slot - 1) g
        WHERE NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
                          WHERE l.name = claim_lease.name AND l.slot = g)
        ORDER BY g LIMIT 1;
        EXIT WHEN s IS NOT NULL;
        UPDATE @extschema@.pg_claim_leases l
        SET n = claim_lease.n, holder = claim_lease.holder, session = false,
            token = @extschema@.next_token(l.token), acquired_at = now_, expires_at = now_ + ttl
        WHERE l.name = claim_lease.name AND l.slot = r.slot
        RETURNING l.slot, l.token, l.expires_at INTO slot, token, expires_at;
        RETURN NEXT;
        RETURN;
    END LOOP;

    -- no reusable row: the lowest slot without a row, if any
    IF s IS NULL THEN
        SELECT g INTO s FROM pg_catalog.generate_series(0, claim_lease.n - 1) g
        WHERE NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
                          WHERE l.name = claim_lease.name AND l.slot = g)
        ORDER BY g LIMIT 1;
    END IF;
    IF s IS NOT NULL THEN
        INSERT INTO @extschema@.pg_claim_leases AS l (name, slot, n, holder, token, acquired_at, expires_at)
        VALUES (claim_lease.name, s, claim_lease.n, claim_lease.holder,
                @extschema@.next_token(NULL), now_, now_ + ttl)
        RETURNING l.slot, l.token, l.expires_at INTO slot, token, expires_at;
        RETURN NEXT;
    END IF;
    -- else: every slot is leased (or fenced): a standby
END $$;
COMMENT ON FUNCTION @extschema@.claim_lease(text, integer, text, interval) IS
    'claim the lowest free or expired slot of name in 0 .. n-1 for holder until ttl from now: one row (slot, token, expires_at), or none when all are leased';

CREATE FUNCTION @extschema@.renew_lease(
    name text, slot integer, token bigint, ttl interval DEFAULT '30 seconds')
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    until_ timestamptz;
BEGIN
    PERFORM @extschema@.lease_check(name, slot, token, ttl);
    UPDATE @extschema@.pg_claim_leases l SET expires_at = pg_catalog.clock_timestamp() + ttl
    WHERE l.name = renew_lease.name AND l.slot = renew_lease.slot AND l.token = renew_lease.token
      AND l.holder IS NOT NULL AND NOT l.session
    RETURNING l.expires_at INTO until_;
    RETURN until_;
END $$;
COMMENT ON FUNCTION @extschema@.renew_lease(text, integer, bigint, interval) IS
    'extend a lease to ttl from now: the new expiry, or NULL when the lease was lost (taken over or released)';

CREATE FUNCTION @extschema@.release_lease(name text, slot integer, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.lease_check(name, slot, token, interval '1 second');
    -- waits for the holder's own fenced transactions: the slot changes hands
    -- only after them
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = release_lease.name AND l.slot = release_lease.slot
      AND l.token = release_lease.token AND l.holder IS NOT NULL AND NOT l.session
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE @extschema@.pg_claim_leases l SET holder = NULL, expires_at = NULL
    WHERE l.name = release_lease.name AND l.slot = release_lease.slot;
    RETURN true;
END $$;
COMMENT ON FUNCTION @extschema@.release_lease(text, integer, bigint) IS
    'give a lease back; false when this token does not hold it';

CREATE FUNCTION @extschema@.lease_holders(name text)
RETURNS TABLE (slot integer, holder text, token bigint, acquired_at timestamptz,
               expires_at timestamptz, expired boolean)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT l.slot, l.holder, l.token, l.acquired_at, l.expires_at,
           l.expires_at <= clock_timestamp()
    FROM @extschema@.pg_claim_leases l
    WHERE l.name = lease_holders.name AND l.holder IS NOT NULL
    ORDER BY l.slot
$$;
COMMENT ON FUNCTION @extschema@.lease_holders(text) IS
    'the leases and session claims with a token of name: slot, holder, token, since when, until when, and whether the lease expired';

-- lease_valid is on every fenced write's path: its argument check is inline
-- (a NULL is 22004, anything else that matches no lease is simply not valid).
CREATE FUNCTION @extschema@.lease_valid(name text, slot integer, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL OR slot IS NULL OR token IS NULL THEN
        PERFORM @extschema@.lease_check(name, slot, token, interval '1 second');
    END IF;
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = lease_valid.name AND l.slot = lease_valid.slot AND l.token = lease_valid.token
      AND l.holder IS NOT NULL
    FOR KEY SHARE;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION @extschema@.lease_valid(text, integer, bigint) IS
    'whether token is the current token of slot of name; when true, the slot cannot change hands before the calling transaction ends';

CREATE FUNCTION @extschema@.fence(name text, slot integer, token bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    current_ bigint;
    holder_ text;
BEGIN
    IF @extschema@.lease_valid(name, slot, token) THEN
        RETURN;
    END IF;
    SELECT l.token, l.holder INTO current_, holder_ FROM @extschema@.pg_claim_leases l
    WHERE l.name = fence.name AND l.slot = fence.slot;
    RAISE EXCEPTION 'fencing token % of slot % of "%" is not current (%)', token, slot, name,
        CASE WHEN current_ IS NULL THEN 'the slot was never claimed'
             WHEN holder_ IS NULL THEN 'the slot was released'
             ELSE 'its token is now ' || current_ END
        USING ERRCODE = 'PC001',
        HINT = 'This worker lost the slot (its lease expired and was taken over, or it was released): stop writing, and claim again.';
END $$;
COMMENT ON FUNCTION @extschema@.fence(text, integer, bigint) IS
    'raise PC001 unless token is the current token of slot of name; when it passes, the slot cannot change hands before the calling transaction ends';

-- The fencing token of this session's claim_slot claim of name, recorded
-- the first time it is asked for after the slot changed hands (waiting for
-- the previous holder's fenced transactions); NULL when the session holds no
-- slot of name.
CREATE FUNCTION @extschema@.my_token(name text)
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
COMMENT ON FUNCTION @extschema@.my_token(text) IS
    'the fencing token of this session''s claim_slot claim of name (NULL when it holds none), for fence and lease_valid';

-- D4 (claim branch)
-- Internal (EXECUTE revoked from PUBLIC): whether name has a live lease.
-- claim_slot and claim_slots call it through the function manager after
-- taking a new slot lock, and give the slot back when it returns true. It
-- first waits for a claim_lease of the name in progress (the name mutex,
-- taken and released at once at session level), so that of a claim_lease
-- and a claim_slot racing for one name, one always sees the other.
CREATE FUNCTION @extschema@.pg_claim_leased(name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k integer;
BEGIN
    IF name IS NULL THEN
        RETURN false;
    END IF;
    k := (@extschema@.crc32(name)::bit(32))::integer;
    PERFORM pg_catalog.pg_advisory_lock(k, 269484034);
    PERFORM pg_catalog.pg_advisory_unlock(k, 269484034);
    RETURN EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
                   WHERE l.name = pg_claim_leased.name AND l.holder IS NOT NULL AND NOT l.session
                     AND l.expires_at > pg_catalog.clock_timestamp());
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leased(text) FROM PUBLIC;
