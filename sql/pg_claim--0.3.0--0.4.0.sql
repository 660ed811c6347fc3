-- pg_claim 0.3.0 -> 0.4.0, run by ALTER EXTENSION pg_claim UPDATE.
-- History, append-only: a released step is never edited; a change goes in a new step.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.3.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.4.0'" to load this file. \quit

-- ==== items ====
-- slot_counts calls slot_counts_query exact-typed (rel::oid): with rel as a
-- regclass, a slot_counts_query(regclass, ...) created in pg_claim's schema
-- matched better and ran instead. (The body is that of sql/items.sql.)
CREATE OR REPLACE FUNCTION @extschema@.slot_counts(
    rel regclass, n integer, key text DEFAULT NULL, method text DEFAULT 'auto',
    route text DEFAULT NULL)
RETURNS TABLE (slot integer, items bigint)
LANGUAGE plpgsql STABLE
AS $body$
BEGIN
    -- exact-typed (rel::oid): a slot_counts_query(regclass, ...) created in
    -- this schema would otherwise match better and run instead
    RETURN QUERY EXECUTE @extschema@.slot_counts_query(rel::pg_catalog.oid, n, key, method, route) USING n;
END
$body$;

-- notify_slot becomes a C trigger function (src/wake.rs): the same
-- arguments and channels, about the cost of a hand-written pg_notify
-- trigger, and no SQL function resolved per row. Triggers that use it keep
-- working (same function, replaced in place).
CREATE OR REPLACE FUNCTION @extschema@.notify_slot()
RETURNS trigger
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_claim_notify_slot';

-- ==== lease ====
-- Leases belong to roles; exact-typed calls; claims that do not depend on n
-- and hold the name's lock only for their statement; one slot, one holder
-- across modes; READ COMMITTED required; calendar intervals by their real
-- length; failure records dumped (docs/leases.md, docs/failures.md). The
-- bodies are those of sql/leases.sql, sql/status.sql and sql/failures.sql.
--
-- Existing leases and token records get no owner (NULL): until their slot
-- changes hands they behave as in 0.3.0, for any role that may call the
-- functions; the next holder's role then owns the slot's row.
ALTER TABLE @extschema@.pg_claim_leases ADD COLUMN owner oid;

-- Refuse at once (0A000) under REPEATABLE READ or SERIALIZABLE: the
-- functions that change leases and failure records must see the rows other
-- transactions committed since their snapshot.
CREATE FUNCTION @extschema@.pg_claim_need_read_committed(what text)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    level text := pg_catalog.current_setting('transaction_isolation');
BEGIN
    IF level IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION '% needs READ COMMITTED, but this transaction is %', what, pg_catalog.upper(level)
            USING ERRCODE = '0A000',
            HINT = 'Run it in its own READ COMMITTED transaction (autocommit), or set default_transaction_isolation = ''read committed'' for the worker role (ALTER ROLE ... SET).';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_need_read_committed(text) FROM PUBLIC;

-- Argument checks shared by the lease functions; each raises with a
-- SQLSTATE, a message naming the value and a hint. A ttl is judged by its
-- real length from now: an interval that mixes months with days or times
-- ('-1 mon 31 days') is as long as the calendar makes it today.
CREATE OR REPLACE FUNCTION @extschema@.lease_check(name text, slot integer, token bigint, ttl interval)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ timestamptz;
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
    IF extract(month FROM ttl) <> 0 OR extract(year FROM ttl) <> 0 THEN
        now_ := pg_catalog.clock_timestamp();
        IF now_ + ttl <= now_ OR now_ + ttl > now_ + interval '1 day' THEN
            RAISE EXCEPTION 'ttl must be more than 0 and at most 1 day, got % (% from now)', ttl, (now_ + ttl) - now_
                USING ERRCODE = '22023',
                HINT = 'A lease lasts ttl without a renewal: choose a few times the renew period, e.g. 30 seconds renewed every 10. An interval that mixes months with days is as long as the calendar makes it.';
        END IF;
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.lease_check(text, integer, bigint, interval) FROM PUBLIC;

-- claim_lease's argument checks.
CREATE FUNCTION @extschema@.pg_claim_lease_claim_check(name text, n integer, holder text, ttl interval)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.lease_check(name, 0::integer, 0::bigint, ttl);
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
            HINT = 'The holder names one claim instance (one worker process), the same on every call, e.g. host:pid:random.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_claim_check(text, integer, text, interval) FROM PUBLIC;

-- claim_lease (src/leases.rs) for `role`: takes the name's lease mutex at
-- session level for this statement only, and always gives it back.
CREATE FUNCTION @extschema@.pg_claim_lease_claim(
    role oid, name text, n integer, holder text, ttl interval,
    OUT slot integer, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    crc_ bigint;
    key_ integer;
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('claim_lease'::text);
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    -- The name registry (no two names share a lock key), before the name
    -- mutex: a claim_slot registering the name keeps the registry row
    -- locked until its transaction ends, and then takes the mutex.
    PERFORM @extschema@.pg_claim_register_name(name::pg_catalog.text);
    crc_ := @extschema@.crc32(name);
    key_ := (crc_::bit(32))::integer;
    -- One claimer of a name at a time, for this statement only: a
    -- claim_lease in an open transaction does not hold up other claimers.
    PERFORM pg_catalog.pg_advisory_lock(key_, 269484034);
    BEGIN
        SELECT t.slot, t.token, t.expires_at INTO slot, token, expires_at
        FROM @extschema@.pg_claim_lease_take(role, name, n, holder, ttl, crc_, key_) t;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
        RAISE;
    END;
    PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_claim(oid, text, integer, text, interval) FROM PUBLIC;

-- The body of claim_lease, under the name's mutex (called only by
-- pg_claim_lease_claim, whose owner's rights it runs with).
CREATE FUNCTION @extschema@.pg_claim_lease_take(
    role oid, name text, n integer, holder text, ttl interval, crc_ bigint, key_ integer,
    OUT slot integer, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    r record;
    lo integer := 0;
    g integer;
    tries integer := 0;
BEGIN
    -- the same checks again: a superuser may call this function directly
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    IF crc_ IS DISTINCT FROM @extschema@.crc32(name) OR key_ IS DISTINCT FROM (crc_::bit(32))::integer THEN
        RAISE EXCEPTION 'crc_ and key_ must be crc32(name) and its int4 form, got % and %', crc_, key_
            USING ERRCODE = '22023',
            HINT = 'This is claim_lease''s internal function: call claim_lease.';
    END IF;
    -- a name in session mode: claim_slot holds a slot of it
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks k
               WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
                 AND k.mode = 'ExclusiveLock'
                 AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                   WHERE d.datname = pg_catalog.current_database())
                 AND k.classid = crc_::oid AND k.objid::bigint <= 1048575) THEN
        RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease. The sessions that hold its slots: SELECT * FROM slot_status(name, n).';
    END IF;
    -- a name is leased by one role at a time
    SELECT l.owner INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_take.name AND NOT l.session AND l.holder IS NOT NULL
      AND l.expires_at > now_ AND l.owner IS NOT NULL AND l.owner <> role
      AND NOT pg_catalog.pg_has_role(role, l.owner, 'USAGE')
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'name "%" is leased by role %; role % cannot lease it', name,
            r.owner::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'A name is leased by one role at a time. Workers that log in as different roles share a name through a common role: GRANT fleet_role TO each worker role, and let them claim as fleet_role (SET ROLE, or ALTER ROLE worker SET role = ''fleet_role'').';
    END IF;
    -- live leases of another n
    SELECT l.n, l.holder INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_take.name AND NOT l.session AND l.holder IS NOT NULL
      AND l.expires_at > now_ AND l.n <> pg_claim_lease_take.n
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'n = % does not match n = % used by the live leases of "%" (for example holder "%")',
            pg_claim_lease_take.n, r.n, name, r.holder
            USING ERRCODE = '55000',
            HINT = 'All workers of one name must use the same n. Use the same n, or let the leases of the other n expire or be released first (SELECT * FROM lease_holders(name)).';
    END IF;

    -- the same holder again: the same slot and token, the expiry extended
    -- (also when it expired and no one took it meanwhile); one holder holds
    -- at most one slot of a name
    SELECT l.slot INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_take.name AND l.holder = pg_claim_lease_take.holder
      AND NOT l.session AND l.slot < pg_claim_lease_take.n
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    ORDER BY l.expires_at > now_ DESC, l.slot
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(key_, r.slot) THEN
            RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
                USING ERRCODE = '55000',
                HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
        END IF;
        UPDATE @extschema@.pg_claim_leases l
        SET expires_at = now_ + ttl, n = pg_claim_lease_take.n
        WHERE l.name = pg_claim_lease_take.name AND l.slot = r.slot
        RETURNING l.slot, l.token, l.expires_at
        INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at;
    ELSE
        -- a new acquisition
        LOOP
            tries := tries + 1;
            EXIT WHEN tries > 1000;
            -- the lowest slot >= lo without a row: found from the rows of
            -- the name, whatever n is
            SELECT CASE WHEN lo < pg_claim_lease_take.n AND NOT EXISTS (
                             SELECT 1 FROM @extschema@.pg_claim_leases l
                             WHERE l.name = pg_claim_lease_take.name AND l.slot = lo)
                        THEN lo
                        ELSE (SELECT min(l.slot) + 1 FROM @extschema@.pg_claim_leases l
                              WHERE l.name = pg_claim_lease_take.name AND l.slot >= lo
                                AND l.slot < pg_claim_lease_take.n - 1
                                AND NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases m
                                                WHERE m.name = pg_claim_lease_take.name
                                                  AND m.slot = l.slot + 1)) END
            INTO g;
            -- a lower slot whose lease expired or was released, or whose
            -- session record's session is gone (no session holds a slot of
            -- the name: checked above); a slot whose row a fenced
            -- transaction holds is skipped, never waited for
            SELECT l.slot INTO r FROM @extschema@.pg_claim_leases l
            WHERE l.name = pg_claim_lease_take.name
              AND l.slot < coalesce(g, pg_claim_lease_take.n)
              AND (l.holder IS NULL OR l.session OR l.expires_at <= now_)
            ORDER BY l.slot
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(key_, r.slot) THEN
                    RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
                        USING ERRCODE = '55000',
                        HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
                END IF;
                UPDATE @extschema@.pg_claim_leases l
                SET n = pg_claim_lease_take.n, holder = pg_claim_lease_take.holder, session = false,
                    owner = role, token = @extschema@.next_token(l.token),
                    acquired_at = now_, expires_at = now_ + ttl
                WHERE l.name = pg_claim_lease_take.name AND l.slot = r.slot
                RETURNING l.slot, l.token, l.expires_at
                INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at;
                EXIT;
            END IF;
            EXIT WHEN g IS NULL;
            -- the slot's first row; another claim_lease that is inserting it
            -- in a transaction not yet committed holds the reservation
            IF pg_catalog.pg_try_advisory_xact_lock(key_, 270532608 + g) THEN
                IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(key_, g) THEN
                    RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
                        USING ERRCODE = '55000',
                        HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
                END IF;
                INSERT INTO @extschema@.pg_claim_leases AS l
                    (name, slot, n, holder, token, acquired_at, expires_at, owner)
                VALUES (pg_claim_lease_take.name, g, pg_claim_lease_take.n, pg_claim_lease_take.holder,
                        @extschema@.next_token(NULL::bigint), now_, now_ + ttl, role)
                ON CONFLICT ON CONSTRAINT pg_claim_leases_pkey DO NOTHING
                RETURNING l.slot, l.token, l.expires_at
                INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at;
                EXIT WHEN FOUND;
            END IF;
            lo := g + 1;
        END LOOP;
        -- the holder's other slots (after a change of n) are free now
        IF pg_claim_lease_take.slot IS NOT NULL THEN
            UPDATE @extschema@.pg_claim_leases l SET holder = NULL, expires_at = NULL
            WHERE l.name = pg_claim_lease_take.name
              AND l.slot IN (SELECT o.slot FROM @extschema@.pg_claim_leases o
                             WHERE o.name = pg_claim_lease_take.name
                               AND o.holder = pg_claim_lease_take.holder AND NOT o.session
                               AND o.slot <> pg_claim_lease_take.slot
                               AND (o.owner IS NULL OR o.owner = role
                                    OR pg_catalog.pg_has_role(role, o.owner, 'USAGE'))
                             FOR UPDATE SKIP LOCKED);
        END IF;
        -- else: every slot is leased (or fenced): a standby
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_take(oid, text, integer, text, interval, bigint, integer) FROM PUBLIC;

CREATE FUNCTION @extschema@.pg_claim_lease_renew(
    role oid, name text, slot integer, token bigint, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    until_ timestamptz;
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('renew_lease'::text);
    PERFORM @extschema@.lease_check(name, slot, token, ttl);
    UPDATE @extschema@.pg_claim_leases l SET expires_at = pg_catalog.clock_timestamp() + ttl
    WHERE l.name = pg_claim_lease_renew.name AND l.slot = pg_claim_lease_renew.slot
      AND l.token = pg_claim_lease_renew.token AND l.holder IS NOT NULL AND NOT l.session
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    RETURNING l.expires_at INTO until_;
    RETURN until_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_renew(oid, text, integer, bigint, interval) FROM PUBLIC;

CREATE FUNCTION @extschema@.pg_claim_lease_release(role oid, name text, slot integer, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('release_lease'::text);
    PERFORM @extschema@.lease_check(name, slot, token, interval '1 second');
    -- waits for the holder's own fenced transactions: the slot changes hands
    -- only after them
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_release.name AND l.slot = pg_claim_lease_release.slot
      AND l.token = pg_claim_lease_release.token AND l.holder IS NOT NULL AND NOT l.session
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE @extschema@.pg_claim_leases l SET holder = NULL, expires_at = NULL
    WHERE l.name = pg_claim_lease_release.name AND l.slot = pg_claim_lease_release.slot;
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_release(oid, text, integer, bigint) FROM PUBLIC;

-- lease_holders' rows as arrays, one element a row: the leases and the live
-- session records of name (a session record is live while the session it
-- names holds the slot). holder and token are NULL for rows whose owner
-- role `role` lacks the privileges of.
CREATE FUNCTION @extschema@.pg_claim_lease_holders(
    role oid, name text,
    OUT slots integer[], OUT holders text[], OUT tokens bigint[],
    OUT acquired timestamptz[], OUT expires timestamptz[], OUT expired boolean[])
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN
        RETURN;
    END IF;
    WITH rows_ AS (
        SELECT l.slot, l.holder, l.token, l.acquired_at, l.expires_at, l.session,
               (l.owner IS NULL OR l.owner = role
                OR pg_catalog.pg_has_role(role, l.owner, 'USAGE')) AS visible
        FROM @extschema@.pg_claim_leases l
        WHERE l.name = pg_claim_lease_holders.name AND l.holder IS NOT NULL
    ),
    sessions AS MATERIALIZED (
        SELECT k.objid::bigint AS slot,
               'session ' || k.pid || ' ' || extract(epoch FROM a.backend_start) AS holder
        FROM pg_catalog.pg_locks k
        CROSS JOIN LATERAL pg_catalog.pg_stat_get_activity(k.pid) a
        WHERE EXISTS (SELECT 1 FROM rows_ WHERE rows_.session)
          AND k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
          AND k.mode = 'ExclusiveLock'
          AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                            WHERE d.datname = pg_catalog.current_database())
          AND k.classid = @extschema@.crc32(pg_claim_lease_holders.name)::oid
          AND k.objid::bigint <= 1048575
    )
    SELECT pg_catalog.array_agg(r.slot ORDER BY r.slot),
           pg_catalog.array_agg(CASE WHEN r.visible THEN r.holder END ORDER BY r.slot),
           pg_catalog.array_agg(CASE WHEN r.visible THEN r.token END ORDER BY r.slot),
           pg_catalog.array_agg(r.acquired_at ORDER BY r.slot),
           pg_catalog.array_agg(r.expires_at ORDER BY r.slot),
           pg_catalog.array_agg(r.expires_at <= pg_catalog.clock_timestamp() ORDER BY r.slot)
    INTO slots, holders, tokens, acquired, expires, expired
    FROM rows_ r
    WHERE NOT r.session
       OR EXISTS (SELECT 1 FROM sessions s WHERE s.slot = r.slot AND s.holder = r.holder);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_holders(oid, text) FROM PUBLIC;

-- lease_valid and fence are on every fenced write's path: one row look-up
-- (the owner checked only when it is another role), argument checks only
-- for a NULL.
CREATE FUNCTION @extschema@.pg_claim_lease_valid(role oid, name text, slot integer, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL OR slot IS NULL OR token IS NULL THEN
        PERFORM @extschema@.lease_check(name, slot, token, interval '1 second');
    END IF;
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_valid.name AND l.slot = pg_claim_lease_valid.slot
      AND l.token = pg_claim_lease_valid.token AND l.holder IS NOT NULL
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    FOR KEY SHARE;
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_valid(oid, text, integer, bigint) FROM PUBLIC;

CREATE FUNCTION @extschema@.pg_claim_lease_fence(role oid, name text, slot integer, token bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF name IS NULL OR slot IS NULL OR token IS NULL THEN
        PERFORM @extschema@.lease_check(name, slot, token, interval '1 second');
    END IF;
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_fence.name AND l.slot = pg_claim_lease_fence.slot
      AND l.token = pg_claim_lease_fence.token AND l.holder IS NOT NULL
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    FOR KEY SHARE;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT l.token, l.holder,
           (l.owner IS NULL OR l.owner = role
            OR pg_catalog.pg_has_role(role, l.owner, 'USAGE')) AS visible
    INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_fence.name AND l.slot = pg_claim_lease_fence.slot;
    RAISE EXCEPTION 'fencing token % of slot % of "%" is not current (%)', token, slot, name,
        CASE WHEN r.token IS NULL THEN 'the slot was never claimed'
             WHEN r.holder IS NULL THEN 'the slot was released'
             WHEN NOT r.visible THEN 'the slot is held by a role whose privileges this role lacks'
             ELSE 'its token is now ' || r.token END
        USING ERRCODE = 'PC001',
        HINT = 'This worker lost the slot (its lease expired and was taken over, or it was released): stop writing, and claim again.';
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_fence(oid, text, integer, bigint) FROM PUBLIC;

-- The fencing token of this session's claim_slot claim of name, recorded
-- the first time it is asked for after the slot changed hands (waiting for
-- the previous holder's fenced transactions); NULL when the session holds no
-- slot of name. Live leases of the name refuse it; expired leases and
-- records of sessions that no longer hold the slot do not.
CREATE FUNCTION @extschema@.pg_claim_lease_my_token(role oid, name text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s integer;
    me text;
    r record;
BEGIN
    IF name IS NULL THEN
        RETURN NULL;
    END IF;
    -- the name's checks (its length), as for a lease
    PERFORM @extschema@.lease_check(name, 0::integer, 0::bigint, interval '1 second');
    s := @extschema@.my_slot(name);
    IF s IS NULL THEN
        RETURN NULL;
    END IF;
    me := 'session ' || pg_catalog.pg_backend_pid() || ' '
          || (SELECT extract(epoch FROM a.backend_start)
              FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a);
    SELECT l.holder, l.token, l.session INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_my_token.name AND l.slot = s;
    IF FOUND AND r.holder = me AND r.session THEN
        RETURN r.token;
    END IF;
    -- from here on it writes
    PERFORM @extschema@.pg_claim_need_read_committed('my_token'::text);
    IF EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
               WHERE l.name = pg_claim_lease_my_token.name AND NOT l.session
                 AND l.holder IS NOT NULL AND l.expires_at > pg_catalog.clock_timestamp()) THEN
        RAISE EXCEPTION 'name "%" is leased with claim_lease; it cannot also be claimed with claim_slot', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
    END IF;
    -- the slot changed hands: wait for the previous holder's fenced
    -- transactions, then record this session with a greater token
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_my_token.name AND l.slot = s FOR UPDATE;
    INSERT INTO @extschema@.pg_claim_leases AS l (name, slot, holder, session, token, acquired_at, owner)
    VALUES (pg_claim_lease_my_token.name, s, me, true, @extschema@.next_token(NULL::bigint),
            pg_catalog.clock_timestamp(), role)
    ON CONFLICT ON CONSTRAINT pg_claim_leases_pkey DO UPDATE
        SET holder = excluded.holder, session = true, n = NULL,
            token = @extschema@.next_token(l.token), acquired_at = excluded.acquired_at,
            expires_at = NULL, owner = excluded.owner
    RETURNING l.token INTO r;
    RETURN r.token;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_my_token(oid, text) FROM PUBLIC;

-- claim_slot's check (D4 of the design): waits for any claim_lease of name
-- in progress (takes and at once gives back its mutex), then tells whether
-- name has a live lease. Called by claim_slot / claim_slots through the
-- function manager after taking a slot lock; no role may EXECUTE it.
CREATE FUNCTION @extschema@.pg_claim_leased(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    key_ integer;
BEGIN
    IF name IS NULL THEN
        RETURN false;
    END IF;
    key_ := (@extschema@.crc32(name)::bit(32))::integer;
    PERFORM pg_catalog.pg_advisory_lock(key_, 269484034);
    PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
    RETURN EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
                   WHERE l.name = pg_claim_leased.name AND NOT l.session
                     AND l.holder IS NOT NULL AND l.expires_at > pg_catalog.clock_timestamp());
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leased(text) FROM PUBLIC;

-- The public lease functions become the Rust functions of src/leases.rs
-- (SECURITY INVOKER; the same names, arguments, defaults and result
-- columns), which call the internal functions above with the caller's role.
CREATE OR REPLACE FUNCTION @extschema@."claim_lease"(
	"name" TEXT,
	"n" INT,
	"holder" TEXT,
	"ttl" interval DEFAULT '30 seconds'
) RETURNS TABLE (
	"slot" INT,
	"token" bigint,
	"expires_at" timestamp with time zone
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'claim_lease_wrapper';

CREATE OR REPLACE FUNCTION @extschema@."renew_lease"(
	"name" TEXT,
	"slot" INT,
	"token" bigint,
	"ttl" interval DEFAULT '30 seconds'
) RETURNS timestamp with time zone
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'renew_lease_wrapper';

CREATE OR REPLACE FUNCTION @extschema@."release_lease"(
	"name" TEXT,
	"slot" INT,
	"token" bigint
) RETURNS bool
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'release_lease_wrapper';

CREATE OR REPLACE FUNCTION @extschema@."lease_holders"(
	"name" TEXT
) RETURNS TABLE (
	"slot" INT,
	"holder" TEXT,
	"token" bigint,
	"acquired_at" timestamp with time zone,
	"expires_at" timestamp with time zone,
	"expired" bool
)
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_holders_wrapper';

CREATE OR REPLACE FUNCTION @extschema@."lease_valid"(
	"name" TEXT,
	"slot" INT,
	"token" bigint
) RETURNS bool
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_valid_wrapper';

CREATE OR REPLACE FUNCTION @extschema@."fence"(
	"name" TEXT,
	"slot" INT,
	"token" bigint
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'fence_wrapper';

CREATE OR REPLACE FUNCTION @extschema@."my_token"(
	"name" TEXT
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'my_token_wrapper';

COMMENT ON FUNCTION @extschema@.lease_holders(text) IS
    'the leases and live session claims of name: slot, holder, token (NULL for leases of roles whose privileges the caller lacks), since when, until when, and whether the lease expired';

-- slot_status: tokens by the rules of lease_holders
CREATE OR REPLACE FUNCTION @extschema@.slot_status(name text, n integer)
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
          AND l.classid = @extschema@.crc32(slot_status.name)::pg_catalog.oid
          AND l.objid::bigint < slot_status.n
          -- never another name's sessions
          AND @extschema@.pg_claim_name_owns_key(slot_status.name::pg_catalog.text)
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
        -- lease_holders returns only the live session records: the one of a
        -- held slot is its holder's
        LEFT JOIN records r ON r.slot = s.slot AND r.expires_at IS NULL
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

-- Failure records
-- The checks every failure function shares.
CREATE OR REPLACE FUNCTION @extschema@.failure_check(name text, item text)
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

CREATE OR REPLACE FUNCTION @extschema@.record_failure(
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

CREATE OR REPLACE FUNCTION @extschema@.failure_due(name text, item text)
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

CREATE OR REPLACE FUNCTION @extschema@.failing_items(name text)
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

CREATE OR REPLACE FUNCTION @extschema@.clear_failure(name text, VARIADIC items text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    removed integer;
    long_ text;
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('clear_failure'::text);
    PERFORM @extschema@.failure_check(name, ''::text);
    IF items IS NULL OR pg_catalog.array_position(items, NULL) IS NOT NULL THEN
        RAISE EXCEPTION '%', CASE WHEN items IS NULL THEN 'items must not be null'
                                  ELSE 'items must not contain null (element '
                                       || pg_catalog.array_position(items, NULL) || ')' END
            USING ERRCODE = '22004',
            HINT = 'Pass the keys of the items as text, e.g. clear_failure(''mailer'', ''42'') or clear_failure(''mailer'', VARIADIC ids::text[]).';
    END IF;
    SELECT i INTO long_ FROM pg_catalog.unnest(items) i WHERE pg_catalog.octet_length(i) > 1024 LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.failure_check(name, long_);
    END IF;
    DELETE FROM @extschema@.pg_claim_failures f
    WHERE f.name = clear_failure.name AND f.item = ANY (items);
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END $$;
COMMENT ON FUNCTION @extschema@.clear_failure(text, text[]) IS
    'forget the failures of the given items of name (after a success, or to retry a dead item): how many records were removed';

CREATE OR REPLACE FUNCTION @extschema@.item_failures(name text)
RETURNS TABLE (item text, state text, attempts integer, last_error text,
               first_failed_at timestamptz, last_failed_at timestamptz, retry_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.failure_check(name, ''::text);
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

SELECT pg_catalog.pg_extension_config_dump('@extschema@.pg_claim_failures', '');

-- ==== claim ====
-- The name registry (sql/names.sql): names never share lock keys.
CREATE TABLE @extschema@.pg_claim_names (
    -- crc32(name) as a signed int4: the name's first advisory lock key
    key              integer     PRIMARY KEY,
    name             text        NOT NULL,
    first_claimed_at timestamptz NOT NULL
);
REVOKE ALL ON @extschema@.pg_claim_names FROM PUBLIC;
COMMENT ON TABLE @extschema@.pg_claim_names IS
    'pg_claim''s name registry: the name that owns each lock key; written only through pg_claim_register_name';
-- kept by pg_dump and restored with the extension
SELECT pg_catalog.pg_extension_config_dump('@extschema@.pg_claim_names', '');
-- The extension's owner (a database owner, in a trusted install) may read
-- the registry, restore it (pg_restore --role=owner) and free a name that
-- is no longer used (DELETE).
DO $owner$
BEGIN
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON @extschema@.pg_claim_names TO %s',
        (SELECT e.extowner::pg_catalog.regrole::pg_catalog.text
         FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim'));
END $owner$;

-- Internal (EXECUTE revoked from PUBLIC): called by the claiming functions
-- through the function manager and by claim_lease. Registers `name` under
-- its key if the key is free; raises 42710 if another name has the key. In
-- a read-only transaction or during recovery it only checks.
CREATE FUNCTION @extschema@.pg_claim_register_name(name text) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k integer;
    other text;
BEGIN
    IF name IS NULL THEN
        RETURN;
    END IF;
    k := (@extschema@.crc32(name)::bit(32))::integer;
    SELECT r.name INTO other FROM @extschema@.pg_claim_names r WHERE r.key = k;
    IF NOT FOUND THEN
        IF pg_catalog.pg_is_in_recovery()
           OR pg_catalog.current_setting('transaction_read_only') = 'on' THEN
            RETURN;
        END IF;
        INSERT INTO @extschema@.pg_claim_names AS r (key, name, first_claimed_at)
        VALUES (k, pg_claim_register_name.name, pg_catalog.clock_timestamp())
        ON CONFLICT (key) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        -- registered by a concurrent transaction that committed meanwhile
        SELECT r.name INTO other FROM @extschema@.pg_claim_names r WHERE r.key = k;
    END IF;
    IF other IS DISTINCT FROM name THEN
        RAISE EXCEPTION 'name "%" has the same lock key (crc32 %) as name "%", which is already in use in this database',
            name, @extschema@.crc32(name), other
            USING ERRCODE = '42710',
            HINT = 'Names are keyed by their crc32, and two names with one key would share slots. Choose another name (for example append a suffix), such that crc32(new name) differs.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_register_name(text) FROM PUBLIC;

-- Whether name's lock key is free or registered to name itself (false when
-- another name has it). The readers of the lock table (slot_holders,
-- slot_status, group_members, group_position) show nothing for a name whose
-- key belongs to another name, so they never name another fleet's sessions.
-- Tells no more than the 42710 of a claim would.
CREATE FUNCTION @extschema@.pg_claim_name_owns_key(name text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_names r
                       WHERE r.key = (@extschema@.crc32($1)::bit(32))::integer
                         AND r.name <> $1)
$$;
COMMENT ON FUNCTION @extschema@.pg_claim_name_owns_key(text) IS
    'whether the lock key of name (its crc32) is free or registered to name itself';

-- ==== claim: grants (keep this section last) ====
-- Who may claim (sql/grants.sql): EXECUTE on the claiming functions granted
-- to PUBLIC by the extension's owner, so that the owner can revoke it. Run
-- after every section that creates such a function. An ALTER EXTENSION
-- UPDATE run by a superuser on an extension a database owner installed
-- still makes that owner (pg_extension.extowner) the grantor.
-- The grants to PUBLIC, made by the extension's owner: this function is
-- given to the owner below and dropped once called.
CREATE FUNCTION @extschema@.pg_claim_grant_to_public(fns pg_catalog.regprocedure[])
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f pg_catalog.regprocedure;
BEGIN
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) FROM PUBLIC;

DO $grants$
DECLARE
    fns pg_catalog.regprocedure[];
    public_fns pg_catalog.regprocedure[];
    f pg_catalog.regprocedure;
    owner_ pg_catalog.text;
    path_ pg_catalog.text := pg_catalog.current_setting('search_path');
BEGIN
    -- function signatures below print schema-qualified
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    SELECT e.extowner::pg_catalog.regrole::pg_catalog.text INTO owner_
    FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim';
    SELECT pg_catalog.array_agg(p.oid::pg_catalog.regprocedure ORDER BY p.oid) INTO fns
    FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_proc p ON p.oid = d.objid
    WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
      AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
      AND d.deptype = 'e'
      AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim')
      AND (p.proname = ANY (ARRAY[
               'claim_slot', 'claim_slots', 'release_slot', 'my_slot', 'my_slots',
               'slot_holders', 'slot_status',
               'claim_lease', 'claim_leases', 'renew_lease', 'release_lease',
               'lease_holders', 'fence', 'lease_valid', 'my_token',
               'claim_partitions', 'my_partitions',
               'record_failure', 'failure_due', 'failing_items', 'clear_failure',
               'item_failures']::pg_catalog.name[])
           OR p.proname OPERATOR(pg_catalog.~~) 'group\_%');
    -- (in an upgrade, a function whose EXECUTE was already revoked from
    -- PUBLIC stays revoked)
    SELECT pg_catalog.array_agg(f2 ORDER BY f2::pg_catalog.oid) INTO public_fns
    FROM pg_catalog.unnest(fns) f2
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc p,
                  pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                  WHERE p.oid = f2::pg_catalog.oid AND a.grantee = 0 AND a.privilege_type = 'EXECUTE');
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s WITH GRANT OPTION', f, owner_);
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) OWNER TO %s', owner_);
    PERFORM @extschema@.pg_claim_grant_to_public(coalesce(public_fns, '{}'));
    PERFORM pg_catalog.set_config('search_path', path_, true);
END $grants$;

DROP FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]);
