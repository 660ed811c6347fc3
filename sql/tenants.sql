-- Tenants (docs/tenants.md): slot_of_spread, a mapping that spreads one
-- tenant's rows over at most k slots spaced n/k apart (so that they land with
-- different claim_leases holders, which hold runs of neighbouring slots), and
-- my_items_fair / my_items_fair_query, a batch that takes the tenants of a
-- slot in turn. SQL and PL/pgSQL only: the extension and the portable edition
-- share this file.

-- k outside 1 .. n (or n below 1): slot_of_spread's error (22023).
-- IMMUTABLE, so that slot_of_spread stays inlinable.
CREATE FUNCTION @extschema@.pg_claim_bad_spread(n integer, k integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF n < 1 THEN
        RAISE EXCEPTION 'n must be at least 1, got %', n USING ERRCODE = '22023',
            HINT = 'The argument n is the number of slots the keys are split into: pass the worker count (1 or more).';
    END IF;
    RAISE EXCEPTION 'spread k must be between 1 and n = %, got %', n, k USING ERRCODE = '22023',
        HINT = 'k is the most slots (so the most workers) one tenant''s rows spread over: 1 keeps a tenant on one slot, n lets it reach every slot.';
END $$;

-- slot_of_spread(tenant, key, n, k) = (slot_of(tenant, n)
--     + slot_of(key, k) * (n / k)) % n, in 0 .. n-1: the tenant's base slot,
-- and one of k slots spaced n/k (rounded down) apart chosen by the finer
-- key, so that one key's rows stay on one slot (in key order for its
-- holder). Integers map by their non-negative remainder, text by crc32 of
-- its UTF-8 bytes, as slot_of does. SQL functions without SET clause,
-- inlined into the caller's query and into index expressions.
CREATE FUNCTION @extschema@.slot_of_spread(tenant text, key text, n integer, k integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN k OPERATOR(pg_catalog.<) 1 OR k OPERATOR(pg_catalog.>) n
            THEN @extschema@.pg_claim_bad_spread(n, k)
            ELSE ((@extschema@.slot_of(tenant, n)::bigint OPERATOR(pg_catalog.+)
                   (@extschema@.slot_of(key, k)::bigint OPERATOR(pg_catalog.*) (n OPERATOR(pg_catalog./) k)))
                  OPERATOR(pg_catalog.%) n)::integer END;
CREATE FUNCTION @extschema@.slot_of_spread(tenant text, key bigint, n integer, k integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN k OPERATOR(pg_catalog.<) 1 OR k OPERATOR(pg_catalog.>) n
            THEN @extschema@.pg_claim_bad_spread(n, k)
            ELSE ((@extschema@.slot_of(tenant, n)::bigint OPERATOR(pg_catalog.+)
                   (@extschema@.slot_of(key, k)::bigint OPERATOR(pg_catalog.*) (n OPERATOR(pg_catalog./) k)))
                  OPERATOR(pg_catalog.%) n)::integer END;
CREATE FUNCTION @extschema@.slot_of_spread(tenant bigint, key text, n integer, k integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN k OPERATOR(pg_catalog.<) 1 OR k OPERATOR(pg_catalog.>) n
            THEN @extschema@.pg_claim_bad_spread(n, k)
            ELSE ((@extschema@.slot_of(tenant, n)::bigint OPERATOR(pg_catalog.+)
                   (@extschema@.slot_of(key, k)::bigint OPERATOR(pg_catalog.*) (n OPERATOR(pg_catalog./) k)))
                  OPERATOR(pg_catalog.%) n)::integer END;
CREATE FUNCTION @extschema@.slot_of_spread(tenant bigint, key bigint, n integer, k integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN k OPERATOR(pg_catalog.<) 1 OR k OPERATOR(pg_catalog.>) n
            THEN @extschema@.pg_claim_bad_spread(n, k)
            ELSE ((@extschema@.slot_of(tenant, n)::bigint OPERATOR(pg_catalog.+)
                   (@extschema@.slot_of(key, k)::bigint OPERATOR(pg_catalog.*) (n OPERATOR(pg_catalog./) k)))
                  OPERATOR(pg_catalog.%) n)::integer END;
COMMENT ON FUNCTION @extschema@.slot_of_spread(text, text, integer, integer) IS
    'one of the tenant''s k slots: (slot_of(tenant, n) + slot_of(key, k) * (n / k)) % n';
COMMENT ON FUNCTION @extschema@.slot_of_spread(text, bigint, integer, integer) IS
    'one of the tenant''s k slots: (slot_of(tenant, n) + slot_of(key, k) * (n / k)) % n';
COMMENT ON FUNCTION @extschema@.slot_of_spread(bigint, text, integer, integer) IS
    'one of the tenant''s k slots: (slot_of(tenant, n) + slot_of(key, k) * (n / k)) % n';
COMMENT ON FUNCTION @extschema@.slot_of_spread(bigint, bigint, integer, integer) IS
    'one of the tenant''s k slots: (slot_of(tenant, n) + slot_of(key, k) * (n / k)) % n';

-- A column of a table, by name as stored, or an ERROR (42703) naming it and
-- the argument that named it. Returns the column's type.
CREATE FUNCTION @extschema@.pg_claim_tenant_column(rel oid, col text, arg text) RETURNS oid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE t oid;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = rel) THEN
        RAISE EXCEPTION 'relation with OID % does not exist', rel USING ERRCODE = '42P01',
            HINT = 'Pass the table''s oid: ''orders''::regclass::oid.';
    END IF;
    SELECT a.atttypid INTO t FROM pg_attribute a
    WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF t IS NULL THEN
        RAISE EXCEPTION 'column "%" of % does not exist', col, rel::regclass USING ERRCODE = '42703',
            HINT = format('The argument %s names a column of the table, as stored (case-sensitive, unquoted).', arg);
    END IF;
    RETURN t;
END $$;

-- The argument x.<col> of the generated call to a mapping taking `types`
-- (slot_of: int2, int4, int8, text, bytea, uuid; slot_of_spread: int8,
-- text), exact-typed: cast to the parameter type when the column's declared
-- type is another (a varchar, char(n) or domain column; an int2 or int4
-- column for an int8 parameter), so that the call matches only pg_claim's
-- own function and no overload anyone creates for the declared type. An
-- index built the natural way (slot_of(col, 8) on a varchar column) holds
-- the same expression: PostgreSQL inserts the same cast implicitly there.
CREATE FUNCTION @extschema@.pg_claim_tenant_arg(rel oid, col text, arg text, types regtype[]) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t oid := @extschema@.pg_claim_tenant_column(rel, col, arg);
    b oid := t;
    nb oid;
    want oid;
BEGIN
    LOOP
        SELECT ty.typbasetype INTO nb FROM pg_type ty WHERE ty.oid = b AND ty.typtype = 'd';
        EXIT WHEN nb IS NULL;
        b := nb;
    END LOOP;
    IF b = ANY (types::oid[]) THEN
        want := b;
    ELSIF b IN ('int2'::regtype, 'int4'::regtype) AND 'int8'::regtype = ANY (types) THEN
        want := 'int8'::regtype;
    ELSIF (SELECT ty.typcategory FROM pg_type ty WHERE ty.oid = b) = 'S' AND 'text'::regtype = ANY (types) THEN
        want := 'text'::regtype;
    END IF;
    IF want IS NULL OR want = t THEN
        RETURN format('x.%I', col);
    END IF;
    RETURN format('(x.%I)::pg_catalog.%s', col, (SELECT ty.typname FROM pg_type ty WHERE ty.oid = want));
END $$;

-- my_items_fair_query: the query my_items_fair runs ($1: the slot). The
-- slot's rows are those whose slot expression equals the slot: slot_of(route,
-- n), or with spread => k, slot_of_spread(route, spread_key, n, k) (route
-- defaults to fair, spread_key to key). It walks the distinct tenants
-- (column fair) of the slot's pending rows through an index on (slot
-- expression, fair, key) one index probe each (a "loose index scan": a
-- recursive CTE), at most batch of them; takes each tenant's first rows in
-- key order, ceil(batch / tenants) each; and returns them round-robin:
-- every tenant's first row, then every tenant's second, ..., at most batch.
CREATE FUNCTION @extschema@.my_items_fair_query(
    rel oid, slot integer, n integer, fair text,
    key text DEFAULT NULL, route text DEFAULT NULL,
    spread integer DEFAULT NULL, spread_key text DEFAULT NULL,
    batch integer DEFAULT 100, pending text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tbl text;
    slot_expr text;
    pend text := 'true';
    pt oid;
    pnull boolean;
BEGIN
    IF rel IS NULL OR slot IS NULL OR n IS NULL OR fair IS NULL THEN
        RAISE EXCEPTION 'rel, slot, n and fair must not be null' USING ERRCODE = '22004',
            HINT = 'Pass NULL::table, this worker''s slot (0 .. n-1), n and the tenant column: my_items_fair(NULL::orders, 3, 8, fair => ''tenant_id'').';
    END IF;
    IF n < 1 THEN
        PERFORM @extschema@.pg_claim_bad_spread(n, 1);
    END IF;
    IF slot < 0 OR slot >= n THEN
        RAISE EXCEPTION 'slot must be between 0 and % (n = %), got %', n - 1, n, slot USING ERRCODE = '22023',
            HINT = 'Slots are numbered 0 .. n-1: pass the slot claim_slot returned.';
    END IF;
    IF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch must be at least 1, got %', coalesce(batch::text, 'NULL') USING ERRCODE = '22023',
            HINT = 'batch is the most rows one call returns.';
    END IF;
    IF spread IS NOT NULL AND (spread < 1 OR spread > n) THEN
        PERFORM @extschema@.pg_claim_bad_spread(n, spread);
    END IF;
    IF spread IS NULL AND spread_key IS NOT NULL THEN
        RAISE EXCEPTION 'spread_key "%" needs spread', spread_key USING ERRCODE = '22023',
            HINT = 'spread_key picks one of a tenant''s k slots: pass spread => k with it, or leave both out.';
    END IF;
    SELECT c.oid::regclass::text INTO tbl FROM pg_class c WHERE c.oid = rel AND c.relkind IN ('r', 'p', 'v', 'm', 'f');
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'relation % is not a table', rel USING ERRCODE = '42809',
            HINT = 'Pass a table''s row type: my_items_fair(NULL::orders, ...).';
    END IF;
    IF key IS NULL THEN
        SELECT a.attname INTO key FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
        WHERE i.indrelid = rel AND i.indisprimary AND i.indnatts = 1;
        IF key IS NULL THEN
            RAISE EXCEPTION '% has no single-column primary key', tbl USING ERRCODE = '22023',
                HINT = 'Name the column that orders a tenant''s rows: key => ''id''.';
        END IF;
    END IF;
    PERFORM @extschema@.pg_claim_tenant_column(rel, fair, 'fair'::pg_catalog.text);
    PERFORM @extschema@.pg_claim_tenant_column(rel, key, 'key'::pg_catalog.text);
    route := coalesce(route, fair);
    IF spread IS NULL THEN
        slot_expr := format('@extschema@.slot_of(%s, %s)', @extschema@.pg_claim_tenant_arg(rel, route,
            'route'::pg_catalog.text, '{int2,int4,int8,text,bytea,uuid}'::pg_catalog.regtype[]), n);
    ELSE
        spread_key := coalesce(spread_key, key);
        slot_expr := format('@extschema@.slot_of_spread(%s, %s, %s, %s)',
            @extschema@.pg_claim_tenant_arg(rel, route, 'route'::pg_catalog.text, '{int8,text}'::pg_catalog.regtype[]),
            @extschema@.pg_claim_tenant_arg(rel, spread_key, 'spread_key'::pg_catalog.text, '{int8,text}'::pg_catalog.regtype[]),
            n, spread);
    END IF;
    IF pending IS NOT NULL THEN
        pt := @extschema@.pg_claim_tenant_column(rel, pending, 'pending'::pg_catalog.text);
        SELECT NOT a.attnotnull INTO pnull FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = pending;
        IF pt = 'boolean'::regtype THEN
            pend := format('NOT x.%I', pending);
        ELSIF pnull THEN
            pend := format('x.%I IS NULL', pending);
        ELSE
            RAISE EXCEPTION 'pending column % of % is of type % and NOT NULL, so it cannot mark rows as pending',
                quote_ident(pending), tbl, format_type(pt, NULL) USING ERRCODE = '42804',
                HINT = 'Use a boolean flag (pending while false) or a nullable column set when done.';
        END IF;
    END IF;
    RETURN format($q$WITH RECURSIVE pgc_tenants(pgc_tenant, pgc_i) AS (
    (SELECT x.%1$I, 1 FROM %2$s x WHERE %3$s OPERATOR(pg_catalog.=) $1 AND %4$s ORDER BY x.%1$I LIMIT 1)
    UNION ALL
    SELECT (SELECT x.%1$I FROM %2$s x WHERE %3$s OPERATOR(pg_catalog.=) $1 AND %4$s AND x.%1$I OPERATOR(pg_catalog.>) t.pgc_tenant
            ORDER BY x.%1$I LIMIT 1), t.pgc_i OPERATOR(pg_catalog.+) 1
    FROM pgc_tenants t WHERE t.pgc_tenant IS NOT NULL AND t.pgc_i OPERATOR(pg_catalog.<) %5$s
), pgc_ts AS (SELECT pgc_tenant FROM pgc_tenants WHERE pgc_tenant IS NOT NULL),
pgc_per AS (SELECT (((%5$s OPERATOR(pg_catalog.+) pg_catalog.count(*)) OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) greatest(pg_catalog.count(*), 1))::pg_catalog.int8 AS pgc_q FROM pgc_ts)
SELECT (r.pgc_row).* FROM pgc_ts CROSS JOIN pgc_per CROSS JOIN LATERAL (
    SELECT x AS pgc_row, x.%6$I AS pgc_key, pg_catalog.row_number() OVER (ORDER BY x.%6$I) AS pgc_rn
    FROM %2$s x WHERE %3$s OPERATOR(pg_catalog.=) $1 AND %4$s AND x.%1$I OPERATOR(pg_catalog.=) pgc_ts.pgc_tenant
    ORDER BY x.%6$I LIMIT pgc_per.pgc_q) r
ORDER BY r.pgc_rn, pgc_ts.pgc_tenant, r.pgc_key LIMIT %5$s$q$, fair, tbl, slot_expr, pend, batch, key);
END $$;
COMMENT ON FUNCTION @extschema@.my_items_fair_query(oid, integer, integer, text, text, text, integer, text, integer, text) IS
    'the query my_items_fair runs for these arguments ($1: the slot), to EXPLAIN or prepare';

CREATE FUNCTION @extschema@.my_items_fair(
    rel anyelement, slot integer, n integer, fair text,
    key text DEFAULT NULL, route text DEFAULT NULL,
    spread integer DEFAULT NULL, spread_key text DEFAULT NULL,
    batch integer DEFAULT 100, pending text DEFAULT NULL)
RETURNS SETOF anyelement
LANGUAGE plpgsql STABLE AS $$
DECLARE r oid;
BEGIN
    SELECT t.typrelid INTO r FROM pg_catalog.pg_type t WHERE t.oid = pg_catalog.pg_typeof(rel)::pg_catalog.oid;
    IF r IS NULL OR r = 0 THEN
        RAISE EXCEPTION 'rel must be a table''s row type, got %', pg_catalog.pg_typeof(rel) USING ERRCODE = '42809',
            HINT = 'Pass NULL cast to the table: my_items_fair(NULL::orders, slot, n, fair => ''tenant_id'').';
    END IF;
    RETURN QUERY EXECUTE @extschema@.my_items_fair_query(r, slot, n, fair, key, route, spread, spread_key, batch, pending)
        USING slot;
END $$;
COMMENT ON FUNCTION @extschema@.my_items_fair(anyelement, integer, integer, text, text, text, integer, text, integer, text) IS
    'a batch of the slot''s rows taking its tenants (column fair) in turn, each tenant''s rows in key order';
