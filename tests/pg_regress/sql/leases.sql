-- Leases and fencing tokens in one session: claiming, idempotency, renewal,
-- release, expiry and takeover, fencing, session-mode tokens, bad input, and
-- a table that only the functions write. (Races: tests/isolation.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP ROLE IF EXISTS ls_worker;
RESET client_min_messages;

CREATE TABLE ls_got (who text, slot integer, token bigint, expires_at timestamptz);

-- The functions and their markings.
SELECT p.oid::regprocedure AS function, provolatile, prosecdef, proconfig
FROM pg_proc p
WHERE proname IN ('claim_lease', 'renew_lease', 'release_lease', 'lease_holders', 'fence',
                  'lease_valid', 'my_token')
ORDER BY p.oid::regprocedure::text;

-- Lowest free slot first; the same holder gets the same slot and token back
-- with a later expiry; when all n are leased, no row (a standby).
INSERT INTO ls_got SELECT 'w1', * FROM claim_lease('ls', 2, 'w1');
INSERT INTO ls_got SELECT 'w1 again', * FROM claim_lease('ls', 2, 'w1');
INSERT INTO ls_got SELECT 'w2', * FROM claim_lease('ls', 2, 'w2');
INSERT INTO ls_got SELECT 'w3', * FROM claim_lease('ls', 2, 'w3');
SELECT who, slot,
       token = (SELECT token FROM ls_got WHERE who = 'w1') AS token_of_w1,
       expires_at > clock_timestamp() + interval '25 seconds' AS about_30s_ahead
FROM ls_got ORDER BY who;
SELECT (SELECT expires_at FROM ls_got WHERE who = 'w1 again') > (SELECT expires_at FROM ls_got WHERE who = 'w1')
    AS idempotent_claim_extends;
SELECT count(*) AS standby_rows FROM ls_got WHERE who = 'w3';
SELECT slot, holder, expired FROM lease_holders('ls');

-- Another n than the live leases: 55000 naming both.
SELECT pc_try($$SELECT * FROM claim_lease('ls', 3, 'w4')$$) AS other_n;

-- Renewal: a new expiry with the current token, NULL with another.
SELECT renew_lease('ls', 0, (SELECT token FROM ls_got WHERE who = 'w1'), '1 minute')
    > clock_timestamp() + interval '55 seconds' AS renewed;
SELECT renew_lease('ls', 0, 42) IS NULL AS lost_with_another_token;
SELECT renew_lease('ls', 1, (SELECT token FROM ls_got WHERE who = 'w1')) IS NULL AS lost_on_another_slot;

-- Fencing: the current token passes, any other raises PC001.
SELECT fence('ls', 0, (SELECT token FROM ls_got WHERE who = 'w1'));
SELECT lease_valid('ls', 0, (SELECT token FROM ls_got WHERE who = 'w1')) AS valid,
       lease_valid('ls', 0, 42) AS other_token_valid,
       lease_valid('ls', 1, (SELECT token FROM ls_got WHERE who = 'w1')) AS other_slot_valid,
       lease_valid('nothing', 0, 1) AS unknown_name_valid;
SELECT pc_try($$SELECT fence('ls', 0, 42)$$) AS stale_token;
SELECT pc_try($$SELECT fence('nothing', 0, 1)$$) AS never_claimed;

-- Release: true once, then the token is dead; the next claimer gets the slot
-- with a greater token.
SELECT release_lease('ls', 0, (SELECT token FROM ls_got WHERE who = 'w1')) AS released,
       release_lease('ls', 0, (SELECT token FROM ls_got WHERE who = 'w1')) AS released_twice;
SELECT pc_try(format('SELECT fence(%L, 0, %s)', 'ls', (SELECT token FROM ls_got WHERE who = 'w1'))) AS after_release;
INSERT INTO ls_got SELECT 'w3 later', * FROM claim_lease('ls', 2, 'w3');
SELECT slot, token > (SELECT token FROM ls_got WHERE who = 'w1') AS greater_token
FROM ls_got WHERE who = 'w3 later';

-- Expiry and takeover: an expired lease is taken by the next claimer with a
-- greater token; the old holder's renewal and fence fail.
INSERT INTO ls_got SELECT 'short', * FROM claim_lease('ls_exp', 1, 'short', '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT slot, holder, expired FROM lease_holders('ls_exp');
INSERT INTO ls_got SELECT 'taker', * FROM claim_lease('ls_exp', 1, 'taker');
SELECT (SELECT token FROM ls_got WHERE who = 'taker') > (SELECT token FROM ls_got WHERE who = 'short') AS greater_token,
       renew_lease('ls_exp', 0, (SELECT token FROM ls_got WHERE who = 'short')) IS NULL AS old_renewal_lost;
SELECT pc_try(format('SELECT fence(%L, 0, %s)', 'ls_exp', (SELECT token FROM ls_got WHERE who = 'short'))) AS old_fence;
-- an expired lease no one took: its holder gets the same slot back, with a
-- new token (the old one died with the lease)
INSERT INTO ls_got SELECT 'nap', * FROM claim_lease('ls_nap', 1, 'nap', '10 milliseconds');
SELECT pg_sleep(0.05);
INSERT INTO ls_got SELECT 'nap back', * FROM claim_lease('ls_nap', 1, 'nap');
SELECT (SELECT slot FROM ls_got WHERE who = 'nap back') = (SELECT slot FROM ls_got WHERE who = 'nap') AS same_slot,
       (SELECT token FROM ls_got WHERE who = 'nap back') > (SELECT token FROM ls_got WHERE who = 'nap') AS newer_token;

-- Session mode: my_token is the token of this session's claim_slot claim,
-- stable while it holds the slot, NULL without a claim; it fences like a
-- lease. A name is leased or claimed, never both.
SELECT my_token('ls_session') IS NULL AS no_claim_no_token;
SELECT claim_slot('ls_session', 2) AS slot;
SELECT my_token('ls_session') = my_token('ls_session') AS stable, my_token('ls_session') > 0 AS positive;
-- the same holder whatever the session's TimeZone and DateStyle
CREATE TEMP TABLE ls_tok AS SELECT my_token('ls_session') AS t;
SET TimeZone = 'Asia/Tokyo';
SET DateStyle = 'German';
SELECT my_token('ls_session') = (SELECT t FROM ls_tok) AS stable_across_settings;
RESET TimeZone;
RESET DateStyle;
SELECT fence('ls_session', 0, my_token('ls_session'));
SELECT pc_try($$SELECT fence('ls_session', 1, my_token('ls_session'))$$) AS other_slot;
SELECT pc_try($$SELECT * FROM claim_lease('ls_session', 2, 'lessee')$$) AS lease_a_claimed_name;
-- (claim_slot and my_token refuse a leased name)
SELECT pc_try($$SELECT claim_slot('ls', 2)$$) AS claim_slot_of_a_leased_name;
SELECT pc_try($$SELECT my_token('ls')$$) AS token_of_a_leased_name;
SELECT release_slot('ls'), release_slot('ls_session');
SELECT my_token('ls_session') IS NULL AS released_no_token;

-- Bad input: a SQLSTATE, a message naming the value, a hint; nothing made.
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ($$SELECT * FROM claim_lease(NULL, 2, 'w')$$),
    ($$SELECT * FROM claim_lease('x', NULL, 'w')$$),
    ($$SELECT * FROM claim_lease('x', 0, 'w')$$),
    ($$SELECT * FROM claim_lease('x', 2147483647, 'w')$$),
    ($$SELECT * FROM claim_lease('x', 2, NULL)$$),
    ($$SELECT * FROM claim_lease('x', 2, '')$$),
    ($$SELECT * FROM claim_lease(repeat('x', 1025), 2, 'w')$$),
    ($$SELECT my_token(repeat('x', 1025))$$),
    ($$SELECT * FROM claim_lease('x', 2, 'w', NULL)$$),
    ($$SELECT * FROM claim_lease('x', 2, 'w', '0 seconds')$$),
    ($$SELECT * FROM claim_lease('x', 2, 'w', '-1 second')$$),
    ($$SELECT * FROM claim_lease('x', 2, 'w', '300000 years')$$),
    ($$SELECT renew_lease('x', NULL, 1)$$),
    ($$SELECT renew_lease('x', 0, NULL)$$),
    ($$SELECT renew_lease('x', -1, 1)$$),
    ($$SELECT renew_lease('x', 0, 1, '2 days')$$),
    ($$SELECT release_lease(NULL, 0, 1)$$),
    ($$SELECT fence('x', NULL, 1)$$),
    ($$SELECT lease_valid('x', 0, NULL)$$)
) v(t);
SELECT count(*) AS rows_for_x FROM pg_claim_leases WHERE name = 'x';

-- The table is written only through the functions: a worker role may call
-- them but cannot read, forge, extend or steal a lease directly.
CREATE ROLE ls_worker;
SET ROLE ls_worker;
SELECT pc_try($$SELECT * FROM pg_claim_leases$$) AS read_table;
SELECT pc_try($$UPDATE pg_claim_leases SET expires_at = 'infinity'$$) AS extend_directly;
SELECT pc_try($$INSERT INTO pg_claim_leases (name, slot, token) VALUES ('ls', 0, 1)$$) AS forge;
SELECT pc_try($$SELECT next_token(1)$$) AS internal_helper;
SELECT count(*) AS through_functions FROM claim_lease('ls_role', 1, 'role worker');
SELECT slot, holder FROM lease_holders('ls_role');
RESET ROLE;
-- and with EXECUTE revoked, a role cannot claim at all
REVOKE EXECUTE ON FUNCTION claim_lease(text, integer, text, interval) FROM PUBLIC;
SET ROLE ls_worker;
SELECT pc_try($$SELECT * FROM claim_lease('ls_role', 1, 'other')$$) AS without_execute;
RESET ROLE;
GRANT EXECUTE ON FUNCTION claim_lease(text, integer, text, interval) TO PUBLIC;

DELETE FROM pg_claim_leases WHERE name LIKE 'ls%';
DROP TABLE ls_got;
DROP ROLE ls_worker;
