-- Leases belong to roles: a role without the privileges of a lease's owner
-- sees the slot but not its holder or token, and cannot renew, release,
-- fence with, validate or steal it; a name is leased by one role at a time;
-- a fleet whose workers log in as different roles shares a name through a
-- common role; no role can call the internal functions. (docs/leases.md)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP ROLE IF EXISTS lr_a;
DROP ROLE IF EXISTS lr_b;
DROP ROLE IF EXISTS lr_w1;
DROP ROLE IF EXISTS lr_w2;
DROP ROLE IF EXISTS lr_fleet;
RESET client_min_messages;
CREATE ROLE lr_a;
CREATE ROLE lr_b;
CREATE ROLE lr_fleet;
CREATE ROLE lr_w1 IN ROLE lr_fleet;
CREATE ROLE lr_w2 IN ROLE lr_fleet;
CREATE TABLE lr_got (who text PRIMARY KEY, slot integer, token bigint);
GRANT ALL ON lr_got TO PUBLIC;

-- a's lease: a sees its holder and token
SET ROLE lr_a;
INSERT INTO lr_got SELECT 'a', slot, token FROM claim_lease('lr', 2, 'a-1');
SELECT slot, holder, token = (SELECT token FROM lr_got WHERE who = 'a') AS own_token, expired
FROM lease_holders('lr');
SELECT slot, state, holder, token = (SELECT token FROM lr_got WHERE who = 'a') AS own_token
FROM slot_status('lr', 2);
RESET ROLE;

-- b sees that slot 0 is leased, not by whom nor its token
SET ROLE lr_b;
SELECT slot, holder, token, acquired_at IS NOT NULL AS since_shown, expired FROM lease_holders('lr');
SELECT slot, state, holder, token FROM slot_status('lr', 2);
-- with a's token (read elsewhere) b can neither renew, release nor validate
-- it: the token looks wrong to b
SELECT renew_lease('lr', 0, (SELECT token FROM lr_got WHERE who = 'a'), '1 hour') IS NULL AS renew_lost,
       release_lease('lr', 0, (SELECT token FROM lr_got WHERE who = 'a')) AS released,
       lease_valid('lr', 0, (SELECT token FROM lr_got WHERE who = 'a')) AS valid;
SELECT pc_try(format('SELECT fence(%L, 0, %s)', 'lr', (SELECT token FROM lr_got WHERE who = 'a'))) AS fence;
-- nor lease the name while a's lease is live, not even under a's holder text
SELECT pc_try($$SELECT * FROM claim_lease('lr', 2, 'b-1')$$) AS claim;
SELECT pc_try($$SELECT * FROM claim_lease('lr', 2, 'a-1')$$) AS claim_as_a_holder;
-- nor call the internal functions with a's oid
SELECT pc_try(format('SELECT pg_claim_lease_renew(%s, %L, 0, %s, %L)', 'lr_a'::regrole::oid, 'lr',
              (SELECT token FROM lr_got WHERE who = 'a'), '1 hour')) AS internal_renew;
SELECT pc_try(format('SELECT * FROM pg_claim_lease_holders(%s, %L)', 'lr_a'::regrole::oid, 'lr')) AS internal_holders;
SELECT pc_try($$SELECT pg_claim_leased('lr')$$) AS internal_leased;
SELECT pc_try($$SELECT * FROM pg_claim_lease_take(0, 'lr', 2, 'b', '1 hour', 0, 0)$$) AS internal_take;
RESET ROLE;

-- a's lease is untouched; a still renews, fences and releases it
SET ROLE lr_a;
SELECT slot, holder, token = (SELECT token FROM lr_got WHERE who = 'a') AS same_token FROM lease_holders('lr');
SELECT renew_lease('lr', 0, (SELECT token FROM lr_got WHERE who = 'a')) IS NOT NULL AS renewed;
SELECT fence('lr', 0, (SELECT token FROM lr_got WHERE who = 'a'));
-- the session now remembers a's row; to b, in the same session, a's token
-- is still wrong
RESET ROLE;
SET ROLE lr_b;
SELECT lease_valid('lr', 0, (SELECT token FROM lr_got WHERE who = 'a')) AS valid_to_b;
RESET ROLE;
SET ROLE lr_a;
SELECT release_lease('lr', 0, (SELECT token FROM lr_got WHERE who = 'a')) AS released;
RESET ROLE;
-- released: now b may lease the name, with a greater token
SET ROLE lr_b;
INSERT INTO lr_got SELECT 'b', slot, token FROM claim_lease('lr', 2, 'b-1');
SELECT slot, token > (SELECT token FROM lr_got WHERE who = 'a') AS greater FROM lr_got WHERE who = 'b';
RESET ROLE;
-- a superuser has the privileges of every role
SELECT slot, holder, token = (SELECT token FROM lr_got WHERE who = 'b') AS token_shown FROM lease_holders('lr');

-- an expired lease of another role is free for anyone: b's short lease,
-- taken over by a; b's renewal and fence then fail
SET ROLE lr_b;
INSERT INTO lr_got SELECT 'b short', slot, token FROM claim_lease('lr_exp', 1, 'b-2', '10 milliseconds');
RESET ROLE;
SELECT pg_sleep(0.05);
SET ROLE lr_a;
INSERT INTO lr_got SELECT 'a taker', slot, token FROM claim_lease('lr_exp', 1, 'a-2');
SELECT slot, token > (SELECT token FROM lr_got WHERE who = 'b short') AS greater FROM lr_got WHERE who = 'a taker';
RESET ROLE;
SET ROLE lr_b;
SELECT renew_lease('lr_exp', 0, (SELECT token FROM lr_got WHERE who = 'b short')) IS NULL AS b_renew_lost;
SELECT slot, holder, token FROM lease_holders('lr_exp');
RESET ROLE;

-- a fleet whose workers log in as lr_w1 and lr_w2 shares a name by claiming
-- as their common role lr_fleet; as themselves, the second one is refused
SET ROLE lr_w1;
SELECT count(*) AS w1_alone FROM claim_lease('lr_fleet_alone', 2, 'w1');
RESET ROLE;
SET ROLE lr_w2;
SELECT pc_try($$SELECT * FROM claim_lease('lr_fleet_alone', 2, 'w2')$$) AS w2_alone;
RESET ROLE;
SET ROLE lr_w1;
SET ROLE lr_fleet;
INSERT INTO lr_got SELECT 'w1', slot, token FROM claim_lease('lr_fleet', 2, 'w1');
RESET ROLE;
SET ROLE lr_w2;
SET ROLE lr_fleet;
INSERT INTO lr_got SELECT 'w2', slot, token FROM claim_lease('lr_fleet', 2, 'w2');
SELECT slot, holder FROM lease_holders('lr_fleet');
RESET ROLE;
-- a member of the owner role has its privileges: lr_w2, as itself, may
-- fence with w1's token (a lease of lr_fleet)
SET ROLE lr_w2;
SELECT lease_valid('lr_fleet', 0, (SELECT token FROM lr_got WHERE who = 'w1')) AS member_valid;
RESET ROLE;
SELECT l.name, l.slot, l.owner::regrole FROM pg_claim_leases l WHERE l.name LIKE 'lr%' AND l.holder IS NOT NULL
ORDER BY 1, 2;

-- session records (my_token) belong to the session's role the same way
SET ROLE lr_a;
SELECT claim_slot('lr_session', 1) AS slot, my_token('lr_session') > 0 AS token;
RESET ROLE;
SET ROLE lr_b;
SELECT slot, holder, token FROM lease_holders('lr_session');
SELECT slot, state, token FROM slot_status('lr_session', 1);
RESET ROLE;
SET ROLE lr_a;
SELECT slot, state, token IS NOT NULL AS token_shown FROM slot_status('lr_session', 1);
SELECT release_slot('lr_session');
RESET ROLE;

DELETE FROM pg_claim_leases WHERE name LIKE 'lr%';
DROP TABLE lr_got;
DROP ROLE lr_a;
DROP ROLE lr_b;
DROP ROLE lr_w1;
DROP ROLE lr_w2;
DROP ROLE lr_fleet;
