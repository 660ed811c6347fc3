-- Balancing a claim_leases fleet by remaining work (docs/leases.md,
-- "Balancing"): report_backlog's internal function and the weighted planner
-- that claim_leases (sql/leases_fleet.sql) runs once a weight is known.
--
-- A slot's weight is the remaining work last reported for it
-- (pg_claim_leases.backlog, kept across hand-overs: the best estimate its
-- next holder has), for a minute after the report (backlog_at); a slot
-- with no weight, or an older one, weighs the average of the others. A
-- report of an unchanged weight writes only to keep it fresh (every 10 s),
-- so a fleet whose holders stop reporting goes back to shares by count a
-- minute later. A slot that another live holder wants (wanted_by) is
-- given back by its holder after its batch in hand (report_backlog tells
-- it), or at its next claim_leases call; pg_claim_lease_hand clears the mark
-- when the slot changes hands. Neither column fires the guard trigger of
-- sql/leases_guard.sql, so fence's session cache stays valid.

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

-- report_backlog (src/leases.rs) for `role`: stores `remaining` as the
-- weight of the lease (name, slot, token), when token is the slot's current
-- token and the lease is role's; returns the slots of the lease's holder
-- that another live holder of the fleet wants (this slot among them when it
-- is; ascending; empty when none), NULL when the token does not hold the
-- lease (nothing stored). NULL remaining stores no weight and only asks;
-- fenced_batches is stored whatever remaining is (NULL: false). Every
-- wanted slot, not only this one: a holder of many slots learns at its next
-- batch of any slot that one is wanted, and gives it back after that batch
-- (found through pg_claim_leases_wanted, an index of the marked rows only).
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

-- The weighted planner, for holder's claim_leases call under the name's
-- mutex (called only by pg_claim_leases_take, after it renewed the holder's
-- `mine` leases): NULL when no slot of the name below n has a fresh weight,
-- or every fresh weight is 0 (no work left: the caller then shares by
-- count), else the holder's lease count after it
--   1. gave back its slots that another live member wants (those no fenced
--      transaction holds);
--   2. took unserved slots, those it wants first, then the heaviest, while
--      its weight is below the fleet's mean (and, whatever its weight,
--      those that weigh at most the slack, so that no slot stays unserved);
--   3. moved to it, when its weight is below the mean by more than the
--      slack (a tenth of the mean), and then until it is within half the
--      slack, slots of the heaviest members (taken at once when its
--      holder's batches of it are fenced, fenced_batches, and no fenced
--      transaction holds it; else marked as wanted): the
--      largest that fits in what it lacks and in what that member has
--      above the mean, else the smallest whose move still lowers the
--      heavier of the two; never a slot that changed hands within
--      least(ttl / 3, 5 s), nor one whose move would not lower the larger
--      weight (the damping rule: no slot bounces).
-- `active` is the active members of a capped fleet (sql/leases_cap.sql),
-- NULL when it is not capped: the others are neither shared with nor
-- taken from. Its own earlier marks are cleared first and made again from
-- the weights of now (none is made while one could not be cleared). The
-- mean is the weight of the slots no claim_lease holder holds over the
-- live (active) members whose max is above 0. Each step reads the name's
-- rows at most once, except the marking, which reads the chosen member's
-- slots once per move (at most 32 moves per call: a joiner's share of 32
-- holders of n = 1024 in one call).
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
