-- define_fleet, drop_fleet and the failures query of the views of the
-- portable edition: the extension's C functions of src/items/backlog.rs in
-- PL/pgSQL, and the fleet functions of sql/fleets.sql that need the
-- extension (scripts/portable takes the rest of sql/fleets.sql unchanged).
--
-- The extension's define_fleet and drop_fleet run with the caller's rights
-- and call the internal SECURITY DEFINER functions pg_claim_fleet_put and
-- pg_claim_fleet_drop through the function manager, which no role may
-- EXECUTE. Here define_fleet and drop_fleet check with the caller's rights
-- as the extension's do, then call pg_claim_fleet_define and
-- pg_claim_fleet_forget: SECURITY DEFINER, callable by every role, they act
-- for the session's role (pg_claim_caller, as the lease functions of
-- sql/portable/leases.sql) and check its privileges on the table again, so
-- that a direct call stores nothing define_fleet would refuse for lack of
-- a privilege.

-- The failures query of a fleet (pg_claim_fleet_slots): slot, failing and
-- dead per slot of the failure records $1 (items as text) and $2 (dead).
CREATE FUNCTION @extschema@.pg_claim_fleet_failures_query(
    rel oid, n integer, key text, route text, method text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
    b record;
    col text;
    arg text;
    expr text;
    suffix text;
    eq text;
    join_ text := '';
BEGIN
    -- the table, n, method and key as define_fleet checks them (a key is
    -- needed: failure records name items by key)
    SELECT * INTO b FROM @extschema@.pg_claim_backlog_parts(rel, n, NULL, key, NULL, method, NULL, 'define_fleet');
    SELECT * INTO p FROM @extschema@.pg_claim_items_parts(rel, n, key, coalesce(method, 'auto'), route, NULL, 'define_fleet');
    col := pg_catalog.quote_ident(coalesce(route, (SELECT at.attname FROM pg_catalog.pg_attribute at
                                                    WHERE at.attrelid = rel AND pg_catalog.quote_ident(at.attname) = p.keycol
                                                      AND at.attnum > 0 AND NOT at.attisdropped)));
    arg := CASE WHEN route IS NULL THEN pg_catalog.format('(f.item)::%s', p.keytype) ELSE 't.' || col END;
    -- the mapping expression ends in the column (or its text cast) and n
    suffix := ', ' || n || ')';
    IF pg_catalog.right(p.mapexpr, pg_catalog.length(col || suffix)) = col || suffix THEN
        expr := pg_catalog.left(p.mapexpr, -pg_catalog.length(col || suffix)) || arg || suffix;
    ELSE
        expr := pg_catalog.left(p.mapexpr, -pg_catalog.length('(' || col || ')::pg_catalog.text' || suffix))
                || '(' || arg || ')::pg_catalog.text' || suffix;
    END IF;
    IF route IS NOT NULL THEN
        SELECT pg_catalog.format('OPERATOR(%I.=)', ns.nspname) INTO eq
        FROM pg_catalog.pg_attribute at
        JOIN pg_catalog.pg_operator o ON o.oprname = '=' AND o.oprleft = at.atttypid AND o.oprright = at.atttypid
        JOIN pg_catalog.pg_namespace ns ON ns.oid = o.oprnamespace
        WHERE at.attrelid = rel AND pg_catalog.quote_ident(at.attname) = p.keycol AND at.attnum > 0
        ORDER BY ns.nspname <> 'pg_catalog' LIMIT 1;
        join_ := pg_catalog.format('JOIN %s AS t ON t.%s %s (f.item)::%s WHERE t.%s IS NOT NULL ',
                                   p.tbl, p.keycol, coalesce(eq, 'OPERATOR(pg_catalog.=)'), p.keytype, col);
    END IF;
    RETURN pg_catalog.format(
        'SELECT %s AS slot, pg_catalog.count(*) FILTER (WHERE NOT f.dead) AS failing, pg_catalog.count(*) FILTER (WHERE f.dead) AS dead FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.bool[])) AS f(item, dead) %sGROUP BY 1',
        expr, join_);
END $$;

-- The fleet views' backlog query: the text of the extension's
-- pg_claim_fleet_backlog_query (parameters: $1 n, $2 the items that are not
-- claimable), slot_backlog's columns and claimable.
CREATE FUNCTION @extschema@.pg_claim_fleet_backlog_query(
    rel oid, n integer, pending text, key text, route text, method text, age text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b record;
    p record;
BEGIN
    SELECT * INTO b FROM @extschema@.pg_claim_backlog_parts(rel, n, pending, key, route, method, age, 'slot_backlog');
    SELECT * INTO p FROM @extschema@.pg_claim_items_parts(rel, n, key, coalesce(method, 'auto'), NULL, NULL, 'slot_backlog');
    RETURN pg_catalog.format(
        'SELECT g.slot, COALESCE(c.backlog, 0::pg_catalog.int8) AS backlog, c.oldest, c.claimable FROM pg_catalog.generate_series(0, $1 OPERATOR(pg_catalog.-) 1) AS g(slot) LEFT JOIN (SELECT %s AS slot, pg_catalog.count(*) AS backlog, %s AS oldest, %s AS claimable FROM %s WHERE %s GROUP BY 1) AS c ON c.slot OPERATOR(pg_catalog.=) g.slot ORDER BY g.slot',
        b.mapexpr,
        CASE WHEN b.agecol IS NULL THEN 'NULL::pg_catalog.timestamptz'
             ELSE pg_catalog.format('pg_catalog.min(%s)::pg_catalog.timestamptz', b.agecol) END,
        CASE WHEN b.agecol IS NULL THEN 'NULL::pg_catalog.timestamptz'
             ELSE pg_catalog.format('pg_catalog.min(%s) FILTER (WHERE NOT ((%s)::pg_catalog.text OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[])))::pg_catalog.timestamptz',
                                    b.agecol, p.keycol) END,
        b.tbl, b.pendexpr);
END $$;

-- Whether `role` may replace or drop a definition that belongs to `owner`:
-- with the privileges of the owner (a member of it), or of the installing
-- role, which owns the table of definitions (the extension's owner in the
-- extension), or when the owner role no longer exists. It reads pg_roles,
-- not pg_authid, which only a superuser may read.
CREATE FUNCTION @extschema@.pg_claim_fleet_may_change(role oid, owner oid)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles a WHERE a.oid = owner)
        OR pg_catalog.pg_has_role(role, owner, 'USAGE')
        OR pg_catalog.pg_has_role(role, (SELECT c.relowner FROM pg_catalog.pg_class c
                                         WHERE c.oid = pg_catalog.to_regclass('@extschema@.pg_claim_fleets')), 'USAGE')
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_may_change(oid, oid) FROM PUBLIC;

-- define_fleet for the session's role: its privileges on the table and on
-- the named columns, then pg_claim_fleet_put (sql/fleets.sql).
CREATE FUNCTION @extschema@.pg_claim_fleet_define(
    name text, tbl oid, n integer, pending text, key text, route text, method text, age text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    role_ oid := @extschema@.pg_claim_caller();
    col text;
BEGIN
    IF tbl IS NOT NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = tbl) THEN
        IF NOT pg_catalog.has_any_column_privilege(role_, tbl, 'SELECT') THEN
            RAISE EXCEPTION 'permission denied for table %', tbl::regclass USING ERRCODE = '42501',
                HINT = 'The function define_fleet reads the table with the caller''s privileges; GRANT SELECT on it to this role.';
        END IF;
        FOREACH col IN ARRAY ARRAY[key, route, pending, age] LOOP
            IF col IS NOT NULL
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute at WHERE at.attrelid = tbl AND at.attname = col
                           AND at.attnum > 0 AND NOT at.attisdropped)
               AND NOT pg_catalog.has_column_privilege(role_, tbl, col, 'SELECT') THEN
                RAISE EXCEPTION 'permission denied for column % of table %', pg_catalog.quote_ident(col), tbl::regclass
                    USING ERRCODE = '42501', HINT = 'define_fleet checks the definition with the caller''s privileges.';
            END IF;
        END LOOP;
    END IF;
    PERFORM @extschema@.pg_claim_fleet_put(role_, name, tbl, n, pending, key, route, method, age);
END $$;
GRANT EXECUTE ON FUNCTION @extschema@.pg_claim_fleet_define(text, oid, integer, text, text, text, text, text) TO PUBLIC;

-- drop_fleet for the session's role.
CREATE FUNCTION @extschema@.pg_claim_fleet_forget(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN @extschema@.pg_claim_fleet_drop(@extschema@.pg_claim_caller(), name);
END $$;
GRANT EXECUTE ON FUNCTION @extschema@.pg_claim_fleet_forget(text) TO PUBLIC;

CREATE FUNCTION @extschema@.define_fleet(
    name text, tbl regclass, n integer, pending text DEFAULT NULL, key text DEFAULT NULL,
    route text DEFAULT NULL, method text DEFAULT 'auto', age text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'The name is the fleet''s: the name its workers pass to claim_slot or claim_leases, e.g. define_fleet(''mailer'', ''outbox'', 8, ''sent_at'').';
    END IF;
    IF pg_catalog.octet_length(name) > 1024 THEN
        RAISE EXCEPTION 'name must be at most 1024 bytes, got % bytes (starting "%")',
            pg_catalog.octet_length(name), pg_catalog.left(name, 20) USING ERRCODE = '22023',
            HINT = 'The name identifies the worker fleet: use a short name such as ''mailer''.';
    END IF;
    -- as slot_backlog and the view fleet_slots will use it, with the
    -- caller's privileges
    PERFORM @extschema@.pg_claim_backlog_parts(tbl::oid, n, pending, key, route, method, age, 'define_fleet');
    PERFORM @extschema@.pg_claim_fleet_failures_query(tbl::oid, n, key, route, method);
    PERFORM @extschema@.pg_claim_fleet_define(name, tbl::oid, n, pending, key, route, method, age);
END $$;

CREATE FUNCTION @extschema@.drop_fleet(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'Pass the name of a fleet defined with define_fleet.';
    END IF;
    RETURN @extschema@.pg_claim_fleet_forget(name);
END $$;
