-- Balancing a claim_leases fleet by remaining work (docs/leases.md,
-- "Balancing"): report_backlog's weights and marks, the weighted planner's
-- moves, the damping rule, standbys, max, and bad input. In one session,
-- holders are names. (Races of the hand-over:
-- tests/isolation/specs/leases_balance.spec.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE FUNCTION lb_round(fleet text, n integer, holders text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE h text;
BEGIN
    FOREACH h IN ARRAY holders LOOP
        PERFORM count(*) FROM claim_leases(fleet, n, h, ttl => '1 minute');
    END LOOP;
END $$;
-- every live lease as holder:slots
CREATE FUNCTION lb_shares(fleet text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(holder || '=' || slots, ' ' ORDER BY holder), '')
    FROM (SELECT holder, string_agg(slot::text, ',' ORDER BY slot) AS slots
          FROM lease_holders(fleet) WHERE NOT expired GROUP BY holder) s
$$;
CREATE FUNCTION lb_token(fleet text, s integer) RETURNS bigint LANGUAGE sql AS $$
    SELECT token FROM lease_holders(fleet) WHERE slot = s AND NOT expired
$$;
-- each holder reports the same remaining for every slot it holds
CREATE FUNCTION lb_report(fleet text, h text, remaining bigint) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(slot || ':' || coalesce(report_backlog(fleet, slot, token, remaining)::text, 'null'), ','
                      ORDER BY slot)
    FROM lease_holders(fleet) WHERE holder = h AND NOT expired
$$;
-- the slots marked as wanted, by whom (the table is the extension's)
CREATE FUNCTION lb_wanted(fleet text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(slot || '>' || wanted_by, ' ' ORDER BY slot), '')
    FROM pg_claim_leases WHERE name = fleet AND wanted_by IS NOT NULL
$$;
-- the leases as if they changed hands a minute ago (past the damping)
CREATE FUNCTION lb_age(fleet text) RETURNS void LANGUAGE sql AS $$
    UPDATE pg_claim_leases SET acquired_at = acquired_at - interval '1 minute' WHERE name = fleet
$$;

-- With no weight reported, shares by count: 4 and 4.
SELECT lb_round('lb', 8, '{a,b}'), lb_round('lb', 8, '{a,b}');
SELECT lb_shares('lb') AS by_count;
-- a has 400 left over its 4 slots, b nothing: a report stores the weight
-- and answers {} (none of its slots is wanted elsewhere).
SELECT lb_report('lb', 'a', 100) AS a_reports, lb_report('lb', 'b', 0) AS b_reports;
-- b has nothing left, but the slots changed hands just now: damping, no mark.
SELECT count(*) AS b_slots FROM claim_leases('lb', 8, 'b', ttl => '1 minute');
SELECT lb_wanted('lb') AS wanted_while_damped;
-- Past the damping, b (0, below the mean 200) marks a's slots, largest
-- first within what it lacks: two of 100, and the two are even.
SELECT lb_age('lb');
SELECT count(*) AS b_slots FROM claim_leases('lb', 8, 'b', ttl => '1 minute');
SELECT lb_wanted('lb') AS wanted;
-- A call again marks the same slots (its marks are made again, not added).
SELECT count(*) AS b_slots FROM claim_leases('lb', 8, 'b', ttl => '1 minute');
SELECT lb_wanted('lb') AS wanted_again;
-- a learns it from its next batch's report, of any of its slots: slots 0 and 1.
SELECT lb_report('lb', 'a', NULL) AS a_asks;
-- a gives slot 0 back after its batch; b takes it at its next call, with a
-- new token; a's old token of slot 0 is dead.
SELECT lb_token('lb', 0) AS old_token \gset
SELECT release_lease('lb', 0, :old_token) AS released;
SELECT count(*) AS b_slots FROM claim_leases('lb', 8, 'b', ttl => '1 minute');
SELECT lb_shares('lb') AS after_release;
SELECT pc_try(format('SELECT fence(%L, 0, %s)', 'lb', :old_token)) AS old_token_fence;
SELECT report_backlog('lb', 0, :old_token, 5) IS NULL AS old_token_report_refused;
-- a's renew gives back the slot still wanted (slot 1); b takes it.
SELECT count(*) AS a_slots FROM claim_leases('lb', 8, 'a', ttl => '1 minute');
SELECT count(*) AS b_slots FROM claim_leases('lb', 8, 'b', ttl => '1 minute');
SELECT lb_shares('lb') AS even_by_weight, lb_wanted('lb') AS wanted_left;
-- A stable fleet: more calls move nothing.
SELECT lb_round('lb', 8, '{a,b,a,b}');
SELECT lb_shares('lb') AS stable;
-- Damping: b's new slots 0 and 1 now carry the work, a's none; a is light,
-- but the slots that just moved do not move back.
SELECT lb_report('lb', 'a', 0) AS a_reports;
SELECT string_agg(slot || ':' || report_backlog('lb', slot, token, CASE WHEN slot < 2 THEN 100 ELSE 0 END)::text, ','
                  ORDER BY slot) AS b_reports
FROM lease_holders('lb') WHERE holder = 'b' AND NOT expired;
SELECT count(*) AS a_slots FROM claim_leases('lb', 8, 'a', ttl => '1 minute');
SELECT lb_wanted('lb') AS no_bounce;
-- Past the damping, a takes one of them: the move lowers the larger weight.
SELECT lb_age('lb');
SELECT count(*) AS a_slots FROM claim_leases('lb', 8, 'a', ttl => '1 minute');
SELECT lb_wanted('lb') AS wanted_by_a;
-- a leaves (max => 0): b takes every slot; the slot a wanted is no longer wanted.
SELECT count(*) AS a_left FROM claim_leases('lb', 8, 'a', max => 0);
SELECT count(*) AS b_slots FROM claim_leases('lb', 8, 'b', ttl => '1 minute');
SELECT lb_shares('lb') AS after_leave, lb_wanted('lb') AS wanted_after_leave;

-- A standby: one slot of weight 100, a second holder with nothing does not
-- take it (the move would not lower the larger weight).
SELECT lb_round('lb1', 1, '{a,b}');
SELECT lb_report('lb1', 'a', 100) AS a_reports;
SELECT lb_age('lb1');
SELECT lb_round('lb1', 1, '{b,a,b}');
SELECT lb_shares('lb1') AS standby_stays, lb_wanted('lb1') AS wanted;

-- max: a holder takes and marks at most max slots. c joins a fleet whose
-- slots all carry work, with max => 1.
SELECT lb_round('lbm', 4, '{a}');
SELECT lb_report('lbm', 'a', 10) AS a_reports;
SELECT lb_age('lbm');
SELECT count(*) AS c_slots FROM claim_leases('lbm', 4, 'c', max => 1, ttl => '1 minute');
SELECT lb_wanted('lbm') AS wanted_within_max;

-- A joiner of two holders of 48 slots of 100 each (mean 3200 with it, slack
-- 320) marks in one call up to 32 slots, of both, and once it marks goes on
-- to within half the slack of the mean: 31 slots (3100).
SELECT lb_round('lbj', 96, '{a,b}'), lb_round('lbj', 96, '{a,b}');
SELECT length(lb_report('lbj', 'a', 100)) > 0 AS a_reports, length(lb_report('lbj', 'b', 100)) > 0 AS b_reports;
SELECT lb_age('lbj');
SELECT count(*) AS c_slots FROM claim_leases('lbj', 96, 'c', ttl => '1 minute');
SELECT count(*) AS c_marks, count(*) FILTER (WHERE holder = 'a') AS of_a, count(*) FILTER (WHERE holder = 'b') AS of_b
FROM pg_claim_leases WHERE name = 'lbj' AND wanted_by = 'c';

-- A weight counts for a minute after its report: a fleet whose reports
-- stopped shares by count again (no marks), until its holders report anew.
SELECT lb_round('lbf', 4, '{a,b}'), lb_round('lbf', 4, '{a,b}');
SELECT lb_report('lbf', 'a', 100) AS a_reports, lb_report('lbf', 'b', 0) AS b_reports;
SELECT lb_age('lbf');
UPDATE pg_claim_leases SET backlog_at = backlog_at - interval '2 minutes' WHERE name = 'lbf';
SELECT lb_round('lbf', 4, '{b,a,b}');
SELECT lb_shares('lbf') AS stale_by_count, lb_wanted('lbf') AS stale_wanted;
SELECT lb_report('lbf', 'a', 100) AS a_reports_again, lb_report('lbf', 'b', 0) AS b_reports_again;
SELECT count(*) AS b_slots FROM claim_leases('lbf', 4, 'b', ttl => '1 minute');
SELECT lb_wanted('lbf') AS fresh_wanted;

-- No work left anywhere (every weight 0): shares by count, so a joiner of
-- a drained fleet gets its share.
SELECT lb_round('lbz', 4, '{a}');
SELECT lb_report('lbz', 'a', 0) AS a_reports;
SELECT lb_round('lbz', 4, '{b,a,b}');
SELECT lb_shares('lbz') AS drained_by_count;

-- Fenced batches: a holder whose reports say that every batch of a slot
-- passes fence before it reads (fenced_batches => true, as the worker
-- libraries' batches do) loses a slot that no batch holds at once, with no
-- mark: its old token is refused at its next batch. The mark is cleared by
-- the hand-over (the new holder says it again), and a report without it
-- clears it (the last report counts). (A slot whose batch is open is marked
-- instead: tests/isolation/specs/leases_balance.spec.)
SELECT lb_round('lbt', 4, '{a}');
SELECT string_agg(slot || ':' || report_backlog('lbt', slot, token, 100, fenced_batches => true)::text, ','
                  ORDER BY slot) AS a_reports_fenced
FROM lease_holders('lbt') WHERE holder = 'a';
SELECT string_agg(slot::text, ',' ORDER BY slot) AS fenced FROM pg_claim_leases WHERE name = 'lbt' AND fenced_batches;
SELECT lb_age('lbt');
SELECT lb_token('lbt', 0) AS old_token \gset
SELECT count(*) AS b_slots FROM claim_leases('lbt', 4, 'b', ttl => '1 minute');
SELECT lb_shares('lbt') AS taken_at_once, lb_wanted('lbt') AS wanted;
SELECT pc_try(format('SELECT fence(%L, 0, %s)', 'lbt', :old_token)) AS old_token_fence;
SELECT string_agg(slot::text, ',' ORDER BY slot) AS still_fenced FROM pg_claim_leases WHERE name = 'lbt' AND fenced_batches;
SELECT lb_report('lbt', 'a', 100) AS a_reports_unfenced;
SELECT count(*) FILTER (WHERE fenced_batches) AS fenced_left FROM pg_claim_leases WHERE name = 'lbt';

-- Bad input: SQLSTATE, a message naming the value, a hint.
SELECT lb_token('lb', 2) AS tok \gset
SELECT pc_try(format('SELECT report_backlog(%L, 2, %s, -1)', 'lb', :tok)) AS negative_remaining;
SELECT pc_try(format('SELECT report_backlog(%L, 2, %s, %L)', 'lb', :tok, 'abc')) AS non_numeric_remaining;
SELECT pc_try($$SELECT report_backlog('lb_none', 0, 1, 5)$$) AS unknown_fleet;
SELECT pc_try($$SELECT report_backlog(NULL, 0, 1, 5)$$) AS null_name;
SELECT pc_try($$SELECT report_backlog('lb', NULL, 1, 5)$$) AS null_slot;
SELECT pc_try($$SELECT report_backlog('lb', -1, 1, 5)$$) AS negative_slot;
SELECT report_backlog('lb', 2, 1, 5) IS NULL AS wrong_token_refused;
