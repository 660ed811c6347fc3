-- slot_status (docs/claiming.md): every slot of a name, served or not, in
-- every mode. Session claims come from the lock table (as slot_holders), leases
-- and my_token's records from lease_holders, whose rules say whose holder and
-- token the caller sees (those of leases and session records whose owner role
-- it has the privileges of). The function itself runs with the caller's
-- rights; every call of an extension function is schema-qualified and
-- exact-typed.
CREATE FUNCTION @extschema@.slot_status(name text, n integer)
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
