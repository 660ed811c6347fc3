-- pg_claim 0.4.0 -> 0.5.0, run by ALTER EXTENSION pg_claim UPDATE.
-- History, append-only: a released step is never edited; a change goes in a new step.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.4.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.5.0'" to load this file. \quit

-- ==== lease ====
-- A lease's token is dead once the lease expired or was released:
-- renew_lease, release_lease, lease_valid and fence refuse it; release_lease
-- expires the lease now and keeps its last holder; claim_lease gives a holder
-- whose lease expired its slot back with a new token, through the new
-- pg_claim_lease_hand (shared with claim_leases). A holder is at most 1024
-- bytes (it is a key of an index). (The bodies are those of sql/leases.sql.)
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

CREATE FUNCTION @extschema@.pg_claim_lease_hand(
    role oid, name text, s integer, n integer, holder text, ttl interval, key_ integer,
    now_ timestamptz, OUT slot integer, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
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
        acquired_at = now_, expires_at = now_ + ttl
    WHERE l.name = pg_claim_lease_hand.name AND l.slot = s
    RETURNING l.slot, l.token, l.expires_at
    INTO pg_claim_lease_hand.slot, pg_claim_lease_hand.token, pg_claim_lease_hand.expires_at;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_hand(oid, text, integer, integer, text, interval, integer, timestamptz) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_claim_check(name text, n integer, holder text, ttl interval)
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

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_take(
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
        UPDATE @extschema@.pg_claim_leases l
        SET expires_at = now_ + ttl, n = pg_claim_lease_take.n
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
              AND l.slot IN (SELECT o.slot FROM @extschema@.pg_claim_leases o
                             WHERE o.name = pg_claim_lease_take.name
                               AND o.holder = pg_claim_lease_take.holder AND NOT o.session
                               AND o.slot <> pg_claim_lease_take.slot
                               AND (o.owner IS NULL OR o.owner = role
                                    OR pg_catalog.pg_has_role(role, o.owner, 'USAGE'))
                               AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                             FOR UPDATE SKIP LOCKED);
        END IF;
        -- else: every slot is leased (or fenced): a standby
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_take(oid, text, integer, text, interval, bigint, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_renew(
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
      AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    RETURNING l.expires_at INTO until_;
    RETURN until_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_renew(oid, text, integer, bigint, interval) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_release(role oid, name text, slot integer, token bigint)
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

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_valid(role oid, name text, slot integer, token bigint)
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

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_fence(role oid, name text, slot integer, token bigint)
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

-- fence and lease_valid check the lease row in Rust (src/leases/check.rs);
-- lease_valid is STABLE, so with constant arguments a statement evaluates it
-- once, before its first row.
ALTER FUNCTION @extschema@.lease_valid(text, integer, bigint) STABLE;

-- ==== lease: claim_leases ====
-- Elastic lease fleets (sql/leases_fleet.sql, whole).
-- Elastic lease fleets: claim_leases (docs/leases.md, "claim_leases").
--
-- Every holder of a name calls claim_leases every ttl/3 or so. One call, under
-- the name's lease mutex (the one claim_lease takes, for the statement only):
--   1. records the holder as a member of the name's fleet until ttl from now
--      (a member is live while it calls within its ttl, counted from its
--      first call even when that call returns no slot);
--   2. renews the holder's live leases (a lease that expired is not renewed:
--      its token is dead, and the slot is taken again with a new token);
--   3. computes every live member's target: n shared out as evenly as the
--      members' max allow (a member whose max is below the even share gets
--      its max, the others share the rest); of those that share the rest,
--      the ones holding the most (then the earliest joined) get one more;
--   4. gives back what the holder holds beyond its target, and takes
--      unserved slots (free, expired, given back) up to it.
-- So a joiner gets its share from holders above their targets, and a leaver's
-- slots go to holders below theirs; no other slot moves.
--
-- Targets are computed from each member's count of leases as of its own last
-- call (pg_claim_lease_members.held), so a call reads the members of the name
-- and its own leases, never every slot: its cost grows with the number of
-- live holders and the slots that change hands, not with n. (The first call
-- that finds the name's rows below n creates the missing rows, once.)
--
-- A slot's hand-over takes its row FOR UPDATE SKIP LOCKED, so a slot whose
-- row a fenced transaction holds (fence / lease_valid: FOR KEY SHARE) is not
-- given back or taken until that transaction ends: at no moment do two
-- holders pass fence for one slot. A given-back lease expires at once (the
-- holder is kept, so lease_holders and slot_status show since when).

CREATE TABLE @extschema@.pg_claim_lease_members (
    name       text        NOT NULL,
    holder     text        NOT NULL,
    -- the role that called
    owner      oid         NOT NULL,
    n          integer     NOT NULL,
    -- the most slots it takes (claim_leases' max)
    max        integer     NOT NULL,
    -- how many leases it held at the end of its last call
    held       integer     NOT NULL,
    joined_at  timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL,
    -- live until then: seen_at + its ttl
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, holder)
);
REVOKE ALL ON @extschema@.pg_claim_lease_members FROM PUBLIC;
COMMENT ON TABLE @extschema@.pg_claim_lease_members IS
    'pg_claim''s claim_leases holders, one row per live holder of a name; written only through claim_leases';

-- The leases of one holder (renewal, give-back) and the unserved slots of a
-- name, found without reading every slot of the name.
CREATE INDEX pg_claim_leases_holder ON @extschema@.pg_claim_leases (name, holder);
CREATE INDEX pg_claim_leases_expiry ON @extschema@.pg_claim_leases (name, expires_at);

-- claim_leases' argument checks (besides claim_lease's). A call reads,
-- and may lock and write, every slot of the name: n is at most 1024.
CREATE FUNCTION @extschema@.pg_claim_leases_check(n integer, max integer)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF n > 1024 THEN
        RAISE EXCEPTION 'n must be at most 1024 for claim_leases, got %', n USING ERRCODE = '22023',
            HINT = 'One claim_leases call reads and may take or renew every slot of the name: serve more than 1024 slots with claim_lease per slot, or with session claims (claim_slots).';
    END IF;
    IF max < 0 OR max > n THEN
        RAISE EXCEPTION 'max must be between 0 and n = %, got %', n, max USING ERRCODE = '22023',
            HINT = 'max is the most slots this holder takes (NULL or n: no limit); max => 0 gives back every slot and leaves the fleet.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_check(integer, integer) FROM PUBLIC;

-- claim_leases (src/leases.rs) for `role`: the name's lease mutex for this
-- statement only, then the body. The holder's leases after the call, as
-- arrays ordered by slot.
CREATE FUNCTION @extschema@.pg_claim_leases_claim(
    role oid, name text, n integer, holder text, max integer, ttl interval,
    OUT slots integer[], OUT tokens bigint[], OUT expires timestamptz[])
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    crc_ bigint;
    key_ integer;
    max_ integer := coalesce(max, n);
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('claim_leases'::text);
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    PERFORM @extschema@.pg_claim_leases_check(n, max_);
    -- the name registry before the mutex, as claim_lease
    PERFORM @extschema@.pg_claim_register_name(name::pg_catalog.text);
    IF max_ = 0 THEN
        -- leaving: no mutex (it may wait for the holder's fenced transactions)
        PERFORM @extschema@.pg_claim_leases_leave(role, name, holder);
        RETURN;
    END IF;
    crc_ := @extschema@.crc32(name);
    key_ := (crc_::bit(32))::integer;
    PERFORM pg_catalog.pg_advisory_lock(key_, 269484034);
    BEGIN
        SELECT t.slots, t.tokens, t.expires INTO slots, tokens, expires
        FROM @extschema@.pg_claim_leases_take(role, name, n, holder, max_, ttl, crc_, key_) t;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
        RAISE;
    END;
    PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_claim(oid, text, integer, text, integer, interval) FROM PUBLIC;

-- claim_leases(..., max => 0): the holder leaves the fleet. Its member row
-- stops counting at once, and every lease it holds is given back, after the
-- holder's own fenced transactions in progress end (as release_lease waits
-- for them); nothing is renewed. Called only by pg_claim_leases_claim.
CREATE FUNCTION @extschema@.pg_claim_leases_leave(role oid, name text, holder text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    r record;
BEGIN
    IF role IS NULL OR name IS NULL OR holder IS NULL THEN
        RAISE EXCEPTION '% must not be null',
            CASE WHEN role IS NULL THEN 'role' WHEN name IS NULL THEN 'name' ELSE 'holder' END
            USING ERRCODE = '22004',
            HINT = 'This is claim_leases''s internal function: call claim_leases(name, n, holder, max => 0).';
    END IF;
    -- another role's live member of that holder text is not this role's to end
    SELECT m.owner INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_leave.name AND m.holder = pg_claim_leases_leave.holder
      AND m.expires_at > pg_catalog.clock_timestamp()
      AND m.owner <> role AND NOT pg_catalog.pg_has_role(role, m.owner, 'USAGE');
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_lease_refuse_role(name, r.owner, role);
    END IF;
    UPDATE @extschema@.pg_claim_lease_members m
    SET expires_at = pg_catalog.clock_timestamp(), max = 0, held = 0
    WHERE m.name = pg_claim_leases_leave.name AND m.holder = pg_claim_leases_leave.holder;
    -- FOR UPDATE waits for the fenced transactions (FOR KEY SHARE)
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_leave.name AND l.holder = pg_claim_leases_leave.holder
      AND NOT l.session AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    FOR UPDATE;
    UPDATE @extschema@.pg_claim_leases l SET expires_at = pg_catalog.clock_timestamp()
    WHERE l.name = pg_claim_leases_leave.name AND l.holder = pg_claim_leases_leave.holder
      AND NOT l.session AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'));
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_leave(oid, text, text) FROM PUBLIC;

-- The body of claim_leases, under the name's mutex (called only by
-- pg_claim_leases_claim, whose owner's rights it runs with).
CREATE FUNCTION @extschema@.pg_claim_leases_take(
    role oid, name text, n integer, holder text, max integer, ttl interval,
    crc_ bigint, key_ integer,
    OUT slots integer[], OUT tokens bigint[], OUT expires timestamptz[])
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    joining boolean;
    r record;
    mine integer;
    target integer;
    rest integer;
    sharing integer;
    capped integer;
    ahead bigint;
    given integer;
    holders_ text[];
    maxes_ integer[];
BEGIN
    -- the same checks again: a superuser may call this function directly
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    PERFORM @extschema@.pg_claim_leases_check(n, max);
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be null' USING ERRCODE = '22004',
            HINT = 'This is claim_leases''s internal function: call claim_leases.';
    END IF;
    max := coalesce(max, n);
    IF crc_ IS DISTINCT FROM @extschema@.crc32(name) OR key_ IS DISTINCT FROM (crc_::bit(32))::integer THEN
        RAISE EXCEPTION 'crc_ and key_ must be crc32(name) and its int4 form, got % and %', crc_, key_
            USING ERRCODE = '22023',
            HINT = 'This is claim_leases''s internal function: call claim_leases.';
    END IF;

    -- the members of the name that are no longer live are forgotten (a
    -- row that a claimer's open transaction holds waits for the next call)
    DELETE FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_take.name
      AND m.holder IN (SELECT o.holder FROM @extschema@.pg_claim_lease_members o
                       WHERE o.name = pg_claim_leases_take.name AND o.expires_at <= now_
                         AND o.holder <> pg_claim_leases_take.holder
                       FOR UPDATE SKIP LOCKED);
    -- a live member of a role whose privileges this role lacks, this
    -- holder's own row included (its holder text is no key to it)
    SELECT m.owner INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_take.name AND m.expires_at > now_
      AND m.owner <> role AND NOT pg_catalog.pg_has_role(role, m.owner, 'USAGE')
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_lease_refuse_role(name, r.owner, role);
    END IF;
    -- a live member of another n
    SELECT m.n, m.holder INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_take.name AND m.expires_at > now_
      AND m.holder <> pg_claim_leases_take.holder AND m.n <> pg_claim_leases_take.n
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_lease_refuse_n(name, n, r.n, r.holder);
    END IF;

    SELECT m.expires_at <= now_ AS gone INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_take.name AND m.holder = pg_claim_leases_take.holder;
    joining := NOT FOUND OR r.gone;
    IF joining THEN
        -- a joiner checks what the members do not show: the name's other
        -- leases (claim_lease's holders) and its session claims
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks k
                   WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
                     AND k.mode = 'ExclusiveLock'
                     AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                       WHERE d.datname = pg_catalog.current_database())
                     AND k.classid = crc_::oid AND k.objid::bigint <= 1048575) THEN
            RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
                USING ERRCODE = '55000',
                HINT = 'Use one mode per name: claim_slots on direct connections, or claim_leases. The sessions that hold its slots: SELECT * FROM slot_status(name, n).';
        END IF;
        SELECT l.owner, l.n, l.holder INTO r FROM @extschema@.pg_claim_leases l
        WHERE l.name = pg_claim_leases_take.name AND NOT l.session AND l.holder IS NOT NULL
          AND l.expires_at > now_
          AND (l.n <> pg_claim_leases_take.n
               OR (l.owner IS NOT NULL AND l.owner <> role
                   AND NOT pg_catalog.pg_has_role(role, l.owner, 'USAGE')))
        LIMIT 1;
        IF FOUND AND r.n <> n THEN
            PERFORM @extschema@.pg_claim_lease_refuse_n(name, n, r.n, r.holder);
        ELSIF FOUND THEN
            PERFORM @extschema@.pg_claim_lease_refuse_role(name, r.owner, role);
        END IF;
    END IF;

    -- 1. the holder is a live member until ttl from now (max => 0: it leaves)
    INSERT INTO @extschema@.pg_claim_lease_members AS m
        (name, holder, owner, n, max, held, joined_at, seen_at, expires_at)
    VALUES (name, holder, role, n, max, 0, now_, now_,
            CASE WHEN max = 0 THEN now_ ELSE now_ + ttl END)
    ON CONFLICT ON CONSTRAINT pg_claim_lease_members_pkey DO UPDATE
        SET owner = excluded.owner, n = excluded.n, max = excluded.max,
            joined_at = CASE WHEN joining THEN excluded.joined_at ELSE m.joined_at END,
            held = CASE WHEN joining THEN 0 ELSE m.held END,
            seen_at = excluded.seen_at, expires_at = excluded.expires_at;

    -- 2. renew its live leases below n; those at or above n (n changed) are
    -- given back below
    UPDATE @extschema@.pg_claim_leases l SET expires_at = now_ + ttl
    WHERE l.name = pg_claim_leases_take.name AND l.holder = pg_claim_leases_take.holder
      AND NOT l.session AND l.expires_at > now_ AND l.slot < n
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'));
    GET DIAGNOSTICS mine = ROW_COUNT;

    -- 3. its target: members whose max is below the even share of what is
    -- left get their max; the others share the rest, one more each for the
    -- first (rest mod sharing) of them by (held desc, joined_at, holder),
    -- from each member's count as of its own last call
    SELECT pg_catalog.array_agg(m.holder ORDER BY m.max, m.holder),
           pg_catalog.array_agg(m.max ORDER BY m.max, m.holder)
    INTO holders_, maxes_
    FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_take.name AND m.expires_at > now_;
    sharing := coalesce(pg_catalog.cardinality(holders_), 0);
    rest := n;
    capped := 0;
    WHILE capped < pg_catalog.cardinality(holders_)
          AND maxes_[capped + 1]::bigint * sharing <= rest LOOP
        capped := capped + 1;
        IF holders_[capped] = holder THEN
            target := maxes_[capped];
        END IF;
        rest := rest - maxes_[capped];
        sharing := sharing - 1;
    END LOOP;
    IF max = 0 THEN
        target := 0;
    ELSIF target IS NULL AND sharing > 0 THEN
        target := rest / sharing;
        IF rest % sharing > 0 THEN
            SELECT m.held, m.joined_at INTO r FROM @extschema@.pg_claim_lease_members m
            WHERE m.name = pg_claim_leases_take.name AND m.holder = pg_claim_leases_take.holder;
            -- the sharing members ranked before this holder
            SELECT count(*) INTO ahead FROM @extschema@.pg_claim_lease_members m
            WHERE m.name = pg_claim_leases_take.name AND m.expires_at > now_
              AND m.holder <> ALL (holders_[1:capped]) AND m.holder <> pg_claim_leases_take.holder
              AND (m.held > r.held
                   OR (m.held = r.held AND (m.joined_at, m.holder) < (r.joined_at, pg_claim_leases_take.holder)));
            IF ahead < rest % sharing THEN
                target := target + 1;
            END IF;
        END IF;
    END IF;
    target := least(coalesce(target, 0), max);

    -- 4a. give back every live lease at or above n (n changed), and what it
    -- holds beyond the target (its highest slots); a slot that a fenced
    -- transaction holds (its row, or its fence lock) stays until that
    -- transaction ends
    UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
    WHERE l.name = pg_claim_leases_take.name
      AND l.slot IN (SELECT o.slot FROM @extschema@.pg_claim_leases o
                     WHERE o.name = pg_claim_leases_take.name
                       AND o.holder = pg_claim_leases_take.holder AND NOT o.session
                       AND o.expires_at > now_ AND o.slot >= n
                       AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                     FOR UPDATE SKIP LOCKED);
    IF mine > target THEN
        UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
        WHERE l.name = pg_claim_leases_take.name
          AND l.slot IN (SELECT o.slot FROM @extschema@.pg_claim_leases o
                         WHERE o.name = pg_claim_leases_take.name
                           AND o.holder = pg_claim_leases_take.holder AND NOT o.session
                           AND o.expires_at > now_ AND o.slot < n
                           AND (o.owner IS NULL OR o.owner = role
                                OR pg_catalog.pg_has_role(role, o.owner, 'USAGE'))
                           AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                         ORDER BY o.slot DESC
                         LIMIT mine - target
                         FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS given = ROW_COUNT;
        mine := mine - given;
    END IF;

    -- 4b. take unserved slots up to the target: first its own slots whose
    -- lease expired (or was given back), then the longest unserved (never
    -- leased: expiry -infinity; then by expiry), then those with no expiry
    -- (released before 0.5.0, and records of sessions that left); each
    -- found by index, so the cost follows the slots taken, not n
    IF mine < target THEN
        -- the name's rows 0 .. n-1 exist (made once, when they do not)
        IF coalesce((SELECT l.slot FROM @extschema@.pg_claim_leases l
                     WHERE l.name = pg_claim_leases_take.name
                     ORDER BY l.slot DESC LIMIT 1), -1) < n - 1 THEN
            INSERT INTO @extschema@.pg_claim_leases AS l (name, slot, n, token, expires_at)
            SELECT name, g, n, 0, '-infinity' FROM pg_catalog.generate_series(0, n - 1) g
            WHERE NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases o
                              WHERE o.name = pg_claim_leases_take.name AND o.slot = g)
            ON CONFLICT ON CONSTRAINT pg_claim_leases_pkey DO NOTHING;
        END IF;
        FOR r IN SELECT l.slot FROM @extschema@.pg_claim_leases l
                 WHERE l.name = pg_claim_leases_take.name AND l.holder = pg_claim_leases_take.holder
                   AND NOT l.session AND l.slot < n AND l.expires_at <= now_
                 ORDER BY l.slot LIMIT target - mine
                 FOR UPDATE SKIP LOCKED LOOP
            IF (SELECT h.slot FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h)
               IS NOT NULL THEN
                mine := mine + 1;
            END IF;
        END LOOP;
        FOR r IN SELECT l.slot FROM @extschema@.pg_claim_leases l
                 WHERE l.name = pg_claim_leases_take.name AND l.expires_at <= now_ AND l.slot < n
                 ORDER BY l.expires_at LIMIT target - mine
                 FOR UPDATE SKIP LOCKED LOOP
            IF (SELECT h.slot FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h)
               IS NOT NULL THEN
                mine := mine + 1;
            END IF;
        END LOOP;
        FOR r IN SELECT l.slot FROM @extschema@.pg_claim_leases l
                 WHERE l.name = pg_claim_leases_take.name AND l.expires_at IS NULL AND l.slot < n
                 ORDER BY l.slot LIMIT target - mine
                 FOR UPDATE SKIP LOCKED LOOP
            IF (SELECT h.slot FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h)
               IS NOT NULL THEN
                mine := mine + 1;
            END IF;
        END LOOP;
    END IF;

    UPDATE @extschema@.pg_claim_lease_members m SET held = mine
    WHERE m.name = pg_claim_leases_take.name AND m.holder = pg_claim_leases_take.holder;

    SELECT pg_catalog.array_agg(l.slot ORDER BY l.slot), pg_catalog.array_agg(l.token ORDER BY l.slot),
           pg_catalog.array_agg(l.expires_at ORDER BY l.slot)
    INTO slots, tokens, expires
    FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_take.name AND l.holder = pg_claim_leases_take.holder
      AND NOT l.session AND l.expires_at > now_ AND l.slot < n
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'));
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_take(oid, text, integer, text, integer, interval, bigint, integer) FROM PUBLIC;

CREATE FUNCTION @extschema@."claim_leases"(
	"name" TEXT,
	"n" INT,
	"holder" TEXT,
	"max" INT DEFAULT NULL,
	"ttl" interval DEFAULT '30 seconds'
) RETURNS TABLE (
	"slot" INT,
	"token" bigint,
	"expires_at" timestamp with time zone
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'claim_leases_wrapper';
COMMENT ON FUNCTION @extschema@.claim_leases(text, integer, text, integer, interval) IS
    'renew, take and give back leases of name so that the live holders share its n slots evenly (at most max for this holder; max => 0: leave): every slot holder holds after the call';

-- ==== lease: fence lock ====
-- fence and lease_valid hold the slot's fence lock in READ COMMITTED
-- instead of the lease row (sql/leases.sql, "Locks carry the fencing
-- guarantee"): the writer's half (sql/leases_guard.sql, whole).
CREATE FUNCTION @extschema@."pg_claim_lease_handover"(
	"name" TEXT,
	"slot" INT
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'pg_claim_lease_handover_wrapper';
-- The writer's half of the fence lock (sql/leases.sql, "Locks carry the
-- fencing guarantee"): every change of a lease that can end a holder's right
-- to write (its holder, token, owner or session flag changes, or its expiry
-- moves earlier, or the row goes) takes the slot's fence lock
-- (key1, 271581184 + slot) exclusive to the end of the changing transaction,
-- waiting for the transactions that passed fence / lease_valid on the slot
-- in READ COMMITTED; and, when it commits, tells every session to forget
-- what it knew of the leases (src/leases/check.rs keeps, per session, the
-- rows that passed, so that the next check of the same token reads nothing).
-- A renewal only extends expires_at: it fires nothing.
--
-- The triggers fire ALWAYS, also with session_replication_role = replica.

CREATE FUNCTION @extschema@.pg_claim_leases_guard()
RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.pg_claim_lease_handover(OLD.name, OLD.slot);
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_guard() FROM PUBLIC;

CREATE TRIGGER pg_claim_leases_guard AFTER UPDATE ON @extschema@.pg_claim_leases
FOR EACH ROW
WHEN (OLD.name IS DISTINCT FROM NEW.name OR OLD.slot IS DISTINCT FROM NEW.slot
      OR OLD.holder IS DISTINCT FROM NEW.holder OR OLD.token IS DISTINCT FROM NEW.token
      OR OLD.owner IS DISTINCT FROM NEW.owner OR OLD.session IS DISTINCT FROM NEW.session
      OR (OLD.expires_at IS DISTINCT FROM NEW.expires_at
          AND NOT coalesce(NEW.expires_at > OLD.expires_at, false)))
EXECUTE FUNCTION @extschema@.pg_claim_leases_guard();
CREATE TRIGGER pg_claim_leases_guard_delete AFTER DELETE ON @extschema@.pg_claim_leases
FOR EACH ROW EXECUTE FUNCTION @extschema@.pg_claim_leases_guard();
ALTER TABLE @extschema@.pg_claim_leases ENABLE ALWAYS TRIGGER pg_claim_leases_guard;
ALTER TABLE @extschema@.pg_claim_leases ENABLE ALWAYS TRIGGER pg_claim_leases_guard_delete;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_handover(text, integer) FROM PUBLIC;

-- ==== items ====
-- slot_partition (sql/slot_partition.sql, whole).
-- slot_partition (docs/my_items.md, "Hash partitions"): the partition of a
-- table hash-partitioned with modulus n that holds slot `slot`'s rows, for
-- method 'pg_hash' (pg_hash_slot(key, n) is the remainder PostgreSQL routes
-- a key to). A worker that writes to that partition directly skips the
-- routing through the parent. It runs with the caller's rights and only reads
-- the catalogs: what the caller then runs on the partition is checked with
-- the caller's privileges on the partition, and the partition's row-level
-- security applies; a table whose row-level security the partition would not
-- apply is refused.
CREATE FUNCTION @extschema@.slot_partition(tbl regclass, slot integer, n integer)
RETURNS regclass
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    strat "char";
    natts integer;
    parent_rls boolean;
    p record;
    m text[];
    found_ regclass;
BEGIN
    IF tbl IS NULL OR slot IS NULL OR n IS NULL THEN
        RAISE EXCEPTION '% must not be null',
            CASE WHEN tbl IS NULL THEN 'tbl' WHEN slot IS NULL THEN 'slot' ELSE 'n' END
            USING ERRCODE = '22004',
            HINT = 'Pass the table, the slot and the n of the fleet, e.g. slot_partition(''events'', 3, 8).';
    END IF;
    IF n < 1 OR n > 1048576 THEN
        RAISE EXCEPTION 'n must be between 1 and 1048576, got %', n USING ERRCODE = '22023',
            HINT = 'n is the modulus of the table''s hash partitions and the number of slots of the fleet.';
    END IF;
    IF slot < 0 OR slot >= n THEN
        RAISE EXCEPTION 'slot must be between 0 and n - 1 = %, got %', n - 1, slot USING ERRCODE = '22023',
            HINT = 'Pass a slot the worker holds.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) tbl) THEN
        RAISE EXCEPTION 'relation with oid % does not exist', tbl::oid USING ERRCODE = '42P01',
            HINT = 'Pass an existing table; if another session drops and re-creates it, call again.';
    END IF;
    SELECT pt.partstrat, pt.partnatts, c.relrowsecurity INTO strat, natts, parent_rls
    FROM pg_catalog.pg_partitioned_table pt
    JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pt.partrelid
    WHERE pt.partrelid OPERATOR(pg_catalog.=) tbl;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % is not partitioned', tbl USING ERRCODE = '22023',
            HINT = 'slot_partition needs a table PARTITION BY HASH (key) with n partitions FOR VALUES WITH (MODULUS n, REMAINDER 0 .. n-1); read other tables with my_items.';
    END IF;
    IF strat OPERATOR(pg_catalog.<>) 'h' THEN
        RAISE EXCEPTION 'table % is partitioned by %, not by hash', tbl,
            CASE strat WHEN 'r' THEN 'range' WHEN 'l' THEN 'list' ELSE strat::text END
            USING ERRCODE = '22023',
            HINT = 'slot_partition needs PARTITION BY HASH (key) with MODULUS n; read range and list partitioned tables with my_items.';
    END IF;
    IF natts OPERATOR(pg_catalog.<>) 1 THEN
        RAISE EXCEPTION 'table % is partitioned by hash of % columns, not one', tbl, natts
            USING ERRCODE = '22023',
            HINT = 'A slot maps one key (pg_hash_slot(key, n)): partition by the hash of one column.';
    END IF;
    FOR p IN SELECT c.oid, c.relkind, c.relrowsecurity, pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound
             FROM pg_catalog.pg_inherits i
             JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
             WHERE i.inhparent OPERATOR(pg_catalog.=) tbl AND NOT i.inhdetachpending
             ORDER BY c.oid LOOP
        m := pg_catalog.regexp_match(p.bound, '^FOR VALUES WITH \(modulus (\d+), remainder (\d+)\)$');
        IF m IS NULL THEN
            RAISE EXCEPTION 'partition % of % has the bound "%", not a hash bound', p.oid::regclass, tbl, p.bound
                USING ERRCODE = '22023',
                HINT = 'Every partition must be FOR VALUES WITH (MODULUS n, REMAINDER r).';
        END IF;
        IF m[1]::integer OPERATOR(pg_catalog.<>) n THEN
            RAISE EXCEPTION 'partition % of % has modulus %, not n = %', p.oid::regclass, tbl, m[1], n
                USING ERRCODE = '22023',
                HINT = 'slot_partition needs every partition FOR VALUES WITH (MODULUS n, ...) with the fleet''s n; with other moduli, read the table with my_items(..., method => ''pg_hash'').';
        END IF;
        IF p.relkind OPERATOR(pg_catalog.=) 'p' THEN
            RAISE EXCEPTION 'partition % of % is itself partitioned', p.oid::regclass, tbl
                USING ERRCODE = '22023',
                HINT = 'slot_partition needs one level of hash partitions; read multi-level tables with my_items.';
        END IF;
        IF m[2]::integer OPERATOR(pg_catalog.=) slot THEN
            IF parent_rls AND NOT p.relrowsecurity THEN
                RAISE EXCEPTION 'table % has row-level security, which its partition % does not apply', tbl, p.oid::regclass
                    USING ERRCODE = '42501',
                    HINT = 'A query on the partition applies the partition''s policies, not the table''s: enable row-level security with the same policies on each partition, or read through the table with my_items.';
            END IF;
            found_ := p.oid::regclass;
        END IF;
    END LOOP;
    IF found_ IS NULL THEN
        RAISE EXCEPTION 'table % has no partition with remainder % of modulus %', tbl, slot, n
            USING ERRCODE = '22023',
            HINT = 'Create it: CREATE TABLE ... PARTITION OF the table FOR VALUES WITH (MODULUS n, REMAINDER slot).';
    END IF;
    RETURN found_;
END $$;
COMMENT ON FUNCTION @extschema@.slot_partition(regclass, integer, integer) IS
    'the partition of tbl, hash-partitioned with modulus n, that holds slot''s rows (pg_hash_slot(key, n) = slot)';

-- ==== items: fleets ====
-- slot_backlog, defined fleets and their views (sql/fleets.sql, whole).
-- Seeing the fleet (docs/my_items.md, "Backlog and fleets"): slot_backlog,
-- the defined fleets (define_fleet, drop_fleet) and the views fleet_slots and
-- fleets.
--
-- slot_backlog runs, with the caller's rights, the query that the C function
-- slot_backlog_query (src/items/backlog.rs) writes and checks against the
-- catalogs, as slot_counts does with slot_counts_query.
--
-- A fleet's definition is a row of @extschema@.pg_claim_fleets, readable by
-- every role and written only by the internal SECURITY DEFINER functions
-- pg_claim_fleet_put and pg_claim_fleet_drop, which define_fleet and
-- drop_fleet (C functions that run with the caller's rights) call through the
-- function manager with the calling role's oid first, after checking the
-- definition as slot_backlog would with the caller's privileges. A definition
-- belongs to the role that wrote it: another role may replace or drop it only
-- with the privileges of that role (pg_has_role(role, owner, 'USAGE')) or of
-- the extension's owner. The definitions are part of a dump
-- (pg_extension_config_dump).
--
-- The views read every fleet's table with the caller's rights (one
-- slot_backlog scan per fleet, through pg_claim_fleet_slots); a fleet whose
-- table the caller may not read shows pending and oldest NULL instead of an
-- error. Every call of an extension function from here is schema-qualified
-- and exact-typed.

CREATE FUNCTION @extschema@.slot_backlog_query(
    rel oid, n integer, pending text, key text DEFAULT NULL, route text DEFAULT NULL,
    method text DEFAULT 'auto', age text DEFAULT NULL)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_slot_backlog_query';
COMMENT ON FUNCTION @extschema@.slot_backlog_query(oid, integer, text, text, text, text, text) IS
    'the query slot_backlog runs for these arguments (parameter $1: n)';

CREATE FUNCTION @extschema@.slot_backlog(
    tbl regclass, n integer, pending text, key text DEFAULT NULL, route text DEFAULT NULL,
    method text DEFAULT 'auto', age text DEFAULT NULL)
RETURNS TABLE (slot integer, backlog bigint, oldest timestamptz)
LANGUAGE plpgsql VOLATILE
AS $body$
BEGIN
    -- VOLATILE: the query below runs with a snapshot taken after
    -- slot_backlog_query locked the table, so a call that waited behind a
    -- migration counts what it committed, as a plain SELECT would.
    -- Exact-typed (tbl::oid): a slot_backlog_query(regclass, ...) created in
    -- this schema would otherwise match better and run instead
    RETURN QUERY EXECUTE @extschema@.slot_backlog_query(
        tbl::pg_catalog.oid, n, pending, key, route, method, age) USING n;
END
$body$;
COMMENT ON FUNCTION @extschema@.slot_backlog(regclass, integer, text, text, text, text, text) IS
    'pending rows per slot 0 .. n-1 (0 for empty slots) of a table split by key (or route column), and the oldest pending row''s age column';

-- The query that maps failure records to slots (parameters: $1 the items as
-- text, $2 whether each is dead): slot, failing, dead per slot. Items are
-- cast to the key column's type; with a route column, joined to the table
-- by key. Called by pg_claim_fleet_slots.
CREATE FUNCTION @extschema@.pg_claim_fleet_failures_query(
    rel oid, n integer, key text, route text, method text)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_fleet_failures_query';

CREATE TABLE @extschema@.pg_claim_fleets (
    name       text        PRIMARY KEY,
    tbl        regclass    NOT NULL,
    n          integer     NOT NULL,
    pending    text,
    key        text,
    route      text,
    method     text        NOT NULL,
    age        text,
    -- the role that defined it
    owner      regrole     NOT NULL,
    defined_at timestamptz NOT NULL
);
REVOKE ALL ON @extschema@.pg_claim_fleets FROM PUBLIC;
GRANT SELECT ON @extschema@.pg_claim_fleets TO PUBLIC;
COMMENT ON TABLE @extschema@.pg_claim_fleets IS
    'pg_claim''s defined fleets (define_fleet); written only through define_fleet and drop_fleet';
SELECT pg_catalog.pg_extension_config_dump('@extschema@.pg_claim_fleets', '');

-- Whether `role` may replace or drop a definition that belongs to `owner`:
-- with the privileges of the owner (a member of it), or of the extension's
-- owner (who can so remove any definition), or when the owner role no longer
-- exists.
CREATE FUNCTION @extschema@.pg_claim_fleet_may_change(role oid, owner oid)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.pg_authid a WHERE a.oid = owner)
        OR pg_catalog.pg_has_role(role, owner, 'USAGE')
        OR pg_catalog.pg_has_role(role, (SELECT e.extowner FROM pg_catalog.pg_extension e
                                         WHERE e.extname = 'pg_claim'), 'USAGE')
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_may_change(oid, oid) FROM PUBLIC;

-- define_fleet for `role` (internal; define_fleet checked the arguments
-- with role's privileges): insert, or replace a definition that belongs to a
-- role whose privileges `role` has (or to a role that no longer exists).
CREATE FUNCTION @extschema@.pg_claim_fleet_put(
    role oid, name text, tbl oid, n integer, pending text, key text, route text,
    method text, age text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    owner_ oid;
BEGIN
    -- (define_fleet checked all of this already; a direct call by a
    -- superuser gets the same errors)
    IF role IS NULL OR name IS NULL OR tbl IS NULL OR n IS NULL THEN
        RAISE EXCEPTION '% must not be null',
            CASE WHEN role IS NULL THEN 'role' WHEN name IS NULL THEN 'name' WHEN tbl IS NULL THEN 'tbl' ELSE 'n' END
            USING ERRCODE = '22004', HINT = 'Call define_fleet(name, tbl, n, ...).';
    END IF;
    IF pg_catalog.octet_length(name) > 1024 OR n < 1 OR n > 1048576
       OR coalesce(method, 'auto') NOT IN ('auto', 'crc32', 'jump', 'pg_hash') THEN
        RAISE EXCEPTION 'invalid fleet definition: name of % bytes, n = %, method %',
            pg_catalog.octet_length(name), n, coalesce(method, 'auto')
            USING ERRCODE = '22023', HINT = 'Call define_fleet(name, tbl, n, ...), which checks every argument.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = tbl) THEN
        RAISE EXCEPTION 'relation with oid % does not exist', tbl
            USING ERRCODE = '42P01', HINT = 'Call define_fleet(name, tbl, n, ...) with an existing table.';
    END IF;
    INSERT INTO @extschema@.pg_claim_fleets AS f
        (name, tbl, n, pending, key, route, method, age, owner, defined_at)
    VALUES (pg_claim_fleet_put.name, pg_claim_fleet_put.tbl::regclass, pg_claim_fleet_put.n,
            pg_claim_fleet_put.pending, pg_claim_fleet_put.key, pg_claim_fleet_put.route,
            coalesce(pg_claim_fleet_put.method, 'auto'), pg_claim_fleet_put.age,
            role::regrole, pg_catalog.clock_timestamp())
    ON CONFLICT ON CONSTRAINT pg_claim_fleets_pkey DO UPDATE
        SET tbl = excluded.tbl, n = excluded.n, pending = excluded.pending, key = excluded.key,
            route = excluded.route, method = excluded.method, age = excluded.age,
            owner = excluded.owner, defined_at = excluded.defined_at
        WHERE @extschema@.pg_claim_fleet_may_change(role, f.owner::oid)
    RETURNING f.owner::oid INTO owner_;
    IF owner_ IS NULL THEN
        SELECT f.owner::oid INTO owner_ FROM @extschema@.pg_claim_fleets f
        WHERE f.name = pg_claim_fleet_put.name;
        RAISE EXCEPTION 'fleet "%" is defined by role %, whose privileges role % does not have',
            name, owner_::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a member of the role that defined a fleet, or of the extension''s owner, may replace or drop it: ask that role, or choose another fleet name.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_put(oid, text, oid, integer, text, text, text, text, text) FROM PUBLIC;

-- drop_fleet for `role` (internal): true when the fleet was defined.
CREATE FUNCTION @extschema@.pg_claim_fleet_drop(role oid, name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    owner_ oid;
BEGIN
    SELECT f.owner::oid INTO owner_ FROM @extschema@.pg_claim_fleets f
    WHERE f.name = pg_claim_fleet_drop.name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT @extschema@.pg_claim_fleet_may_change(role, owner_) THEN
        RAISE EXCEPTION 'fleet "%" is defined by role %, whose privileges role % does not have',
            name, owner_::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a member of the role that defined a fleet, or of the extension''s owner, may replace or drop it: ask that role.';
    END IF;
    DELETE FROM @extschema@.pg_claim_fleets f WHERE f.name = pg_claim_fleet_drop.name;
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_drop(oid, text) FROM PUBLIC;

CREATE FUNCTION @extschema@.define_fleet(
    name text, tbl regclass, n integer, pending text DEFAULT NULL, key text DEFAULT NULL,
    route text DEFAULT NULL, method text DEFAULT 'auto', age text DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'pg_claim_define_fleet';
COMMENT ON FUNCTION @extschema@.define_fleet(text, regclass, integer, text, text, text, text, text) IS
    'define (or replace) the fleet name: its table, n and mapping, for the views fleet_slots and fleets';

CREATE FUNCTION @extschema@.drop_fleet(name text)
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'pg_claim_drop_fleet';
COMMENT ON FUNCTION @extschema@.drop_fleet(text) IS
    'forget the definition of the fleet name: true when it was defined';

-- One row per defined fleet and slot (the view fleet_slots), with the
-- caller's rights: one slot_backlog scan, one slot_status call and one
-- item_failures call per fleet. A fleet whose table this caller cannot read
-- (no privilege, a table dropped or changed since the definition, a foreign
-- table whose server fails) shows pending and oldest NULL, and failing and
-- dead NULL when the failures need the table (a route column): one fleet
-- never makes the whole view fail. A cancel or statement_timeout still
-- ends the query (WHEN OTHERS does not catch them).
CREATE FUNCTION @extschema@.pg_claim_fleet_slots()
RETURNS TABLE (fleet text, slot integer, pending bigint, oldest timestamptz, holder text,
               mode text, token bigint, since timestamptz, unserved_since timestamptz,
               failing bigint, dead bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f record;
    backlog_ bigint[];
    oldest_ timestamptz[];
    items_ text[];
    dead_ boolean[];
    failing_ bigint[];
    deadn_ bigint[];
    r record;
    q text;
    i integer;
BEGIN
    FOR f IN SELECT d.* FROM @extschema@.pg_claim_fleets d ORDER BY d.name LOOP
        backlog_ := NULL;
        oldest_ := NULL;
        IF f.pending IS NOT NULL THEN
            BEGIN
                SELECT pg_catalog.array_agg(b.backlog ORDER BY b.slot),
                       pg_catalog.array_agg(b.oldest ORDER BY b.slot)
                INTO backlog_, oldest_
                FROM @extschema@.slot_backlog(f.tbl, f.n, f.pending, f.key, f.route, f.method, f.age) b;
            EXCEPTION WHEN OTHERS THEN
                backlog_ := NULL;
                oldest_ := NULL;
            END;
        END IF;
        -- failure records: retry or due (failing), dead
        SELECT pg_catalog.array_agg(x.item), pg_catalog.array_agg(x.state = 'dead')
        INTO items_, dead_
        FROM @extschema@.item_failures(f.name) x;
        failing_ := pg_catalog.array_fill(0::bigint, ARRAY[f.n]);
        deadn_ := pg_catalog.array_fill(0::bigint, ARRAY[f.n]);
        IF items_ IS NOT NULL THEN
            BEGIN
                q := @extschema@.pg_claim_fleet_failures_query(
                    f.tbl::pg_catalog.oid, f.n, f.key, f.route, f.method);
                BEGIN
                    FOR r IN EXECUTE q USING items_, dead_ LOOP
                        failing_[r.slot + 1] := r.failing;
                        deadn_[r.slot + 1] := r.dead;
                    END LOOP;
                EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
                    -- an item that is not a value of the key's type belongs
                    -- to no slot: map the items one by one
                    failing_ := pg_catalog.array_fill(0::bigint, ARRAY[f.n]);
                    deadn_ := pg_catalog.array_fill(0::bigint, ARRAY[f.n]);
                    FOR i IN 1 .. pg_catalog.cardinality(items_) LOOP
                        BEGIN
                            FOR r IN EXECUTE q USING ARRAY[items_[i]], ARRAY[dead_[i]] LOOP
                                failing_[r.slot + 1] := failing_[r.slot + 1] + r.failing;
                                deadn_[r.slot + 1] := deadn_[r.slot + 1] + r.dead;
                            END LOOP;
                        EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
                            NULL;
                        END;
                    END LOOP;
                END;
            EXCEPTION WHEN OTHERS THEN
                failing_ := NULL;
                deadn_ := NULL;
            END;
        END IF;
        RETURN QUERY
        SELECT f.name, st.slot, backlog_[st.slot + 1], oldest_[st.slot + 1],
               CASE WHEN st.state <> 'unserved' THEN st.holder END,
               CASE WHEN st.state <> 'unserved' THEN st.state END,
               CASE WHEN st.state = 'lease' THEN st.token END,
               CASE WHEN st.state <> 'unserved' THEN st.since END,
               CASE WHEN st.state = 'unserved' THEN st.since END,
               failing_[st.slot + 1], deadn_[st.slot + 1]
        FROM @extschema@.slot_status(f.name, f.n) st
        ORDER BY st.slot;
    END LOOP;
END $$;
COMMENT ON FUNCTION @extschema@.pg_claim_fleet_slots() IS
    'the rows of the view fleet_slots: every slot of every defined fleet, read with the caller''s rights';

CREATE VIEW @extschema@.fleet_slots WITH (security_invoker = true) AS
    SELECT s.fleet, s.slot, s.pending, s.oldest, s.holder, s.mode, s.token, s.since,
           s.unserved_since, s.failing, s.dead
    FROM @extschema@.pg_claim_fleet_slots() s;
COMMENT ON VIEW @extschema@.fleet_slots IS
    'every slot of every defined fleet: pending rows, oldest, holder (session or lease) or unserved since, failing and dead items';
GRANT SELECT ON @extschema@.fleet_slots TO PUBLIC;

CREATE VIEW @extschema@.fleets WITH (security_invoker = true) AS
    SELECT d.name AS fleet, d.tbl, d.n, d.pending AS pending_column, d.key, d.route,
           d.method, d.age,
           coalesce(s.holders, 0)::integer AS holders,
           coalesce(s.unserved, d.n)::integer AS unserved,
           s.pending, s.oldest,
           fl.failing, fl.dead
    FROM @extschema@.pg_claim_fleets d
    LEFT JOIN (SELECT x.fleet,
                      pg_catalog.count(DISTINCT x.holder) AS holders,
                      pg_catalog.count(*) FILTER (WHERE x.mode IS NULL) AS unserved,
                      pg_catalog.sum(x.pending)::bigint AS pending,
                      pg_catalog.min(x.oldest) AS oldest
               FROM @extschema@.pg_claim_fleet_slots() x
               GROUP BY x.fleet) s ON s.fleet = d.name
    LEFT JOIN LATERAL (
        SELECT pg_catalog.count(*) FILTER (WHERE y.state <> 'dead') AS failing,
               pg_catalog.count(*) FILTER (WHERE y.state = 'dead') AS dead
        FROM @extschema@.item_failures(d.name) y) fl ON true;
COMMENT ON VIEW @extschema@.fleets IS
    'every defined fleet: its definition, distinct live holders, unserved slots, pending rows, oldest, failing and dead items';
GRANT SELECT ON @extschema@.fleets TO PUBLIC;

-- ==== failures ====
-- item_failures(name, VARIADIC items): the records of the given items only;
-- failure_items_check, the check of the items it shares with clear_failure;
-- pg_claim_failure_state, the state both forms of item_failures report
-- (the bodies are those of sql/failures.sql).
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

CREATE OR REPLACE FUNCTION @extschema@.clear_failure(name text, VARIADIC items text[])
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

CREATE OR REPLACE FUNCTION @extschema@.item_failures(name text)
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

-- The failure records of the given items only (a worker's batch): each read
-- through the primary key (name, item), whatever else is kept for the name.
CREATE FUNCTION @extschema@.item_failures(name text, VARIADIC items text[])
RETURNS TABLE (item text, state text, attempts integer, last_error text,
               first_failed_at timestamptz, last_failed_at timestamptz, retry_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.failure_items_check('item_failures'::text, name, items);
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

-- ==== claim: grants (keep this section last) ====
-- Who may claim (sql/grants.sql, whole): claim_leases and
-- item_failures(text, text[]) are granted to PUBLIC by the extension's owner,
-- as the other claiming functions.
-- Who may claim (docs/claiming.md, "Who may claim"). Runs last in the
-- install script, and again in every upgrade script that adds such a
-- function.
--
-- The functions that take, renew or report claims are granted to PUBLIC by
-- the extension's owner, so that the owner can restrict who may claim with
-- REVOKE EXECUTE ... FROM PUBLIC and GRANT EXECUTE ... TO a role. (In a
-- trusted install the functions belong to the bootstrap superuser, and
-- PUBLIC's default EXECUTE is granted by that superuser: the installing
-- owner's REVOKE would change nothing.) So, for each of these functions:
-- EXECUTE to the extension's owner WITH GRANT OPTION, revoked from PUBLIC,
-- then granted to PUBLIC again by the extension's owner, from a temporary
-- SECURITY DEFINER function that belongs to the owner (SET ROLE is not
-- allowed in a trusted install script), dropped at once.
--
-- In an upgrade, a function whose EXECUTE was revoked from PUBLIC before
-- stays revoked. The functions are selected by name among the extension's members, so that
-- every overload is covered. The pure mappings (slot_of, crc32, ...) and the
-- caller-rights readers (my_items, slot_counts, ...) keep PUBLIC's default
-- EXECUTE from their owner.

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
               'item_failures', 'define_fleet', 'drop_fleet']::pg_catalog.name[])
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
