-- Waking a slot's worker (docs/wake.md): a per-slot LISTEN/NOTIFY channel,
-- and a row trigger function that notifies the channel of each new row's
-- slot. Notifications are hints: workers also poll, slowly.

CREATE FUNCTION @extschema@.slot_channel(name text, slot integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL OR slot IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN name IS NULL THEN 'name' ELSE 'slot' END
            USING ERRCODE = '22004',
            HINT = 'Pass the name of the fleet and a slot, e.g. slot_channel(''mailer'', my_slot(''mailer'')).';
    END IF;
    IF slot < 0 OR slot > 1048575 THEN
        RAISE EXCEPTION 'slot must be between 0 and 1048575, got %', slot USING ERRCODE = '22023',
            HINT = 'Pass a slot the worker holds, e.g. my_slot(''mailer'').';
    END IF;
    -- a lower-case identifier stays readable (unquoted in LISTEN); the slot
    -- is the part after the last underscore, so these never collide
    IF name ~ '^[a-z][a-z0-9_]*$' AND 10 + pg_catalog.octet_length(name) + pg_catalog.length(slot::text) <= 63 THEN
        RETURN 'pg_claim_' || name || '_' || slot;
    END IF;
    RETURN 'pg_claim__' || pg_catalog.lpad(pg_catalog.to_hex(@extschema@.crc32(name)), 8, '0') || '_' || slot;
END $$;
COMMENT ON FUNCTION @extschema@.slot_channel(text, integer) IS
    'the LISTEN/NOTIFY channel of slot of name, at most 63 bytes and usable unquoted';

-- EXECUTE FUNCTION notify_slot(name, n, column [, mapping]): a version-1 C
-- trigger function (src/wake.rs) that maps the key with the same code as
-- slot_of / jump_slot and calls no SQL function.
CREATE FUNCTION @extschema@.notify_slot()
RETURNS trigger
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_claim_notify_slot';
COMMENT ON FUNCTION @extschema@.notify_slot() IS
    'row trigger notify_slot(name, n, column [, mapping]): NOTIFY slot_channel(name, mapping(NEW.column, n)) for each new row';
