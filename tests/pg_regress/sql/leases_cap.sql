-- cap_fleet and fleet_cap: at most g holders of a claim_leases fleet hold
-- slots at once (docs/leases.md, "Capping a fleet"). In one session, holders
-- are names. Standbys beyond the cap, a leave and a death handed to the
-- first standby, a returning holder queued as a standby, a lower and a
-- higher cap, the weighted planner, claim_lease's holders counted, the
-- errors. (Real workers killed and paused past their ttl through PgBouncer:
-- tests/libs/test_cap.py; other roles and planted objects:
-- tests/security/test_cap.py.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE FUNCTION cp_round(fleet text, holders text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE h text;
BEGIN
    FOREACH h IN ARRAY holders LOOP
        PERFORM count(*) FROM claim_leases(fleet, 8, h, ttl => '1 minute');
    END LOOP;
END $$;
CREATE FUNCTION cp_shares(fleet text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(holder || '=' || c, ' ' ORDER BY holder), '')
    FROM (SELECT holder, count(*) AS c FROM lease_holders(fleet) WHERE NOT expired GROUP BY holder) s
$$;
-- a holder that dies: its member row and leases end now, as at its ttl
CREATE FUNCTION cp_die(fleet text, h text) RETURNS void LANGUAGE sql AS $$
    UPDATE pg_claim_lease_members SET expires_at = clock_timestamp() WHERE name = fleet AND holder = h;
    UPDATE pg_claim_leases SET expires_at = clock_timestamp() WHERE name = fleet AND holder = h;
$$;

-- Three holders, cap 2: the first two share n = 8, the third is a standby.
SELECT cp_round('cp', '{a}');
-- (fleet_cap in a statement of its own: a statement sees what committed before it)
SELECT cap_fleet('cp', 2) AS cap_before;
SELECT fleet_cap('cp') AS cap;
SELECT cp_round('cp', '{b,c}');
SELECT cp_round('cp', '{a,b,c}');
SELECT cp_round('cp', '{a,b,c}');
SELECT cp_shares('cp') AS capped_at_2;
SELECT count(*) AS c_holds FROM claim_leases('cp', 8, 'c');

-- a leaves: the standby takes its slots, and the shares are even again
SELECT count(*) FROM claim_leases('cp', 8, 'a', max => 0);
SELECT cp_round('cp', '{b,c}');
SELECT cp_round('cp', '{b,c}');
SELECT cp_shares('cp') AS after_a_left;
-- a comes back: a joiner queues behind the members already there
SELECT cp_round('cp', '{a,b,c}');
SELECT cp_shares('cp') AS a_back;
-- b dies: the first standby (a) takes over; b back: a standby
SELECT cp_die('cp', 'b');
SELECT cp_round('cp', '{a,c}');
SELECT cp_round('cp', '{a,c}');
SELECT cp_shares('cp') AS after_b_died;
SELECT cp_round('cp', '{b,a,c}');
SELECT cp_shares('cp') AS b_back;

-- A lower cap: the holders beyond it give back at their next call; the
-- one that stays takes every slot.
SELECT cap_fleet('cp', 1) AS cap_before;
SELECT cp_round('cp', '{a,b,c}');
SELECT cp_round('cp', '{a,b,c}');
SELECT cp_shares('cp') AS capped_at_1;
-- A higher cap: the first standbys take their shares.
SELECT cap_fleet('cp', 3) AS cap_before;
SELECT cp_round('cp', '{a,b,c}');
SELECT cp_round('cp', '{a,b,c}');
SELECT cp_round('cp', '{a,b,c}');
SELECT cp_shares('cp') AS capped_at_3;
-- No cap: every member shares.
SELECT cap_fleet('cp', 2) AS cap_before;
SELECT cp_round('cp', '{a,b,c,d}');
SELECT cp_round('cp', '{a,b,c,d}');
SELECT cp_shares('cp') AS capped_at_2_again;
SELECT cap_fleet('cp', NULL) AS cap_before;
SELECT fleet_cap('cp') AS cap;
SELECT cp_round('cp', '{a,b,c,d}');
SELECT cp_round('cp', '{a,b,c,d}');
SELECT cp_shares('cp') AS uncapped;
SELECT cp_round('cp', '{a,b,c,d}') FROM (SELECT count(*) FROM claim_leases('cp', 8, 'a', max => 0)) x;

-- The weighted planner shares among the active members only: a standby
-- neither takes nor marks, and loses its marks.
SELECT cp_round('cw', '{a,b}');
SELECT cap_fleet('cw', 2) AS cap_before;
SELECT cp_round('cw', '{a,b,c}');
SELECT count(*) AS reported FROM lease_holders('cw') h,
       LATERAL report_backlog('cw', h.slot, h.token, CASE WHEN h.holder = 'a' THEN 100 ELSE 1 END) r
WHERE NOT h.expired;
SELECT cp_round('cw', '{c,b,a}');
SELECT cp_round('cw', '{c,b,a}');
SELECT cp_round('cw', '{c,b,a}');
SELECT cp_shares('cw') AS weighted_capped;
SELECT count(*) AS marks_of_standby FROM pg_claim_leases WHERE name = 'cw' AND wanted_by = 'c';
SELECT count(*) AS live_holders FROM (SELECT DISTINCT holder FROM lease_holders('cw') WHERE NOT expired) h;

-- claim_lease's holders count: with a claim_lease holder and one member
-- under cap 2, a second member waits.
SELECT count(*) AS single FROM claim_lease('cs', 8, 'x', '1 minute');
SELECT cap_fleet('cs', 2) AS cap_before;
SELECT cp_round('cs', '{a,b}');
SELECT cp_round('cs', '{a,b}');
SELECT cp_shares('cs') AS with_claim_lease;

-- Errors, each changing nothing.
SELECT pc_try($$SELECT cap_fleet('cp', 0)$$) AS zero;
SELECT pc_try($$SELECT cap_fleet('cp', -3)$$) AS negative;
SELECT pc_try($$SELECT cap_fleet(NULL, 2)$$) AS null_name;
SELECT pc_try($$SELECT cap_fleet('cp_nowhere', 2)$$) AS unknown_name;
SELECT pc_try($$SELECT cap_fleet(repeat('x', 2000), 2)$$) AS long_name;
SELECT fleet_cap('cp') AS unchanged, fleet_cap('cp_nowhere') AS unknown, fleet_cap(NULL) AS null_name;
-- another role: not its fleet, not its definition, not its cap
CREATE ROLE cp_other;
CREATE TABLE cp_jobs (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
GRANT SELECT ON cp_jobs TO cp_other;
SELECT define_fleet('cp_def', 'cp_jobs', 4, 'done');
SELECT cap_fleet('cp_def', 2) AS defined_then_capped;
SELECT cap_fleet('cp_left', 1) FROM (SELECT cp_round('cp_left', '{a}')) x;
SELECT count(*) FROM claim_leases('cp_left', 8, 'a', max => 0);
SET ROLE cp_other;
SELECT pc_try($$SELECT cap_fleet('cw', 1)$$) AS other_role_leases;
SELECT pc_try($$SELECT cap_fleet('cp_def', 1)$$) AS other_role_definition;
SELECT pc_try($$SELECT cap_fleet('cp_left', 3)$$) AS other_role_cap;
SELECT fleet_cap('cw') AS other_role_sees_cap;
RESET ROLE;
SELECT fleet_cap('cw') AS unchanged, fleet_cap('cp_def') AS unchanged_definition,
       fleet_cap('cp_left') AS unchanged_cap;
-- the cap holds the name's mutex only to the end of its transaction
SELECT count(*) AS locks_left FROM pg_locks
WHERE locktype = 'advisory' AND objid = 269484034 AND pid = pg_backend_pid();
SELECT drop_fleet('cp_def');
SELECT count(cap_fleet(f, NULL)) AS caps_removed FROM unnest('{cp_def,cp_left,cw,cs}'::text[]) f;
SELECT count(*) AS caps_left FROM pg_claim_lease_caps;
REVOKE ALL ON cp_jobs FROM cp_other;
DROP ROLE cp_other;
