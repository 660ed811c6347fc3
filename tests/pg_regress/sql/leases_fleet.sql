-- claim_leases: elastic lease fleets (docs/leases.md, "claim_leases"). In one
-- session, holders are names: each "round" is one call per live holder.
-- Balance after joins and leaves, minimal movement, max, leaving with
-- max => 0, dead tokens of given-back and expired leases, slot_status, bad
-- input. (Races: tests/isolation/specs/leases_fleet.spec; fleets through
-- PgBouncer: tests/pooler/elastic.py.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- One call per holder, in order; then every holder's count of slots.
CREATE FUNCTION lf_round(fleet text, n integer, holders text[], ttl interval DEFAULT '1 minute')
RETURNS void LANGUAGE plpgsql AS $$
DECLARE h text;
BEGIN
    FOREACH h IN ARRAY holders LOOP
        PERFORM count(*) FROM claim_leases(fleet, n, h, ttl => ttl);
    END LOOP;
END $$;
CREATE FUNCTION lf_shares(fleet text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(holder || '=' || c, ' ' ORDER BY holder), '')
    FROM (SELECT holder, count(*) AS c FROM lease_holders(fleet) WHERE NOT expired GROUP BY holder) s
$$;
-- Which holder holds each slot now, to count what moved.
CREATE TABLE lf_before (slot integer, holder text);
CREATE FUNCTION lf_snapshot(fleet text) RETURNS void LANGUAGE sql AS $$
    DELETE FROM lf_before;
    INSERT INTO lf_before SELECT slot, holder FROM lease_holders(fleet) WHERE NOT expired;
$$;
CREATE FUNCTION lf_moved(fleet text) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM lf_before b
    LEFT JOIN (SELECT slot, holder FROM lease_holders(fleet) WHERE NOT expired) a USING (slot)
    WHERE a.holder IS DISTINCT FROM b.holder
$$;

-- One holder serves all n; the result is every slot it holds.
SELECT slot, token > 0 AS token, expires_at > now() AS live FROM claim_leases('lf', 8, 'a');
-- A second joins: counted from its first call, which gets nothing while a
-- holds everything; a gives back down to 4 at its next call; 4/4.
SELECT count(*) AS first_call FROM claim_leases('lf', 8, 'b');
SELECT lf_round('lf', 8, '{a,b}');
SELECT lf_shares('lf') AS two;
-- A third: 3/3/2 within three rounds, and only the joiner's share moves.
SELECT lf_snapshot('lf');
SELECT lf_round('lf', 8, '{c,a,b}');
SELECT lf_round('lf', 8, '{c,a,b}');
SELECT lf_shares('lf') AS three, lf_moved('lf') AS moved;
-- Calls again change nothing: the same slots, the same tokens.
SELECT lf_snapshot('lf');
CREATE TABLE lf_tokens AS SELECT slot, token FROM lease_holders('lf') WHERE NOT expired;
SELECT lf_round('lf', 8, '{a,b,c}');
SELECT lf_moved('lf') AS moved_when_stable,
       (SELECT count(*) FROM lease_holders('lf') h JOIN lf_tokens t USING (slot)
        WHERE NOT h.expired AND h.token <> t.token) AS new_tokens;

-- A graceful leave (max => 0): every slot given back, no row returned, and
-- its tokens dead at once; the others take the leaver's slots and no other.
SELECT slot, token FROM lease_holders('lf') WHERE holder = 'c' AND NOT expired ORDER BY slot LIMIT 1 \gset c_
SELECT count(*) AS leave_returns FROM claim_leases('lf', 8, 'c', max => 0);
SELECT lease_valid('lf', :c_slot, :c_token) AS given_back_valid,
       renew_lease('lf', :c_slot, :c_token) IS NULL AS given_back_renewal_refused;
SELECT pc_try(format('SELECT fence(%L, %s, %s)', 'lf', :c_slot, :c_token)) AS given_back_fence;
SELECT lf_snapshot('lf');
SELECT lf_round('lf', 8, '{a,b}');
SELECT lf_shares('lf') AS after_leave, lf_moved('lf') AS moved;
-- slot_status of an elastic fleet: every slot, served by a or b
SELECT state, count(*) FROM slot_status('lf', 8) GROUP BY state;

-- 8 holders on 64 slots, then a ninth: at most 8 slots move, shares 8 or 7.
SELECT lf_round('lf64', 64, ARRAY(SELECT 'w' || i FROM generate_series(1, 8) i));
SELECT lf_round('lf64', 64, ARRAY(SELECT 'w' || i FROM generate_series(1, 8) i));
SELECT lf_shares('lf64') AS eight;
SELECT lf_snapshot('lf64');
SELECT lf_round('lf64', 64, ARRAY(SELECT 'w' || i FROM generate_series(1, 9) i)) FROM generate_series(1, 3);
SELECT string_agg(DISTINCT c::text, ',') AS shares, lf_moved('lf64') AS moved
FROM (SELECT count(*) AS c FROM lease_holders('lf64') WHERE NOT expired GROUP BY holder) s;
-- a holder that stops calling: its leases expire (a 50 ms ttl here), and
-- its slots, and no other, go to the others
SELECT count(*) AS w9_slots FROM claim_leases('lf64', 64, 'w9', ttl => '50 milliseconds');
SELECT pg_sleep(0.1);
SELECT lf_snapshot('lf64');
SELECT lf_round('lf64', 64, ARRAY(SELECT 'w' || i FROM generate_series(1, 8) i)) FROM generate_series(1, 2);
SELECT lf_shares('lf64') AS after_expiry, lf_moved('lf64') AS moved;
-- the departed holder is forgotten: no member row left behind
SELECT count(*) AS members, count(*) FILTER (WHERE holder = 'w9') AS w9_kept
FROM pg_claim_lease_members WHERE name = 'lf64';

-- An expired lease's token is dead even when no one took the slot: fence
-- and lease_valid refuse it, renew_lease does not revive it, and the next
-- call takes the slot back with a new token.
SELECT slot, token FROM claim_leases('lf_exp', 1, 'solo', ttl => '10 milliseconds') \gset e_
SELECT pg_sleep(0.05);
SELECT lease_valid('lf_exp', :e_slot, :e_token) AS expired_valid,
       renew_lease('lf_exp', :e_slot, :e_token) IS NULL AS expired_renewal_refused;
SELECT pc_try(format('SELECT fence(%L, %s, %s)', 'lf_exp', :e_slot, :e_token)) AS expired_fence;
SELECT slot = :e_slot AS same_slot, token > :e_token AS newer_token FROM claim_leases('lf_exp', 1, 'solo');

-- max: a holder takes at most max; the others share the rest.
SELECT count(*) FROM claim_leases('lf_max', 10, 'small', max => 2);
SELECT lf_round('lf_max', 10, '{big1,big2}');
SELECT count(*) FROM claim_leases('lf_max', 10, 'small', max => 2);
SELECT lf_round('lf_max', 10, '{big1,big2}');
SELECT lf_shares('lf_max') AS capped;

-- Mixed with claim_lease: its holder keeps its one slot and is not counted.
SELECT slot FROM claim_lease('lf_mix', 4, 'single');
SELECT slot FROM claim_leases('lf_mix', 4, 'fleet1');
SELECT lf_shares('lf_mix') AS mixed;

-- With a claim_lease holder on the name, the members share the slots it
-- does not hold, each within one of the others: 5 slots, one held by
-- claim_lease, 4 members: one each (not 2, 1, 1 and 0).
SELECT slot FROM claim_lease('lf_one', 5, 'single');
SELECT lf_round('lf_one', 5, '{m1,m2,m3,m4}') FROM generate_series(1, 4);
SELECT lf_shares('lf_one') AS four_of_five;
-- and as the claim_lease holder comes and goes, still within one
SELECT release_lease('lf_one', slot, token) FROM lease_holders('lf_one') WHERE holder = 'single';
SELECT lf_round('lf_one', 5, '{m1,m2,m3,m4}') FROM generate_series(1, 3);
SELECT lf_shares('lf_one') AS five_slots_four_members;

-- A call reads the name's live holders a bounded number of times, whatever
-- the statistics: 300 holders join a name that the statistics do not know
-- (they estimate one row of it), then one call reads fewer than 20 member
-- rows per live holder and 20 lease rows per slot (a join that runs a
-- subquery again for every row read 300 times that).
ANALYZE pg_claim_lease_members;
ANALYZE pg_claim_leases;
SELECT count(*) AS joined_slots
FROM generate_series(1, 300) g, LATERAL claim_leases('lf_many', 64, 'h' || g, ttl => '1 hour') c;
-- (the counts of earlier transactions not yet written out would add to
-- those of this one: written out first)
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT count(*) AS h1_keeps FROM claim_leases('lf_many', 64, 'h1', ttl => '1 hour');
SELECT relname, seq_tup_read + idx_tup_fetch < 20 * CASE relname WHEN 'pg_claim_leases' THEN 64 ELSE 300 END
       AS bounded
FROM pg_stat_xact_all_tables WHERE relname IN ('pg_claim_lease_members', 'pg_claim_leases') ORDER BY relname;
COMMIT;

-- A failure record of an item of a claim_leases fleet, as for any worker.
SELECT record_failure('lf', '42', 'smtp timeout', 3, '1 second') AS failure_state;
SELECT item, state, attempts FROM item_failures('lf');

-- Bad input: SQLSTATE, a message naming the value, a hint.
SELECT pc_try($$SELECT * FROM claim_leases(NULL, 8, 'h')$$) AS null_name;
SELECT pc_try($$SELECT * FROM claim_leases('lf_bad', NULL, 'h')$$) AS null_n;
SELECT pc_try($$SELECT * FROM claim_leases('lf_bad', 0, 'h')$$) AS zero_n;
SELECT pc_try($$SELECT * FROM claim_leases('lf_bad', 1025, 'h')$$) AS n_above_1024;
SELECT pc_try($$SELECT * FROM claim_leases('lf_bad', 8, '')$$) AS empty_holder;
SELECT pc_try($$SELECT * FROM claim_leases('lf_bad', 8, 'h', max => -1)$$) AS negative_max;
SELECT pc_try($$SELECT * FROM claim_leases('lf_bad', 8, 'h', max => 9)$$) AS max_above_n;
SELECT pc_try($$SELECT * FROM claim_leases('lf_bad', 8, 'h', ttl => '0 seconds')$$) AS zero_ttl;
SELECT pc_try($$SELECT * FROM claim_leases('lf', 16, 'other')$$) AS other_n;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pc_try($$SELECT * FROM claim_leases('lf', 8, 'a')$$) AS repeatable_read;
ROLLBACK;
SELECT claim_slot('lf_sess', 4) AS session_slot;
SELECT pc_try($$SELECT * FROM claim_leases('lf_sess', 4, 'h')$$) AS session_mode;
SELECT release_slot('lf_sess');
