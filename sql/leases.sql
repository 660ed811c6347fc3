-- Leases and fencing tokens (docs/leases.md).
--
-- A lease is a row of @extschema@.pg_claim_leases: who holds slot `slot` of `name`
-- until `expires_at` on the database server's clock, with a fencing token
-- that strictly increases for the slot at every change of holder, and the
-- role that owns it. Each function is one statement, so it works inside any
-- READ COMMITTED transaction and through a transaction-mode pooler.
--
-- Leases belong to roles. The public functions (claim_lease, renew_lease,
-- release_lease, lease_holders, fence, lease_valid, my_token; src/leases.rs)
-- run with the caller's rights and call the internal SECURITY DEFINER
-- functions below (pg_claim_lease_*) directly through the function manager,
-- passing the calling role's oid first. No role may EXECUTE the internal
-- functions, so no role can pass another's oid. A role sees the holder and
-- token of, renews, releases and fences with, a lease only when it has the
-- privileges of the lease's owner (pg_has_role(role, owner, 'USAGE')); to
-- every other role such a lease looks like one whose token it does not have.
-- owner NULL (rows from before 0.4.0, until their slot changes hands): any
-- role that may call the functions.
--
-- Every call from these functions to a function of the extension is
-- schema-qualified and exact-typed (each argument's type is the parameter's
-- type), so no overload planted in any schema can stand in for it.
--
-- Locks carry the fencing guarantee. fence / lease_valid hold, to the end
-- of the caller's transaction:
--   in READ COMMITTED      the slot's fence lock (key1, 271581184 + slot),
--                          shared, taken before the check reads the row
--   in REPEATABLE READ     FOR KEY SHARE on the slot's row (the check reads
--   and SERIALIZABLE       the transaction's snapshot)
-- and every change of a lease's holder, token, owner or session flag, or
-- shortening of its expiry (claim_lease, claim_leases, release_lease,
-- my_token), takes the row FOR UPDATE (which conflicts with KEY SHARE) and,
-- by the trigger of sql/leases_guard.sql, the fence lock exclusive (which
-- conflicts with shared). A hand-over tries both first and skips a slot a
-- fenced transaction holds; release_lease, my_token and a leaving
-- claim_leases wait for it. A renewal (renew_lease, and claim_lease's and
-- claim_leases' own) that extends expires_at is an UPDATE that takes neither
-- lock in a conflicting mode; one that would move it earlier (a shorter ttl,
-- or the clock stepped back) tries the fence lock first and, when a fenced
-- transaction holds it, keeps the later expiry: a renewal never waits for
-- the holder's own fenced transactions. So a slot cannot change
-- hands while a transaction that passed fence with the slot's token is open.
--
-- Advisory locks (two-int4 keys, key1 = crc32(name) as int4; src/locks.rs):
--   (key1, 269484034 = 0x10100002)  the lease mutex of the name, exclusive,
--        session-level, held by claim_lease and claim_leases for their
--        statement only (released before it returns, also on error; waited
--        for at most ttl / 3, pg_claim_lease_mutex) and taken and at once
--        released by pg_claim_leased (claim_slot's check)
--   (key1, slot), ShareLock, transaction-level: taken by claim_lease on the
--        slot it takes, so that claim_slot cannot take that slot while the
--        lease is not yet committed
--   (key1, 271581184 + slot = 0x10300000 + slot), the slot's fence lock
--        (above), transaction-level
--   (key1, 270532608 + slot = 0x10200000 + slot), exclusive,
--        transaction-level: a claim_lease that inserts the slot's first row
--        reserves it, so that another claim_lease does not wait for an
--        uncommitted insert: it takes the next free slot
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
    -- a session claim's record (my_token), not a lease; live only while
    -- that session holds the slot
    session     boolean     NOT NULL DEFAULT false,
    token       bigint      NOT NULL,
    acquired_at timestamptz,
    -- NULL for session records: they last as long as the session's claim
    expires_at  timestamptz,
    -- the role that claimed it (NULL: any role, for rows from before 0.4.0)
    owner       oid,
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
CREATE FUNCTION @extschema@.lease_check(name text, slot integer, token bigint, ttl interval)
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
    -- holders are keys of an index of pg_claim_leases, as names are
    IF pg_catalog.octet_length(holder) > 1024 THEN
        RAISE EXCEPTION 'holder must be at most 1024 bytes, got % bytes (starting "%")',
            pg_catalog.octet_length(holder), pg_catalog.left(holder, 20)
            USING ERRCODE = '22023',
            HINT = 'The holder names one claim instance (one worker process): use a short text such as host:pid:random.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_claim_check(text, integer, text, interval) FROM PUBLIC;

-- The time an internal lease function is given as its statement's (now_):
-- its callers pass clock_timestamp(); a direct call with a time a day or
-- more away is refused before any arithmetic on it overflows.
CREATE FUNCTION @extschema@.pg_claim_lease_now_check(now_ timestamptz)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF now_ IS NULL OR NOT pg_catalog.isfinite(now_)
       OR pg_catalog.abs(extract(epoch FROM now_ - pg_catalog.clock_timestamp())) > 86400 THEN
        RAISE EXCEPTION 'now_ must be within a day of the clock, got %', now_ USING ERRCODE = '22023',
            HINT = 'now_ is the time of the calling statement: pass clock_timestamp().';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_now_check(timestamptz) FROM PUBLIC;

-- The refusals claim_lease and claim_leases share: a live lease of the
-- name belongs to role `owner`, whose privileges `role` lacks (42501); live
-- leases of the name use another n (55000).
CREATE FUNCTION @extschema@.pg_claim_lease_refuse_role(name text, owner oid, role oid)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'name "%" is leased by role %; role % cannot lease it', name,
        owner::regrole, role::regrole
        USING ERRCODE = '42501',
        HINT = 'A name is leased by one role at a time. Workers that log in as different roles share a name through a common role: GRANT fleet_role TO each worker role, and let them claim as fleet_role (SET ROLE, or ALTER ROLE worker SET role = ''fleet_role'').';
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_refuse_role(text, oid, oid) FROM PUBLIC;

CREATE FUNCTION @extschema@.pg_claim_lease_refuse_n(name text, n integer, other_n integer, other_holder text)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'n = % does not match n = % used by the live leases of "%" (for example holder "%")',
        n, other_n, name, other_holder
        USING ERRCODE = '55000',
        HINT = 'All workers of one name must use the same n. Use the same n, or let the leases of the other n expire or be released first (SELECT * FROM lease_holders(name)).';
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_refuse_n(text, integer, integer, text) FROM PUBLIC;

-- Hands slot `s` of name (its row locked FOR UPDATE by the caller: free,
-- expired, given back, or a stale session record) to holder for role until
-- ttl from `now_`, with the slot's next token (and no longer wanted by
-- anyone: sql/leases_balance.sql); returns NULLs and changes
-- nothing when a fenced transaction holds the slot's fence lock. Refuses (55000) when a
-- session holds the slot with claim_slot (its advisory lock); the
-- transaction-level share lock taken here keeps claim_slot off the slot until
-- the caller's transaction ends. Called by claim_lease and claim_leases only.
CREATE FUNCTION @extschema@.pg_claim_lease_hand(
    role oid, name text, s integer, n integer, holder text, ttl interval, key_ integer,
    now_ timestamptz, OUT slot integer, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- its callers pass checked values; a direct call is checked the same way
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    PERFORM @extschema@.pg_claim_lease_now_check(now_);
    -- a transaction that passed fence / lease_valid on the slot in READ
    -- COMMITTED holds its fence lock shared: the slot is left to the caller's
    -- next candidate (all three OUT values NULL), never waited for
    IF NOT pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + s) THEN
        RETURN;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(key_, s) THEN
        RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
    END IF;
    UPDATE @extschema@.pg_claim_leases l
    SET n = pg_claim_lease_hand.n, holder = pg_claim_lease_hand.holder, session = false,
        owner = role, token = @extschema@.next_token(l.token),
        acquired_at = now_, expires_at = now_ + ttl, wanted_by = NULL, fenced_batches = false
    WHERE l.name = pg_claim_lease_hand.name AND l.slot = s
    RETURNING l.slot, l.token, l.expires_at
    INTO pg_claim_lease_hand.slot, pg_claim_lease_hand.token, pg_claim_lease_hand.expires_at;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_hand(oid, text, integer, integer, text, interval, integer, timestamptz) FROM PUBLIC;

-- The name's lease mutex for claim_lease and claim_leases (fn, the caller's
-- name for the error), taken at session level for the calling statement:
-- waited for at most ttl / 3, the period at which holders renew (or the
-- caller's lock_timeout when that is shorter). A claim queued longer has
-- been given up by its holder, whose next call comes by then: under a
-- burst of load the queue behind the mutex stays as long as the fleet's
-- holders, not as long as every call they gave up on (each of which would
-- still run, for a reply nobody reads). Past the bound: 55P03, the
-- caller's lock_timeout as it was.
CREATE FUNCTION @extschema@.pg_claim_lease_mutex(name text, key_ integer, ttl interval, fn text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- the caller's lock_timeout, in milliseconds (0: none)
    prev text;
    bound bigint;
BEGIN
    IF pg_catalog.pg_try_advisory_lock(key_, 269484034) THEN
        RETURN;
    END IF;
    -- its callers pass checked values; a direct call is checked the same way
    PERFORM @extschema@.lease_check(name, 0::integer, 0::bigint, ttl);
    SELECT s.setting INTO prev FROM pg_catalog.pg_settings s WHERE s.name = 'lock_timeout';
    bound := greatest(1, (extract(epoch FROM ttl) * 1000 / 3)::bigint);
    IF prev::bigint > 0 AND prev::bigint < bound THEN
        bound := prev::bigint;
    END IF;
    PERFORM pg_catalog.set_config('lock_timeout', bound::text, true);
    BEGIN
        PERFORM pg_catalog.pg_advisory_lock(key_, 269484034);
    EXCEPTION WHEN lock_not_available THEN
        -- the error ends the caller's (sub)transaction, which sets
        -- lock_timeout back as it was
        RAISE EXCEPTION '% of "%" gave up after % ms waiting for the name''s claim mutex, which other claims of the name hold',
            fn, name, bound
            USING ERRCODE = '55P03',
            HINT = 'The claims of one name run one at a time, and one waits for the others at most ttl / 3 (the period at which holders renew) or lock_timeout if that is shorter. Call again (the worker libraries do, at their next call). If it happens often, the server is overloaded or a claim of the name runs long: SELECT pid, now() - query_start, query FROM pg_stat_activity WHERE query LIKE ''%claim_lease%''.';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prev, true);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_mutex(text, integer, interval, text) FROM PUBLIC;

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
    PERFORM @extschema@.pg_claim_lease_mutex(name, key_, ttl, 'claim_lease'::text);
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
    -- slots whose fence lock a fenced transaction holds, left this time
    fenced_ integer[] := '{}';
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
        PERFORM @extschema@.pg_claim_lease_refuse_role(name, r.owner, role);
    END IF;
    -- a live claim_leases fleet of another n (its members hold no lease
    -- between a resize_fleet and their next call): PC002, as claim_leases
    -- says it (sql/leases_resize.sql)
    SELECT m.n INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_lease_take.name AND m.expires_at > now_ AND m.n <> pg_claim_lease_take.n
    ORDER BY m.seen_at DESC
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_leases_refuse_resized(name, r.n, pg_claim_lease_take.n);
    END IF;
    -- live leases of another n
    SELECT l.n, l.holder INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_take.name AND NOT l.session AND l.holder IS NOT NULL
      AND l.expires_at > now_ AND l.n <> pg_claim_lease_take.n
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_lease_refuse_n(name, pg_claim_lease_take.n, r.n, r.holder);
    END IF;

    -- the same holder again: the same slot and token, the expiry extended;
    -- one holder holds at most one slot of a name
    SELECT l.slot INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_take.name AND l.holder = pg_claim_lease_take.holder
      AND NOT l.session AND l.slot < pg_claim_lease_take.n AND l.expires_at > now_
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    ORDER BY l.slot
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(key_, r.slot) THEN
            RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
                USING ERRCODE = '55000',
                HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
        END IF;
        -- earlier than it was only when the slot's fence lock is free (the
        -- trigger of sql/leases_guard.sql takes it: it would wait for the
        -- holder's own fenced transactions, the mutex held)
        UPDATE @extschema@.pg_claim_leases l
        SET expires_at = CASE WHEN now_ + ttl >= l.expires_at THEN now_ + ttl
                              WHEN pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + l.slot) THEN now_ + ttl
                              ELSE l.expires_at END,
            n = pg_claim_lease_take.n
        WHERE l.name = pg_claim_lease_take.name AND l.slot = r.slot
        RETURNING l.slot, l.token, l.expires_at
        INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at;
    ELSE
        -- a new acquisition: first the slot this holder had, when its lease
        -- expired (or was released) and no one took it meanwhile (a new token)
        SELECT l.slot INTO r FROM @extschema@.pg_claim_leases l
        WHERE l.name = pg_claim_lease_take.name AND l.holder = pg_claim_lease_take.holder
          AND NOT l.session AND l.slot < pg_claim_lease_take.n AND l.expires_at <= now_
        ORDER BY l.slot
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            SELECT h.slot, h.token, h.expires_at
            INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at
            FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h;
            IF pg_claim_lease_take.slot IS NULL THEN
                fenced_ := fenced_ || r.slot;
            END IF;
        END IF;
        LOOP
            EXIT WHEN pg_claim_lease_take.slot IS NOT NULL;
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
              AND l.slot <> ALL (fenced_)
            ORDER BY l.slot
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                SELECT h.slot, h.token, h.expires_at
                INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at
                FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h;
                EXIT WHEN pg_claim_lease_take.slot IS NOT NULL;
                fenced_ := fenced_ || r.slot;
                CONTINUE;
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
        -- the holder's other slots (after a change of n) are given back
        IF pg_claim_lease_take.slot IS NOT NULL THEN
            UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
            WHERE l.name = pg_claim_lease_take.name
              -- an array computed once, not a join that could run the
              -- locking subquery again for every row of the name
              AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                                      WHERE o.name = pg_claim_lease_take.name
                                        AND o.holder = pg_claim_lease_take.holder AND NOT o.session
                                        AND o.slot <> pg_claim_lease_take.slot
                                        AND (o.owner IS NULL OR o.owner = role
                                             OR pg_catalog.pg_has_role(role, o.owner, 'USAGE'))
                                        AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                                      FOR UPDATE SKIP LOCKED));
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
    -- earlier than it was (a shorter ttl, or the clock stepped back) only
    -- when the slot's fence lock is free: the trigger of
    -- sql/leases_guard.sql takes it, which would wait for the holder's own
    -- fenced transactions; else the later expiry stays
    UPDATE @extschema@.pg_claim_leases l
    SET expires_at = CASE WHEN pg_catalog.clock_timestamp() + ttl >= l.expires_at
                          THEN pg_catalog.clock_timestamp() + ttl
                          WHEN pg_catalog.pg_try_advisory_xact_lock(
                                   (@extschema@.crc32(l.name)::bit(32))::integer, 271581184 + l.slot)
                          THEN pg_catalog.clock_timestamp() + ttl
                          ELSE l.expires_at END
    WHERE l.name = pg_claim_lease_renew.name AND l.slot = pg_claim_lease_renew.slot
      AND l.token = pg_claim_lease_renew.token AND l.holder IS NOT NULL AND NOT l.session
      AND l.expires_at > pg_catalog.clock_timestamp()
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
    -- only the lease's token (and the owner's rights) may wait for anything
    IF NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
                   WHERE l.name = pg_claim_lease_release.name AND l.slot = pg_claim_lease_release.slot
                     AND l.token = pg_claim_lease_release.token AND l.holder IS NOT NULL AND NOT l.session
                     AND l.expires_at > pg_catalog.clock_timestamp()
                     AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))) THEN
        RETURN false;
    END IF;
    -- waits for the holder's own fenced transactions: the slot changes hands
    -- only after them. The fence lock first, then the row: the holder's
    -- claim_leases, which renews under the name's mutex, then skips the
    -- slot instead of waiting for the row (sql/leases_fleet.sql)
    PERFORM pg_catalog.pg_advisory_xact_lock((@extschema@.crc32(name)::bit(32))::integer, 271581184 + slot);
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_release.name AND l.slot = pg_claim_lease_release.slot
      AND l.token = pg_claim_lease_release.token AND l.holder IS NOT NULL AND NOT l.session
      AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- released: expired from now on, the last holder kept (lease_holders
    -- and slot_status show since when the slot is unserved)
    UPDATE @extschema@.pg_claim_leases l SET expires_at = pg_catalog.clock_timestamp()
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
      AND (l.session OR l.expires_at > pg_catalog.clock_timestamp())
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
      AND (l.session OR l.expires_at > pg_catalog.clock_timestamp())
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    FOR KEY SHARE;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT l.token, l.holder, l.expires_at,
           (l.owner IS NULL OR l.owner = role
            OR pg_catalog.pg_has_role(role, l.owner, 'USAGE')) AS visible
    INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_fence.name AND l.slot = pg_claim_lease_fence.slot;
    RAISE EXCEPTION 'fencing token % of slot % of "%" is not current (%)', token, slot, name,
        CASE WHEN r.token IS NULL THEN 'the slot was never claimed'
             WHEN r.holder IS NULL THEN 'the slot is not leased'
             WHEN NOT r.visible THEN 'the slot is held by a role whose privileges this role lacks'
             WHEN r.token <> token THEN 'its token is now ' || r.token
             ELSE 'the lease expired or was given back' END
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
