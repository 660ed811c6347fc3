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

-- EXECUTE FUNCTION notify_slot(name, n, column [, mapping])
CREATE FUNCTION @extschema@.notify_slot()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n_ integer;
    col text;
    mapping text;
    s integer;
BEGIN
    IF TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('INSERT', 'UPDATE') THEN
        RAISE EXCEPTION 'notify_slot must be a FOR EACH ROW trigger on INSERT or UPDATE, not % on %', TG_LEVEL, TG_OP
            USING ERRCODE = '39P01',
            HINT = 'CREATE TRIGGER ... AFTER INSERT ON tbl FOR EACH ROW EXECUTE FUNCTION notify_slot(''mailer'', ''8'', ''id'').';
    END IF;
    IF TG_NARGS NOT IN (3, 4) THEN
        RAISE EXCEPTION 'notify_slot takes 3 or 4 trigger arguments (name, n, column [, mapping]), got %', TG_NARGS
            USING ERRCODE = '22023',
            HINT = 'EXECUTE FUNCTION notify_slot(''mailer'', ''8'', ''id'') or notify_slot(''mailer'', ''8'', ''id'', ''jump_slot'').';
    END IF;
    IF TG_ARGV[1] !~ '^[0-9]{1,7}$' OR TG_ARGV[1]::integer NOT BETWEEN 1 AND 1048576 THEN
        RAISE EXCEPTION 'n must be an integer between 1 and 1048576, got "%"', TG_ARGV[1]
            USING ERRCODE = '22023',
            HINT = 'The second trigger argument is the n the workers use, e.g. ''8''.';
    END IF;
    n_ := TG_ARGV[1]::integer;
    col := TG_ARGV[2];
    mapping := coalesce(TG_ARGV[3], 'slot_of');
    IF mapping NOT IN ('slot_of', 'jump_slot') THEN
        RAISE EXCEPTION 'mapping must be slot_of or jump_slot, got "%"', mapping USING ERRCODE = '22023',
            HINT = 'Use the mapping of the workers'' walk; leave the fourth argument out for slot_of.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                   WHERE a.attrelid = TG_RELID AND a.attname = col AND a.attnum > 0
                     AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'table %.% has no column "%"', TG_TABLE_SCHEMA, TG_TABLE_NAME, col
            USING ERRCODE = '42703',
            HINT = 'The third trigger argument is the key column the workers'' slot_of uses, e.g. ''id''.';
    END IF;
    EXECUTE pg_catalog.format('SELECT @extschema@.%I(($1).%I, $2)', mapping, col) INTO s USING NEW, n_;
    IF s IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify(@extschema@.slot_channel(TG_ARGV[0], s), '');
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION @extschema@.notify_slot() IS
    'row trigger notify_slot(name, n, column [, mapping]): NOTIFY slot_channel(name, mapping(NEW.column, n)) for each new row';
