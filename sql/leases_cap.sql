-- A fleet-wide cap: cap_fleet and fleet_cap (docs/leases.md, "Capping a
-- fleet"; docs/tenants.md).
--
-- cap_fleet(name, g) lets at most g holders of the claim_leases fleet name
-- hold slots at once, for a downstream that allows g concurrent calls. The
-- other members stay members (live while they call, as every member) and
-- hold nothing: they are standbys, and take over when a holder leaves, dies
-- or is paused past its ttl. claim_leases (sql/leases_fleet.sql) applies it
-- under the name's lease mutex, so the calls of the name see one another's
-- outcome in turn:
--   1. the active members are the first g - h live members (max above 0),
--      h the holders of live leases that are not live members (claim_lease's
--      holders), by (held slots at their last call first, then the earliest
--      joined, then by holder): the ones that hold slots keep them, and a
--      joiner or a holder back from a pause past its ttl (a joiner again)
--      queues behind the members already there;
--   2. the planners (by count, and by weight) share n among the active
--      members only;
--   3. an active member that holds nothing takes slots only while fewer
--      than g other holders hold a live lease of the name (claim_lease's
--      holders included): a dead holder's leases expire before its standby
--      takes one of them, so at no moment do g + 1 holders hold a lease;
--   4. a standby gives back what it holds (after its fenced batch in hand,
--      as every give-back) and takes nothing.
-- A lower cap takes effect at each holder's next claim_leases call (within
-- ttl / 3; the worker libraries call at once when a fence is refused): the
-- holders beyond it give back their slots there. A higher cap lets the
-- first standbys take slots at their next call. cap_fleet(name, NULL)
-- removes the cap.
--
-- The cap belongs to the name (kept when the fleet stops, as a define_fleet
-- definition is), and to the role that set it: only a role with the
-- privileges of every live member's and live lease's role, of the
-- definition's owner, and of the role that set the cap before may change
-- it (42501).
--
-- Every call from here to a function of the extension is schema-qualified
-- and exact-typed, and the functions run with search_path = pg_catalog,
-- pg_temp: no object planted in any schema is called.

CREATE TABLE @extschema@.pg_claim_lease_caps (
    name   text        PRIMARY KEY,
    -- at most that many holders hold slots of the name at once
    cap    integer     NOT NULL CHECK (cap >= 1),
    -- the role that set it
    owner  oid         NOT NULL,
    set_at timestamptz NOT NULL
);
REVOKE ALL ON @extschema@.pg_claim_lease_caps FROM PUBLIC;
COMMENT ON TABLE @extschema@.pg_claim_lease_caps IS
    'pg_claim''s fleet-wide caps, one row per capped claim_leases name; written only through cap_fleet';

-- cap_fleet (src/leases.rs) for `role`: the cap before (NULL: none).
CREATE FUNCTION @extschema@.pg_claim_leases_cap(role oid, name text, cap integer)
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
    owner_ oid;
    r record;
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be null' USING ERRCODE = '22004',
            HINT = 'This is cap_fleet''s internal function: call cap_fleet(name, g).';
    END IF;
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'cap_fleet(name, g) lets at most g holders of the lease fleet name hold slots at once: pass the fleet''s name (g NULL removes its cap).';
    END IF;
    IF cap < 1 THEN
        RAISE EXCEPTION 'cap must be at least 1, got %', cap USING ERRCODE = '22023',
            HINT = 'cap_fleet(name, g): g is the most holders that hold slots of the fleet at once; NULL removes the cap. To stop a fleet, stop its workers (or claim_leases with max => 0).';
    END IF;
    -- the name's checks (its length), as for a lease
    PERFORM @extschema@.lease_check(name, 0::integer, 0::bigint, interval '1 second');
    crc_ := @extschema@.crc32(name);
    key_ := (crc_::bit(32))::integer;
    -- the lease mutex, to the end of the transaction: the claims of the
    -- name run before the cap, or after its commit
    PERFORM pg_catalog.pg_advisory_xact_lock(key_, 269484034);
    now_ := pg_catalog.clock_timestamp();

    -- the name exists: a live member, a lease row, a definition, or a cap
    IF NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_lease_caps c WHERE c.name = pg_claim_leases_cap.name)
       AND NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_lease_members m
                   WHERE m.name = pg_claim_leases_cap.name AND m.expires_at > now_)
       AND NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l WHERE l.name = pg_claim_leases_cap.name)
       AND NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_fleets f WHERE f.name = pg_claim_leases_cap.name) THEN
        RAISE EXCEPTION 'fleet "%" does not exist: it has no live member, no lease and no definition', name
            USING ERRCODE = '42704',
            HINT = 'cap_fleet caps a claim_leases fleet: check the name (SELECT * FROM lease_holders(name)), or define the fleet first with define_fleet, then cap it before its workers start.';
    END IF;

    -- the rights: as for resize_fleet, and the cap's own setter
    owner_ := @extschema@.pg_claim_leases_foreign_owner(role, name, now_);
    IF owner_ IS NOT NULL THEN
        RAISE EXCEPTION 'fleet "%" is leased by role %; role % cannot cap it', name,
            owner_::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a role with the privileges of the role whose workers hold the fleet''s leases may cap it: cap it as that role (SET ROLE), or be granted it.';
    END IF;
    SELECT f.owner::oid AS owner INTO r FROM @extschema@.pg_claim_fleets f
    WHERE f.name = pg_claim_leases_cap.name;
    IF FOUND AND NOT @extschema@.pg_claim_fleet_may_change(role, r.owner) THEN
        RAISE EXCEPTION 'fleet "%" is defined by role %; role % cannot cap it', name,
            r.owner::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a member of the role that defined a fleet, or of the extension''s owner, may cap it: ask that role.';
    END IF;
    SELECT c.cap, c.owner INTO r FROM @extschema@.pg_claim_lease_caps c
    WHERE c.name = pg_claim_leases_cap.name
    FOR UPDATE;
    IF FOUND THEN
        old_ := r.cap;
        IF NOT @extschema@.pg_claim_fleet_may_change(role, r.owner) THEN
            RAISE EXCEPTION 'the cap of fleet "%" was set by role %; role % cannot change it', name,
                r.owner::regrole, role::regrole
                USING ERRCODE = '42501',
                HINT = 'Only a member of the role that set a fleet''s cap, or of the extension''s owner, may change it: ask that role.';
        END IF;
    END IF;

    IF cap IS NULL THEN
        DELETE FROM @extschema@.pg_claim_lease_caps c WHERE c.name = pg_claim_leases_cap.name;
    ELSE
        INSERT INTO @extschema@.pg_claim_lease_caps AS c (name, cap, owner, set_at)
        VALUES (name, cap, role, now_)
        ON CONFLICT ON CONSTRAINT pg_claim_lease_caps_pkey DO UPDATE
            SET cap = excluded.cap, owner = excluded.owner, set_at = excluded.set_at;
    END IF;
    RETURN old_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_cap(oid, text, integer) FROM PUBLIC;

-- fleet_cap (src/leases.rs): the cap of the name, NULL when it has none.
-- Only that number (`role` is the shells' first argument; every role that
-- may claim the name may ask).
CREATE FUNCTION @extschema@.pg_claim_fleet_cap(role oid, name text)
RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.cap FROM @extschema@.pg_claim_lease_caps c WHERE c.name = pg_claim_fleet_cap.name
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_cap(oid, text) FROM PUBLIC;

-- claim_leases' reading of the cap, under the name's mutex (called only by
-- pg_claim_leases_take): NULL when the name has no cap (every live member
-- is active), else the active members (step 1 above) when `holder` is one
-- of them and may take slots (step 3), else an empty array: the holder is a
-- standby. `mine` is what the holder holds after its renewal.
CREATE FUNCTION @extschema@.pg_claim_leases_active(name text, holder text, mine integer, now_ timestamptz)
RETURNS text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    cap_ integer;
    active_ text[];
    others_ bigint;
    outside_ bigint;
BEGIN
    SELECT c.cap INTO cap_ FROM @extschema@.pg_claim_lease_caps c WHERE c.name = pg_claim_leases_active.name;
    IF cap_ IS NULL THEN
        RETURN NULL;
    END IF;
    -- the holders of live leases but this one, and those of them that are
    -- not live members (one read of the name's slots)
    SELECT count(DISTINCT l.holder) FILTER (WHERE l.holder <> pg_claim_leases_active.holder),
           count(DISTINCT l.holder) FILTER (WHERE NOT EXISTS (
               SELECT 1 FROM @extschema@.pg_claim_lease_members m
               WHERE m.name = pg_claim_leases_active.name AND m.holder = l.holder AND m.expires_at > now_))
    INTO others_, outside_
    FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_active.name AND NOT l.session AND l.holder IS NOT NULL
      AND l.expires_at > now_;
    active_ := ARRAY(SELECT m.holder FROM @extschema@.pg_claim_lease_members m
                     WHERE m.name = pg_claim_leases_active.name AND m.expires_at > now_ AND m.max > 0
                     ORDER BY m.held > 0 DESC, m.joined_at, m.holder COLLATE "C"
                     LIMIT greatest(cap_ - outside_, 0));
    IF NOT holder = ANY (active_) THEN
        RETURN '{}';
    END IF;
    -- an active member with nothing yet waits for the leases of the holders
    -- it replaces to end
    IF mine = 0 AND others_ >= cap_ THEN
        RETURN '{}';
    END IF;
    RETURN active_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_active(text, text, integer, timestamptz) FROM PUBLIC;
