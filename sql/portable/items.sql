-- my_items, my_items_query and slot_counts_query of the portable edition:
-- the extension's C functions (src/items*) in PL/pgSQL. my_items_query and
-- slot_counts_query write the same query text as the extension's (the
-- mapping call schema-qualified and with n as a constant, operators of
-- pg_catalog, identifiers quoted); my_items runs it with EXECUTE in the
-- caller's rights, so the caller's privileges and the table's row-level
-- security apply exactly as to the caller's own SELECT. The extension's
-- one-time NOTICE about a missing index is not given (docs/portable.md).

-- A type as the extension writes it into a query: qualified, but for the
-- types with SQL names of their own (integer, numeric(10,2), ...).
CREATE FUNCTION @extschema@.pg_claim_type_text(t oid, typmod integer) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = '' AS $$
    SELECT CASE WHEN ty.typnamespace = 'pg_catalog'::pg_catalog.regnamespace
                     AND CASE WHEN ty.typcategory = 'A' THEN ty.typelem ELSE ty.oid END NOT IN (
                         'bit'::pg_catalog.regtype, 'boolean'::pg_catalog.regtype, 'character'::pg_catalog.regtype,
                         'real'::pg_catalog.regtype, 'double precision'::pg_catalog.regtype,
                         'smallint'::pg_catalog.regtype, 'integer'::pg_catalog.regtype, 'bigint'::pg_catalog.regtype,
                         'numeric'::pg_catalog.regtype, 'interval'::pg_catalog.regtype,
                         'time without time zone'::pg_catalog.regtype, 'time with time zone'::pg_catalog.regtype,
                         'timestamp without time zone'::pg_catalog.regtype, 'timestamp with time zone'::pg_catalog.regtype,
                         'bit varying'::pg_catalog.regtype, 'character varying'::pg_catalog.regtype)
                THEN 'pg_catalog.' || pg_catalog.format_type(t, typmod)
                ELSE pg_catalog.format_type(t, typmod) END
    FROM pg_catalog.pg_type ty WHERE ty.oid = t
$$;

-- The parts of a share's query for table relid: the qualified table, the
-- key column, its type as written, and the mapping expression of the route
-- (or key) column with n; checks of every name with the extension's errors.
CREATE FUNCTION @extschema@.pg_claim_items_parts(
    relid oid, n integer, key text, method text, route text, pending text, what text,
    OUT tbl text, OUT keycol text, OUT keytype text, OUT mapexpr text, OUT pendexpr text)
-- an empty search_path: the types written into the query come out qualified
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = '' AS $$
DECLARE
    cols text;
    pk int2[];
    a record;
    r record;
    base oid;
    fn text;
    arg text;
BEGIN
    SELECT pg_catalog.format('%I.%I', ns.nspname, c.relname) INTO tbl
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
    WHERE c.oid = relid;
    -- the caller's privileges, before anything else is read
    IF NOT pg_catalog.has_any_column_privilege(relid, 'SELECT') THEN
        RAISE EXCEPTION 'permission denied for table %', tbl USING ERRCODE = '42501',
            HINT = pg_catalog.format('The function %s reads the table with the caller''s privileges; GRANT SELECT on it to this role.', what);
    END IF;
    SELECT pg_catalog.string_agg(at.attname::text, ', ' ORDER BY at.attnum) INTO cols
    FROM pg_catalog.pg_attribute at WHERE at.attrelid = relid AND at.attnum > 0 AND NOT at.attisdropped;
    IF method IS NULL OR method NOT IN ('auto', 'crc32', 'jump', 'pg_hash') THEN
        RAISE EXCEPTION 'unsupported method "%"', method USING ERRCODE = '22023',
            HINT = 'The method is one of: auto, crc32, jump, pg_hash.';
    END IF;
    IF key IS NULL THEN
        SELECT ARRAY(SELECT pg_catalog.unnest(i.indkey::int2[])) INTO pk FROM pg_catalog.pg_index i WHERE i.indrelid = relid AND i.indisprimary;
        IF NOT FOUND THEN
            RAISE EXCEPTION '% has no primary key to use as the key', tbl USING ERRCODE = '42P10',
                HINT = CASE WHEN what = 'my_items'
                            THEN 'Name the key column: my_items(..., key => ''column_name''); paging with after needs it unique and not null.'
                            ELSE pg_catalog.format('Name the key column: %s(..., key => ''column_name'').', what) END;
        END IF;
        IF pg_catalog.cardinality(pk) <> 1 THEN
            RAISE EXCEPTION 'the primary key of % has % columns (%), so there is no single key column', tbl,
                pg_catalog.cardinality(pk),
                (SELECT pg_catalog.string_agg(at.attname::text, ', ' ORDER BY o)
                 FROM pg_catalog.unnest(pk) WITH ORDINALITY u(num, o)
                 JOIN pg_catalog.pg_attribute at ON at.attrelid = relid AND at.attnum = u.num)
                USING ERRCODE = '42P10',
                HINT = CASE WHEN what = 'my_items'
                            THEN 'Name the key column: my_items(..., key => ''column_name''); paging with after needs it unique and not null.'
                            ELSE pg_catalog.format('Name the key column: %s(..., key => ''column_name'').', what) END;
        END IF;
        SELECT at.attname INTO key FROM pg_catalog.pg_attribute at WHERE at.attrelid = relid AND at.attnum = pk[1];
    END IF;
    -- the key, then the route and pending columns
    FOR a IN SELECT k.role, k.col FROM (VALUES (1, 'key', key), (2, 'route', coalesce(route, key)), (3, 'pending', pending)) AS k(o, role, col)
             WHERE k.col IS NOT NULL ORDER BY k.o LOOP
        SELECT at.atttypid, at.atttypmod, at.attnotnull INTO r FROM pg_catalog.pg_attribute at
        WHERE at.attrelid = relid AND at.attname = a.col AND at.attnum > 0 AND NOT at.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'column "%" of % does not exist', a.col, tbl USING ERRCODE = '42703',
                HINT = pg_catalog.format('%s takes column names as stored (case-sensitive, without quotes); %s has: %s', a.role, tbl, cols);
        END IF;
        IF NOT pg_catalog.has_column_privilege(relid, a.col, 'SELECT') THEN
            RAISE EXCEPTION 'permission denied for column % of table %', a.col, tbl USING ERRCODE = '42501',
                HINT = CASE WHEN a.role = 'key'
                            THEN pg_catalog.format('The share is selected by its key: GRANT SELECT (%s) ON %s to this role.', pg_catalog.quote_ident(a.col), tbl)
                            WHEN a.role = 'route'
                            THEN pg_catalog.format('The share is selected by its route column: GRANT SELECT (%s) ON %s to this role.', pg_catalog.quote_ident(a.col), tbl)
                            ELSE pg_catalog.format('The pending rows are selected by this column: GRANT SELECT (%s) ON %s to this role.', pg_catalog.quote_ident(a.col), tbl) END;
        END IF;
        IF a.role = 'key' THEN
            keycol := pg_catalog.quote_ident(a.col);
            keytype := @extschema@.pg_claim_type_text(r.atttypid, r.atttypmod);
        ELSIF a.role = 'route' THEN
            base := r.atttypid;
            WHILE (SELECT t.typtype FROM pg_catalog.pg_type t WHERE t.oid = base) = 'd' LOOP
                base := (SELECT t.typbasetype FROM pg_catalog.pg_type t WHERE t.oid = base);
            END LOOP;
            arg := pg_catalog.quote_ident(a.col);
            fn := CASE
                WHEN method = 'pg_hash' THEN 'pg_hash_slot'
                WHEN base IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype) THEN
                    CASE method WHEN 'auto' THEN 'slot_of' WHEN 'jump' THEN 'jump_slot' ELSE 'slot_of' END
                WHEN base IN ('text'::regtype, 'character varying'::regtype, 'character'::regtype,
                              'bytea'::regtype, 'uuid'::regtype) THEN
                    CASE method WHEN 'jump' THEN 'jump_slot' ELSE 'slot_of' END
                END;
            IF fn IS NULL THEN
                RAISE EXCEPTION 'method "%" cannot map % column % of type %', method,
                    CASE WHEN route IS NULL THEN 'key' ELSE 'route' END, pg_catalog.quote_ident(a.col),
                    pg_catalog.format_type(r.atttypid, NULL)
                    USING ERRCODE = '42804',
                    HINT = pg_catalog.format('The only method ''pg_hash'' maps keys of this type; slot_of and jump_slot take smallint, integer, bigint, text, bytea and uuid; use method => ''pg_hash'', or %s => a column of a supported type.',
                                             CASE WHEN route IS NULL THEN 'key' ELSE 'route' END);
            END IF;
            IF base = 'character'::regtype AND method IN ('auto', 'crc32', 'jump') THEN
                -- char(n): its text form, without the padding (as the extension)
                arg := '(' || arg || ')::pg_catalog.text';
            END IF;
            IF method = 'crc32' AND base IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype) THEN
                arg := '(' || arg || ')::pg_catalog.text';
            END IF;
            IF method = 'jump' AND base IN ('smallint'::regtype, 'integer'::regtype) THEN
                -- jump_slot hashes a bigint (as the extension writes it)
                arg := '(' || arg || ')::pg_catalog.int8';
            END IF;
            mapexpr := pg_catalog.format('@extschema@.%s(%s, %s)', fn, arg, n);
        ELSE
            IF (SELECT t.typbasetype = 'boolean'::regtype OR t.oid = 'boolean'::regtype
                FROM pg_catalog.pg_type t WHERE t.oid = r.atttypid) THEN
                pendexpr := 'NOT ' || pg_catalog.quote_ident(a.col);
            ELSIF r.attnotnull THEN
                RAISE EXCEPTION 'pending column % of % is of type % and NOT NULL, so it cannot mark rows as pending',
                    pg_catalog.quote_ident(a.col), tbl, @extschema@.pg_claim_type_text(r.atttypid, r.atttypmod)
                    USING ERRCODE = '42804',
                    HINT = 'Name a boolean column that is true once a row is done (pending rows: NOT done), or a nullable column set when it is done (pending rows: sent_at IS NULL).';
            ELSE
                pendexpr := pg_catalog.quote_ident(a.col) || ' IS NULL';
            END IF;
        END IF;
    END LOOP;
END $$;
-- every role's my_items calls it; the first 0.5.0 build revoked it from PUBLIC
GRANT EXECUTE ON FUNCTION @extschema@.pg_claim_items_parts(oid, integer, text, text, text, text, text) TO PUBLIC;

CREATE FUNCTION @extschema@.my_items_query(
    rel oid, slot integer, n integer,
    key text DEFAULT NULL, method text DEFAULT 'auto',
    after text DEFAULT NULL, batch integer DEFAULT NULL, columns text[] DEFAULT NULL,
    route text DEFAULT NULL, pending text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = '' AS $$
DECLARE
    t record;
    relid oid;
    p record;
    sel text := '*';
    q text;
    c text;
BEGIN
    IF slot IS NULL OR n IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN slot IS NULL THEN 'slot' ELSE 'n' END USING ERRCODE = '22004',
            HINT = 'The slot is this worker''s slot (0 .. n-1) and n the number of slots.';
    END IF;
    IF n < 1 THEN
        RAISE EXCEPTION 'n must be at least 1, got %', n USING ERRCODE = '22023',
            HINT = 'The argument n is the number of slots the keys are split into: pass the worker count (1 or more).';
    END IF;
    IF slot < 0 OR slot >= n THEN
        RAISE EXCEPTION 'slot must be between 0 and % (n = %), got %', n - 1, n, slot USING ERRCODE = '22023',
            HINT = 'Slots are numbered 0 .. n-1: pass the slot claim_slot returned.';
    END IF;
    IF batch < 1 THEN
        RAISE EXCEPTION 'batch must be at least 1, got %', batch USING ERRCODE = '22023',
            HINT = 'The batch is the most rows one call returns; leave it NULL for the whole share.';
    END IF;
    SELECT ty.typrelid, ty.typtype INTO t FROM pg_catalog.pg_type ty WHERE ty.oid = rel;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'type with oid % does not exist', rel USING ERRCODE = '42704',
            HINT = 'Pass the table''s row type: my_items_query(''my_table''::regtype, slot, n), or SELECT * FROM my_items(NULL::my_table, slot, n).';
    END IF;
    IF t.typrelid = 0 THEN
        RAISE EXCEPTION 'my_items needs a table''s row type, got type %', rel::regtype USING ERRCODE = '42809',
            HINT = 'Pass a typed NULL of the table: SELECT * FROM my_items(NULL::my_table, slot, n).';
    END IF;
    relid := t.typrelid;
    IF (SELECT cl.relkind FROM pg_catalog.pg_class cl WHERE cl.oid = relid) NOT IN ('r', 'p', 'm', 'f') THEN
        RAISE EXCEPTION 'my_items needs a table, but % is a %',
            (SELECT pg_catalog.format('%I.%I', ns.nspname, cl.relname) FROM pg_catalog.pg_class cl
             JOIN pg_catalog.pg_namespace ns ON ns.oid = cl.relnamespace WHERE cl.oid = relid),
            CASE (SELECT cl.relkind FROM pg_catalog.pg_class cl WHERE cl.oid = relid)
                 WHEN 'v' THEN 'view' WHEN 'c' THEN 'composite type' ELSE 'relation of another kind' END
            USING ERRCODE = '42809',
            HINT = 'The function my_items reads tables, partitioned tables, materialized views and foreign tables; for a view, filter it yourself: WHERE slot_of(key, n) = slot.';
    END IF;
    SELECT * INTO p FROM @extschema@.pg_claim_items_parts(relid, n, key, method, route, pending, 'my_items');
    IF columns IS NOT NULL THEN
        IF pg_catalog.array_position(columns, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'columns must not contain null' USING ERRCODE = '22004',
                HINT = 'Name the columns to read, e.g. columns => ARRAY[''id'', ''email''].';
        END IF;
        FOREACH c IN ARRAY columns LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute at WHERE at.attrelid = relid AND at.attname = c
                           AND at.attnum > 0 AND NOT at.attisdropped) THEN
                RAISE EXCEPTION 'column "%" of % does not exist', c, p.tbl USING ERRCODE = '42703',
                    HINT = pg_catalog.format('columns takes column names as stored (case-sensitive, without quotes); %s has: %s', p.tbl,
                        (SELECT pg_catalog.string_agg(at.attname::text, ', ' ORDER BY at.attnum) FROM pg_catalog.pg_attribute at
                         WHERE at.attrelid = relid AND at.attnum > 0 AND NOT at.attisdropped));
            END IF;
            IF NOT pg_catalog.has_column_privilege(relid, c, 'SELECT') THEN
                RAISE EXCEPTION 'permission denied for column % of table %', c, p.tbl USING ERRCODE = '42501',
                    HINT = pg_catalog.format('Leave %s out of columns, or GRANT SELECT (%s) ON %s to this role.', c, pg_catalog.quote_ident(c), p.tbl);
            END IF;
        END LOOP;
        SELECT pg_catalog.string_agg(CASE WHEN at.attname = ANY (columns) OR pg_catalog.quote_ident(at.attname) = p.keycol
                                          THEN pg_catalog.quote_ident(at.attname)
                                          ELSE pg_catalog.format('NULL::%s AS %I', @extschema@.pg_claim_type_text(at.atttypid, at.atttypmod), at.attname) END,
                                     ', ' ORDER BY at.attnum)
        INTO sel FROM pg_catalog.pg_attribute at WHERE at.attrelid = relid AND at.attnum > 0 AND NOT at.attisdropped;
    END IF;
    IF columns IS NULL THEN
        SELECT at.attname INTO c FROM pg_catalog.pg_attribute at
        WHERE at.attrelid = relid AND at.attnum > 0 AND NOT at.attisdropped
          AND NOT pg_catalog.has_column_privilege(relid, at.attnum, 'SELECT')
        ORDER BY at.attnum LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'permission denied for column % of table %', c, p.tbl USING ERRCODE = '42501',
                HINT = 'This role may read only some columns: name them, my_items(..., columns => ARRAY[''id'', ''email'']); the others come back NULL.';
        END IF;
    END IF;
    q := pg_catalog.format('SELECT %s FROM %s WHERE %s OPERATOR(pg_catalog.=) $1', sel, p.tbl, p.mapexpr);
    IF p.pendexpr IS NOT NULL THEN
        q := q || ' AND ' || p.pendexpr;
    END IF;
    IF after IS NOT NULL THEN
        q := q || pg_catalog.format(' AND %s OPERATOR(pg_catalog.>) $3::%s', p.keycol, p.keytype);
    END IF;
    IF after IS NOT NULL OR batch IS NOT NULL THEN
        q := q || pg_catalog.format(' ORDER BY %s', p.keycol);
    END IF;
    IF batch IS NOT NULL THEN
        q := q || ' LIMIT $4';
    END IF;
    RETURN q;
END $$;

CREATE FUNCTION @extschema@.slot_counts_query(
    rel oid, n integer, key text DEFAULT NULL, method text DEFAULT 'auto',
    route text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
BEGIN
    IF rel IS NULL OR n IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN rel IS NULL THEN 'rel' ELSE 'n' END USING ERRCODE = '22004',
            HINT = 'Pass the table and the number of slots, e.g. slot_counts(''items'', 8).';
    END IF;
    IF n < 1 THEN
        RAISE EXCEPTION 'n must be at least 1, got %', n USING ERRCODE = '22023',
            HINT = 'The argument n is the number of slots the keys are split into: pass the worker count (1 or more).';
    END IF;
    IF n > 1048576 THEN
        RAISE EXCEPTION 'n must be at most 1048576 for slot_counts, got %', n USING ERRCODE = '22023',
            HINT = 'The function slot_counts lists every slot 0 .. n-1; for more slots, count the non-empty ones yourself: SELECT slot_of(key, n), count(*) FROM tbl GROUP BY 1.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class cl WHERE cl.oid = rel AND cl.relkind IN ('r', 'p', 'm', 'f', 'v')) THEN
        RAISE EXCEPTION 'slot_counts needs a table, but % is a %',
            (SELECT pg_catalog.format('%I.%I', ns.nspname, cl.relname) FROM pg_catalog.pg_class cl
             JOIN pg_catalog.pg_namespace ns ON ns.oid = cl.relnamespace WHERE cl.oid = rel),
            CASE (SELECT cl.relkind FROM pg_catalog.pg_class cl WHERE cl.oid = rel)
                 WHEN 'v' THEN 'view' WHEN 'c' THEN 'composite type' ELSE 'relation of another kind' END
            USING ERRCODE = '42809',
            HINT = 'The function slot_counts reads tables, partitioned tables, materialized views and foreign tables; for a view, filter it yourself: WHERE slot_of(key, n) = slot.';
    END IF;
    SELECT * INTO p FROM @extschema@.pg_claim_items_parts(rel, n, key, method, route, NULL, 'slot_counts');
    RETURN pg_catalog.format(
        'SELECT g.slot, COALESCE(c.items, 0::pg_catalog.int8) AS items FROM pg_catalog.generate_series(0, $1 OPERATOR(pg_catalog.-) 1) AS g(slot) LEFT JOIN (SELECT %s AS slot, pg_catalog.count(*) AS items FROM %s GROUP BY 1) AS c ON c.slot OPERATOR(pg_catalog.=) g.slot ORDER BY g.slot',
        pg_catalog.replace(p.mapexpr, ', ' || n || ')', ', $1)'), p.tbl);
END $$;

CREATE FUNCTION @extschema@.my_items(
    rel anyelement, slot integer, n integer,
    key text DEFAULT NULL, method text DEFAULT 'auto',
    after text DEFAULT NULL, batch integer DEFAULT NULL, columns text[] DEFAULT NULL,
    route text DEFAULT NULL, pending text DEFAULT NULL)
RETURNS SETOF anyelement
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE @extschema@.my_items_query(pg_catalog.pg_typeof(rel)::pg_catalog.oid, slot, n, key,
                                                    method, after, batch, columns, route, pending)
        USING slot, n, after, batch;
END $$;

-- The parts of slot_backlog's query (and of a fleet definition, what =
-- 'define_fleet': pending may then be NULL), checked in the extension's
-- order (src/items/backlog.rs) with the caller's privileges: the table,
-- the mapping expression of the route (or key) column with n written in,
-- the pending predicate as the extension writes it (NOT done, sent_at IS
-- NULL: the predicate of a partial index on the pending rows), and the
-- quoted age column.
CREATE FUNCTION @extschema@.pg_claim_backlog_parts(
    rel oid, n integer, pending text, key text, route text, method text, age text, what text,
    OUT tbl text, OUT mapexpr text, OUT pendexpr text, OUT agecol text)
LANGUAGE plpgsql STABLE SET search_path = '' AS $$
DECLARE
    args_hint constant text := 'Pass the table, n and the pending column, e.g. slot_backlog(''outbox'', 8, ''sent_at'') or slot_backlog(''jobs'', 8, ''done'').';
    kind "char";
    r record;
    base oid;
    p record;
BEGIN
    IF rel IS NULL OR n IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN rel IS NULL THEN 'tbl' ELSE 'n' END
            USING ERRCODE = '22004', HINT = args_hint;
    END IF;
    IF n < 1 OR n > 1048576 THEN
        RAISE EXCEPTION 'n must be between 1 and 1048576 for %, got %', what, n USING ERRCODE = '22023',
            HINT = 'n is the number of slots the fleet''s keys are split into: the n its workers pass to claim_slot or claim_leases.';
    END IF;
    IF pending IS NULL AND what = 'slot_backlog' THEN
        RAISE EXCEPTION 'pending must not be null' USING ERRCODE = '22004',
            HINT = 'Name the column that says which rows are pending: a boolean done flag (pending while NOT done) or a column set when a row is done (pending while it IS NULL); to count every row, use slot_counts.';
    END IF;
    IF pending IS NULL AND age IS NOT NULL THEN
        RAISE EXCEPTION 'age needs a pending column, got age => ''%'' without pending', age USING ERRCODE = '22023',
            HINT = 'age names the column whose smallest value among the pending rows is the oldest: pass pending too.';
    END IF;
    method := coalesce(method, 'auto');
    IF method NOT IN ('auto', 'crc32', 'jump', 'pg_hash') THEN
        RAISE EXCEPTION 'unsupported method "%"', method USING ERRCODE = '22023',
            HINT = 'The method is one of: auto, crc32, jump, pg_hash.';
    END IF;
    SELECT c.relkind INTO kind FROM pg_catalog.pg_class c WHERE c.oid = rel;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation with oid % does not exist', rel::pg_catalog.int8 USING ERRCODE = '42P01',
            HINT = 'Pass an existing table; if another session drops and re-creates it, call again.';
    END IF;
    SELECT pg_catalog.format('%I.%I', ns.nspname, c.relname) INTO tbl
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE c.oid = rel;
    IF kind NOT IN ('r', 'p', 'm', 'f', 'v') THEN
        RAISE EXCEPTION '% needs a table, but % is %', what, tbl,
            CASE kind WHEN 'c' THEN 'a composite type' WHEN 'S' THEN 'a sequence' WHEN 'i' THEN 'an index'
                      WHEN 'I' THEN 'an index' WHEN 't' THEN 'a TOAST table' ELSE 'not a table' END
            USING ERRCODE = '42809',
            HINT = pg_catalog.format('The function %s reads tables, partitioned tables, materialized views and foreign tables; for a view, filter it yourself: WHERE slot_of(key, n) = slot.', what);
    END IF;
    IF NOT pg_catalog.has_any_column_privilege(rel, 'SELECT') THEN
        RAISE EXCEPTION 'permission denied for table %', tbl USING ERRCODE = '42501',
            HINT = pg_catalog.format('The function %s reads the table with the caller''s privileges; GRANT SELECT on it to this role.', what);
    END IF;
    IF route IS NOT NULL AND key IS NULL THEN
        -- with route, a count needs no key (nor a primary key): the route
        -- column, checked as route, plays the key's part below
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute at WHERE at.attrelid = rel AND at.attname = route
                       AND at.attnum > 0 AND NOT at.attisdropped) THEN
            RAISE EXCEPTION 'column "%" of % does not exist', route, tbl USING ERRCODE = '42703',
                HINT = pg_catalog.format('route takes column names as stored (case-sensitive, without quotes); %s has: %s', tbl,
                    (SELECT pg_catalog.string_agg(at.attname::text, ', ' ORDER BY at.attnum) FROM pg_catalog.pg_attribute at
                     WHERE at.attrelid = rel AND at.attnum > 0 AND NOT at.attisdropped));
        END IF;
        IF NOT pg_catalog.has_column_privilege(rel, route, 'SELECT') THEN
            RAISE EXCEPTION 'permission denied for column % of table %', route, tbl USING ERRCODE = '42501',
                HINT = pg_catalog.format('The share is selected by its route column: GRANT SELECT (%s) ON %s to this role.',
                                         pg_catalog.quote_ident(route), tbl);
        END IF;
        key := route;
    END IF;
    SELECT * INTO p FROM @extschema@.pg_claim_items_parts(rel, n, key, method, route, pending, what);
    mapexpr := p.mapexpr;
    pendexpr := p.pendexpr;
    IF age IS NOT NULL THEN
        SELECT at.atttypid, at.atttypmod INTO r FROM pg_catalog.pg_attribute at
        WHERE at.attrelid = rel AND at.attname = age AND at.attnum > 0 AND NOT at.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'column "%" of % does not exist', age, tbl USING ERRCODE = '42703',
                HINT = pg_catalog.format('age takes column names as stored (case-sensitive, without quotes); %s has: %s', tbl,
                    (SELECT pg_catalog.string_agg(at.attname::text, ', ' ORDER BY at.attnum) FROM pg_catalog.pg_attribute at
                     WHERE at.attrelid = rel AND at.attnum > 0 AND NOT at.attisdropped));
        END IF;
        agecol := pg_catalog.quote_ident(age);
        IF NOT pg_catalog.has_column_privilege(rel, age, 'SELECT') THEN
            RAISE EXCEPTION 'permission denied for column % of table %', agecol, tbl USING ERRCODE = '42501',
                HINT = pg_catalog.format('The oldest pending row is found by this column: GRANT SELECT (%s) ON %s to this role, or leave age out.',
                                         agecol, tbl);
        END IF;
        base := r.atttypid;
        WHILE (SELECT t.typtype FROM pg_catalog.pg_type t WHERE t.oid = base) = 'd' LOOP
            base := (SELECT t.typbasetype FROM pg_catalog.pg_type t WHERE t.oid = base);
        END LOOP;
        IF base NOT IN ('timestamp with time zone'::pg_catalog.regtype, 'timestamp without time zone'::pg_catalog.regtype) THEN
            RAISE EXCEPTION 'age column % of % is of type %, not a timestamp', agecol, tbl,
                @extschema@.pg_claim_type_text(r.atttypid, r.atttypmod) USING ERRCODE = '42804',
                HINT = 'age names a timestamptz or timestamp column, such as created_at: the oldest pending row is the one whose value is smallest.';
        END IF;
    END IF;
END $$;

-- The query slot_backlog (sql/fleets.sql, the extension's wrapper) runs:
-- the text of the extension's slot_backlog_query. Parameter $1: n.
CREATE FUNCTION @extschema@.slot_backlog_query(
    rel oid, n integer, pending text, key text DEFAULT NULL, route text DEFAULT NULL,
    method text DEFAULT 'auto', age text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
BEGIN
    SELECT * INTO p FROM @extschema@.pg_claim_backlog_parts(rel, n, pending, key, route, method, age, 'slot_backlog');
    RETURN pg_catalog.format(
        'SELECT g.slot, COALESCE(c.backlog, 0::pg_catalog.int8) AS backlog, c.oldest FROM pg_catalog.generate_series(0, $1 OPERATOR(pg_catalog.-) 1) AS g(slot) LEFT JOIN (SELECT %s AS slot, pg_catalog.count(*) AS backlog, %s AS oldest FROM %s WHERE %s GROUP BY 1) AS c ON c.slot OPERATOR(pg_catalog.=) g.slot ORDER BY g.slot',
        p.mapexpr,
        CASE WHEN p.agecol IS NULL THEN 'NULL::pg_catalog.timestamptz'
             ELSE pg_catalog.format('pg_catalog.min(%s)::pg_catalog.timestamptz', p.agecol) END,
        p.tbl, p.pendexpr);
END $$;
