-- resize_fleet and fleet_n: the online resize of a claim_leases fleet
-- (docs/leases.md, "Resizing"). In one session, holders are names. Growing
-- and shrinking: old tokens dead, PC002 for the old n (member and joiner),
-- each holder's own slots taken back first, the lease rows and balance
-- weights, the definition's n, the errors. (The wait for fenced
-- transactions and a concurrent resize: tests/isolation/specs/leases_resize.spec;
-- other roles and planted objects: tests/security/test_resize.py.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE FUNCTION rs_round(fleet text, n integer, holders text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE h text;
BEGIN
    FOREACH h IN ARRAY holders LOOP
        PERFORM count(*) FROM claim_leases(fleet, n, h, ttl => '1 minute');
    END LOOP;
END $$;
CREATE FUNCTION rs_shares(fleet text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(holder || '=' || slots, ' ' ORDER BY holder), '')
    FROM (SELECT holder, string_agg(slot::text, ',' ORDER BY slot) AS slots
          FROM lease_holders(fleet) WHERE NOT expired GROUP BY holder) s
$$;

-- Two holders share n = 4.
SELECT rs_round('rs', 4, '{a,b}');
SELECT rs_round('rs', 4, '{a,b}');
SELECT rs_shares('rs') AS before, fleet_n('rs') AS n;
CREATE TABLE rs_old AS SELECT slot, token FROM lease_holders('rs') WHERE NOT expired;
SELECT report_backlog('rs', o.slot, o.token, 10) FROM rs_old o WHERE o.slot = 0;

-- Grow to 8: the old n back, every old token dead (fence: PC001), every
-- weight cleared, every row of n = 8, the members' n 8 and nothing held.
-- (fleet_n in a statement of its own: a statement sees what committed before it)
SELECT resize_fleet('rs', 8) AS old_n;
SELECT fleet_n('rs') AS n;
SELECT count(*) FILTER (WHERE lease_valid('rs', o.slot, o.token)) AS old_tokens_valid FROM rs_old o;
SELECT pc_try(format('SELECT fence(%L, %s, %s)', 'rs', o.slot, o.token)) AS old_token_fence
FROM rs_old o WHERE o.slot = 1;
SELECT count(*) AS rows, count(*) FILTER (WHERE n = 8) AS of_n_8,
       count(*) FILTER (WHERE backlog IS NOT NULL OR backlog_at IS NOT NULL OR wanted_by IS NOT NULL) AS weighted,
       count(*) FILTER (WHERE holder IS NOT NULL AND expires_at > clock_timestamp()) AS live
FROM pg_claim_leases WHERE name = 'rs';
SELECT holder, n, held FROM pg_claim_lease_members WHERE name = 'rs' ORDER BY holder;

-- The old n: PC002 naming the fleet's n, for a member, a joiner and
-- claim_lease.
SELECT pc_try($$SELECT * FROM claim_leases('rs', 4, 'a')$$) AS member_old_n;
SELECT pc_try($$SELECT * FROM claim_leases('rs', 4, 'c')$$) AS joiner_old_n;
-- claim_lease too, while the members hold no lease yet
SELECT pc_try($$SELECT * FROM claim_lease('rs', 4, 'single')$$) AS claim_lease_old_n;
-- The new n: each holder takes its own slots back first, then the new ones.
SELECT rs_round('rs', 8, '{a,b}');
SELECT rs_round('rs', 8, '{a,b}');
SELECT rs_shares('rs') AS after_grow;
SELECT count(*) AS new_tokens FROM lease_holders('rs') h JOIN rs_old o USING (slot)
WHERE NOT h.expired AND h.token > o.token;

-- Shrink to 3: the rows of slots 3 .. 7 are gone, the others given back.
SELECT resize_fleet('rs', 3) AS old_n;
SELECT fleet_n('rs') AS n;
SELECT array_agg(slot ORDER BY slot) AS slots, bool_and(n = 3) AS n_3,
       count(*) FILTER (WHERE expires_at > clock_timestamp()) AS live
FROM pg_claim_leases WHERE name = 'rs';
SELECT rs_round('rs', 3, '{a,b}');
SELECT rs_round('rs', 3, '{a,b}');
SELECT rs_shares('rs') AS after_shrink;
SELECT pc_try($$SELECT * FROM claim_leases('rs', 8, 'b')$$) AS member_old_n_after_shrink;

-- Stop, change n, start still works: once every member left, the first
-- call's n is the fleet's.
SELECT count(*) FROM claim_leases('rs', 3, 'a', max => 0);
SELECT count(*) FROM claim_leases('rs', 3, 'b', max => 0);
SELECT fleet_n('rs') AS n_when_stopped;
SELECT count(*) AS started_with_5 FROM claim_leases('rs', 5, 'c');
SELECT fleet_n('rs') AS n;
SELECT count(*) FROM claim_leases('rs', 5, 'c', max => 0);

-- A record of a session that left passes fence until its slot changes
-- hands; a resize ends it too.
SELECT claim_slot('rs_stale', 2) AS stale_slot;
SELECT my_token('rs_stale') AS stale_token \gset
SELECT release_slot('rs_stale');
SELECT slot FROM claim_leases('rs_stale', 2, 'a', max => 1);
SELECT lease_valid('rs_stale', 0, :stale_token) AS stale_valid_before;
SELECT resize_fleet('rs_stale', 3) AS old_n;
SELECT lease_valid('rs_stale', 0, :stale_token) AS stale_valid_after;
SELECT count(*) FROM claim_leases('rs_stale', 3, 'a', max => 0);

-- A definition's n follows the resize; with no live member fleet_n is the
-- definition's.
CREATE TABLE rs_jobs (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
SELECT define_fleet('rs_def', 'rs_jobs', 4, 'done');
SELECT fleet_n('rs_def') AS defined_n;
SELECT resize_fleet('rs_def', 6) AS old_n;
SELECT fleet_n('rs_def') AS n, (SELECT n FROM fleets WHERE fleet = 'rs_def') AS fleets_n;
SELECT rs_round('rs_def', 6, '{w}');
SELECT resize_fleet('rs_def', 2) AS old_n;
SELECT (SELECT n FROM pg_claim_fleets WHERE name = 'rs_def') AS defined_n, fleet_n('rs_def') AS n;
SELECT pc_try($$SELECT * FROM claim_leases('rs_def', 6, 'w')$$) AS member_old_n;
SELECT count(*) FROM claim_leases('rs_def', 2, 'w', max => 0);
SELECT drop_fleet('rs_def');
SELECT fleet_n('rs_def') AS n_dropped, fleet_n('rs_none') AS unknown, fleet_n(NULL) AS null_name;
-- A definition's n may be far above any lease: the resize locks the fence
-- of the slots that have a row (here one), not of every slot below n.
SELECT define_fleet('rs_wide', 'rs_jobs', 1048576, 'done');
SELECT count(*) FROM claim_lease('rs_wide', 1048576, 'w');
SELECT resize_fleet('rs_wide', 1) AS old_n;
SELECT fleet_n('rs_wide') AS n, (SELECT count(*) FROM pg_claim_leases WHERE name = 'rs_wide') AS rows_left;
SELECT drop_fleet('rs_wide');
DELETE FROM pg_claim_leases WHERE name = 'rs_wide';

-- Errors.
SELECT rs_round('rs_bad', 4, '{a}');
SELECT pc_try($$SELECT resize_fleet('rs_bad', 0)$$) AS zero;
SELECT pc_try($$SELECT resize_fleet('rs_bad', 1025)$$) AS above_cap;
SELECT pc_try($$SELECT resize_fleet('rs_bad', NULL)$$) AS null_n;
SELECT pc_try($$SELECT resize_fleet(NULL, 4)$$) AS null_name;
SELECT pc_try($$SELECT resize_fleet('rs_bad', 4)$$) AS same_n;
SELECT pc_try($$SELECT resize_fleet('rs_nowhere', 4)$$) AS unknown_name;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pc_try($$SELECT resize_fleet('rs_bad', 5)$$) AS repeatable_read;
COMMIT;
SELECT fleet_n('rs_bad') AS unchanged_after_errors;
SELECT count(*) FROM claim_leases('rs_bad', 4, 'a', max => 0);
-- session claims: no token to fence an in-flight batch with
SELECT claim_slot('rs_sess', 4) AS session_slot;
SELECT pc_try($$SELECT resize_fleet('rs_sess', 8)$$) AS session_mode;
SELECT release_slot('rs_sess');
-- another role's fleet, and another role's definition
CREATE ROLE rs_other;
GRANT SELECT ON rs_jobs TO rs_other;
SELECT rs_round('rs_mine', 4, '{a}');
SELECT define_fleet('rs_def2', 'rs_jobs', 4, 'done');
SET ROLE rs_other;
SELECT pc_try($$SELECT resize_fleet('rs_mine', 8)$$) AS other_role_leases;
SELECT pc_try($$SELECT resize_fleet('rs_def2', 8)$$) AS other_role_definition;
SELECT fleet_n('rs_mine') AS other_role_sees_n;
RESET ROLE;
SELECT fleet_n('rs_mine') AS unchanged, fleet_n('rs_def2') AS unchanged_definition;
SELECT count(*) FROM claim_leases('rs_mine', 4, 'a', max => 0);
SELECT drop_fleet('rs_def2');
REVOKE ALL ON rs_jobs FROM rs_other;
DROP ROLE rs_other;
-- the resize holds the name's mutex only to the end of its transaction
SELECT count(*) AS locks_left FROM pg_locks
WHERE locktype = 'advisory' AND objid IN (269484034, 269484036) AND pid = pg_backend_pid();
