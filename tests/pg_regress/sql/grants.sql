-- Who may claim (docs/claiming.md, "Who may claim"): the functions that take,
-- renew or report claims are granted to PUBLIC by the extension's owner, so
-- that the owner, also a database owner who installed pg_claim as a trusted
-- extension, can revoke them and grant them to chosen roles.
SET client_min_messages = warning;
DROP DATABASE IF EXISTS gr_owned;
DROP DATABASE IF EXISTS gr_super;
DROP ROLE IF EXISTS gr_owner;
DROP ROLE IF EXISTS gr_worker;
DROP ROLE IF EXISTS gr_other;
RESET client_min_messages;
CREATE ROLE gr_owner LOGIN CREATEDB;
CREATE ROLE gr_worker LOGIN;
CREATE ROLE gr_other LOGIN;
SELECT current_database() AS regress_db \gset

-- A database owner who is not a superuser creates its database and installs
-- pg_claim (trusted): the functions belong to the bootstrap superuser.
\c :regress_db gr_owner
CREATE DATABASE gr_owned;
\c gr_owned gr_owner
CREATE EXTENSION pg_claim;
SELECT extowner::regrole FROM pg_extension WHERE extname = 'pg_claim';
SELECT proowner::regrole, proacl FROM pg_proc WHERE oid = 'claim_slot(text, integer)'::regprocedure;
-- every claiming function, each overload, is granted to PUBLIC by the owner;
-- the pure mappings keep their default grant
SELECT p.proname, count(*) AS overloads,
       bool_and(p.proacl::text[] @> ARRAY['=X/gr_owner', 'gr_owner=X*/postgres']) AS granted_by_owner
FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_claim')
  AND p.proacl IS NOT NULL AND 'gr_owner=X*/postgres' = ANY (p.proacl::text[])
GROUP BY 1 ORDER BY 1;
SELECT proacl IS NULL AS default_grant FROM pg_proc WHERE oid = 'slot_of(bigint, integer)'::regprocedure;
-- no temporary function is left behind
SELECT count(*) AS leftovers FROM pg_proc WHERE proname = 'pg_claim_grant_to_public';

-- The owner restricts claim_slot(text, integer) to gr_worker.
REVOKE EXECUTE ON FUNCTION claim_slot(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_slot(text, integer) TO gr_worker;
\c gr_owned gr_other
SELECT claim_slot('gr_fleet', 2);
SELECT has_function_privilege('claim_slot(text, integer)', 'EXECUTE') AS other_may_claim,
       has_function_privilege('slot_of(bigint, integer)', 'EXECUTE') AS other_may_map;
\c gr_owned gr_worker
SELECT claim_slot('gr_fleet', 2) AS worker_claims;
-- and gives it back to everyone
\c gr_owned gr_owner
GRANT EXECUTE ON FUNCTION claim_slot(text, integer) TO PUBLIC;
\c gr_owned gr_other
SELECT claim_slot('gr_fleet2', 2) AS other_claims_again;

-- A superuser acts as the functions' owner, which granted PUBLIC nothing:
-- its REVOKE ... FROM PUBLIC leaves the owner's grant. It revokes as the
-- extension's owner (SET ROLE), or with the owner's grant option (CASCADE).
\c gr_owned postgres
REVOKE EXECUTE ON FUNCTION claim_slots(text, integer, integer) FROM PUBLIC;
SELECT has_function_privilege('gr_other', 'claim_slots(text, integer, integer)', 'EXECUTE') AS after_superuser_revoke;
SET ROLE gr_owner;
REVOKE EXECUTE ON FUNCTION claim_slots(text, integer, integer) FROM PUBLIC;
RESET ROLE;
SELECT has_function_privilege('gr_other', 'claim_slots(text, integer, integer)', 'EXECUTE') AS after_revoke_as_owner;
REVOKE GRANT OPTION FOR EXECUTE ON FUNCTION release_slot(text) FROM gr_owner CASCADE;
SELECT has_function_privilege('gr_other', 'release_slot(text)', 'EXECUTE') AS after_cascade;

-- Installed by a superuser, the superuser is the extension's owner and its
-- REVOKE works as before.
\c :regress_db postgres
CREATE DATABASE gr_super;
\c gr_super postgres
CREATE EXTENSION pg_claim;
SELECT proacl FROM pg_proc WHERE oid = 'claim_slot(text, integer)'::regprocedure;
REVOKE EXECUTE ON FUNCTION claim_slot(text, integer) FROM PUBLIC;
\c gr_super gr_other
SELECT claim_slot('gr_fleet', 2);
\c gr_super postgres
GRANT EXECUTE ON FUNCTION claim_slot(text, integer) TO gr_other;
\c gr_super gr_other
SELECT claim_slot('gr_fleet', 2) AS granted_claims;

\c :regress_db postgres
DROP DATABASE gr_owned;
DROP DATABASE gr_super;
DROP ROLE gr_owner;
DROP ROLE gr_worker;
DROP ROLE gr_other;
