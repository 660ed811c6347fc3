-- pg_claim 0.3.0 -> 0.4.0, run by ALTER EXTENSION pg_claim UPDATE.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.3.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.4.0'" to load this file. \quit

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

-- slot_status shows no sessions of another name (the D3 line of
-- sql/status.sql).
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
          AND l.classid = @extschema@.crc32(slot_status.name)::oid
          AND l.objid::bigint < slot_status.n
          -- D3 (claim branch): never another name's sessions
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

-- D3/D4 (claim branch): claim_lease registers its name and refuses a name a
-- session holds a slot of (the marked lines of sql/leases.sql). The lease
-- section's claim_lease supersedes this one.
CREATE OR REPLACE FUNCTION @extschema@.claim_lease(
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
