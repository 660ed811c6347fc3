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
-- Once a holder of the name reported a slot's remaining work
-- (report_backlog), steps 3 and 4 are those of the weighted planner instead
-- (sql/leases_balance.sql): shares by weight, not by count.
-- So a joiner gets its share from holders above their targets, and a leaver's
-- slots go to holders below theirs; no other slot moves.
--
-- A call whose n is not that of the name's live members (another n, or the
-- n before a resize_fleet; sql/leases_resize.sql) raises PC002, naming the
-- fleet's n, whether the holder is a member or a joiner: a worker follows
-- with fleet_n. The fleet's n changes only by resize_fleet, or by stopping
-- every member and starting with another n (a name with no live member and
-- no live lease starts with the n its first call passes). A joiner beside
-- live leases of claim_lease's holders of another n still gets 55000; a
-- claim_lease beside live members of another n gets PC002 (sql/leases.sql).
--
-- Targets are computed from each member's count of leases as of its own last
-- call (pg_claim_lease_members.held), so a call reads the members of the name
-- and its live leases (at most n) a fixed number of times: its cost grows
-- linearly with the number of live holders, whatever the planner's
-- statistics (no statement is a join that could read them again per row).
-- (The first call that finds fewer than n rows of the name's slots 0 .. n-1
-- creates the missing ones, once.)
--
-- A slot's hand-over takes its fence lock with a try and its row FOR UPDATE
-- SKIP LOCKED, so a slot that a fenced transaction holds (fence /
-- lease_valid: the fence lock shared, or the row FOR KEY SHARE) is not
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

-- The leases of one holder (renewal, give-back), found without reading every
-- slot of the name. No index holds expires_at, and the pages keep room: so a
-- renewal, which changes only expires_at, is a HOT update (no new index
-- entry, and the pruning of the page frees its dead versions). Every call
-- renews every lease of its holder, so the indexes of an indexed expiry
-- grew by n entries per round of the fleet's calls, and every read of the
-- name's slots waded through them (a call of a holder of 32 in a fleet of
-- n = 1024 cost about a quarter more: BENCHMARKS.md, "claim_leases with
-- many holders"). The unserved slots are found by reading the name's slots
-- (at most n = 1024) through the primary key instead.
CREATE INDEX pg_claim_leases_holder ON @extschema@.pg_claim_leases (name, holder);
ALTER TABLE @extschema@.pg_claim_leases SET (fillfactor = 50);
ALTER TABLE @extschema@.pg_claim_lease_members SET (fillfactor = 50);

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
    PERFORM @extschema@.pg_claim_lease_mutex(name, key_, ttl, 'claim_leases'::text);
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
    -- the slots it wanted are no longer wanted (sql/leases_balance.sql)
    UPDATE @extschema@.pg_claim_leases l SET wanted_by = NULL
    WHERE l.name = pg_claim_leases_leave.name AND l.wanted_by = pg_claim_leases_leave.holder;
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
    maxes_ integer[];
    balanced integer;
    -- the active members of a capped fleet (NULL: not capped; empty: this
    -- holder is a standby)
    active_ text[];
    -- the member that refuses the call, if any
    refused_at timestamptz;
    refused_role boolean;
    refused_owner oid;
    refused_n integer;
    stale boolean := false;
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

    -- one read of the members for what the call must know of them first:
    -- this holder's own row (is it joining?), a live member of a role whose
    -- privileges this role lacks, this holder's own row included (its holder
    -- text is no key to it), else a live member of another n, this holder's
    -- own row included (a resize_fleet set it: PC002, the call follows with
    -- fleet_n), and whether any other member is no longer live
    joining := true;
    FOR r IN SELECT m.holder, m.owner, m.n, m.seen_at, m.expires_at > now_ AS live,
                    (m.owner <> role AND NOT pg_catalog.pg_has_role(role, m.owner, 'USAGE')) AS other_role
             FROM @extschema@.pg_claim_lease_members m
             WHERE m.name = pg_claim_leases_take.name
               AND (m.holder = pg_claim_leases_take.holder OR m.expires_at <= now_ OR m.owner <> role
                    OR m.n <> pg_claim_leases_take.n) LOOP
        IF r.holder = pg_claim_leases_take.holder THEN
            joining := NOT r.live;
        END IF;
        IF NOT r.live THEN
            stale := stale OR r.holder <> pg_claim_leases_take.holder;
        ELSIF (r.other_role OR r.n <> n)
              AND (refused_at IS NULL OR (r.other_role AND NOT refused_role)
                   OR (r.other_role = refused_role AND r.seen_at > refused_at)) THEN
            -- the first of them by (other role first, the latest seen)
            refused_at := r.seen_at;
            refused_role := r.other_role;
            refused_owner := r.owner;
            refused_n := r.n;
        END IF;
    END LOOP;
    IF refused_role THEN
        PERFORM @extschema@.pg_claim_lease_refuse_role(name, refused_owner, role);
    ELSIF refused_at IS NOT NULL THEN
        PERFORM @extschema@.pg_claim_leases_refuse_resized(name, refused_n, n);
    END IF;
    -- the members of the name that are no longer live are forgotten (a
    -- row that a claimer's open transaction holds waits for the next call)
    -- (each statement that changes rows a locking subquery picks takes them
    -- as an array, computed once: a join with the subquery could run it
    -- again for every row of the name, when the planner estimates one row)
    IF stale THEN
        DELETE FROM @extschema@.pg_claim_lease_members m
        WHERE m.name = pg_claim_leases_take.name
          AND m.holder = ANY (ARRAY(SELECT o.holder FROM @extschema@.pg_claim_lease_members o
                                    WHERE o.name = pg_claim_leases_take.name AND o.expires_at <= now_
                                      AND o.holder <> pg_claim_leases_take.holder
                                    FOR UPDATE SKIP LOCKED));
    END IF;
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
    -- earlier than it was (a shorter ttl, or the clock stepped back) only
    -- when the slot's fence lock is free: the trigger of sql/leases_guard.sql
    -- takes it, which would wait for the holder's own fenced transactions
    -- with the mutex held; else the later expiry stays.
    -- A slot whose fence lock another transaction holds exclusive (a
    -- release_lease in progress: it takes that lock before the row) is
    -- skipped, neither renewed nor counted: waiting for its row with the
    -- mutex held deadlocks with that transaction when it calls claim_leases
    -- next. The try is shared: the holder's fenced transactions (shared)
    -- do not stop it, and its batches' report_backlog (the row, not the
    -- fence lock) is waited for, as before.
    UPDATE @extschema@.pg_claim_leases l
    SET expires_at = CASE WHEN now_ + ttl >= l.expires_at THEN now_ + ttl
                          WHEN pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + l.slot) THEN now_ + ttl
                          ELSE l.expires_at END
    WHERE l.name = pg_claim_leases_take.name AND l.holder = pg_claim_leases_take.holder
      AND NOT l.session AND l.expires_at > now_ AND l.slot < n
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
      AND pg_catalog.pg_try_advisory_xact_lock_shared(key_, 271581184 + l.slot);
    GET DIAGNOSTICS mine = ROW_COUNT;

    -- 3. a standby of a capped fleet (sql/leases_cap.sql) holds nothing,
    -- and wants nothing; else by weight, once the fleet's holders report
    -- weights (sql/leases_balance.sql: it gives back, takes and marks
    -- itself); else by count, as follows; both among the active members
    active_ := @extschema@.pg_claim_leases_active(name, holder, mine, now_);
    IF pg_catalog.cardinality(active_) = 0 THEN
        target := 0;
        -- (skipping a row another transaction holds, as in 2.)
        UPDATE @extschema@.pg_claim_leases l SET wanted_by = NULL
        WHERE l.name = pg_claim_leases_take.name
          AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                                  WHERE o.name = pg_claim_leases_take.name
                                    AND o.wanted_by = pg_claim_leases_take.holder
                                  FOR NO KEY UPDATE SKIP LOCKED));
    ELSE
        balanced := @extschema@.pg_claim_leases_balance(role, name, n, holder, max, ttl, key_, now_, mine, active_);
    END IF;
    IF balanced IS NOT NULL THEN
        mine := balanced;
        target := balanced;
    ELSIF target IS NULL THEN
        -- 3. its target: the slots the members share are n less those that
        -- live leases of claim_lease's holders (not members) hold; members whose
        -- max is below the even share of what is left get their max; the others
        -- share the rest, one more each for the first (rest mod sharing) of them
        -- by (held desc, joined_at, holder), from each member's count as of its
        -- own last call. Each step reads the rows of the name once, with no
        -- join whose plan could read them again per row: the members' maxes
        -- (ordered, as an integer array: read by position in constant time) and
        -- the non-members' live leases come from one grouping by holder.
        SELECT pg_catalog.array_agg(g.mx ORDER BY g.mx) FILTER (WHERE g.mx IS NOT NULL),
               n - coalesce(pg_catalog.sum(g.leases) FILTER (WHERE g.mx IS NULL), 0)
        INTO maxes_, rest
        FROM (SELECT pg_catalog.max(u.mx) AS mx, pg_catalog.sum(u.lease) AS leases
              FROM (SELECT m.holder, m.max AS mx, 0 AS lease
                    FROM @extschema@.pg_claim_lease_members m
                    WHERE m.name = pg_claim_leases_take.name AND m.expires_at > now_
                      AND (active_ IS NULL OR m.holder = ANY (active_))
                    UNION ALL
                    SELECT l.holder, NULL::integer, 1 FROM @extschema@.pg_claim_leases l
                    WHERE l.name = pg_claim_leases_take.name AND NOT l.session AND l.holder IS NOT NULL
                      AND l.expires_at > now_ AND l.slot < n) u
              GROUP BY u.holder COLLATE "C") g;
        sharing := coalesce(pg_catalog.cardinality(maxes_), 0);
        capped := 0;
        -- members of equal max are capped together: the capped ones are those
        -- whose max is at most maxes_[capped]
        WHILE sharing > 0 AND maxes_[capped + 1]::bigint * sharing <= rest LOOP
            capped := capped + 1;
            rest := rest - maxes_[capped];
            sharing := sharing - 1;
        END LOOP;
        IF max = 0 THEN
            target := 0;
        ELSIF capped > 0 AND max <= maxes_[capped] THEN
            target := max;
        ELSIF sharing > 0 THEN
            target := rest / sharing;
            IF rest % sharing > 0 THEN
                SELECT m.held, m.joined_at INTO r FROM @extschema@.pg_claim_lease_members m
                WHERE m.name = pg_claim_leases_take.name AND m.holder = pg_claim_leases_take.holder;
                -- the sharing members ranked before this holder
                SELECT count(*) INTO ahead FROM @extschema@.pg_claim_lease_members m
                WHERE m.name = pg_claim_leases_take.name AND m.expires_at > now_
                  AND m.max > coalesce(maxes_[capped], -1)
                  AND (active_ IS NULL OR m.holder = ANY (active_))
                  AND m.holder <> pg_claim_leases_take.holder
                  AND (m.held > r.held
                       OR (m.held = r.held AND (m.joined_at, m.holder) < (r.joined_at, pg_claim_leases_take.holder)));
                IF ahead < rest % sharing THEN
                    target := target + 1;
                END IF;
            END IF;
        END IF;
        target := least(coalesce(target, 0), max);
    END IF;

    -- 4a. give back every live lease at or above n (n changed), and what it
    -- holds beyond the target (its highest slots); a slot that a fenced
    -- transaction holds (its row, or its fence lock) stays until that
    -- transaction ends
    UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
    WHERE l.name = pg_claim_leases_take.name
      AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                              WHERE o.name = pg_claim_leases_take.name
                                AND o.holder = pg_claim_leases_take.holder AND NOT o.session
                                AND o.expires_at > now_ AND o.slot >= n
                                AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                              FOR UPDATE SKIP LOCKED));
    IF mine > target THEN
        UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
        WHERE l.name = pg_claim_leases_take.name
          AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                                  WHERE o.name = pg_claim_leases_take.name
                                    AND o.holder = pg_claim_leases_take.holder AND NOT o.session
                                    AND o.expires_at > now_ AND o.slot < n
                                    AND (o.owner IS NULL OR o.owner = role
                                         OR pg_catalog.pg_has_role(role, o.owner, 'USAGE'))
                                    AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                                  ORDER BY o.slot DESC
                                  LIMIT mine - target
                                  FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS given = ROW_COUNT;
        mine := mine - given;
    END IF;

    -- 4b. take unserved slots up to the target: first its own slots whose
    -- lease expired (or was given back), then the longest unserved (never
    -- leased: expiry -infinity; then by expiry), then those with no expiry
    -- (released before 0.5.0, and records of sessions that left); each
    -- one read of the name's slots (at most n)
    IF mine < target THEN
        -- the name's rows 0 .. n-1 exist (made once, when they do not)
        -- (counted: rows of a few slots, such as those session claims'
        -- my_token recorded, leave the others missing)
        IF (SELECT count(*) FROM @extschema@.pg_claim_leases l
            WHERE l.name = pg_claim_leases_take.name AND l.slot < n) < n THEN
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
