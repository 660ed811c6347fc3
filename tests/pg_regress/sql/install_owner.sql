-- Who can install pg_claim: a database owner who is not a superuser can
-- (the extension is trusted: its script runs as the bootstrap superuser,
-- the extension belongs to the owner); a role without CREATE on the
-- database cannot. (Privileges of the functions: docs/security.md.)
SET client_min_messages = warning;
DROP DATABASE IF EXISTS io_owned;
DROP DATABASE IF EXISTS io_other;
DROP ROLE IF EXISTS io_owner;
DROP ROLE IF EXISTS io_worker;
RESET client_min_messages;
CREATE ROLE io_owner LOGIN;
CREATE ROLE io_worker LOGIN;
CREATE DATABASE io_owned OWNER io_owner;
CREATE DATABASE io_other OWNER io_owner;
SELECT DISTINCT superuser, trusted FROM pg_available_extension_versions WHERE name = 'pg_claim';
SELECT current_database() AS regress_db \gset

\c io_owned io_owner
SELECT rolsuper FROM pg_roles WHERE rolname = current_user;
CREATE EXTENSION pg_claim;
SELECT extowner::regrole AS extension_owner FROM pg_extension WHERE extname = 'pg_claim';
SELECT DISTINCT proowner::regrole AS functions_owner FROM pg_proc
WHERE proname IN ('slot_of', 'claim_slot', 'my_items', 'claim_lease', 'fence');
-- and it works for the owner and for another role
SELECT slot_of(42, 8) AS slot_of, claim_slot('io', 2) AS claimed, release_slot('io') AS released;
SELECT count(*) AS leased FROM claim_lease('io_lease', 1, 'owner');
CREATE TABLE io_items (id bigint PRIMARY KEY);
INSERT INTO io_items SELECT generate_series(1, 10);
GRANT SELECT ON io_items TO io_worker;
\c io_owned io_worker
SELECT count(*) AS share FROM my_items(NULL::io_items, 0, 2);
SELECT count(*) AS leased FROM claim_lease('io_lease_worker', 1, 'worker');

-- without CREATE on the database a role cannot install it
\c io_other io_worker
CREATE EXTENSION pg_claim;

\c :regress_db postgres
DROP DATABASE io_owned;
DROP DATABASE io_other;
DROP ROLE io_owner;
DROP ROLE io_worker;
