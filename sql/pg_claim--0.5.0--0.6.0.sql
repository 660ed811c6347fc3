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



-- ==== leases ====
-- (the bodies are those of sql/leases.sql, sql/leases_fleet.sql and
-- sql/slot_partition.sql)

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_take(
    role oid, name text, n integer, holder text, ttl interval, crc_ bigint, key_ integer,
    OUT slot integer, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    r record;
    lo integer := 0;
    g integer;
    tries integer := 0;
    -- slots whose fence lock a fenced transaction holds, left this time
    fenced_ integer[] := '{}';
BEGIN
    -- the same checks again: a superuser may call this function directly
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    IF crc_ IS DISTINCT FROM @extschema@.crc32(name) OR key_ IS DISTINCT FROM (crc_::bit(32))::integer THEN
        RAISE EXCEPTION 'crc_ and key_ must be crc32(name) and its int4 form, got % and %', crc_, key_
            USING ERRCODE = '22023',
            HINT = 'This is claim_lease''s internal function: call claim_lease.';
    END IF;
    -- a name in session mode: claim_slot holds a slot of it
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks k
               WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
                 AND k.mode = 'ExclusiveLock'
                 AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                   WHERE d.datname = pg_catalog.current_database())
                 AND k.classid = crc_::oid AND k.objid::bigint <= 1048575) THEN
        RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease. The sessions that hold its slots: SELECT * FROM slot_status(name, n).';
    END IF;
    -- a name is leased by one role at a time
    SELECT l.owner INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_take.name AND NOT l.session AND l.holder IS NOT NULL
      AND l.expires_at > now_ AND l.owner IS NOT NULL AND l.owner <> role
      AND NOT pg_catalog.pg_has_role(role, l.owner, 'USAGE')
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_lease_refuse_role(name, r.owner, role);
    END IF;
    -- a live claim_leases fleet of another n (its members hold no lease
    -- between a resize_fleet and their next call): PC002, as claim_leases
    -- says it (sql/leases_resize.sql)
    SELECT m.n INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_lease_take.name AND m.expires_at > now_ AND m.n <> pg_claim_lease_take.n
    ORDER BY m.seen_at DESC
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_leases_refuse_resized(name, r.n, pg_claim_lease_take.n);
    END IF;
    -- live leases of another n
    SELECT l.n, l.holder INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_take.name AND NOT l.session AND l.holder IS NOT NULL
      AND l.expires_at > now_ AND l.n <> pg_claim_lease_take.n
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_lease_refuse_n(name, pg_claim_lease_take.n, r.n, r.holder);
    END IF;

    -- the same holder again: the same slot and token, the expiry extended;
    -- one holder holds at most one slot of a name
    SELECT l.slot INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_take.name AND l.holder = pg_claim_lease_take.holder
      AND NOT l.session AND l.slot < pg_claim_lease_take.n AND l.expires_at > now_
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    ORDER BY l.slot
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(key_, r.slot) THEN
            RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
                USING ERRCODE = '55000',
                HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
        END IF;
        -- earlier than it was only when the slot's fence lock is free (the
        -- trigger of sql/leases_guard.sql takes it: it would wait for the
        -- holder's own fenced transactions, the mutex held)
        UPDATE @extschema@.pg_claim_leases l
        SET expires_at = CASE WHEN now_ + ttl >= l.expires_at THEN now_ + ttl
                              WHEN pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + l.slot) THEN now_ + ttl
                              ELSE l.expires_at END,
            n = pg_claim_lease_take.n
        WHERE l.name = pg_claim_lease_take.name AND l.slot = r.slot
        RETURNING l.slot, l.token, l.expires_at
        INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at;
    ELSE
        -- a new acquisition: first the slot this holder had, when its lease
        -- expired (or was released) and no one took it meanwhile (a new token)
        SELECT l.slot INTO r FROM @extschema@.pg_claim_leases l
        WHERE l.name = pg_claim_lease_take.name AND l.holder = pg_claim_lease_take.holder
          AND NOT l.session AND l.slot < pg_claim_lease_take.n AND l.expires_at <= now_
        ORDER BY l.slot
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            SELECT h.slot, h.token, h.expires_at
            INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at
            FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h;
            IF pg_claim_lease_take.slot IS NULL THEN
                fenced_ := fenced_ || r.slot;
            END IF;
        END IF;
        LOOP
            EXIT WHEN pg_claim_lease_take.slot IS NOT NULL;
            tries := tries + 1;
            EXIT WHEN tries > 1000;
            -- the lowest slot >= lo without a row: found from the rows of
            -- the name, whatever n is
            SELECT CASE WHEN lo < pg_claim_lease_take.n AND NOT EXISTS (
                             SELECT 1 FROM @extschema@.pg_claim_leases l
                             WHERE l.name = pg_claim_lease_take.name AND l.slot = lo)
                        THEN lo
                        ELSE (SELECT min(l.slot) + 1 FROM @extschema@.pg_claim_leases l
                              WHERE l.name = pg_claim_lease_take.name AND l.slot >= lo
                                AND l.slot < pg_claim_lease_take.n - 1
                                AND NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases m
                                                WHERE m.name = pg_claim_lease_take.name
                                                  AND m.slot = l.slot + 1)) END
            INTO g;
            -- a lower slot whose lease expired or was released, or whose
            -- session record's session is gone (no session holds a slot of
            -- the name: checked above); a slot whose row a fenced
            -- transaction holds is skipped, never waited for
            SELECT l.slot INTO r FROM @extschema@.pg_claim_leases l
            WHERE l.name = pg_claim_lease_take.name
              AND l.slot < coalesce(g, pg_claim_lease_take.n)
              AND (l.holder IS NULL OR l.session OR l.expires_at <= now_)
              AND l.slot <> ALL (fenced_)
            ORDER BY l.slot
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                SELECT h.slot, h.token, h.expires_at
                INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at
                FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h;
                EXIT WHEN pg_claim_lease_take.slot IS NOT NULL;
                fenced_ := fenced_ || r.slot;
                CONTINUE;
            END IF;
            EXIT WHEN g IS NULL;
            -- the slot's first row; another claim_lease that is inserting it
            -- in a transaction not yet committed holds the reservation
            IF pg_catalog.pg_try_advisory_xact_lock(key_, 270532608 + g) THEN
                IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(key_, g) THEN
                    RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
                        USING ERRCODE = '55000',
                        HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
                END IF;
                INSERT INTO @extschema@.pg_claim_leases AS l
                    (name, slot, n, holder, token, acquired_at, expires_at, owner)
                VALUES (pg_claim_lease_take.name, g, pg_claim_lease_take.n, pg_claim_lease_take.holder,
                        @extschema@.next_token(NULL::bigint), now_, now_ + ttl, role)
                ON CONFLICT ON CONSTRAINT pg_claim_leases_pkey DO NOTHING
                RETURNING l.slot, l.token, l.expires_at
                INTO pg_claim_lease_take.slot, pg_claim_lease_take.token, pg_claim_lease_take.expires_at;
                EXIT WHEN FOUND;
            END IF;
            lo := g + 1;
        END LOOP;
        -- the holder's other slots (after a change of n) are given back
        IF pg_claim_lease_take.slot IS NOT NULL THEN
            UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
            WHERE l.name = pg_claim_lease_take.name
              -- an array computed once, not a join that could run the
              -- locking subquery again for every row of the name
              AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                                      WHERE o.name = pg_claim_lease_take.name
                                        AND o.holder = pg_claim_lease_take.holder AND NOT o.session
                                        AND o.slot <> pg_claim_lease_take.slot
                                        AND (o.owner IS NULL OR o.owner = role
                                             OR pg_catalog.pg_has_role(role, o.owner, 'USAGE'))
                                        AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                                      FOR UPDATE SKIP LOCKED));
        END IF;
        -- else: every slot is leased (or fenced): a standby
    END IF;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_renew(
    role oid, name text, slot integer, token bigint, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    until_ timestamptz;
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('renew_lease'::text);
    PERFORM @extschema@.lease_check(name, slot, token, ttl);
    -- earlier than it was (a shorter ttl, or the clock stepped back) only
    -- when the slot's fence lock is free: the trigger of
    -- sql/leases_guard.sql takes it, which would wait for the holder's own
    -- fenced transactions; else the later expiry stays
    UPDATE @extschema@.pg_claim_leases l
    SET expires_at = CASE WHEN pg_catalog.clock_timestamp() + ttl >= l.expires_at
                          THEN pg_catalog.clock_timestamp() + ttl
                          WHEN pg_catalog.pg_try_advisory_xact_lock(
                                   (@extschema@.crc32(l.name)::bit(32))::integer, 271581184 + l.slot)
                          THEN pg_catalog.clock_timestamp() + ttl
                          ELSE l.expires_at END
    WHERE l.name = pg_claim_lease_renew.name AND l.slot = pg_claim_lease_renew.slot
      AND l.token = pg_claim_lease_renew.token AND l.holder IS NOT NULL AND NOT l.session
      AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    RETURNING l.expires_at INTO until_;
    RETURN until_;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_leases_take(
    role oid, name text, n integer, holder text, max integer, ttl interval,
    crc_ bigint, key_ integer,
    OUT slots integer[], OUT tokens bigint[], OUT expires timestamptz[])
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    joining boolean;
    r record;
    mine integer;
    target integer;
    rest integer;
    sharing integer;
    capped integer;
    ahead bigint;
    given integer;
    maxes_ integer[];
    balanced integer;
    -- the active members of a capped fleet (NULL: not capped; empty: this
    -- holder is a standby)
    active_ text[];
    -- the member that refuses the call, if any
    refused_at timestamptz;
    refused_role boolean;
    refused_owner oid;
    refused_n integer;
    stale boolean := false;
BEGIN
    -- the same checks again: a superuser may call this function directly
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    PERFORM @extschema@.pg_claim_leases_check(n, max);
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be null' USING ERRCODE = '22004',
            HINT = 'This is claim_leases''s internal function: call claim_leases.';
    END IF;
    max := coalesce(max, n);
    IF crc_ IS DISTINCT FROM @extschema@.crc32(name) OR key_ IS DISTINCT FROM (crc_::bit(32))::integer THEN
        RAISE EXCEPTION 'crc_ and key_ must be crc32(name) and its int4 form, got % and %', crc_, key_
            USING ERRCODE = '22023',
            HINT = 'This is claim_leases''s internal function: call claim_leases.';
    END IF;

    -- one read of the members for what the call must know of them first:
    -- this holder's own row (is it joining?), a live member of a role whose
    -- privileges this role lacks, this holder's own row included (its holder
    -- text is no key to it), else a live member of another n, this holder's
    -- own row included (a resize_fleet set it: PC002, the call follows with
    -- fleet_n), and whether any other member is no longer live
    joining := true;
    FOR r IN SELECT m.holder, m.owner, m.n, m.seen_at, m.expires_at > now_ AS live,
                    (m.owner <> role AND NOT pg_catalog.pg_has_role(role, m.owner, 'USAGE')) AS other_role
             FROM @extschema@.pg_claim_lease_members m
             WHERE m.name = pg_claim_leases_take.name
               AND (m.holder = pg_claim_leases_take.holder OR m.expires_at <= now_ OR m.owner <> role
                    OR m.n <> pg_claim_leases_take.n) LOOP
        IF r.holder = pg_claim_leases_take.holder THEN
            joining := NOT r.live;
        END IF;
        IF NOT r.live THEN
            stale := stale OR r.holder <> pg_claim_leases_take.holder;
        ELSIF (r.other_role OR r.n <> n)
              AND (refused_at IS NULL OR (r.other_role AND NOT refused_role)
                   OR (r.other_role = refused_role AND r.seen_at > refused_at)) THEN
            -- the first of them by (other role first, the latest seen)
            refused_at := r.seen_at;
            refused_role := r.other_role;
            refused_owner := r.owner;
            refused_n := r.n;
        END IF;
    END LOOP;
    IF refused_role THEN
        PERFORM @extschema@.pg_claim_lease_refuse_role(name, refused_owner, role);
    ELSIF refused_at IS NOT NULL THEN
        PERFORM @extschema@.pg_claim_leases_refuse_resized(name, refused_n, n);
    END IF;
    -- the members of the name that are no longer live are forgotten (a
    -- row that a claimer's open transaction holds waits for the next call)
    -- (each statement that changes rows a locking subquery picks takes them
    -- as an array, computed once: a join with the subquery could run it
    -- again for every row of the name, when the planner estimates one row)
    IF stale THEN
        DELETE FROM @extschema@.pg_claim_lease_members m
        WHERE m.name = pg_claim_leases_take.name
          AND m.holder = ANY (ARRAY(SELECT o.holder FROM @extschema@.pg_claim_lease_members o
                                    WHERE o.name = pg_claim_leases_take.name AND o.expires_at <= now_
                                      AND o.holder <> pg_claim_leases_take.holder
                                    FOR UPDATE SKIP LOCKED));
    END IF;
    IF joining THEN
        -- a joiner checks what the members do not show: the name's other
        -- leases (claim_lease's holders) and its session claims
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks k
                   WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
                     AND k.mode = 'ExclusiveLock'
                     AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                       WHERE d.datname = pg_catalog.current_database())
                     AND k.classid = crc_::oid AND k.objid::bigint <= 1048575) THEN
            RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
                USING ERRCODE = '55000',
                HINT = 'Use one mode per name: claim_slots on direct connections, or claim_leases. The sessions that hold its slots: SELECT * FROM slot_status(name, n).';
        END IF;
        SELECT l.owner, l.n, l.holder INTO r FROM @extschema@.pg_claim_leases l
        WHERE l.name = pg_claim_leases_take.name AND NOT l.session AND l.holder IS NOT NULL
          AND l.expires_at > now_
          AND (l.n <> pg_claim_leases_take.n
               OR (l.owner IS NOT NULL AND l.owner <> role
                   AND NOT pg_catalog.pg_has_role(role, l.owner, 'USAGE')))
        LIMIT 1;
        IF FOUND AND r.n <> n THEN
            PERFORM @extschema@.pg_claim_lease_refuse_n(name, n, r.n, r.holder);
        ELSIF FOUND THEN
            PERFORM @extschema@.pg_claim_lease_refuse_role(name, r.owner, role);
        END IF;
    END IF;

    -- 1. the holder is a live member until ttl from now (max => 0: it leaves)
    INSERT INTO @extschema@.pg_claim_lease_members AS m
        (name, holder, owner, n, max, held, joined_at, seen_at, expires_at)
    VALUES (name, holder, role, n, max, 0, now_, now_,
            CASE WHEN max = 0 THEN now_ ELSE now_ + ttl END)
    ON CONFLICT ON CONSTRAINT pg_claim_lease_members_pkey DO UPDATE
        SET owner = excluded.owner, n = excluded.n, max = excluded.max,
            joined_at = CASE WHEN joining THEN excluded.joined_at ELSE m.joined_at END,
            held = CASE WHEN joining THEN 0 ELSE m.held END,
            seen_at = excluded.seen_at, expires_at = excluded.expires_at;

    -- 2. renew its live leases below n; those at or above n (n changed) are
    -- given back below
    -- earlier than it was (a shorter ttl, or the clock stepped back) only
    -- when the slot's fence lock is free: the trigger of sql/leases_guard.sql
    -- takes it, which would wait for the holder's own fenced transactions
    -- with the mutex held; else the later expiry stays.
    -- A slot whose fence lock another transaction holds exclusive (a
    -- release_lease in progress: it takes that lock before the row) is
    -- skipped, neither renewed nor counted: waiting for its row with the
    -- mutex held deadlocks with that transaction when it calls claim_leases
    -- next. The try is shared: the holder's fenced transactions (shared)
    -- do not stop it, and its batches' report_backlog (the row, not the
    -- fence lock) is waited for, as before.
    UPDATE @extschema@.pg_claim_leases l
    SET expires_at = CASE WHEN now_ + ttl >= l.expires_at THEN now_ + ttl
                          WHEN pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + l.slot) THEN now_ + ttl
                          ELSE l.expires_at END
    WHERE l.name = pg_claim_leases_take.name AND l.holder = pg_claim_leases_take.holder
      AND NOT l.session AND l.expires_at > now_ AND l.slot < n
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
      AND pg_catalog.pg_try_advisory_xact_lock_shared(key_, 271581184 + l.slot);
    GET DIAGNOSTICS mine = ROW_COUNT;

    -- 3. a standby of a capped fleet (sql/leases_cap.sql) holds nothing,
    -- and wants nothing; else by weight, once the fleet's holders report
    -- weights (sql/leases_balance.sql: it gives back, takes and marks
    -- itself); else by count, as follows; both among the active members
    active_ := @extschema@.pg_claim_leases_active(name, holder, mine, now_);
    IF pg_catalog.cardinality(active_) = 0 THEN
        target := 0;
        -- (skipping a row another transaction holds, as in 2.)
        UPDATE @extschema@.pg_claim_leases l SET wanted_by = NULL
        WHERE l.name = pg_claim_leases_take.name
          AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                                  WHERE o.name = pg_claim_leases_take.name
                                    AND o.wanted_by = pg_claim_leases_take.holder
                                  FOR NO KEY UPDATE SKIP LOCKED));
    ELSE
        balanced := @extschema@.pg_claim_leases_balance(role, name, n, holder, max, ttl, key_, now_, mine, active_);
    END IF;
    IF balanced IS NOT NULL THEN
        mine := balanced;
        target := balanced;
    ELSIF target IS NULL THEN
        -- 3. its target: the slots the members share are n less those that
        -- live leases of claim_lease's holders (not members) hold; members whose
        -- max is below the even share of what is left get their max; the others
        -- share the rest, one more each for the first (rest mod sharing) of them
        -- by (held desc, joined_at, holder), from each member's count as of its
        -- own last call. Each step reads the rows of the name once, with no
        -- join whose plan could read them again per row: the members' maxes
        -- (ordered, as an integer array: read by position in constant time) and
        -- the non-members' live leases come from one grouping by holder.
        SELECT pg_catalog.array_agg(g.mx ORDER BY g.mx) FILTER (WHERE g.mx IS NOT NULL),
               n - coalesce(pg_catalog.sum(g.leases) FILTER (WHERE g.mx IS NULL), 0)
        INTO maxes_, rest
        FROM (SELECT pg_catalog.max(u.mx) AS mx, pg_catalog.sum(u.lease) AS leases
              FROM (SELECT m.holder, m.max AS mx, 0 AS lease
                    FROM @extschema@.pg_claim_lease_members m
                    WHERE m.name = pg_claim_leases_take.name AND m.expires_at > now_
                      AND (active_ IS NULL OR m.holder = ANY (active_))
                    UNION ALL
                    SELECT l.holder, NULL::integer, 1 FROM @extschema@.pg_claim_leases l
                    WHERE l.name = pg_claim_leases_take.name AND NOT l.session AND l.holder IS NOT NULL
                      AND l.expires_at > now_ AND l.slot < n) u
              GROUP BY u.holder COLLATE "C") g;
        sharing := coalesce(pg_catalog.cardinality(maxes_), 0);
        capped := 0;
        -- members of equal max are capped together: the capped ones are those
        -- whose max is at most maxes_[capped]
        WHILE sharing > 0 AND maxes_[capped + 1]::bigint * sharing <= rest LOOP
            capped := capped + 1;
            rest := rest - maxes_[capped];
            sharing := sharing - 1;
        END LOOP;
        IF max = 0 THEN
            target := 0;
        ELSIF capped > 0 AND max <= maxes_[capped] THEN
            target := max;
        ELSIF sharing > 0 THEN
            target := rest / sharing;
            IF rest % sharing > 0 THEN
                SELECT m.held, m.joined_at INTO r FROM @extschema@.pg_claim_lease_members m
                WHERE m.name = pg_claim_leases_take.name AND m.holder = pg_claim_leases_take.holder;
                -- the sharing members ranked before this holder
                SELECT count(*) INTO ahead FROM @extschema@.pg_claim_lease_members m
                WHERE m.name = pg_claim_leases_take.name AND m.expires_at > now_
                  AND m.max > coalesce(maxes_[capped], -1)
                  AND (active_ IS NULL OR m.holder = ANY (active_))
                  AND m.holder <> pg_claim_leases_take.holder
                  AND (m.held > r.held
                       OR (m.held = r.held AND (m.joined_at, m.holder) < (r.joined_at, pg_claim_leases_take.holder)));
                IF ahead < rest % sharing THEN
                    target := target + 1;
                END IF;
            END IF;
        END IF;
        target := least(coalesce(target, 0), max);
    END IF;

    -- 4a. give back every live lease at or above n (n changed), and what it
    -- holds beyond the target (its highest slots); a slot that a fenced
    -- transaction holds (its row, or its fence lock) stays until that
    -- transaction ends
    UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
    WHERE l.name = pg_claim_leases_take.name
      AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                              WHERE o.name = pg_claim_leases_take.name
                                AND o.holder = pg_claim_leases_take.holder AND NOT o.session
                                AND o.expires_at > now_ AND o.slot >= n
                                AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                              FOR UPDATE SKIP LOCKED));
    IF mine > target THEN
        UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
        WHERE l.name = pg_claim_leases_take.name
          AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                                  WHERE o.name = pg_claim_leases_take.name
                                    AND o.holder = pg_claim_leases_take.holder AND NOT o.session
                                    AND o.expires_at > now_ AND o.slot < n
                                    AND (o.owner IS NULL OR o.owner = role
                                         OR pg_catalog.pg_has_role(role, o.owner, 'USAGE'))
                                    AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                                  ORDER BY o.slot DESC
                                  LIMIT mine - target
                                  FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS given = ROW_COUNT;
        mine := mine - given;
    END IF;

    -- 4b. take unserved slots up to the target: first its own slots whose
    -- lease expired (or was given back), then the longest unserved (never
    -- leased: expiry -infinity; then by expiry), then those with no expiry
    -- (released before 0.5.0, and records of sessions that left); each
    -- one read of the name's slots (at most n)
    IF mine < target THEN
        -- the name's rows 0 .. n-1 exist (made once, when they do not)
        -- (counted: rows of a few slots, such as those session claims'
        -- my_token recorded, leave the others missing)
        IF (SELECT count(*) FROM @extschema@.pg_claim_leases l
            WHERE l.name = pg_claim_leases_take.name AND l.slot < n) < n THEN
            INSERT INTO @extschema@.pg_claim_leases AS l (name, slot, n, token, expires_at)
            SELECT name, g, n, 0, '-infinity' FROM pg_catalog.generate_series(0, n - 1) g
            WHERE NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases o
                              WHERE o.name = pg_claim_leases_take.name AND o.slot = g)
            ON CONFLICT ON CONSTRAINT pg_claim_leases_pkey DO NOTHING;
        END IF;
        FOR r IN SELECT l.slot FROM @extschema@.pg_claim_leases l
                 WHERE l.name = pg_claim_leases_take.name AND l.holder = pg_claim_leases_take.holder
                   AND NOT l.session AND l.slot < n AND l.expires_at <= now_
                 ORDER BY l.slot LIMIT target - mine
                 FOR UPDATE SKIP LOCKED LOOP
            IF (SELECT h.slot FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h)
               IS NOT NULL THEN
                mine := mine + 1;
            END IF;
        END LOOP;
        FOR r IN SELECT l.slot FROM @extschema@.pg_claim_leases l
                 WHERE l.name = pg_claim_leases_take.name AND l.expires_at <= now_ AND l.slot < n
                 ORDER BY l.expires_at LIMIT target - mine
                 FOR UPDATE SKIP LOCKED LOOP
            IF (SELECT h.slot FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h)
               IS NOT NULL THEN
                mine := mine + 1;
            END IF;
        END LOOP;
        FOR r IN SELECT l.slot FROM @extschema@.pg_claim_leases l
                 WHERE l.name = pg_claim_leases_take.name AND l.expires_at IS NULL AND l.slot < n
                 ORDER BY l.slot LIMIT target - mine
                 FOR UPDATE SKIP LOCKED LOOP
            IF (SELECT h.slot FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h)
               IS NOT NULL THEN
                mine := mine + 1;
            END IF;
        END LOOP;
    END IF;

    UPDATE @extschema@.pg_claim_lease_members m SET held = mine
    WHERE m.name = pg_claim_leases_take.name AND m.holder = pg_claim_leases_take.holder;

    SELECT pg_catalog.array_agg(l.slot ORDER BY l.slot), pg_catalog.array_agg(l.token ORDER BY l.slot),
           pg_catalog.array_agg(l.expires_at ORDER BY l.slot)
    INTO slots, tokens, expires
    FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_take.name AND l.holder = pg_claim_leases_take.holder
      AND NOT l.session AND l.expires_at > now_ AND l.slot < n
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'));
END $$;

CREATE OR REPLACE FUNCTION @extschema@.slot_partition(tbl regclass, slot integer, n integer)
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

-- ==== balance by remaining work ====
-- (the bodies are those of sql/leases.sql, sql/leases_fleet.sql and
-- sql/leases_balance.sql) The leases table gains a slot's weight (backlog)
-- and the holder that wants it (wanted_by); report_backlog stores the
-- weight and answers whether the slot is wanted; claim_leases shares by
-- weight once a weight is known; a hand-over and a leave clear the marks.
ALTER TABLE @extschema@.pg_claim_leases
    ADD COLUMN IF NOT EXISTS backlog bigint,
    ADD COLUMN IF NOT EXISTS backlog_at timestamptz,
    ADD COLUMN IF NOT EXISTS wanted_by text,
    -- report_backlog's fenced_batches, for the lease's token: its holder
    -- runs every batch of the slot in one transaction that passed fence
    -- before it read the batch's rows, so while no fenced transaction holds
    -- the slot it is between two batches (the planner below then takes it
    -- at once instead of marking it); pg_claim_lease_hand clears it
    ADD COLUMN IF NOT EXISTS fenced_batches boolean NOT NULL DEFAULT false;

-- The marked rows of a name by holder (report_backlog's look-up of a
-- holder's wanted slots): a partial index, so a renewal, which changes
-- only expires_at, stays a HOT update.
CREATE INDEX pg_claim_leases_wanted ON @extschema@.pg_claim_leases (name, holder) WHERE wanted_by IS NOT NULL;

-- The time an internal lease function is given as its statement's (now_):
-- its callers pass clock_timestamp(); a direct call with a time a day or
-- more away is refused before any arithmetic on it overflows.
CREATE FUNCTION @extschema@.pg_claim_lease_now_check(now_ timestamptz)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF now_ IS NULL OR NOT pg_catalog.isfinite(now_)
       OR pg_catalog.abs(extract(epoch FROM now_ - pg_catalog.clock_timestamp())) > 86400 THEN
        RAISE EXCEPTION 'now_ must be within a day of the clock, got %', now_ USING ERRCODE = '22023',
            HINT = 'now_ is the time of the calling statement: pass clock_timestamp().';
    END IF;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_now_check(timestamptz) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_hand(
    role oid, name text, s integer, n integer, holder text, ttl interval, key_ integer,
    now_ timestamptz, OUT slot integer, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- its callers pass checked values; a direct call is checked the same way
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    PERFORM @extschema@.pg_claim_lease_now_check(now_);
    -- a transaction that passed fence / lease_valid on the slot in READ
    -- COMMITTED holds its fence lock shared: the slot is left to the caller's
    -- next candidate (all three OUT values NULL), never waited for
    IF NOT pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + s) THEN
        RETURN;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(key_, s) THEN
        RAISE EXCEPTION 'name "%" is claimed with claim_slot; it cannot also be leased', name
            USING ERRCODE = '55000',
            HINT = 'Use one mode per name: claim_slot and my_token, or claim_lease.';
    END IF;
    UPDATE @extschema@.pg_claim_leases l
    SET n = pg_claim_lease_hand.n, holder = pg_claim_lease_hand.holder, session = false,
        owner = role, token = @extschema@.next_token(l.token),
        acquired_at = now_, expires_at = now_ + ttl, wanted_by = NULL, fenced_batches = false
    WHERE l.name = pg_claim_lease_hand.name AND l.slot = s
    RETURNING l.slot, l.token, l.expires_at
    INTO pg_claim_lease_hand.slot, pg_claim_lease_hand.token, pg_claim_lease_hand.expires_at;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_leases_leave(role oid, name text, holder text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    r record;
BEGIN
    IF role IS NULL OR name IS NULL OR holder IS NULL THEN
        RAISE EXCEPTION '% must not be null',
            CASE WHEN role IS NULL THEN 'role' WHEN name IS NULL THEN 'name' ELSE 'holder' END
            USING ERRCODE = '22004',
            HINT = 'This is claim_leases''s internal function: call claim_leases(name, n, holder, max => 0).';
    END IF;
    -- another role's live member of that holder text is not this role's to end
    SELECT m.owner INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_leave.name AND m.holder = pg_claim_leases_leave.holder
      AND m.expires_at > pg_catalog.clock_timestamp()
      AND m.owner <> role AND NOT pg_catalog.pg_has_role(role, m.owner, 'USAGE');
    IF FOUND THEN
        PERFORM @extschema@.pg_claim_lease_refuse_role(name, r.owner, role);
    END IF;
    UPDATE @extschema@.pg_claim_lease_members m
    SET expires_at = pg_catalog.clock_timestamp(), max = 0, held = 0
    WHERE m.name = pg_claim_leases_leave.name AND m.holder = pg_claim_leases_leave.holder;
    -- the slots it wanted are no longer wanted (sql/leases_balance.sql)
    UPDATE @extschema@.pg_claim_leases l SET wanted_by = NULL
    WHERE l.name = pg_claim_leases_leave.name AND l.wanted_by = pg_claim_leases_leave.holder;
    -- FOR UPDATE waits for the fenced transactions (FOR KEY SHARE)
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_leave.name AND l.holder = pg_claim_leases_leave.holder
      AND NOT l.session AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    FOR UPDATE;
    UPDATE @extschema@.pg_claim_leases l SET expires_at = pg_catalog.clock_timestamp()
    WHERE l.name = pg_claim_leases_leave.name AND l.holder = pg_claim_leases_leave.holder
      AND NOT l.session AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'));
END $$;

CREATE FUNCTION @extschema@.pg_claim_lease_report(role oid, name text, slot integer, token bigint,
                                                  remaining bigint, fenced_batches boolean)
RETURNS integer[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    PERFORM @extschema@.lease_check(name, slot, token, interval '1 second');
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be null' USING ERRCODE = '22004',
            HINT = 'This is report_backlog''s internal function: call report_backlog.';
    END IF;
    IF remaining < 0 THEN
        RAISE EXCEPTION 'remaining must be at least 0, got %', remaining USING ERRCODE = '22023',
            HINT = 'remaining is the number of the slot''s pending items: 0 when none is left, NULL to keep the last report.';
    END IF;
    fenced_batches := coalesce(fenced_batches, false);
    SELECT l.holder, l.backlog, l.backlog_at, l.fenced_batches INTO r FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_report.name AND l.slot = pg_claim_lease_report.slot
      AND l.token = pg_claim_lease_report.token AND l.holder IS NOT NULL AND NOT l.session
      AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'));
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_lease_members m
                       WHERE m.name = pg_claim_lease_report.name) THEN
            RAISE EXCEPTION 'no claim_leases fleet is named "%"', name USING ERRCODE = '42704',
                HINT = 'report_backlog reports on a lease that claim_leases gave: pass the name, slot and token of one this holder holds.';
        END IF;
        RETURN NULL;
    END IF;
    IF remaining IS NOT NULL AND (r.backlog IS DISTINCT FROM remaining
                                  OR r.backlog_at < pg_catalog.clock_timestamp() - interval '10 seconds') THEN
        UPDATE @extschema@.pg_claim_leases l SET backlog = remaining, backlog_at = pg_catalog.clock_timestamp(),
            fenced_batches = pg_claim_lease_report.fenced_batches
        WHERE l.name = pg_claim_lease_report.name AND l.slot = pg_claim_lease_report.slot
          AND l.token = pg_claim_lease_report.token;
    ELSIF r.fenced_batches <> fenced_batches THEN
        UPDATE @extschema@.pg_claim_leases l SET fenced_batches = pg_claim_lease_report.fenced_batches
        WHERE l.name = pg_claim_lease_report.name AND l.slot = pg_claim_lease_report.slot
          AND l.token = pg_claim_lease_report.token;
    END IF;
    -- the holder's live leases of role's that a live other member wants
    RETURN ARRAY(
        SELECT l.slot FROM @extschema@.pg_claim_leases l
        WHERE l.name = pg_claim_lease_report.name AND l.holder = r.holder AND l.wanted_by IS NOT NULL
          AND l.wanted_by <> l.holder AND NOT l.session AND l.expires_at > pg_catalog.clock_timestamp()
          AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
          AND EXISTS (SELECT 1 FROM @extschema@.pg_claim_lease_members m
                      WHERE m.name = pg_claim_lease_report.name AND m.holder = l.wanted_by
                        AND m.expires_at > pg_catalog.clock_timestamp())
        ORDER BY l.slot);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_report(oid, text, integer, bigint, bigint, boolean) FROM PUBLIC;

CREATE FUNCTION @extschema@.pg_claim_leases_balance(
    role oid, name text, n integer, holder text, max integer, ttl interval, key_ integer,
    now_ timestamptz, mine integer, active text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    avg_ numeric;
    known bigint := 0;
    summed numeric := 0;
    total numeric := 0;
    members_ text[];
    hs text[];
    cs bigint[];
    sbs numeric[];
    cbs bigint[];
    css bigint[];
    sbss numeric[];
    cbss bigint[];
    mks bigint[];
    marked bigint := 0;
    wanted bigint := 0;
    unserved bigint := 0;
    mean numeric;
    slack numeric;
    own numeric := 0;
    donors text[] := '{}';
    weights numeric[] := '{}';
    i integer;
    best integer;
    fit numeric;
    marks integer := 0;
    moves integer := 0;
    damp timestamptz;
    -- a weight counts for a minute after its report
    fresh timestamptz;
    r record;
BEGIN
    PERFORM @extschema@.pg_claim_lease_now_check(now_);
    -- claim_leases checked them; a direct call is refused as it would be
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    damp := now_ - least(ttl / 3, interval '5 seconds');
    fresh := now_ - interval '1 minute';
    SELECT pg_catalog.array_agg(m.holder) INTO members_ FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_balance.name AND m.expires_at > now_ AND m.max > 0
      AND (active IS NULL OR m.holder = ANY (active));
    -- one read of the name's slots, grouped by live holder (NULL:
    -- unserved): how many, the sum and count of the reported weights, and
    -- the same for the slots that stay where they are (not wanted by
    -- another member, or wanted by this holder, whose marks are made again
    -- below)
    SELECT pg_catalog.array_agg(g.h), pg_catalog.array_agg(g.c), pg_catalog.array_agg(g.sb),
           pg_catalog.array_agg(g.cb), pg_catalog.array_agg(g.cs), pg_catalog.array_agg(g.sbs),
           pg_catalog.array_agg(g.cbs), pg_catalog.array_agg(g.mk)
    INTO hs, cs, sbs, cbs, css, sbss, cbss, mks
    FROM (SELECT u.h, pg_catalog.count(*) AS c, pg_catalog.sum(u.backlog) AS sb,
                 pg_catalog.count(u.backlog) AS cb,
                 pg_catalog.count(*) FILTER (WHERE u.stays) AS cs,
                 pg_catalog.sum(u.backlog) FILTER (WHERE u.stays) AS sbs,
                 pg_catalog.count(u.backlog) FILTER (WHERE u.stays) AS cbs,
                 pg_catalog.count(*) FILTER (WHERE u.mark) AS mk
          FROM (SELECT CASE WHEN l.expires_at > now_ THEN l.holder END AS h,
                       CASE WHEN l.backlog_at > fresh THEN l.backlog END AS backlog,
                       CASE WHEN l.wanted_by IS NULL OR l.wanted_by = l.holder
                                 OR l.wanted_by = pg_claim_leases_balance.holder THEN true
                            ELSE NOT coalesce(l.wanted_by = ANY (members_), false) END AS stays,
                       l.wanted_by = pg_claim_leases_balance.holder AS mark
                FROM @extschema@.pg_claim_leases l
                WHERE l.name = pg_claim_leases_balance.name AND l.slot < n AND NOT l.session) u
          GROUP BY u.h) g;
    FOR i IN 1 .. coalesce(pg_catalog.cardinality(hs), 0) LOOP
        known := known + cbs[i];
        summed := summed + coalesce(sbs[i], 0);
        IF hs[i] IS NOT NULL THEN
            marked := marked + mks[i];
        ELSE
            unserved := cs[i];
        END IF;
    END LOOP;
    -- no fresh weight, or no work left anywhere: shares by count
    IF known = 0 OR summed = 0 THEN
        RETURN NULL;
    END IF;
    -- a slot never reported weighs the average of the reported ones; the
    -- fleet's weight is that of the slots no claim_lease holder holds
    avg_ := summed / known;
    FOR i IN 1 .. pg_catalog.cardinality(hs) LOOP
        IF hs[i] IS NULL OR hs[i] = ANY (members_) THEN
            total := total + coalesce(sbs[i], 0) + (cs[i] - cbs[i]) * avg_;
        END IF;
        IF hs[i] = pg_claim_leases_balance.holder THEN
            own := coalesce(sbss[i], 0) + (css[i] - cbss[i]) * avg_;
            wanted := cs[i] - css[i];
        ELSIF hs[i] = ANY (members_) THEN
            donors := donors || hs[i];
            weights := weights || (coalesce(sbss[i], 0) + (css[i] - cbss[i]) * avg_);
        END IF;
    END LOOP;
    mean := total / greatest(coalesce(pg_catalog.cardinality(members_), 0), 1);
    slack := mean / 10;

    -- 1. give back what others want
    IF wanted > 0 THEN
        UPDATE @extschema@.pg_claim_leases l SET expires_at = now_
        WHERE l.name = pg_claim_leases_balance.name
          AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                                  WHERE o.name = pg_claim_leases_balance.name
                                    AND o.holder = pg_claim_leases_balance.holder AND NOT o.session
                                    AND o.expires_at > now_ AND o.slot < n
                                    AND o.wanted_by <> pg_claim_leases_balance.holder
                                    AND o.wanted_by = ANY (members_)
                                    AND (o.owner IS NULL OR o.owner = role
                                         OR pg_catalog.pg_has_role(role, o.owner, 'USAGE'))
                                    AND pg_catalog.pg_try_advisory_xact_lock(key_, 271581184 + o.slot)
                                  FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS i = ROW_COUNT;
        mine := mine - i;
    END IF;
    -- its own marks are made again below, from the weights of now
    IF marked > 0 THEN
        UPDATE @extschema@.pg_claim_leases l SET wanted_by = NULL
        WHERE l.name = pg_claim_leases_balance.name
          AND l.slot = ANY (ARRAY(SELECT o.slot FROM @extschema@.pg_claim_leases o
                                  WHERE o.name = pg_claim_leases_balance.name
                                    AND o.wanted_by = pg_claim_leases_balance.holder
                                    AND o.expires_at > now_
                                  FOR NO KEY UPDATE SKIP LOCKED));
        -- a mark it could not clear (its row locked, as by a release in
        -- progress) stays: no new marks this time, so none is made twice
        GET DIAGNOSTICS i = ROW_COUNT;
        marked := marked - i;
    END IF;

    -- 2. unserved slots: those it wants, then the heaviest, while it is
    -- light; the lightest ones whatever its weight
    -- (only when the one read found some: this holder's give-backs are
    -- wanted by others, it does not take them)
    IF unserved > 0 THEN
        FOR r IN SELECT l.slot, CASE WHEN l.backlog_at > fresh THEN l.backlog ELSE avg_ END AS w,
                        l.wanted_by IS NOT DISTINCT FROM pg_claim_leases_balance.holder AS mark
                 FROM @extschema@.pg_claim_leases l
                 WHERE l.name = pg_claim_leases_balance.name AND l.slot < n
                   AND (l.expires_at <= now_ OR l.expires_at IS NULL)
                   AND (l.wanted_by IS NULL OR l.wanted_by = pg_claim_leases_balance.holder
                        OR NOT l.wanted_by = ANY (members_))
                 ORDER BY 3 DESC, 2 DESC, l.slot
                 FOR UPDATE SKIP LOCKED LOOP
            EXIT WHEN mine >= max;
            CONTINUE WHEN NOT (r.mark OR own < mean OR r.w <= slack);
            IF (SELECT h.slot FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h)
               IS NOT NULL THEN
                mine := mine + 1;
                own := own + r.w;
            END IF;
        END LOOP;
    END IF;

    -- 3. the heaviest members' slots, taken or marked: once below the mean by more
    -- than the slack, up to half the slack below it (a joiner that stopped
    -- at the slack's edge would sit there by the estimates and below it by
    -- the rows)
    WHILE marked = 0 AND own < mean - slack * CASE WHEN moves > 0 THEN 0.5 ELSE 1 END
          AND mine + marks < max AND moves < 32 LOOP
        best := NULL;
        FOR i IN 1 .. coalesce(pg_catalog.cardinality(weights), 0) LOOP
            IF weights[i] IS NOT NULL AND (best IS NULL OR weights[i] > weights[best]) THEN
                best := i;
            END IF;
        END LOOP;
        EXIT WHEN best IS NULL OR weights[best] <= own;
        fit := least(mean - own, weights[best] - mean);
        -- the largest slot within fit, else the smallest that lowers the larger
        SELECT l.slot, x.w, l.fenced_batches INTO r
        FROM @extschema@.pg_claim_leases l,
             LATERAL (SELECT CASE WHEN l.backlog_at > fresh THEN l.backlog ELSE avg_ END AS w) x
        WHERE l.name = pg_claim_leases_balance.name AND l.holder = donors[best] AND NOT l.session
          AND l.slot < n AND l.expires_at > now_ AND l.acquired_at <= damp
          AND (l.wanted_by IS NULL OR NOT l.wanted_by = ANY (members_))
          AND x.w > 0 AND own + x.w < weights[best]
        ORDER BY x.w <= fit DESC, CASE WHEN x.w <= fit THEN -x.w ELSE x.w END, l.slot
        LIMIT 1
        FOR NO KEY UPDATE OF l SKIP LOCKED;
        IF NOT FOUND THEN
            -- nothing of that member can move: the next heaviest
            weights[best] := NULL;
            CONTINUE;
        END IF;
        -- taken at once when its holder's batches of it are fenced
        -- (fenced_batches) and no fenced transaction holds it: its holder
        -- is then between two batches of it, and learns it at its next
        -- fence (PC001). Else marked: given back after the batch in hand (a
        -- holder that handles a batch before its fenced write is inside a
        -- batch whatever the locks say). A fenced transaction holds the row
        -- FOR KEY SHARE (under REPEATABLE READ, and in the portable edition:
        -- the row lock FOR UPDATE that pg_claim_lease_hand's caller holds
        -- is then not to be had) or the slot's fence lock
        -- (pg_claim_lease_hand's try)
        i := NULL;
        IF r.fenced_batches THEN
            PERFORM 1 FROM @extschema@.pg_claim_leases l
            WHERE l.name = pg_claim_leases_balance.name AND l.slot = r.slot
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                i := (SELECT h.slot FROM @extschema@.pg_claim_lease_hand(role, name, r.slot, n, holder, ttl, key_, now_) h);
            END IF;
        END IF;
        IF i IS NOT NULL THEN
            mine := mine + 1;
        ELSE
            UPDATE @extschema@.pg_claim_leases l SET wanted_by = holder
            WHERE l.name = pg_claim_leases_balance.name AND l.slot = r.slot;
            marks := marks + 1;
        END IF;
        moves := moves + 1;
        own := own + r.w;
        weights[best] := weights[best] - r.w;
    END LOOP;
    RETURN mine;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_balance(oid, text, integer, text, integer, interval, integer, timestamptz, integer, text[]) FROM PUBLIC;

CREATE FUNCTION @extschema@."report_backlog"(
	"name" TEXT,
	"slot" INT,
	"token" bigint,
	"remaining" bigint,
	"fenced_batches" bool DEFAULT false
) RETURNS INT[]
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'report_backlog_wrapper';
COMMENT ON FUNCTION @extschema@.report_backlog(text, integer, bigint, bigint, boolean) IS
    'store remaining as the weight of the lease (its holder''s work left in the slot) for claim_leases'' balance, and fenced_batches (every batch of the slot passes fence before it reads: a lighter holder may take the slot between two batches): the slots of its holder that another holder wants (give them back after this batch; empty: none), NULL when token does not hold the lease';

-- report_backlog is granted as claim_leases is (sql/grants.sql, run again)
-- The grants to PUBLIC, made by the extension's owner: this function is
-- given to the owner below and dropped once called.
CREATE FUNCTION @extschema@.pg_claim_grant_to_public(fns pg_catalog.regprocedure[])
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f pg_catalog.regprocedure;
BEGIN
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) FROM PUBLIC;

DO $grants$
DECLARE
    fns pg_catalog.regprocedure[];
    public_fns pg_catalog.regprocedure[];
    f pg_catalog.regprocedure;
    owner_ pg_catalog.text;
    path_ pg_catalog.text := pg_catalog.current_setting('search_path');
BEGIN
    -- function signatures below print schema-qualified
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    SELECT e.extowner::pg_catalog.regrole::pg_catalog.text INTO owner_
    FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim';
    SELECT pg_catalog.array_agg(p.oid::pg_catalog.regprocedure ORDER BY p.oid) INTO fns
    FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_proc p ON p.oid = d.objid
    WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
      AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
      AND d.deptype = 'e'
      AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim')
      AND (p.proname = ANY (ARRAY[
               'claim_slot', 'claim_slots', 'release_slot', 'my_slot', 'my_slots',
               'slot_holders', 'slot_status',
               'claim_lease', 'claim_leases', 'report_backlog', 'renew_lease', 'release_lease',
               'lease_holders', 'fence', 'lease_valid', 'my_token', 'resize_fleet', 'fleet_n',
               'claim_partitions', 'my_partitions',
               'record_failure', 'failure_due', 'failing_items', 'clear_failure',
               'item_failures', 'has_failures', 'define_fleet', 'drop_fleet']::pg_catalog.name[])
           OR p.proname OPERATOR(pg_catalog.~~) 'group\_%');
    -- (in an upgrade, a function whose EXECUTE was already revoked from
    -- PUBLIC stays revoked)
    SELECT pg_catalog.array_agg(f2 ORDER BY f2::pg_catalog.oid) INTO public_fns
    FROM pg_catalog.unnest(fns) f2
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc p,
                  pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                  WHERE p.oid = f2::pg_catalog.oid AND a.grantee = 0 AND a.privilege_type = 'EXECUTE');
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s WITH GRANT OPTION', f, owner_);
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) OWNER TO %s', owner_);
    PERFORM @extschema@.pg_claim_grant_to_public(coalesce(public_fns, '{}'));
    PERFORM pg_catalog.set_config('search_path', path_, true);
END $grants$;

DROP FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]);


-- ==== tenants ====
-- (the bodies are those of sql/tenants.sql): slot_of_spread, my_items_fair
-- and my_items_fair_query are new.
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

-- ==== lease renewals are HOT updates ====
-- (sql/leases_fleet.sql) no index holds a lease's expiry, and the pages of
-- the leases and the claim_leases members keep room for new versions
DROP INDEX @extschema@.pg_claim_leases_expiry;
ALTER TABLE @extschema@.pg_claim_leases SET (fillfactor = 50);
ALTER TABLE @extschema@.pg_claim_lease_members SET (fillfactor = 50);

-- ==== resize ====
-- (the bodies are those of sql/leases_resize.sql, sql/leases_fleet.sql and
-- sql/grants.sql) resize_fleet changes the n of a claim_leases fleet online
-- (the barrier that keeps order per key: every fenced transaction of the
-- old n ends before any lease of the new n); fleet_n tells a worker the
-- fleet's n; claim_leases refuses a call of another n than the live
-- members' with PC002 (pg_claim_leases_take, above).
-- claim_leases' refusal of a call whose n is not the fleet's: the live
-- members of name use n = fleet_n (after a resize_fleet, or since they
-- started), the call passed n.
CREATE FUNCTION @extschema@.pg_claim_leases_refuse_resized(name text, fleet_n integer, n integer)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'fleet "%" has n = % (since a resize_fleet, or since its members started with it); this call passed n = %',
        name, fleet_n, n
        USING ERRCODE = 'PC002',
        HINT = 'Call claim_leases with the fleet''s n (SELECT fleet_n(name)); the pg_claim worker libraries follow by themselves.';
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_refuse_resized(text, integer, integer) FROM PUBLIC;

-- The owner of a live member or a live lease of `name` whose privileges
-- `role` lacks, else NULL: the rights resize_fleet and cap_fleet
-- (sql/leases_cap.sql) check before they change a running fleet.
CREATE FUNCTION @extschema@.pg_claim_leases_foreign_owner(role oid, name text, now_ timestamptz)
RETURNS oid
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        (SELECT m.owner FROM @extschema@.pg_claim_lease_members m
         WHERE m.name = pg_claim_leases_foreign_owner.name AND m.expires_at > now_
           AND m.owner <> role AND NOT pg_catalog.pg_has_role(role, m.owner, 'USAGE')
         LIMIT 1),
        (SELECT l.owner FROM @extschema@.pg_claim_leases l
         WHERE l.name = pg_claim_leases_foreign_owner.name AND NOT l.session AND l.holder IS NOT NULL
           AND l.expires_at > now_ AND l.owner IS NOT NULL AND l.owner <> role
           AND NOT pg_catalog.pg_has_role(role, l.owner, 'USAGE')
         LIMIT 1))
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_foreign_owner(oid, text, timestamptz) FROM PUBLIC;

-- the key2 values in lo .. hi of the two-int4 advisory locks of key1 = crc
-- (crc32 of a name) that other sessions of this database hold, in order:
-- resize_fleet waits for the claims not yet committed that hold them
CREATE FUNCTION @extschema@.pg_claim_leases_locks_held(crc bigint, lo integer, hi integer)
RETURNS SETOF integer
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT DISTINCT k.objid::bigint::integer FROM pg_catalog.pg_locks k
    WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
      AND k.pid <> pg_catalog.pg_backend_pid()
      AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                        WHERE d.datname = pg_catalog.current_database())
      AND k.classid::bigint = crc
      AND k.objid::bigint BETWEEN lo AND hi
    ORDER BY 1
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_locks_held(bigint, integer, integer) FROM PUBLIC;

-- resize_fleet (src/leases.rs) for `role`: the old n.
CREATE FUNCTION @extschema@.pg_claim_leases_resize(role oid, name text, n integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    now_ timestamptz;
    crc_ bigint;
    key_ integer;
    old_ integer;
    s integer;
    key2_ integer;
    owner_ oid;
    r record;
    known boolean := false;
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('resize_fleet'::text);
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be null' USING ERRCODE = '22004',
            HINT = 'This is resize_fleet''s internal function: call resize_fleet(name, n).';
    END IF;
    IF name IS NULL OR n IS NULL THEN
        RAISE EXCEPTION '% must not be null', CASE WHEN name IS NULL THEN 'name' ELSE 'n' END
            USING ERRCODE = '22004',
            HINT = 'resize_fleet(name, n) sets the number of slots of the lease fleet name to n: pass both.';
    END IF;
    IF n < 1 OR n > 1024 THEN
        RAISE EXCEPTION 'n must be between 1 and 1024 for resize_fleet, got %', n USING ERRCODE = '22023',
            HINT = 'n is the fleet''s new number of slots; claim_leases serves at most 1024 slots of a name.';
    END IF;
    -- the name's checks (its length), as for a lease
    PERFORM @extschema@.lease_check(name, 0::integer, 0::bigint, interval '1 second');
    crc_ := @extschema@.crc32(name);
    key_ := (crc_::bit(32))::integer;

    IF NOT pg_catalog.pg_try_advisory_xact_lock(key_, 269484036) THEN
        RAISE EXCEPTION 'fleet "%" is being resized by another transaction', name
            USING ERRCODE = '55P03',
            HINT = 'One resize of a name at a time: wait for that transaction to end, then see the fleet''s n with SELECT fleet_n(name).';
    END IF;
    -- the lease mutex, to the end of the transaction: claim_leases and
    -- claim_lease of the name wait for the resize to commit
    PERFORM pg_catalog.pg_advisory_xact_lock(key_, 269484034);
    now_ := pg_catalog.clock_timestamp();

    -- a name in session mode: claim_slot holds a slot of it
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks k
               WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted
                 AND k.mode = 'ExclusiveLock'
                 AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                   WHERE d.datname = pg_catalog.current_database())
                 AND k.classid = crc_::oid AND k.objid::bigint <= 1048575) THEN
        RAISE EXCEPTION 'name "%" is claimed with claim_slot; session fleets cannot be resized online', name
            USING ERRCODE = '55000',
            HINT = 'A session claim has no token that could fence an in-flight batch: stop the sessions of the name, change n in their configuration, and start them again.';
    END IF;

    -- the rights: every live member and live lease of the name belongs to a
    -- role whose privileges this role has, and so does its definition
    owner_ := @extschema@.pg_claim_leases_foreign_owner(role, name, now_);
    IF owner_ IS NOT NULL THEN
        RAISE EXCEPTION 'fleet "%" is leased by role %; role % cannot resize it', name,
            owner_::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a role with the privileges of the role whose workers hold the fleet''s leases may resize it: resize as that role (SET ROLE), or be granted it.';
    END IF;
    SELECT f.owner::oid AS owner, f.n INTO r FROM @extschema@.pg_claim_fleets f
    WHERE f.name = pg_claim_leases_resize.name;
    IF FOUND THEN
        known := true;
        old_ := r.n;
        IF NOT @extschema@.pg_claim_fleet_may_change(role, r.owner) THEN
            RAISE EXCEPTION 'fleet "%" is defined by role %; role % cannot resize it', name,
                r.owner::regrole, role::regrole
                USING ERRCODE = '42501',
                HINT = 'Only a member of the role that defined a fleet, or of the extension''s owner, may change its n: ask that role.';
        END IF;
    END IF;

    -- the n now: the live members', else the live leases', else the
    -- definition's, else that of the name's lease rows
    SELECT m.n INTO r FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_leases_resize.name AND m.expires_at > now_
    ORDER BY m.seen_at DESC LIMIT 1;
    IF NOT FOUND THEN
        SELECT l.n INTO r FROM @extschema@.pg_claim_leases l
        WHERE l.name = pg_claim_leases_resize.name AND NOT l.session AND l.holder IS NOT NULL
          AND l.expires_at > now_ AND l.n IS NOT NULL
        ORDER BY l.acquired_at DESC LIMIT 1;
    END IF;
    IF FOUND THEN
        known := true;
        old_ := r.n;
    END IF;
    SELECT pg_catalog.max(l.slot) + 1 AS top, pg_catalog.max(l.n) AS n INTO r
    FROM @extschema@.pg_claim_leases l WHERE l.name = pg_claim_leases_resize.name;
    IF r.top IS NOT NULL THEN
        known := true;
        old_ := coalesce(old_, r.n, r.top);
    END IF;
    IF NOT known THEN
        RAISE EXCEPTION 'fleet "%" does not exist: it has no live member, no lease and no definition', name
            USING ERRCODE = '42704',
            HINT = 'resize_fleet changes the n of a running claim_leases fleet (or of a define_fleet definition): check the name (SELECT * FROM lease_holders(name)); a fleet that is not running starts with the n its first claim_leases passes.';
    END IF;
    IF old_ = n THEN
        RAISE EXCEPTION 'fleet "%" already has n = %', name, n USING ERRCODE = '22023',
            HINT = 'Pass the new number of slots: SELECT fleet_n(name) shows the current one.';
    END IF;

    -- 1. wait for every fenced transaction of the name: READ COMMITTED ones
    -- hold their slot's fence lock, REPEATABLE READ ones its row FOR KEY
    -- SHARE. The fence locks first: a batch that passed fence may still
    -- write its lease row (report_backlog) before it commits, which a row
    -- lock of the resize would make it wait for (a deadlock).
    -- A fenced transaction needs its slot's row, so the fence locks taken
    -- are those of the name's rows (not of every slot below n: a defined n
    -- may be 1048576, more locks than the lock table holds). Rows that a
    -- claim not yet committed wrote are not seen; that claim holds the
    -- slot's fence lock (a hand-over) or first-row reservation (claim_lease's
    -- insert), so the resize first waits for every transaction that holds
    -- one of those (no claim takes one while the resize holds the mutex),
    -- then reads the rows. The reservations (270532608 + slot) and the fence
    -- locks (271581184 + slot) are one range of key2, taken in its order
    FOR key2_ IN SELECT h.key2
                 FROM @extschema@.pg_claim_leases_locks_held(crc_, 270532608, 271581184 + 1048575) h(key2)
                 LOOP
        PERFORM pg_catalog.pg_advisory_xact_lock(key_, key2_);
    END LOOP;
    FOR s IN SELECT l.slot FROM @extschema@.pg_claim_leases l
             WHERE l.name = pg_claim_leases_resize.name ORDER BY l.slot LOOP
        PERFORM pg_catalog.pg_advisory_xact_lock(key_, 271581184 + s);
    END LOOP;
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_resize.name
    ORDER BY l.slot
    FOR UPDATE;
    now_ := pg_catalog.clock_timestamp();

    -- 2. every old token fails fence after the commit (the guard trigger
    -- fires for each row deleted or given back)
    DELETE FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_resize.name AND l.slot >= n;
    -- (a record of a session that left passes fence until its slot changes
    -- hands: it is given back as a lease is; no session holds a slot now)
    UPDATE @extschema@.pg_claim_leases l
    SET n = pg_claim_leases_resize.n, session = false,
        expires_at = CASE WHEN l.holder IS NOT NULL AND (l.session OR l.expires_at > now_)
                          THEN now_ ELSE l.expires_at END,
        backlog = NULL, backlog_at = NULL, wanted_by = NULL
    WHERE l.name = pg_claim_leases_resize.name;

    -- 3. the members' n (each holds nothing now) and the definition's
    UPDATE @extschema@.pg_claim_lease_members m SET n = pg_claim_leases_resize.n, held = 0
    WHERE m.name = pg_claim_leases_resize.name;
    UPDATE @extschema@.pg_claim_fleets f SET n = pg_claim_leases_resize.n
    WHERE f.name = pg_claim_leases_resize.name;
    RETURN old_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_resize(oid, text, integer) FROM PUBLIC;

-- fleet_n (src/leases.rs): the n of the name's live lease fleet (its live
-- members'), else its definition's, else NULL. Only that number: no holder,
-- token or role (`role` is the shells' first argument; every role that may
-- claim the name may ask).
CREATE FUNCTION @extschema@.pg_claim_fleet_n(role oid, name text)
RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n_ integer;
BEGIN
    IF name IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT m.n INTO n_ FROM @extschema@.pg_claim_lease_members m
    WHERE m.name = pg_claim_fleet_n.name AND m.expires_at > pg_catalog.clock_timestamp()
    ORDER BY m.seen_at DESC LIMIT 1;
    IF FOUND THEN
        RETURN n_;
    END IF;
    SELECT f.n INTO n_ FROM @extschema@.pg_claim_fleets f WHERE f.name = pg_claim_fleet_n.name;
    RETURN n_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_n(oid, text) FROM PUBLIC;

CREATE FUNCTION @extschema@."resize_fleet"(
	"name" TEXT,
	"n" INT
) RETURNS INT
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'resize_fleet_wrapper';

CREATE FUNCTION @extschema@."fleet_n"(
	"name" TEXT
) RETURNS INT
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'fleet_n_wrapper';
COMMENT ON FUNCTION @extschema@.resize_fleet(text, integer) IS
    'set the number of slots of the lease fleet name to n online: waits for every fenced transaction of the old n, gives back every lease (old tokens fail fence), sets the members'' and the definition''s n; returns the old n';
COMMENT ON FUNCTION @extschema@.fleet_n(text) IS
    'the n of the lease fleet name: its live members'', else its define_fleet definition''s, else NULL';

-- resize_fleet and fleet_n are granted as claim_leases is (sql/grants.sql,
-- run again)
-- The grants to PUBLIC, made by the extension's owner: this function is
-- given to the owner below and dropped once called.
CREATE FUNCTION @extschema@.pg_claim_grant_to_public(fns pg_catalog.regprocedure[])
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f pg_catalog.regprocedure;
BEGIN
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) FROM PUBLIC;

DO $grants$
DECLARE
    fns pg_catalog.regprocedure[];
    public_fns pg_catalog.regprocedure[];
    f pg_catalog.regprocedure;
    owner_ pg_catalog.text;
    path_ pg_catalog.text := pg_catalog.current_setting('search_path');
BEGIN
    -- function signatures below print schema-qualified
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    SELECT e.extowner::pg_catalog.regrole::pg_catalog.text INTO owner_
    FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim';
    SELECT pg_catalog.array_agg(p.oid::pg_catalog.regprocedure ORDER BY p.oid) INTO fns
    FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_proc p ON p.oid = d.objid
    WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
      AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
      AND d.deptype = 'e'
      AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim')
      AND (p.proname = ANY (ARRAY[
               'claim_slot', 'claim_slots', 'release_slot', 'my_slot', 'my_slots',
               'slot_holders', 'slot_status',
               'claim_lease', 'claim_leases', 'report_backlog', 'renew_lease', 'release_lease',
               'lease_holders', 'fence', 'lease_valid', 'my_token', 'resize_fleet', 'fleet_n',
               'claim_partitions', 'my_partitions',
               'record_failure', 'failure_due', 'failing_items', 'clear_failure',
               'item_failures', 'has_failures', 'define_fleet', 'drop_fleet']::pg_catalog.name[])
           OR p.proname OPERATOR(pg_catalog.~~) 'group\_%');
    -- (in an upgrade, a function whose EXECUTE was already revoked from
    -- PUBLIC stays revoked)
    SELECT pg_catalog.array_agg(f2 ORDER BY f2::pg_catalog.oid) INTO public_fns
    FROM pg_catalog.unnest(fns) f2
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc p,
                  pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                  WHERE p.oid = f2::pg_catalog.oid AND a.grantee = 0 AND a.privilege_type = 'EXECUTE');
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s WITH GRANT OPTION', f, owner_);
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) OWNER TO %s', owner_);
    PERFORM @extschema@.pg_claim_grant_to_public(coalesce(public_fns, '{}'));
    PERFORM pg_catalog.set_config('search_path', path_, true);
END $grants$;

DROP FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]);

-- ==== fleet cap ====
-- (new in 0.6.0, as sql/leases_cap.sql, src/leases.rs, sql/lease_comments.sql and
-- sql/grants.sql) A fleet-wide cap: cap_fleet and fleet_cap (docs/leases.md, "Capping a
-- fleet"; docs/tenants.md).
--
-- cap_fleet(name, g) lets at most g holders of the claim_leases fleet name
-- hold slots at once, for a downstream that allows g concurrent calls. The
-- other members stay members (live while they call, as every member) and
-- hold nothing: they are standbys, and take over when a holder leaves, dies
-- or is paused past its ttl. claim_leases (sql/leases_fleet.sql) applies it
-- under the name's lease mutex, so the calls of the name see one another's
-- outcome in turn:
--   1. the active members are the first g - h live members (max above 0),
--      h the holders of live leases that are not live members (claim_lease's
--      holders), by (held slots at their last call first, then the earliest
--      joined, then by holder): the ones that hold slots keep them, and a
--      joiner or a holder back from a pause past its ttl (a joiner again)
--      queues behind the members already there;
--   2. the planners (by count, and by weight) share n among the active
--      members only;
--   3. an active member that holds nothing takes slots only while fewer
--      than g other holders hold a live lease of the name (claim_lease's
--      holders included): a dead holder's leases expire before its standby
--      takes one of them, so at no moment do g + 1 holders hold a lease;
--   4. a standby gives back what it holds (after its fenced batch in hand,
--      as every give-back) and takes nothing.
-- A lower cap takes effect at each holder's next claim_leases call (within
-- ttl / 3; the worker libraries call at once when a fence is refused): the
-- holders beyond it give back their slots there. A higher cap lets the
-- first standbys take slots at their next call. cap_fleet(name, NULL)
-- removes the cap.
--
-- The cap belongs to the name (kept when the fleet stops, as a define_fleet
-- definition is), and to the role that set it: only a role with the
-- privileges of every live member's and live lease's role, of the
-- definition's owner, and of the role that set the cap before may change
-- it (42501).
--
-- Every call from here to a function of the extension is schema-qualified
-- and exact-typed, and the functions run with search_path = pg_catalog,
-- pg_temp: no object planted in any schema is called.

CREATE TABLE @extschema@.pg_claim_lease_caps (
    name   text        PRIMARY KEY,
    -- at most that many holders hold slots of the name at once
    cap    integer     NOT NULL CHECK (cap >= 1),
    -- the role that set it
    owner  oid         NOT NULL,
    set_at timestamptz NOT NULL
);
REVOKE ALL ON @extschema@.pg_claim_lease_caps FROM PUBLIC;
COMMENT ON TABLE @extschema@.pg_claim_lease_caps IS
    'pg_claim''s fleet-wide caps, one row per capped claim_leases name; written only through cap_fleet';

-- cap_fleet (src/leases.rs) for `role`: the cap before (NULL: none).
CREATE FUNCTION @extschema@.pg_claim_leases_cap(role oid, name text, cap integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    now_ timestamptz;
    crc_ bigint;
    key_ integer;
    old_ integer;
    owner_ oid;
    r record;
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be null' USING ERRCODE = '22004',
            HINT = 'This is cap_fleet''s internal function: call cap_fleet(name, g).';
    END IF;
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = '22004',
            HINT = 'cap_fleet(name, g) lets at most g holders of the lease fleet name hold slots at once: pass the fleet''s name (g NULL removes its cap).';
    END IF;
    IF cap < 1 THEN
        RAISE EXCEPTION 'cap must be at least 1, got %', cap USING ERRCODE = '22023',
            HINT = 'cap_fleet(name, g): g is the most holders that hold slots of the fleet at once; NULL removes the cap. To stop a fleet, stop its workers (or claim_leases with max => 0).';
    END IF;
    -- the name's checks (its length), as for a lease
    PERFORM @extschema@.lease_check(name, 0::integer, 0::bigint, interval '1 second');
    crc_ := @extschema@.crc32(name);
    key_ := (crc_::bit(32))::integer;
    -- the lease mutex, to the end of the transaction: the claims of the
    -- name run before the cap, or after its commit
    PERFORM pg_catalog.pg_advisory_xact_lock(key_, 269484034);
    now_ := pg_catalog.clock_timestamp();

    -- the name exists: a live member, a lease row, a definition, or a cap
    IF NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_lease_caps c WHERE c.name = pg_claim_leases_cap.name)
       AND NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_lease_members m
                   WHERE m.name = pg_claim_leases_cap.name AND m.expires_at > now_)
       AND NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l WHERE l.name = pg_claim_leases_cap.name)
       AND NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_fleets f WHERE f.name = pg_claim_leases_cap.name) THEN
        RAISE EXCEPTION 'fleet "%" does not exist: it has no live member, no lease and no definition', name
            USING ERRCODE = '42704',
            HINT = 'cap_fleet caps a claim_leases fleet: check the name (SELECT * FROM lease_holders(name)), or define the fleet first with define_fleet, then cap it before its workers start.';
    END IF;

    -- the rights: as for resize_fleet, and the cap's own setter
    owner_ := @extschema@.pg_claim_leases_foreign_owner(role, name, now_);
    IF owner_ IS NOT NULL THEN
        RAISE EXCEPTION 'fleet "%" is leased by role %; role % cannot cap it', name,
            owner_::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a role with the privileges of the role whose workers hold the fleet''s leases may cap it: cap it as that role (SET ROLE), or be granted it.';
    END IF;
    SELECT f.owner::oid AS owner INTO r FROM @extschema@.pg_claim_fleets f
    WHERE f.name = pg_claim_leases_cap.name;
    IF FOUND AND NOT @extschema@.pg_claim_fleet_may_change(role, r.owner) THEN
        RAISE EXCEPTION 'fleet "%" is defined by role %; role % cannot cap it', name,
            r.owner::regrole, role::regrole
            USING ERRCODE = '42501',
            HINT = 'Only a member of the role that defined a fleet, or of the extension''s owner, may cap it: ask that role.';
    END IF;
    SELECT c.cap, c.owner INTO r FROM @extschema@.pg_claim_lease_caps c
    WHERE c.name = pg_claim_leases_cap.name
    FOR UPDATE;
    IF FOUND THEN
        old_ := r.cap;
        IF NOT @extschema@.pg_claim_fleet_may_change(role, r.owner) THEN
            RAISE EXCEPTION 'the cap of fleet "%" was set by role %; role % cannot change it', name,
                r.owner::regrole, role::regrole
                USING ERRCODE = '42501',
                HINT = 'Only a member of the role that set a fleet''s cap, or of the extension''s owner, may change it: ask that role.';
        END IF;
    END IF;

    IF cap IS NULL THEN
        DELETE FROM @extschema@.pg_claim_lease_caps c WHERE c.name = pg_claim_leases_cap.name;
    ELSE
        INSERT INTO @extschema@.pg_claim_lease_caps AS c (name, cap, owner, set_at)
        VALUES (name, cap, role, now_)
        ON CONFLICT ON CONSTRAINT pg_claim_lease_caps_pkey DO UPDATE
            SET cap = excluded.cap, owner = excluded.owner, set_at = excluded.set_at;
    END IF;
    RETURN old_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_cap(oid, text, integer) FROM PUBLIC;

-- fleet_cap (src/leases.rs): the cap of the name, NULL when it has none.
-- Only that number (`role` is the shells' first argument; every role that
-- may claim the name may ask).
CREATE FUNCTION @extschema@.pg_claim_fleet_cap(role oid, name text)
RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.cap FROM @extschema@.pg_claim_lease_caps c WHERE c.name = pg_claim_fleet_cap.name
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_fleet_cap(oid, text) FROM PUBLIC;

-- claim_leases' reading of the cap, under the name's mutex (called only by
-- pg_claim_leases_take): NULL when the name has no cap (every live member
-- is active), else the active members (step 1 above) when `holder` is one
-- of them and may take slots (step 3), else an empty array: the holder is a
-- standby. `mine` is what the holder holds after its renewal.
CREATE FUNCTION @extschema@.pg_claim_leases_active(name text, holder text, mine integer, now_ timestamptz)
RETURNS text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
-- every column is qualified: a bare name is one of the arguments
#variable_conflict use_variable
DECLARE
    cap_ integer;
    active_ text[];
    others_ bigint;
    outside_ bigint;
BEGIN
    SELECT c.cap INTO cap_ FROM @extschema@.pg_claim_lease_caps c WHERE c.name = pg_claim_leases_active.name;
    IF cap_ IS NULL THEN
        RETURN NULL;
    END IF;
    -- the holders of live leases but this one, and those of them that are
    -- not live members (one read of the name's slots)
    SELECT count(DISTINCT l.holder) FILTER (WHERE l.holder <> pg_claim_leases_active.holder),
           count(DISTINCT l.holder) FILTER (WHERE NOT EXISTS (
               SELECT 1 FROM @extschema@.pg_claim_lease_members m
               WHERE m.name = pg_claim_leases_active.name AND m.holder = l.holder AND m.expires_at > now_))
    INTO others_, outside_
    FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_leases_active.name AND NOT l.session AND l.holder IS NOT NULL
      AND l.expires_at > now_;
    active_ := ARRAY(SELECT m.holder FROM @extschema@.pg_claim_lease_members m
                     WHERE m.name = pg_claim_leases_active.name AND m.expires_at > now_ AND m.max > 0
                     ORDER BY m.held > 0 DESC, m.joined_at, m.holder COLLATE "C"
                     LIMIT greatest(cap_ - outside_, 0));
    IF NOT holder = ANY (active_) THEN
        RETURN '{}';
    END IF;
    -- an active member with nothing yet waits for the leases of the holders
    -- it replaces to end
    IF mine = 0 AND others_ >= cap_ THEN
        RETURN '{}';
    END IF;
    RETURN active_;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_active(text, text, integer, timestamptz) FROM PUBLIC;

CREATE FUNCTION @extschema@."cap_fleet"(
	"name" TEXT,
	"g" INT
) RETURNS INT
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'cap_fleet_wrapper';

CREATE FUNCTION @extschema@."fleet_cap"(
	"name" TEXT
) RETURNS INT
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'fleet_cap_wrapper';
COMMENT ON FUNCTION @extschema@.cap_fleet(text, integer) IS
    'let at most g holders of the lease fleet name hold slots at once (the other members wait as standbys and take over; NULL: no cap); returns the cap before';
COMMENT ON FUNCTION @extschema@.fleet_cap(text) IS
    'the cap of the lease fleet name (the most holders that hold its slots at once), NULL when it has none';

-- cap_fleet and fleet_cap are granted as claim_leases is (sql/grants.sql,
-- run again)
-- has_failures (the body is that of sql/failures.sql), granted below as
-- the other failure functions are
-- Whether name has any failure record (due, waiting or dead): one look-up of
-- the primary key's first column. A worker asks it now and then to leave
-- the failure records out of its fetch while the name has none.
CREATE FUNCTION @extschema@.has_failures(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL OR pg_catalog.octet_length(name) > 1024 THEN
        PERFORM @extschema@.failure_check(name, ''::text);
    END IF;
    RETURN EXISTS (SELECT 1 FROM @extschema@.pg_claim_failures f WHERE f.name = has_failures.name);
END $$;
COMMENT ON FUNCTION @extschema@.has_failures(text) IS
    'whether name has any failure record (due, waiting or dead)';

-- The grants to PUBLIC, made by the extension's owner: this function is
-- given to the owner below and dropped once called.
CREATE FUNCTION @extschema@.pg_claim_grant_to_public(fns pg_catalog.regprocedure[])
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f pg_catalog.regprocedure;
BEGIN
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) FROM PUBLIC;

DO $grants$
DECLARE
    fns pg_catalog.regprocedure[];
    public_fns pg_catalog.regprocedure[];
    f pg_catalog.regprocedure;
    owner_ pg_catalog.text;
    path_ pg_catalog.text := pg_catalog.current_setting('search_path');
BEGIN
    -- function signatures below print schema-qualified
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    SELECT e.extowner::pg_catalog.regrole::pg_catalog.text INTO owner_
    FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim';
    SELECT pg_catalog.array_agg(p.oid::pg_catalog.regprocedure ORDER BY p.oid) INTO fns
    FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_proc p ON p.oid = d.objid
    WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
      AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
      AND d.deptype = 'e'
      AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim')
      AND (p.proname = ANY (ARRAY[
               'claim_slot', 'claim_slots', 'release_slot', 'my_slot', 'my_slots',
               'slot_holders', 'slot_status',
               'claim_lease', 'claim_leases', 'report_backlog', 'renew_lease', 'release_lease',
               'lease_holders', 'fence', 'lease_valid', 'my_token', 'resize_fleet', 'fleet_n',
               'cap_fleet', 'fleet_cap',
               'claim_partitions', 'my_partitions',
               'record_failure', 'failure_due', 'failing_items', 'clear_failure',
               'item_failures', 'has_failures', 'define_fleet', 'drop_fleet']::pg_catalog.name[])
           OR p.proname OPERATOR(pg_catalog.~~) 'group\_%');
    -- (in an upgrade, a function whose EXECUTE was already revoked from
    -- PUBLIC stays revoked)
    SELECT pg_catalog.array_agg(f2 ORDER BY f2::pg_catalog.oid) INTO public_fns
    FROM pg_catalog.unnest(fns) f2
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc p,
                  pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                  WHERE p.oid = f2::pg_catalog.oid AND a.grantee = 0 AND a.privilege_type = 'EXECUTE');
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s WITH GRANT OPTION', f, owner_);
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) OWNER TO %s', owner_);
    PERFORM @extschema@.pg_claim_grant_to_public(coalesce(public_fns, '{}'));
    PERFORM pg_catalog.set_config('search_path', path_, true);
END $grants$;

DROP FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]);

-- ==== failures ====
-- (the body is that of sql/failures.sql)
-- item_failures(name, VARIADIC items), which a worker's fetch calls once
-- per batch, runs failure_items_check only when one of its checks can fail.
CREATE OR REPLACE FUNCTION @extschema@.item_failures(name text, VARIADIC items text[])
RETURNS TABLE (item text, state text, attempts integer, last_error text,
               first_failed_at timestamptz, last_failed_at timestamptz, retry_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- failure_items_check only when one of its checks can fail (a worker
    -- calls this once per batch: the nested call cost a fifth of it)
    IF name IS NULL OR items IS NULL OR pg_catalog.octet_length(name) > 1024
       OR pg_catalog.array_position(items, NULL) IS NOT NULL
       OR pg_catalog.octet_length(pg_catalog.array_to_string(items, '')) > 1024 THEN
        PERFORM @extschema@.failure_items_check('item_failures'::text, name, items);
    END IF;
    RETURN QUERY
    SELECT f.item,
           @extschema@.pg_claim_failure_state(f.retry_at),
           f.attempts, f.last_error, f.first_failed_at, f.last_failed_at, f.retry_at
    FROM (SELECT DISTINCT k.i FROM pg_catalog.unnest(items) k(i)) k
    -- one look-up of the primary key per item, whatever the table's
    -- statistics say (LIMIT keeps the planner from joining the whole table)
    CROSS JOIN LATERAL (
        SELECT f0.* FROM @extschema@.pg_claim_failures f0
        WHERE f0.name = item_failures.name AND f0.item = k.i LIMIT 1) f
    ORDER BY f.item;
END $$;

-- ==== end ====

-- release_lease takes the slot's fence lock before its row (sql/leases.sql)
CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_release(role oid, name text, slot integer, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('release_lease'::text);
    PERFORM @extschema@.lease_check(name, slot, token, interval '1 second');
    -- only the lease's token (and the owner's rights) may wait for anything
    IF NOT EXISTS (SELECT 1 FROM @extschema@.pg_claim_leases l
                   WHERE l.name = pg_claim_lease_release.name AND l.slot = pg_claim_lease_release.slot
                     AND l.token = pg_claim_lease_release.token AND l.holder IS NOT NULL AND NOT l.session
                     AND l.expires_at > pg_catalog.clock_timestamp()
                     AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))) THEN
        RETURN false;
    END IF;
    -- waits for the holder's own fenced transactions: the slot changes hands
    -- only after them. The fence lock first, then the row: the holder's
    -- claim_leases, which renews under the name's mutex, then skips the
    -- slot instead of waiting for the row (sql/leases_fleet.sql)
    PERFORM pg_catalog.pg_advisory_xact_lock((@extschema@.crc32(name)::bit(32))::integer, 271581184 + slot);
    PERFORM 1 FROM @extschema@.pg_claim_leases l
    WHERE l.name = pg_claim_lease_release.name AND l.slot = pg_claim_lease_release.slot
      AND l.token = pg_claim_lease_release.token AND l.holder IS NOT NULL AND NOT l.session
      AND l.expires_at > pg_catalog.clock_timestamp()
      AND (l.owner IS NULL OR l.owner = role OR pg_catalog.pg_has_role(role, l.owner, 'USAGE'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- released: expired from now on, the last holder kept (lease_holders
    -- and slot_status show since when the slot is unserved)
    UPDATE @extschema@.pg_claim_leases l SET expires_at = pg_catalog.clock_timestamp()
    WHERE l.name = pg_claim_lease_release.name AND l.slot = pg_claim_lease_release.slot;
    RETURN true;
END $$;

-- ==== the claim mutex ====
-- (the bodies are those of sql/leases.sql and sql/leases_fleet.sql)
-- claim_lease and claim_leases wait for the name's claim mutex at most
-- ttl / 3 (or lock_timeout when shorter), then raise 55P03.
CREATE FUNCTION @extschema@.pg_claim_lease_mutex(name text, key_ integer, ttl interval, fn text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- the caller's lock_timeout, in milliseconds (0: none)
    prev text;
    bound bigint;
BEGIN
    IF pg_catalog.pg_try_advisory_lock(key_, 269484034) THEN
        RETURN;
    END IF;
    -- its callers pass checked values; a direct call is checked the same way
    PERFORM @extschema@.lease_check(name, 0::integer, 0::bigint, ttl);
    SELECT s.setting INTO prev FROM pg_catalog.pg_settings s WHERE s.name = 'lock_timeout';
    bound := greatest(1, (extract(epoch FROM ttl) * 1000 / 3)::bigint);
    IF prev::bigint > 0 AND prev::bigint < bound THEN
        bound := prev::bigint;
    END IF;
    PERFORM pg_catalog.set_config('lock_timeout', bound::text, true);
    BEGIN
        PERFORM pg_catalog.pg_advisory_lock(key_, 269484034);
    EXCEPTION WHEN lock_not_available THEN
        -- the error ends the caller's (sub)transaction, which sets
        -- lock_timeout back as it was
        RAISE EXCEPTION '% of "%" gave up after % ms waiting for the name''s claim mutex, which other claims of the name hold',
            fn, name, bound
            USING ERRCODE = '55P03',
            HINT = 'The claims of one name run one at a time, and one waits for the others at most ttl / 3 (the period at which holders renew) or lock_timeout if that is shorter. Call again (the worker libraries do, at their next call). If it happens often, the server is overloaded or a claim of the name runs long: SELECT pid, now() - query_start, query FROM pg_stat_activity WHERE query LIKE ''%claim_lease%''.';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prev, true);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_mutex(text, integer, interval, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_lease_claim(
    role oid, name text, n integer, holder text, ttl interval,
    OUT slot integer, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    crc_ bigint;
    key_ integer;
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('claim_lease'::text);
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    -- The name registry (no two names share a lock key), before the name
    -- mutex: a claim_slot registering the name keeps the registry row
    -- locked until its transaction ends, and then takes the mutex.
    PERFORM @extschema@.pg_claim_register_name(name::pg_catalog.text);
    crc_ := @extschema@.crc32(name);
    key_ := (crc_::bit(32))::integer;
    -- One claimer of a name at a time, for this statement only: a
    -- claim_lease in an open transaction does not hold up other claimers.
    PERFORM @extschema@.pg_claim_lease_mutex(name, key_, ttl, 'claim_lease'::text);
    BEGIN
        SELECT t.slot, t.token, t.expires_at INTO slot, token, expires_at
        FROM @extschema@.pg_claim_lease_take(role, name, n, holder, ttl, crc_, key_) t;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
        RAISE;
    END;
    PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_claim(oid, text, integer, text, interval) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.pg_claim_leases_claim(
    role oid, name text, n integer, holder text, max integer, ttl interval,
    OUT slots integer[], OUT tokens bigint[], OUT expires timestamptz[])
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    crc_ bigint;
    key_ integer;
    max_ integer := coalesce(max, n);
BEGIN
    PERFORM @extschema@.pg_claim_need_read_committed('claim_leases'::text);
    PERFORM @extschema@.pg_claim_lease_claim_check(name, n, holder, ttl);
    PERFORM @extschema@.pg_claim_leases_check(n, max_);
    -- the name registry before the mutex, as claim_lease
    PERFORM @extschema@.pg_claim_register_name(name::pg_catalog.text);
    IF max_ = 0 THEN
        -- leaving: no mutex (it may wait for the holder's fenced transactions)
        PERFORM @extschema@.pg_claim_leases_leave(role, name, holder);
        RETURN;
    END IF;
    crc_ := @extschema@.crc32(name);
    key_ := (crc_::bit(32))::integer;
    PERFORM @extschema@.pg_claim_lease_mutex(name, key_, ttl, 'claim_leases'::text);
    BEGIN
        SELECT t.slots, t.tokens, t.expires INTO slots, tokens, expires
        FROM @extschema@.pg_claim_leases_take(role, name, n, holder, max_, ttl, crc_, key_) t;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
        RAISE;
    END;
    PERFORM pg_catalog.pg_advisory_unlock(key_, 269484034);
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_claim(oid, text, integer, text, integer, interval) FROM PUBLIC;
