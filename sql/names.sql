-- The name registry (docs/claiming.md, "Names and lock keys").
--
-- Every lock of a name is keyed by crc32(name) (its first advisory key), so
-- two names with the same crc32 would share slots, group partitions and the
-- lease mutex. The registry gives each key to the first name claimed with it
-- in this database: claim_slot, claim_slots, group_join and claim_partitions
-- (on a new acquisition, from Rust through the function manager) and
-- claim_lease register the name first, and a name whose key belongs to
-- another name is refused with 42710.
--
-- `name` is unique because `key` is the primary key and key = crc32(name);
-- a unique index on the name itself would refuse names longer than a btree
-- entry.

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
