-- pg_claim 0.5.0 -> 0.6.0, run by ALTER EXTENSION pg_claim UPDATE.
-- History, append-only: a released step is never edited; a change goes in a new step.
--
-- Mapping values do not change: indexes, generated columns and partitions
-- built on 0.5.0 stay valid.

\echo Use "ALTER EXTENSION pg_claim UPDATE TO '0.6.0'" to load this file. \quit

-- ==== fleet views ====
-- (the bodies are those of sql/fleets.sql)
-- The views read a fleet's relation only for a reader that trusts the
-- fleet (pg_claim_fleet_untrusted); fleets gains untrusted and both views
-- claimable, the oldest pending row that is neither dead nor waiting for a
-- retry.
DROP VIEW @extschema@.fleets;
DROP VIEW @extschema@.fleet_slots;
DROP FUNCTION @extschema@.pg_claim_fleet_slots();

-- The fleet views' backlog query (parameters: $1 n, $2 the items that are
-- not claimable: dead, or waiting for a retry): slot_backlog's columns and
-- claimable, the oldest pending row that is none of them.
CREATE FUNCTION @extschema@.pg_claim_fleet_backlog_query(
    rel oid, n integer, pending text, key text, route text, method text, age text)
RETURNS text
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'pg_claim_fleet_backlog_query';

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
            FROM pg_catalog.pg_rewrite rw
            JOIN pg_catalog.pg_depend d
              ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = rw.oid
            WHERE o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND rw.ev_class = o.objid
              AND d.refobjid <> o.objid
              AND d.refclassid IN ('pg_catalog.pg_class'::pg_catalog.regclass, 'pg_catalog.pg_proc'::pg_catalog.regclass,
                                   'pg_catalog.pg_type'::pg_catalog.regclass, 'pg_catalog.pg_operator'::pg_catalog.regclass)
            UNION
            SELECT d.refclassid, d.refobjid
            FROM pg_catalog.pg_policy po
            JOIN pg_catalog.pg_depend d
              ON d.classid = 'pg_catalog.pg_policy'::pg_catalog.regclass AND d.objid = po.oid
            WHERE o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND po.polrelid = o.objid
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
           CASE WHEN u.why IS NULL THEN coalesce(s.holders, 0)::integer END AS holders,
           CASE WHEN u.why IS NULL THEN coalesce(s.unserved, d.n)::integer END AS unserved,
           s.pending, s.oldest,
           fl.failing, fl.dead,
           s.claimable, u.why AS untrusted
    FROM @extschema@.pg_claim_fleets d
    CROSS JOIN LATERAL (
        SELECT @extschema@.pg_claim_fleet_untrusted(
                   (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user),
                   d.owner::pg_catalog.oid, d.tbl::pg_catalog.oid) AS why) u
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



-- ==== leases ====
-- (the bodies are those of sql/leases.sql, sql/leases_fleet.sql and
-- sql/slot_partition.sql)



-- ==== end ====
