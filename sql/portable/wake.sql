-- notify_slot in PL/pgSQL: the extension's C trigger function
-- (src/wake.rs) with the same trigger arguments (name, n, column
-- [, mapping]), errors and channels. It maps the key with slot_of or
-- jump_slot of this schema through one dynamic statement per row.
CREATE FUNCTION @extschema@.notify_slot()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    mapping text;
    col text;
    typ oid;
    base oid;
    slot integer;
    tbl text := pg_catalog.format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
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
        RAISE EXCEPTION 'n must be an integer between 1 and 1048576, got "%"', TG_ARGV[1] USING ERRCODE = '22023',
            HINT = 'The second trigger argument is the n the workers use, e.g. ''8''.';
    END IF;
    n := TG_ARGV[1]::integer;
    mapping := coalesce(TG_ARGV[3], 'slot_of');
    IF mapping NOT IN ('slot_of', 'jump_slot') THEN
        RAISE EXCEPTION 'mapping must be slot_of or jump_slot, got "%"', mapping USING ERRCODE = '22023',
            HINT = 'Use the mapping of the workers'' walk; leave the fourth argument out for slot_of.';
    END IF;
    col := TG_ARGV[2];
    SELECT a.atttypid INTO typ FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = TG_RELID AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % has no column "%"', tbl, col USING ERRCODE = '42703',
            HINT = 'The third trigger argument is the key column the workers'' slot_of uses, e.g. ''id''.';
    END IF;
    base := typ;
    WHILE (SELECT t.typtype FROM pg_catalog.pg_type t WHERE t.oid = base) = 'd' LOOP
        base := (SELECT t.typbasetype FROM pg_catalog.pg_type t WHERE t.oid = base);
    END LOOP;
    IF base NOT IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype, 'text'::regtype,
                    'character varying'::regtype, 'character'::regtype, 'bytea'::regtype, 'uuid'::regtype) THEN
        RAISE EXCEPTION 'notify_slot cannot map column % of table %: % does not take type %',
            pg_catalog.quote_ident(col), tbl, mapping, pg_catalog.format_type(typ, NULL)
            USING ERRCODE = '42804',
            HINT = pg_catalog.format('The key column must be smallint, integer, bigint, text, varchar, char(n), bytea or uuid (or a domain over one), as for the workers'' %s; name such a column, e.g. a generated column (%s::text).', mapping, pg_catalog.quote_ident(col));
    END IF;
    EXECUTE pg_catalog.format('SELECT @extschema@.%s(($1).%I::%s, $2)', mapping, col,
        CASE WHEN base = 'character'::regtype OR base = 'character varying'::regtype THEN 'pg_catalog.text'
             WHEN mapping = 'jump_slot' AND base IN ('smallint'::regtype, 'integer'::regtype) THEN 'pg_catalog.int8'
             ELSE base::regtype::text END)
        INTO slot USING NEW, n;
    IF slot IS NOT NULL AND NOT pg_catalog.pg_is_in_recovery() THEN
        PERFORM pg_catalog.pg_notify(@extschema@.slot_channel(TG_ARGV[0], slot), '');
    END IF;
    RETURN NEW;
END $$;
