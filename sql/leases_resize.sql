-- Online resize of a lease fleet: resize_fleet and fleet_n (docs/leases.md,
-- "Resizing").
--
-- The n of a claim_leases fleet is the number of its slots, and so the
-- mapping of every key to a slot: a key K of slot s under n may belong to
-- slot s' under n'. Order per key holds across a resize by one barrier: an
-- item of K under the new n cannot start while an item of K under the old
-- n is in flight. resize_fleet(name, n) is that barrier, in one transaction
-- under the name's lease mutex (the one claim_leases and claim_lease take;
-- here to the end of the transaction, so no claim of the name runs between
-- the resize and its commit):
--   1. it takes every slot's fence lock exclusive (the lock fence and
--      lease_valid take shared in READ COMMITTED), then every lease row of
--      the name FOR UPDATE (the lock they take in REPEATABLE READ): so it
--      waits for every fenced transaction in flight under the old n, and a
--      new fenced transaction waits behind the resize (rows last: a batch
--      may still write its lease row with report_backlog);
--   2. it deletes the rows of slots at or above the new n and gives back
--      every live lease below it (expired at once, the holder kept, so that
--      a member takes its own slots back first): the guard trigger
--      (sql/leases_guard.sql) has every session forget what it knew of
--      them when the resize commits, so every old token fails fence (PC001);
--   3. it sets n of the name's member rows and lease rows to the new n,
--      clears the balance weights (backlog, backlog_at, wanted_by: they
--      weigh the slots of the old mapping), and sets the n of the name's
--      define_fleet definition, when it has one.
-- A slot's lease under the new n needs a claim_leases after the commit, and
-- every fenced transaction of the old n ended before it: so a batch of K
-- under the new n starts only after every batch of K under the old n ended.
-- After the resize, claim_leases with the old n raises PC002 (the fleet's n
-- is fleet_n(name)); the worker libraries call claim_leases again with it.
--
-- Session claims (claim_slot, claim_slots) have no token that a resize could
-- fence an in-flight batch with: a name with live session claims is refused
-- (55000); such a fleet is resized by stopping it, changing n and starting it.
--
-- Another resize of the same name while one is in progress is refused at
-- once (55P03): the resize lock (key1, 269484036 = 0x10100004) is taken with a
-- try, to the end of the transaction.
--
-- Every call from here to a function of the extension is schema-qualified
-- and exact-typed, and the functions run with search_path = pg_catalog,
-- pg_temp: no object planted in any schema is called.

-- claim_leases' refusal of a call whose n is not the fleet's: the live
-- members of name use n = fleet_n (after a resize_fleet, or since they
-- started), the call passed n.
CREATE FUNCTION @extschema@.pg_claim_leases_refuse_resized(name text, fleet_n integer, n integer)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'fleet "%" has n = % (since a resize_fleet, or since its members started with it); this call passed n = %',
        name, fleet_n, n
        USING ERRCODE = 'PC002',
        HINT = 'Call claim_leases with the fleet''s n (SELECT fleet_n(name)); the pg_claim worker libraries follow by themselves.';
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_refuse_resized(text, integer, integer) FROM PUBLIC;

-- The owner of a live member or a live lease of `name` whose privileges
-- `role` lacks, else NULL: the rights resize_fleet and cap_fleet
-- (sql/leases_cap.sql) check before they change a running fleet.
CREATE FUNCTION @extschema@.pg_claim_leases_foreign_owner(role oid, name text, now_ timestamptz)
RETURNS oid
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        (SELECT m.owner FROM @extschema@.pg_claim_lease_members m
         WHERE m.name = pg_claim_leases_foreign_owner.name AND m.expires_at > now_
           AND m.owner <> role AND NOT pg_catalog.pg_has_role(role, m.owner, 'USAGE')
         LIMIT 1),
        (SELECT l.owner FROM @extschema@.pg_claim_leases l
         WHERE l.name = pg_claim_leases_foreign_owner.name AND NOT l.session AND l.holder IS NOT NULL
           AND l.expires_at > now_ AND l.owner IS NOT NULL AND l.owner <> role
           AND NOT pg_catalog.pg_has_role(role, l.owner, 'USAGE')
         LIMIT 1))
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_foreign_owner(oid, text, timestamptz) FROM PUBLIC;

-- the key2 values in lo .. hi of the two-int4 advisory locks of key1 = crc
-- (crc32 of a name) that other sessions of this database hold, in order:
-- resize_fleet waits for the claims not yet committed that hold them
CREATE FUNCTION @extschema@.pg_claim_leases_locks_held(crc bigint, lo integer, hi integer)
RETURNS SETOF integer
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT DISTINCT k.objid::bigint::integer FROM pg_catalog.pg_locks k
    WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
      AND k.pid <> pg_catalog.pg_backend_pid()
      AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                        WHERE d.datname = pg_catalog.current_database())
      AND k.classid::bigint = crc
      AND k.objid::bigint BETWEEN lo AND hi
    ORDER BY 1
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_locks_held(bigint, integer, integer) FROM PUBLIC;

-- resize_fleet (src/leases.rs) for `role`: the old n.
CREATE FUNCTION @extschema@.pg_claim_leases_resize(role oid, name text, n integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    now_ timestamptz;
    crc_ bigint;
    key_ integer;
    old_ integer;
    s integer;
    key2_ integer;
    owner_ oid;
    r record;
    known boolean := false;
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('resize_fleet'::text);
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be null' USING ERRCODE = '22004',
            HINT = 'This is resize_fleet''s internal function: call resize_fleet(name, n).';
    END IF;
    IF name IS NULL OR n IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN name IS NULL THEN 'name' ELSE 'n' END
            USING ERRCODE = '22004',
            HINT = 'resize_fleet(name, n) sets the number of slots of the lease fleet name to n: pass both.';
    END IF;
    IF n < 1 OR n > 1024 THEN
        RAISE EXCEPTION 'n must be between 1 and 1024 for resize_fleet, got %', n USING ERRCODE = '22023',
            HINT = 'n is the fleet''s new number of slots; claim_leases serves at most 1024 slots of a name.';
    END IF;
    -- the name's checks (its length), as for a lease
    PERFORM @extschema@.lease_check(name, 0::integer, 0::bigint, interval '1 second');
    crc_ := @extschema@.crc32(name);
    key_ := (crc_::bit(32))::integer;

    IF NOT pg_catalog.pg_try_advisory_xact_lock(key_, 269484036) THEN
        RAISE EXCEPTION 'fleet "%" is being resized by another transaction', name
            USING ERRCODE = '55P03',
            HINT = 'One resize of a name at a time: wait for that transaction to end, then see the fleet''s n with SELECT fleet_n(name).';
    END IF;
    -- the lease mutex, to the end of the transaction: claim_leases and
    -- claim_lease of the name wait for the resize to commit
    PERFORM pg_catalog.pg_advisory_xact_lock(key_, 269484034);
    now_ := pg_catalog.clock_timestamp();

    -- a name in session mode: claim_slot holds a slot of it
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks k
               WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
                 AND k.mode = 'ExclusiveLock'
                 AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                   WHERE d.datname = pg_catalog.current_database())
                 AND k.classid = crc_::oid AND k.objid::bigint <= 1048575) THEN
        RAISE EXCEPTION 'name "%" is claimed with claim_slot; session fleets cannot be resized online', name
            USING ERRCODE = '55000',
            HINT = 'A session claim has no token that could fence an in-flight batch: stop the sessions of the name, change n in their configuration, and start them again.';
    END IF;

    -- the rights: every live member and live lease of the name belongs to a
    -- role whose privileges this role has, and so does its definition
    owner_ := @extschema@.pg_claim_leases_foreign_owner(role, name, now_);
    IF owner_ IS NOT NULL THEN
        RAISE EXCEPTION 'fleet "%" is leased by role %; role % cannot resize it', name,
            owner_::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a role with the privileges of the role whose workers hold the fleet''s leases may resize it: resize as that role (SET ROLE), or be granted it.';
    END IF;
    SELECT f.owner::oid AS owner, f.n INTO r FROM @extschema@.pg_claim_fleets f
    WHERE f.name = pg_claim_leases_resize.name;
    IF FOUND THEN
        known := true;
        old_ := r.n;
        IF NOT @extschema@.pg_claim_fleet_may_change(role, r.owner) THEN
            RAISE EXCEPTION 'fleet "%" is defined by role %; role % cannot resize it', name,
                r.owner::regrole, role::regrole
                USING ERRCODE = '42501',
                HINT = 'Only a member of the role that defined a fleet, or of the extension''s owner, may change its n: ask that role.';
        END IF;
    END IF;

    -- the n now: the live members', else the live leases', else the
    -- definition's, else that of the name's lease rows
    SELECT m.n INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_resize.name AND m.expires_at > now_
    ORDER BY m.seen_at DESC LIMIT 1;
    IF NOT FOUND THEN
        SELECT l.n INTO r FROM @extschema@.pg_claim_leases l
        WHERE l.name = pg_claim_leases_resize.name AND NOT l.session AND l.holder IS NOT NULL
          AND l.expires_at > now_ AND l.n IS NOT NULL
        ORDER BY l.acquired_at DESC LIMIT 1;
    END IF;
    IF FOUND THEN
        known := true;
        old_ := r.n;
    END IF;
    SELECT pg_catalog.max(l.slot) + 1 AS top, pg_catalog.max(l.n) AS n INTO r
    FROM @extschema@.pg_claim_leases l WHERE l.name = pg_claim_leases_resize.name;
    IF r.top IS NOT NULL THEN
        known := true;
        old_ := coalesce(old_, r.n, r.top);
    END IF;
    IF NOT known THEN
        RAISE EXCEPTION 'fleet "%" does not exist: it has no live member, no lease and no definition', name
            USING ERRCODE = '42704',
            HINT = 'resize_fleet changes the n of a running claim_leases fleet (or of a define_fleet definition): check the name (SELECT * FROM lease_holders(name)); a fleet that is not running starts with the n its first claim_leases passes.';
    END IF;
    IF old_ = n THEN
        RAISE EXCEPTION 'fleet "%" already has n = %', name, n USING ERRCODE = '22023',
            HINT = 'Pass the new number of slots: SELECT fleet_n(name) shows the current one.';
    END IF;

    -- 1. wait for every fenced transaction of the name: READ COMMITTED ones
    -- hold their slot's fence lock, REPEATABLE READ ones its row FOR KEY
    -- SHARE. The fence locks first: a batch that passed fence may still
    -- write its lease row (report_backlog) before it commits, which a row
    -- lock of the resize would make it wait for (a deadlock).
    -- A fenced transaction needs its slot's row, so the fence locks taken
    -- are those of the name's rows (not of every slot below n: a defined n
    -- may be 1048576, more locks than the lock table holds). Rows that a
    -- claim not yet committed wrote are not seen; that claim holds the
    -- slot's fence lock (a hand-over) or first-row reservation (claim_lease's
    -- insert), so the resize first waits for every transaction that holds
    -- one of those (no claim takes one while the resize holds the mutex),
    -- then reads the rows. The reservations (270532608 + slot) and the fence
    -- locks (271581184 + slot) are one range of key2, taken in its order
    FOR key2_ IN SELECT h.key2
                 FROM @extschema@.pg_claim_leases_locks_held(crc_, 270532608, 271581184 + 1048575) h(key2)
                 LOOP
        PERFORM pg_catalog.pg_advisory_xact_lock(key_, key2_);
    END LOOP;
    FOR s IN SELECT l.slot FROM @extschema@.pg_claim_leases l
             WHERE l.name = pg_claim_leases_resize.name ORDER BY l.slot LOOP
        PERFORM pg_catalog.pg_advisory_xact_lock(key_, 271581184 + s);
    END LOOP;
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_resize.name
    ORDER BY l.slot
    FOR UPDATE;
    now_ := pg_catalog.clock_timestamp();

    -- 2. every old token fails fence after the commit (the guard trigger
    -- fires for each row deleted or given back)
    DELETE FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_resize.name AND l.slot >= n;
    -- (a record of a session that left passes fence until its slot changes
    -- hands: it is given back as a lease is; no session holds a slot now)
    UPDATE @extschema@.pg_claim_leases l
    SET n = pg_claim_leases_resize.n, session = false,
        expires_at = CASE WHEN l.holder IS NOT NULL AND (l.session OR l.expires_at > now_)
                          THEN now_ ELSE l.expires_at END,
        backlog = NULL, backlog_at = NULL, wanted_by = NULL
    WHERE l.name = pg_claim_leases_resize.name;

    -- 3. the members' n (each holds nothing now) and the definition's
    UPDATE @extschema@.pg_claim_lease_members m SET n = pg_claim_leases_resize.n, held = 0
    WHERE m.name = pg_claim_leases_resize.name;
    UPDATE @extschema@.pg_claim_fleets f SET n = pg_claim_leases_resize.n
    WHERE f.name = pg_claim_leases_resize.name;
    RETURN old_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_resize(oid, text, integer) FROM PUBLIC;

-- fleet_n (src/leases.rs): the n of the name's live lease fleet (its live
-- members'), else its definition's, else NULL. Only that number: no holder,
-- token or role (`role` is the shells' first argument; every role that may
-- claim the name may ask).
CREATE FUNCTION @extschema@.pg_claim_fleet_n(role oid, name text)
RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n_ integer;
BEGIN
    IF name IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT m.n INTO n_ FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_fleet_n.name AND m.expires_at > pg_catalog.clock_timestamp()
    ORDER BY m.seen_at DESC LIMIT 1;
    IF FOUND THEN
        RETURN n_;
    END IF;
    SELECT f.n INTO n_ FROM @extschema@.pg_claim_fleets f WHERE f.name = pg_claim_fleet_n.name;
    RETURN n_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_n(oid, text) FROM PUBLIC;
