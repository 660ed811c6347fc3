-- Seeing the fleet (docs/my_items.md, "Backlog and fleets"): slot_backlog,
-- the defined fleets (define_fleet, drop_fleet) and the views fleet_slots and
-- fleets.
--
-- slot_backlog runs, with the caller's rights, the query that the C function
-- slot_backlog_query (src/items/backlog.rs) writes and checks against the
-- catalogs, as slot_counts does with slot_counts_query.
--
-- A fleet's definition is a row of @extschema@.pg_claim_fleets, readable by
-- every role and written only by the internal SECURITY DEFINER functions
-- pg_claim_fleet_put and pg_claim_fleet_drop, which define_fleet and
-- drop_fleet (C functions that run with the caller's rights) call through the
-- function manager with the calling role's oid first, after checking the
-- definition as slot_backlog would with the caller's privileges. A definition
-- belongs to the role that wrote it: another role may replace or drop it only
-- with the privileges of that role (pg_has_role(role, owner, 'USAGE')) or of
-- the extension's owner. The definitions are part of a dump
-- (pg_extension_config_dump).
--
-- The views read a fleet's table with the caller's rights (one backlog
-- scan per fleet, through pg_claim_fleet_slots), and only when the caller
-- trusts the fleet (pg_claim_fleet_untrusted: every role whose code the read
-- could run holds the caller's privileges); a fleet whose table the caller
-- may not read shows pending and oldest NULL instead of an error. Every call
-- of an extension function from here is schema-qualified and exact-typed.

CREATE FUNCTION @extschema@.slot_backlog_query(
    rel oid, n integer, pending text, key text DEFAULT NULL, route text DEFAULT NULL,
    method text DEFAULT 'auto', age text DEFAULT NULL)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_slot_backlog_query';
COMMENT ON FUNCTION @extschema@.slot_backlog_query(oid, integer, text, text, text, text, text) IS
    'the query slot_backlog runs for these arguments (parameter $1: n)';

CREATE FUNCTION @extschema@.slot_backlog(
    tbl regclass, n integer, pending text, key text DEFAULT NULL, route text DEFAULT NULL,
    method text DEFAULT 'auto', age text DEFAULT NULL)
RETURNS TABLE (slot integer, backlog bigint, oldest timestamptz)
LANGUAGE plpgsql VOLATILE
AS $body$
BEGIN
    -- VOLATILE: the query below runs with a snapshot taken after
    -- slot_backlog_query locked the table, so a call that waited behind a
    -- migration counts what it committed, as a plain SELECT would.
    -- Exact-typed (tbl::oid): a slot_backlog_query(regclass, ...) created in
    -- this schema would otherwise match better and run instead
    RETURN QUERY EXECUTE @extschema@.slot_backlog_query(
        tbl::pg_catalog.oid, n, pending, key, route, method, age) USING n;
END
$body$;
COMMENT ON FUNCTION @extschema@.slot_backlog(regclass, integer, text, text, text, text, text) IS
    'pending rows per slot 0 .. n-1 (0 for empty slots) of a table split by key (or route column), and the oldest pending row''s age column';

-- The query that maps failure records to slots (parameters: $1 the items as
-- text, $2 whether each is dead): slot, failing, dead per slot. Items are
-- cast to the key column's type; with a route column, joined to the table
-- by key. Called by pg_claim_fleet_slots.
CREATE FUNCTION @extschema@.pg_claim_fleet_failures_query(
    rel oid, n integer, key text, route text, method text)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_fleet_failures_query';

-- The fleet views' backlog query (parameters: $1 n, $2 the items that are
-- not claimable: dead, or waiting for a retry): slot_backlog's columns and
-- claimable, the oldest pending row that is none of them.
CREATE FUNCTION @extschema@.pg_claim_fleet_backlog_query(
    rel oid, n integer, pending text, key text, route text, method text, age text)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_fleet_backlog_query';

CREATE TABLE @extschema@.pg_claim_fleets (
    name       text        PRIMARY KEY,
    tbl        regclass    NOT NULL,
    n          integer     NOT NULL,
    pending    text,
    key        text,
    route      text,
    method     text        NOT NULL,
    age        text,
    -- the role that defined it
    owner      regrole     NOT NULL,
    defined_at timestamptz NOT NULL
);
REVOKE ALL ON @extschema@.pg_claim_fleets FROM PUBLIC;
GRANT SELECT ON @extschema@.pg_claim_fleets TO PUBLIC;
COMMENT ON TABLE @extschema@.pg_claim_fleets IS
    'pg_claim''s defined fleets (define_fleet); written only through define_fleet and drop_fleet';
SELECT pg_catalog.pg_extension_config_dump('@extschema@.pg_claim_fleets', '');

-- Whether `role` may replace or drop a definition that belongs to `owner`:
-- with the privileges of the owner (a member of it), or of the extension's
-- owner (who can so remove any definition), or when the owner role no longer
-- exists.
CREATE FUNCTION @extschema@.pg_claim_fleet_may_change(role oid, owner oid)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.pg_authid a WHERE a.oid = owner)
        OR pg_catalog.pg_has_role(role, owner, 'USAGE')
        OR pg_catalog.pg_has_role(role, (SELECT e.extowner FROM pg_catalog.pg_extension e
                                         WHERE e.extname = 'pg_claim'), 'USAGE')
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_may_change(oid, oid) FROM PUBLIC;

-- define_fleet for `role` (internal; define_fleet checked the arguments
-- with role's privileges): insert, or replace a definition that belongs to a
-- role whose privileges `role` has (or to a role that no longer exists).
CREATE FUNCTION @extschema@.pg_claim_fleet_put(
    role oid, name text, tbl oid, n integer, pending text, key text, route text,
    method text, age text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    owner_ oid;
BEGIN
    -- (define_fleet checked all of this already; a direct call by a
    -- superuser gets the same errors)
    IF role IS NULL OR name IS NULL OR tbl IS NULL OR n IS NULL THEN
        RAISE EXCEPTION '% must not be null',
            CASE WHEN role IS NULL THEN 'role' WHEN name IS NULL THEN 'name' WHEN tbl IS NULL THEN 'tbl' ELSE 'n' END
            USING ERRCODE = '22004', HINT = 'Call define_fleet(name, tbl, n, ...).';
    END IF;
    IF pg_catalog.octet_length(name) > 1024 OR n < 1 OR n > 1048576
       OR coalesce(method, 'auto') NOT IN ('auto', 'crc32', 'jump', 'pg_hash') THEN
        RAISE EXCEPTION 'invalid fleet definition: name of % bytes, n = %, method %',
            pg_catalog.octet_length(name), n, coalesce(method, 'auto')
            USING ERRCODE = '22023', HINT = 'Call define_fleet(name, tbl, n, ...), which checks every argument.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = tbl) THEN
        RAISE EXCEPTION 'relation with oid % does not exist', tbl
            USING ERRCODE = '42P01', HINT = 'Call define_fleet(name, tbl, n, ...) with an existing table.';
    END IF;
    INSERT INTO @extschema@.pg_claim_fleets AS f
        (name, tbl, n, pending, key, route, method, age, owner, defined_at)
    VALUES (pg_claim_fleet_put.name, pg_claim_fleet_put.tbl::regclass, pg_claim_fleet_put.n,
            pg_claim_fleet_put.pending, pg_claim_fleet_put.key, pg_claim_fleet_put.route,
            coalesce(pg_claim_fleet_put.method, 'auto'), pg_claim_fleet_put.age,
            role::regrole, pg_catalog.clock_timestamp())
    ON CONFLICT ON CONSTRAINT pg_claim_fleets_pkey DO UPDATE
        SET tbl = excluded.tbl, n = excluded.n, pending = excluded.pending, key = excluded.key,
            route = excluded.route, method = excluded.method, age = excluded.age,
            owner = excluded.owner, defined_at = excluded.defined_at
        WHERE @extschema@.pg_claim_fleet_may_change(role, f.owner::oid)
    RETURNING f.owner::oid INTO owner_;
    IF owner_ IS NULL THEN
        SELECT f.owner::oid INTO owner_ FROM @extschema@.pg_claim_fleets f
        WHERE f.name = pg_claim_fleet_put.name;
        RAISE EXCEPTION 'fleet "%" is defined by role %, whose privileges role % does not have',
            name, owner_::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a member of the role that defined a fleet, or of the extension''s owner, may replace or drop it: ask that role, or choose another fleet name.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_put(oid, text, oid, integer, text, text, text, text, text) FROM PUBLIC;

-- drop_fleet for `role` (internal): true when the fleet was defined.
CREATE FUNCTION @extschema@.pg_claim_fleet_drop(role oid, name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    owner_ oid;
BEGIN
    SELECT f.owner::oid INTO owner_ FROM @extschema@.pg_claim_fleets f
    WHERE f.name = pg_claim_fleet_drop.name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT @extschema@.pg_claim_fleet_may_change(role, owner_) THEN
        RAISE EXCEPTION 'fleet "%" is defined by role %, whose privileges role % does not have',
            name, owner_::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a member of the role that defined a fleet, or of the extension''s owner, may replace or drop it: ask that role.';
    END IF;
    DELETE FROM @extschema@.pg_claim_fleets f WHERE f.name = pg_claim_fleet_drop.name;
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_drop(oid, text) FROM PUBLIC;

CREATE FUNCTION @extschema@.define_fleet(
    name text, tbl regclass, n integer, pending text DEFAULT NULL, key text DEFAULT NULL,
    route text DEFAULT NULL, method text DEFAULT 'auto', age text DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'pg_claim_define_fleet';
COMMENT ON FUNCTION @extschema@.define_fleet(text, regclass, integer, text, text, text, text, text) IS
    'define (or replace) the fleet name: its table, n and mapping, for the views fleet_slots and fleets';

CREATE FUNCTION @extschema@.drop_fleet(name text)
RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'pg_claim_drop_fleet';
COMMENT ON FUNCTION @extschema@.drop_fleet(text) IS
    'forget the definition of the fleet name: true when it was defined';

-- The fleet views' trust rule (docs/security.md, "The fleet views"). Reading a
-- fleet's relation runs code that others chose: a view's query, row-level
-- security policies, a domain's CHECK (failure records are cast to the key's
-- type), operators and functions those refer to. In the views that code
-- would run with the reader's rights, so the views read a fleet's relation
-- only when every role that chose such code already holds the reader's
-- privileges (pg_has_role(owner, reader, 'USAGE'): the reader itself, a
-- member of it, a superuser, or the bootstrap superuser that owns the
-- built-in objects), or owns pg_claim's own functions. This function walks
-- the fleet's definer, its relation and everything the relation's rewrite
-- rules and policies depend on, recursively, with the types of every column
-- on the way (domains to their base types and constraints, arrays to their
-- elements, composites to their columns, ranges to their subtype and
-- support functions), and returns the first object whose owner is not
-- trusted, described ('view public.v owned by mallory'), or NULL when the
-- reader may read the fleet. It reads only the catalogs and runs no code
-- of any object it looks at.
CREATE FUNCTION @extschema@.pg_claim_fleet_untrusted(reader oid, definer oid, tbl oid)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
-- (jit off: the recursive walk's estimate is high, its work a few index
-- look-ups)
SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    WITH RECURSIVE obj(classid, objid) AS (
        SELECT 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid, tbl
        UNION
        SELECT x.classid, x.objid
        FROM obj o
        CROSS JOIN LATERAL (
            -- a relation: the code its rewrite rules (a view) and its
            -- policies (row-level security) refer to, its columns' types
            SELECT d.refclassid AS classid, d.refobjid AS objid
            FROM (SELECT 'pg_catalog.pg_rewrite'::pg_catalog.regclass::pg_catalog.oid, rw.oid
                  FROM pg_catalog.pg_rewrite rw WHERE rw.ev_class = o.objid
                  UNION ALL
                  SELECT 'pg_catalog.pg_policy'::pg_catalog.regclass::pg_catalog.oid, po.oid
                  FROM pg_catalog.pg_policy po WHERE po.polrelid = o.objid) AS code(classid, objid)
            JOIN pg_catalog.pg_depend d ON d.classid = code.classid AND d.objid = code.objid
            WHERE o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
              AND d.refobjid <> o.objid
              AND d.refclassid IN ('pg_catalog.pg_class'::pg_catalog.regclass, 'pg_catalog.pg_proc'::pg_catalog.regclass,
                                   'pg_catalog.pg_type'::pg_catalog.regclass, 'pg_catalog.pg_operator'::pg_catalog.regclass)
            UNION
            SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, a.atttypid
            FROM pg_catalog.pg_attribute a
            WHERE o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
              AND a.attrelid = o.objid AND a.attnum > 0 AND NOT a.attisdropped
            -- a type: a domain's base type and what its constraints refer
            -- to, an array's element, a composite's relation, a range's
            -- subtype and functions
            UNION
            SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, u.t
            FROM pg_catalog.pg_type ty
            CROSS JOIN LATERAL (VALUES (ty.typbasetype), (ty.typelem)) AS u(t)
            WHERE o.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND ty.oid = o.objid AND u.t <> 0
            UNION
            SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, ty.typrelid
            FROM pg_catalog.pg_type ty
            WHERE o.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND ty.oid = o.objid
              AND ty.typrelid <> 0
            UNION
            SELECT d.refclassid, d.refobjid
            FROM pg_catalog.pg_constraint c
            JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND d.objid = c.oid
            WHERE o.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND c.contypid = o.objid
              AND d.refobjid <> o.objid
              AND d.refclassid IN ('pg_catalog.pg_class'::pg_catalog.regclass, 'pg_catalog.pg_proc'::pg_catalog.regclass,
                                   'pg_catalog.pg_type'::pg_catalog.regclass, 'pg_catalog.pg_operator'::pg_catalog.regclass)
            UNION
            SELECT v.classid, v.objid
            FROM pg_catalog.pg_range rg
            CROSS JOIN LATERAL (VALUES ('pg_catalog.pg_type'::pg_catalog.regclass::pg_catalog.oid, rg.rngsubtype),
                                       ('pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid, rg.rngcanonical::pg_catalog.oid),
                                       ('pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid, rg.rngsubdiff::pg_catalog.oid)) AS v(classid, objid)
            WHERE o.classid = 'pg_catalog.pg_type'::pg_catalog.regclass
              AND (rg.rngtypid = o.objid OR rg.rngmultitypid = o.objid) AND v.objid <> 0
            -- an operator: its function
            UNION
            SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, op.oprcode::pg_catalog.oid
            FROM pg_catalog.pg_operator op
            WHERE o.classid = 'pg_catalog.pg_operator'::pg_catalog.regclass AND op.oid = o.objid
              AND op.oprcode::pg_catalog.oid <> 0
        ) AS x
    ),
    owned(what, owner, ord) AS (
        SELECT 'the fleet''s definition', definer, 0
        UNION ALL
        SELECT pg_catalog.pg_describe_object(o.classid, o.objid, 0),
               CASE o.classid
                   WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = o.objid)
                   WHEN 'pg_catalog.pg_type'::pg_catalog.regclass THEN (SELECT t.typowner FROM pg_catalog.pg_type t WHERE t.oid = o.objid)
                   WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN (SELECT p.proowner FROM pg_catalog.pg_proc p WHERE p.oid = o.objid)
                   WHEN 'pg_catalog.pg_operator'::pg_catalog.regclass THEN (SELECT op.oprowner FROM pg_catalog.pg_operator op WHERE op.oid = o.objid)
               END,
               1
        FROM obj o
    )
    SELECT CASE WHEN r.rolname IS NULL THEN w.what || ', whose owner no longer exists'
                ELSE w.what || ' owned by ' || pg_catalog.quote_ident(r.rolname) END
    FROM owned w
    LEFT JOIN pg_catalog.pg_roles r ON r.oid = w.owner
    WHERE w.owner IS NOT NULL
      AND (r.oid IS NULL
           OR NOT (pg_catalog.pg_has_role(w.owner, reader, 'USAGE')
                   OR w.owner = (SELECT p.proowner FROM pg_catalog.pg_proc p
                                 WHERE p.oid = '@extschema@.pg_claim_fleet_untrusted(pg_catalog.oid, pg_catalog.oid, pg_catalog.oid)'::pg_catalog.regprocedure)))
    ORDER BY w.ord, w.what
    LIMIT 1
$$;
COMMENT ON FUNCTION @extschema@.pg_claim_fleet_untrusted(oid, oid, oid) IS
    'why the fleet views do not read a fleet''s relation for this reader (the first object whose owner lacks the reader''s privileges), or NULL when they do';

-- One row per defined fleet and slot (the view fleet_slots), with the
-- caller's rights, for the fleets this caller trusts (pg_claim_fleet_untrusted
-- is NULL): another role's definition costs a reader nothing and runs none of
-- its code. For each such fleet: one backlog scan of its table, one
-- slot_status call and one item_failures call. A fleet whose table this
-- caller cannot read (no privilege, a table dropped or changed since the
-- definition, a foreign table whose server fails) shows pending, oldest and
-- claimable NULL, and failing and dead NULL when the failures need the table
-- (a route column): one fleet never makes the whole view fail. A cancel or
-- statement_timeout still ends the query (WHEN OTHERS does not catch them).
-- claimable is the oldest pending row that is not a dead item nor one
-- waiting for its retry (the age an alert should watch: one poison item
-- does not keep it rising).
CREATE FUNCTION @extschema@.pg_claim_fleet_slots()
RETURNS TABLE (fleet text, slot integer, pending bigint, oldest timestamptz, holder text,
               mode text, token bigint, since timestamptz, unserved_since timestamptz,
               failing bigint, dead bigint, claimable timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f record;
    reader oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user);
    backlog_ bigint[];
    oldest_ timestamptz[];
    claimable_ timestamptz[];
    items_ text[];
    dead_ boolean[];
    blocked_ text[];
    failing_ bigint[];
    deadn_ bigint[];
    r record;
    q text;
    i integer;
BEGIN
    FOR f IN SELECT d.* FROM @extschema@.pg_claim_fleets d ORDER BY d.name LOOP
        CONTINUE WHEN @extschema@.pg_claim_fleet_untrusted(reader, f.owner::pg_catalog.oid, f.tbl::pg_catalog.oid) IS NOT NULL;
        -- failure records: retry or due (failing), dead; dead and retry
        -- are not claimable
        SELECT pg_catalog.array_agg(x.item), pg_catalog.array_agg(x.state = 'dead'),
               pg_catalog.array_agg(x.item) FILTER (WHERE x.state <> 'due')
        INTO items_, dead_, blocked_
        FROM @extschema@.item_failures(f.name) x;
        backlog_ := NULL;
        oldest_ := NULL;
        claimable_ := NULL;
        IF f.pending IS NOT NULL THEN
            BEGIN
                IF blocked_ IS NULL THEN
                    SELECT pg_catalog.array_agg(b.backlog ORDER BY b.slot),
                           pg_catalog.array_agg(b.oldest ORDER BY b.slot)
                    INTO backlog_, oldest_
                    FROM @extschema@.slot_backlog(f.tbl, f.n, f.pending, f.key, f.route, f.method, f.age) b;
                    claimable_ := oldest_;
                ELSE
                    q := @extschema@.pg_claim_fleet_backlog_query(
                        f.tbl::pg_catalog.oid, f.n, f.pending, f.key, f.route, f.method, f.age);
                    EXECUTE 'SELECT pg_catalog.array_agg(b.backlog ORDER BY b.slot), '
                            'pg_catalog.array_agg(b.oldest ORDER BY b.slot), '
                            'pg_catalog.array_agg(b.claimable ORDER BY b.slot) FROM (' || q || ') b'
                    INTO backlog_, oldest_, claimable_ USING f.n, blocked_;
                END IF;
            EXCEPTION WHEN OTHERS THEN
                backlog_ := NULL;
                oldest_ := NULL;
                claimable_ := NULL;
            END;
        END IF;
        failing_ := pg_catalog.array_fill(0::bigint, ARRAY[f.n]);
        deadn_ := pg_catalog.array_fill(0::bigint, ARRAY[f.n]);
        IF items_ IS NOT NULL THEN
            BEGIN
                q := @extschema@.pg_claim_fleet_failures_query(
                    f.tbl::pg_catalog.oid, f.n, f.key, f.route, f.method);
                BEGIN
                    FOR r IN EXECUTE q USING items_, dead_ LOOP
                        failing_[r.slot + 1] := r.failing;
                        deadn_[r.slot + 1] := r.dead;
                    END LOOP;
                EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
                    -- an item that is not a value of the key's type belongs
                    -- to no slot: map the items one by one
                    failing_ := pg_catalog.array_fill(0::bigint, ARRAY[f.n]);
                    deadn_ := pg_catalog.array_fill(0::bigint, ARRAY[f.n]);
                    FOR i IN 1 .. pg_catalog.cardinality(items_) LOOP
                        BEGIN
                            FOR r IN EXECUTE q USING ARRAY[items_[i]], ARRAY[dead_[i]] LOOP
                                failing_[r.slot + 1] := failing_[r.slot + 1] + r.failing;
                                deadn_[r.slot + 1] := deadn_[r.slot + 1] + r.dead;
                            END LOOP;
                        EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
                            NULL;
                        END;
                    END LOOP;
                END;
            EXCEPTION WHEN OTHERS THEN
                failing_ := NULL;
                deadn_ := NULL;
            END;
        END IF;
        RETURN QUERY
        SELECT f.name, st.slot, backlog_[st.slot + 1], oldest_[st.slot + 1],
               CASE WHEN st.state <> 'unserved' THEN st.holder END,
               CASE WHEN st.state <> 'unserved' THEN st.state END,
               CASE WHEN st.state = 'lease' THEN st.token END,
               CASE WHEN st.state <> 'unserved' THEN st.since END,
               CASE WHEN st.state = 'unserved' THEN st.since END,
               failing_[st.slot + 1], deadn_[st.slot + 1], claimable_[st.slot + 1]
        FROM @extschema@.slot_status(f.name, f.n) st
        ORDER BY st.slot;
    END LOOP;
END $$;
COMMENT ON FUNCTION @extschema@.pg_claim_fleet_slots() IS
    'the rows of the view fleet_slots: every slot of every defined fleet the caller trusts, read with the caller''s rights';

CREATE VIEW @extschema@.fleet_slots WITH (security_invoker = true) AS
    SELECT s.fleet, s.slot, s.pending, s.oldest, s.holder, s.mode, s.token, s.since,
           s.unserved_since, s.failing, s.dead, s.claimable
    FROM @extschema@.pg_claim_fleet_slots() s;
COMMENT ON VIEW @extschema@.fleet_slots IS
    'every slot of every defined fleet the reader trusts: pending rows, oldest, holder (session or lease) or unserved since, failing and dead items, oldest claimable';
GRANT SELECT ON @extschema@.fleet_slots TO PUBLIC;

-- Every defined fleet. For a fleet the reader does not trust, untrusted says
-- why (the first object whose owner lacks the reader's privileges) and
-- holders, unserved, pending, oldest and claimable are NULL; failing and dead
-- count its failure records, which run no code of the fleet's.
CREATE VIEW @extschema@.fleets WITH (security_invoker = true) AS
    SELECT d.name AS fleet, d.tbl, d.n, d.pending AS pending_column, d.key, d.route,
           d.method, d.age,
           s.holders::integer AS holders,
           s.unserved::integer AS unserved,
           s.pending, s.oldest,
           fl.failing, fl.dead,
           s.claimable,
           -- a fleet the caller trusts has its n >= 1 rows in fleet_slots:
           -- only one without them is walked again, for the reason
           CASE WHEN s.fleet IS NULL THEN @extschema@.pg_claim_fleet_untrusted(
                   (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user),
                   d.owner::pg_catalog.oid, d.tbl::pg_catalog.oid) END AS untrusted
    FROM @extschema@.pg_claim_fleets d
    LEFT JOIN (SELECT x.fleet,
                      pg_catalog.count(DISTINCT x.holder) AS holders,
                      pg_catalog.count(*) FILTER (WHERE x.mode IS NULL) AS unserved,
                      pg_catalog.sum(x.pending)::bigint AS pending,
                      pg_catalog.min(x.oldest) AS oldest,
                      pg_catalog.min(x.claimable) AS claimable
               FROM @extschema@.pg_claim_fleet_slots() x
               GROUP BY x.fleet) s ON s.fleet = d.name
    LEFT JOIN LATERAL (
        SELECT pg_catalog.count(*) FILTER (WHERE y.state <> 'dead') AS failing,
               pg_catalog.count(*) FILTER (WHERE y.state = 'dead') AS dead
        FROM @extschema@.item_failures(d.name) y) fl ON true;
COMMENT ON VIEW @extschema@.fleets IS
    'every defined fleet: its definition, distinct live holders, unserved slots, pending rows, oldest, failing and dead items, oldest claimable, and why it is not counted for this reader (untrusted)';
GRANT SELECT ON @extschema@.fleets TO PUBLIC;
