-- Claiming an identity in the portable edition (docs/claiming.md): claim_slot,
-- claim_slots, release_slot, my_slot, my_slots, slot_holders, with the lock
-- layout of the extension (src/locks.rs): a slot is the session-level
-- advisory lock (crc32(name) as int4, slot), exclusive; a claimer also holds
-- the shared "n record" (key, 0x10000000 + n) and "claimers" (key,
-- 0x10000000) locks, taken under the name's claim mutex (key, 0x10100001)
-- so that the live claimers of a name agree on n; a waiting standby holds
-- (key, 0x10100003) shared.
--
-- The extension keeps what a session holds in the backend's memory; here it
-- is read from the session's own rows of pg_locks, and the session's own
-- slot among several (claim_slots) from a session setting
-- (pg_claim_portable.slot_<crc32>). The functions are SECURITY DEFINER with a fixed
-- search_path: they call the internal pg_claim_register_name and
-- pg_claim_leased, which no role may EXECUTE; advisory locks belong to the
-- session whoever runs the function.

-- This session's granted advisory locks of name key key1: (key2, exclusive).
CREATE FUNCTION @extschema@.pg_claim_own_locks(key1 integer, OUT key2 integer, OUT exclusive boolean)
RETURNS SETOF record
LANGUAGE sql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT l.objid::bigint::integer, l.mode = 'ExclusiveLock'
    FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
      AND l.pid = pg_catalog.pg_backend_pid()
      AND l.classid = (key1::bigint & 4294967295)::oid
      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                        WHERE d.datname = pg_catalog.current_database())
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_own_locks(integer) FROM PUBLIC;

-- This session's claim of key1: its own slot, n and extra slots (NULL slot:
-- none; a claim whose locks were released behind its back is gone).
CREATE FUNCTION @extschema@.pg_claim_current(key1 integer, OUT slot integer, OUT n integer, OUT extra integer[],
                                             OUT held integer[], OUT shared integer[])
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    slots integer[];
    own integer;
BEGIN
    SELECT pg_catalog.array_agg(o.key2 ORDER BY o.key2) FILTER (WHERE o.exclusive AND o.key2 < 268435456),
           pg_catalog.min(o.key2 - 268435456) FILTER (WHERE NOT o.exclusive AND o.key2 > 268435456
                                                          AND o.key2 <= 268435456 + 1048576),
           coalesce(pg_catalog.array_agg(o.key2) FILTER (WHERE NOT o.exclusive), '{}')
    INTO slots, n, shared
    FROM @extschema@.pg_claim_own_locks(key1) o;
    held := coalesce(slots, '{}');
    IF n IS NULL OR slots IS NULL THEN
        n := NULL;
        RETURN;
    END IF;
    own := nullif(pg_catalog.current_setting('pg_claim_portable.slot_' || (key1::bigint & 4294967295), true), '')::integer;
    IF own IS NULL OR NOT own = ANY (slots) THEN
        own := slots[1];
    END IF;
    slot := own;
    extra := pg_catalog.array_remove(slots, own);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_current(integer) FROM PUBLIC;

-- Unlock (key1, key2) in mode exclusive or share if this session holds it
-- (each lock of a claim is taken once).
CREATE FUNCTION @extschema@.pg_claim_unlock(key1 integer, key2 integer, exclusive boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM @extschema@.pg_claim_own_locks(key1) o
               WHERE o.key2 = pg_claim_unlock.key2 AND o.exclusive = pg_claim_unlock.exclusive) THEN
        IF exclusive THEN
            PERFORM pg_catalog.pg_advisory_unlock(key1, key2);
        ELSE
            PERFORM pg_catalog.pg_advisory_unlock_shared(key1, key2);
        END IF;
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_unlock(integer, integer, boolean) FROM PUBLIC;

-- Whether another session holds (key1, key2) in any mode.
CREATE FUNCTION @extschema@.pg_claim_held_by_others(key1 integer, key2 integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.pg_try_advisory_lock(key1, key2) THEN
        PERFORM pg_catalog.pg_advisory_unlock(key1, key2);
        RETURN false;
    END IF;
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_held_by_others(integer, integer) FROM PUBLIC;

-- Leave the claimers of key1 with n: the n record and the claimers lock,
-- and the waiters lock, each taken once; shared_ is what this session holds
-- in share mode (pg_claim_leave below reads it from the lock table).
CREATE FUNCTION @extschema@.pg_claim_leave_held(key1 integer, n integer, shared_ integer[])
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF 269484035 = ANY (shared_) THEN
        PERFORM pg_catalog.pg_advisory_unlock_shared(key1, 269484035);
    END IF;
    IF n IS NOT NULL AND 268435456 + n = ANY (shared_) THEN
        PERFORM pg_catalog.pg_advisory_unlock_shared(key1, 268435456 + n);
    END IF;
    IF 268435456 = ANY (shared_) THEN
        PERFORM pg_catalog.pg_advisory_unlock_shared(key1, 268435456);
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leave_held(integer, integer, integer[]) FROM PUBLIC;

CREATE FUNCTION @extschema@.pg_claim_leave(key1 integer, n integer)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_leave_held(key1, n,
        (SELECT coalesce(pg_catalog.array_agg(o.key2), '{}') FROM @extschema@.pg_claim_own_locks(key1) o
         WHERE NOT o.exclusive))
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leave(integer, integer) FROM PUBLIC;

-- The argument checks of claim_slot and claim_slots.
CREATE FUNCTION @extschema@.pg_claim_claim_check(name text, n integer, wait interval, waits boolean)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'The name identifies the worker fleet, e.g. claim_slot(''mailer'', 8); a NULL name is usually an unset variable in the client.';
    END IF;
    IF n IS NULL THEN
        RAISE EXCEPTION 'n must not be null' USING ERRCODE = '22004',
            HINT = 'The argument n is the number of slots (workers) of the name: pass the same n from every worker.';
    END IF;
    IF n < 1 THEN
        RAISE EXCEPTION 'n must be at least 1, got %', n USING ERRCODE = '22023',
            HINT = 'The argument n is the number of slots (workers) of the name: pass the same n from every worker.';
    END IF;
    IF n > 1048576 THEN
        RAISE EXCEPTION 'n must be at most 1048576, got %', n USING ERRCODE = '22023',
            HINT = 'Each held slot is one entry in PostgreSQL''s shared lock table; split the work into at most 1048576 slots.';
    END IF;
    IF waits AND wait IS NULL THEN
        RAISE EXCEPTION 'wait must not be null' USING ERRCODE = '22004',
            HINT = 'Pass how long to wait for a free slot, e.g. interval ''30 seconds'', or use claim_slot(name, n) to not wait.';
    END IF;
    IF waits AND wait < interval '0' THEN
        RAISE EXCEPTION 'wait must not be negative, got %', wait USING ERRCODE = '22023',
            HINT = 'Pass how long to wait for a free slot, e.g. interval ''30 seconds'', or interval ''0'' to not wait.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_claim_check(text, integer, interval, boolean) FROM PUBLIC;

-- Try free slots of key1 in 0 .. n-1, lowest first, taking at most want of
-- them: the first 64 by conditional lock attempts, past those the free
-- slots the lock table shows.
CREATE FUNCTION @extschema@.pg_claim_take_free(key1 integer, n integer, want integer, mine integer[])
RETURNS integer[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    got integer[] := '{}';
    s integer;
BEGIN
    IF want < 1 THEN
        RETURN got;
    END IF;
    FOR s IN 0 .. least(n, 64) - 1 LOOP
        IF NOT s = ANY (mine) AND pg_catalog.pg_try_advisory_lock(key1, s) THEN
            got := got || s;
            IF pg_catalog.cardinality(got) >= want THEN
                RETURN got;
            END IF;
        END IF;
    END LOOP;
    IF n <= 64 THEN
        RETURN got;
    END IF;
    FOR s IN SELECT g FROM pg_catalog.generate_series(64, n - 1) g
             WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                               WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
                                 AND l.classid = (key1::bigint & 4294967295)::oid
                                 AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                                   WHERE d.datname = pg_catalog.current_database())
                                 AND l.objid = g::oid)
             ORDER BY g LOOP
        IF NOT s = ANY (mine) AND pg_catalog.pg_try_advisory_lock(key1, s) THEN
            got := got || s;
            EXIT WHEN pg_catalog.cardinality(got) >= want;
        END IF;
    END LOOP;
    RETURN got;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_take_free(integer, integer, integer, integer[]) FROM PUBLIC;

-- The claim itself (docs/claiming.md, "How a claim works"): wait_us NULL is
-- a single attempt. The session's own slot, or NULL when none is free.
CREATE FUNCTION @extschema@.pg_claim_claim(name text, n integer, wait_us bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    key1 integer := (@extschema@.crc32(name)::bit(32))::integer;
    rec integer := 268435456 + n;
    cur record;
    other record;
    established boolean := false;
    got integer;
    deadline timestamptz;
    attempt integer := 0;
    ms float8;
    waiting boolean := false;
BEGIN
    -- a claiming session notices a dead client while busy, for the rest of
    -- the session (as the extension does)
    IF pg_catalog.current_setting('client_connection_check_interval') = '0' THEN
        PERFORM pg_catalog.set_config('client_connection_check_interval', '1s', false);
    END IF;
    SELECT * INTO cur FROM @extschema@.pg_claim_current(key1);
    IF cur.slot IS NOT NULL THEN
        SELECT r.name INTO other FROM @extschema@.pg_claim_names r WHERE r.key = key1;
        IF FOUND AND other.name IS DISTINCT FROM name THEN
            RAISE EXCEPTION 'name "%" has the same lock key (crc32 %) as name "%", which is already in use in this database (this session holds its slot %)',
                name, key1::bigint & 4294967295, other.name, cur.slot
                USING ERRCODE = '42710',
                HINT = 'Names are keyed by their crc32, and two names with one key would share slots. Choose another name (for example append a suffix), such that crc32(new name) differs.';
        END IF;
        IF cur.n <> n THEN
            RAISE EXCEPTION 'n = % does not match n = % of slot % of "%", which this session holds', n, cur.n, cur.slot, name
                USING ERRCODE = '55000',
                HINT = 'All workers of one name must use the same n; call release_slot first to claim with another n.';
        END IF;
        -- the name registry's error (42710) when another name has the key
        PERFORM @extschema@.pg_claim_register_name(name);
        RETURN cur.slot;
    END IF;
    PERFORM @extschema@.pg_claim_register_name(name);
    -- establish n under the name's claim mutex
    PERFORM pg_catalog.pg_advisory_lock(key1, 269484033);
    BEGIN
        FOR i IN 1 .. 100 LOOP
            IF NOT @extschema@.pg_claim_held_by_others(key1, 268435456)
               OR @extschema@.pg_claim_held_by_others(key1, rec) THEN
                IF NOT pg_catalog.pg_try_advisory_lock_shared(key1, rec) THEN
                    RAISE EXCEPTION 'advisory lock (%, %) of "%" is held exclusively by a session that is not a pg_claim claimer', key1, rec, name
                        USING ERRCODE = '55P03',
                        HINT = 'Another application uses pg_claim''s two-int4 advisory key range; see the key layout in docs/claiming.md.';
                END IF;
                IF NOT pg_catalog.pg_try_advisory_lock_shared(key1, 268435456) THEN
                    RAISE EXCEPTION 'advisory lock (%, %) of "%" is held exclusively by a session that is not a pg_claim claimer', key1, 268435456, name
                        USING ERRCODE = '55P03',
                        HINT = 'Another application uses pg_claim''s two-int4 advisory key range; see the key layout in docs/claiming.md.';
                END IF;
                established := true;
                EXIT;
            END IF;
            SELECT l.objid::bigint - 268435456 AS n, l.pid INTO other FROM pg_catalog.pg_locks l
            WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.mode = 'ShareLock'
              AND l.pid <> pg_catalog.pg_backend_pid()
              AND l.classid = (key1::bigint & 4294967295)::oid
              AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
              AND l.objid::bigint > 268435456 AND l.objid::bigint <= 268435456 + 1048576
              AND l.objid::bigint <> rec
            ORDER BY l.pid LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'n = % does not match n = % used by the live claimers of "%" (for example pid %)', n, other.n, name, other.pid
                    USING ERRCODE = '55000',
                    HINT = 'All workers of one name must use the same n. Use the same n, or stop the workers with the other n first (SELECT * FROM slot_holders(name)).';
            END IF;
        END LOOP;
        IF NOT established THEN
            RAISE EXCEPTION 'cannot establish n = % for "%": its claimers keep changing', n, name
                USING ERRCODE = '55P03', HINT = 'Retry the claim.';
        END IF;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM @extschema@.pg_claim_leave(key1, n);
        PERFORM pg_catalog.pg_advisory_unlock(key1, 269484033);
        RAISE;
    END;
    PERFORM pg_catalog.pg_advisory_unlock(key1, 269484033);
    -- take a slot; a standby tries again until its deadline
    IF wait_us IS NOT NULL THEN
        deadline := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => least(wait_us, 3153600000000000)::float8 / 1e6);
    END IF;
    BEGIN
        LOOP
            got := (@extschema@.pg_claim_take_free(key1, n, 1, cur.held))[1];
            EXIT WHEN got IS NOT NULL OR wait_us IS NULL OR pg_catalog.clock_timestamp() >= deadline;
            IF NOT waiting THEN
                waiting := pg_catalog.pg_try_advisory_lock_shared(key1, 269484035);
            END IF;
            ms := least(5 * 2 ^ least(attempt, 5), 100,
                                   greatest(extract(epoch FROM deadline - pg_catalog.clock_timestamp()) * 1000, 1));
            attempt := attempt + 1;
            PERFORM pg_catalog.pg_sleep(ms / 1000);
        END LOOP;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM @extschema@.pg_claim_leave(key1, n);
        RAISE;
    END;
    IF waiting THEN
        PERFORM pg_catalog.pg_advisory_unlock_shared(key1, 269484035);
    END IF;
    IF got IS NULL THEN
        PERFORM @extschema@.pg_claim_leave(key1, n);
        RETURN NULL;
    END IF;
    -- one slot, one holder, whatever the mode: a live lease of the name
    -- refuses the claim
    IF @extschema@.pg_claim_leased(name) THEN
        PERFORM pg_catalog.pg_advisory_unlock(key1, got);
        PERFORM @extschema@.pg_claim_leave(key1, n);
        RAISE EXCEPTION 'name "%" is leased with claim_lease; it cannot also be claimed with claim_slot', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot (and my_token), or claim_lease. Let the leases of the name expire or release them (SELECT * FROM lease_holders(name)), or use another name.';
    END IF;
    PERFORM pg_catalog.set_config('pg_claim_portable.slot_' || (key1::bigint & 4294967295), got::text, false);
    RETURN got;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_claim(text, integer, bigint) FROM PUBLIC;

CREATE FUNCTION @extschema@.claim_slot(name text, n integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.pg_claim_claim_check(name, n, NULL::interval, false);
    RETURN @extschema@.pg_claim_claim(name, n, NULL::bigint);
END $$;

CREATE FUNCTION @extschema@.claim_slot(name text, n integer, wait interval)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.pg_claim_claim_check(name, n, wait, true);
    RETURN @extschema@.pg_claim_claim(name, n, least(extract(epoch FROM wait) * 1000000, 9.2e18)::bigint);
END $$;

-- claim_slots (docs/claiming.md): the own slot plus extra free slots up to
-- max while nobody waits; one given back per call while a standby (or a
-- holder below its fair share) wants one.
CREATE FUNCTION @extschema@.pg_claim_claim_many(name text, n integer, max integer, wait interval, waits boolean)
RETURNS integer[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    key1 integer := (@extschema@.crc32(name)::bit(32))::integer;
    cur record;
    extra integer[];
    waiting boolean;
    live integer;
    fair integer;
    floor_ integer;
    target integer;
BEGIN
    PERFORM @extschema@.pg_claim_claim_check(name, n, wait, waits);
    IF max IS NULL THEN
        RAISE EXCEPTION 'max must not be null' USING ERRCODE = '22004',
            HINT = 'The argument max is how many slots this worker serves at most, from 1 to n; pass n to serve every slot nobody else serves.';
    END IF;
    IF max < 1 OR max > n THEN
        RAISE EXCEPTION 'max must be between 1 and n = %, got %', n, max USING ERRCODE = '22023',
            HINT = 'The argument max is how many slots this worker serves at most, from 1 to n; pass n to serve every slot nobody else serves.';
    END IF;
    -- the extension's default pg_claim.max_locks_per_session (1024), fixed:
    -- max slots and the claim's 2 records (3 with a standby's waiters lock)
    IF max + 2 + waits::integer > 1024 THEN
        RAISE EXCEPTION 'claim_slots("%", %, %) could hold % advisory locks (% slots and % records), more than pg_claim.max_locks_per_session (1024) allows',
                name, n, max, max + 2 + waits::integer, max, 2 + waits::integer USING ERRCODE = '53400',
            HINT = format('Pass a max of at most %s (the portable edition''s limit of 1024 locks less the claim''s %s records).',
                          1022 - waits::integer, 2 + waits::integer);
    END IF;
    IF @extschema@.pg_claim_claim(name, n, CASE WHEN waits THEN least(extract(epoch FROM wait) * 1000000, 9.2e18)::bigint END) IS NULL THEN
        RETURN '{}';
    END IF;
    SELECT * INTO cur FROM @extschema@.pg_claim_current(key1);
    extra := coalesce(cur.extra, '{}');
    WHILE 1 + pg_catalog.cardinality(extra) > max LOOP
        PERFORM pg_catalog.pg_advisory_unlock(key1, extra[pg_catalog.cardinality(extra)]);
        extra := extra[1:pg_catalog.cardinality(extra) - 1];
    END LOOP;
    waiting := @extschema@.pg_claim_held_by_others(key1, 269484035);
    SELECT greatest(pg_catalog.count(DISTINCT l.pid), 1) INTO live FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.mode = 'ShareLock'
      AND l.classid = (key1::bigint & 4294967295)::oid AND l.objid = 268435456::oid
      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database());
    fair := (n + live - 1) / live;
    floor_ := n / live;
    IF NOT waiting THEN
        target := max;
    ELSIF 1 + pg_catalog.cardinality(extra) > fair THEN
        PERFORM pg_catalog.pg_advisory_unlock(key1, extra[pg_catalog.cardinality(extra)]);
        extra := extra[1:pg_catalog.cardinality(extra) - 1];
        target := 0;
    ELSE
        target := least(fair, max);
    END IF;
    IF target > 1 + pg_catalog.cardinality(extra) THEN
        extra := extra || @extschema@.pg_claim_take_free(key1, n, target - 1 - pg_catalog.cardinality(extra), extra || cur.slot);
    END IF;
    IF 1 + pg_catalog.cardinality(extra) < least(floor_, max) THEN
        IF NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_own_locks(key1) o WHERE o.key2 = 269484035) THEN
            PERFORM pg_catalog.pg_try_advisory_lock_shared(key1, 269484035);
        END IF;
    ELSE
        PERFORM @extschema@.pg_claim_unlock(key1, 269484035, false);
    END IF;
    RETURN (SELECT pg_catalog.array_agg(s ORDER BY s) FROM pg_catalog.unnest(extra || cur.slot) s);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_claim_many(text, integer, integer, interval, boolean) FROM PUBLIC;

CREATE FUNCTION @extschema@.claim_slots(name text, n integer, max integer)
RETURNS integer[]
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @extschema@.pg_claim_claim_many(name, n, max, NULL::interval, false);

CREATE FUNCTION @extschema@.claim_slots(name text, n integer, max integer, wait interval)
RETURNS integer[]
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @extschema@.pg_claim_claim_many(name, n, max, wait, true);

-- Whether name's key is this session's claim's name: the registry's name
-- for the key (a name never registered: the key is name's if free).
CREATE FUNCTION @extschema@.pg_claim_release(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    key1 integer := (@extschema@.crc32(name)::bit(32))::integer;
    cur record;
    s integer;
BEGIN
    SELECT * INTO cur FROM @extschema@.pg_claim_current(key1);
    IF cur.slot IS NULL OR NOT @extschema@.pg_claim_name_owns_key(name) THEN
        RETURN false;
    END IF;
    FOREACH s IN ARRAY cur.extra || cur.slot LOOP
        PERFORM pg_catalog.pg_advisory_unlock(key1, s);
    END LOOP;
    PERFORM @extschema@.pg_claim_leave_held(key1, cur.n, cur.shared);
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_release(text) FROM PUBLIC;

CREATE FUNCTION @extschema@.release_slot(name text)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @extschema@.pg_claim_release(name);

CREATE FUNCTION @extschema@.my_slot(name text)
RETURNS integer
LANGUAGE sql STABLE STRICT PARALLEL RESTRICTED SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN (SELECT c.slot FROM @extschema@.pg_claim_current((@extschema@.crc32(name)::bit(32))::integer) c
        WHERE @extschema@.pg_claim_name_owns_key(name));

CREATE FUNCTION @extschema@.my_slots(name text)
RETURNS integer[]
LANGUAGE sql STABLE STRICT PARALLEL RESTRICTED SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT (SELECT pg_catalog.array_agg(s ORDER BY s) FROM pg_catalog.unnest(c.extra || c.slot) s)
                 FROM @extschema@.pg_claim_current((@extschema@.crc32(name)::bit(32))::integer) c
                 WHERE c.slot IS NOT NULL AND @extschema@.pg_claim_name_owns_key(name)), '{}');

-- slot_holders: the sessions that hold slots of name, from the lock table;
-- nothing for a name whose lock key another name owns.
CREATE FUNCTION @extschema@.slot_holders(name text)
RETURNS TABLE (slot integer, pid integer, application_name text, client_addr inet,
               backend_start timestamptz, state text)
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT h.slot, h.pid, a.application_name::text, a.client_addr, a.backend_start, a.state::text
    FROM (SELECT DISTINCT l.objid::bigint::integer AS slot, l.pid
          FROM pg_catalog.pg_locks l
          WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.mode = 'ExclusiveLock'
            AND l.classid = @extschema@.crc32(name)::oid
            AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
            AND l.objid::bigint < 1048576
            AND @extschema@.pg_claim_name_owns_key(name)) h
    LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = h.pid
    ORDER BY h.slot, h.pid
$$;
