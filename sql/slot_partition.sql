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
    expr_ text;
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
    SELECT pt.partstrat, pt.partnatts, c.relrowsecurity,
           CASE WHEN pt.partexprs IS NOT NULL
                THEN pg_catalog.pg_get_expr(pt.partexprs, pt.partrelid) END
    INTO strat, natts, parent_rls, expr_
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
    -- PARTITION BY HASH ((id + 1)) routes the hash of the expression's
    -- value, not of a key the worker maps
    IF expr_ IS NOT NULL THEN
        RAISE EXCEPTION 'table % is partitioned by hash of the expression %, not of a column', tbl, expr_
            USING ERRCODE = '22023',
            HINT = 'A slot maps one key (pg_hash_slot(key, n)): partition by the hash of one column, e.g. a stored generated column holding the expression''s value.';
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
