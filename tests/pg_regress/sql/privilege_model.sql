-- The privilege model of docs/reliability.md with its three roles: the owner
-- of the work table, a worker role (SELECT on the table, EXECUTE on the
-- claiming functions), and a role with no grants on the table and, once
-- EXECUTE is revoked from PUBLIC, none on the claiming functions.
-- (privileges.sql has the rest: every method and path, partitions, columns.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP ROLE IF EXISTS pm_owner;
DROP ROLE IF EXISTS pm_worker;
DROP ROLE IF EXISTS pm_nobody;
RESET client_min_messages;
CREATE ROLE pm_owner;
CREATE ROLE pm_worker;
CREATE ROLE pm_nobody;
CREATE SCHEMA pm_app AUTHORIZATION pm_owner;
GRANT USAGE ON SCHEMA pm_app TO pm_worker, pm_nobody;

-- The owner's work table, with a policy: the worker sees tenant 'a' only.
SET ROLE pm_owner;
CREATE TABLE pm_app.jobs (id bigint PRIMARY KEY, tenant text NOT NULL, payload text, secret text);
INSERT INTO pm_app.jobs SELECT g, CASE WHEN g % 4 = 0 THEN 'b' ELSE 'a' END, 'p' || g, 's' || g
FROM generate_series(1, 40) g;
ALTER TABLE pm_app.jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY pm_tenant_a ON pm_app.jobs TO pm_worker USING (tenant = 'a');
GRANT SELECT (id, tenant, payload) ON pm_app.jobs TO pm_worker;
RESET ROLE;

-- The claiming functions: EXECUTE for the worker role only.
REVOKE EXECUTE ON FUNCTION claim_slot(text, integer), claim_slot(text, integer, interval),
    claim_lease(text, integer, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_slot(text, integer), claim_slot(text, integer, interval),
    claim_lease(text, integer, text, interval) TO pm_worker;

-- The role with no grants: no share, no count, no claim.
SET ROLE pm_nobody;
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ('SELECT * FROM my_items(NULL::pm_app.jobs, 0, 2, columns => ARRAY[''payload''])'),
    ('SELECT * FROM slot_counts(''pm_app.jobs'', 2)'),
    ('SELECT * FROM slot_skew(''pm_app.jobs'', 2)'),
    ('SELECT claim_slot(''pm'', 2)'),
    ('SELECT claim_slot(''pm'', 2, ''0 seconds'')'),
    ('SELECT * FROM claim_lease(''pm_lease'', 2, ''nobody'')')) v(t);
RESET ROLE;

-- The worker: its share and its counts hold exactly the rows the policy
-- shows it, on its columns; the hidden rows appear in neither.
SET ROLE pm_worker;
SELECT (SELECT count(*) FROM pm_app.jobs) AS visible,
       (SELECT sum(items) FROM slot_counts('pm_app.jobs', 3)) AS counted,
       (SELECT count(*) FROM generate_series(0, 2) s,
               my_items(NULL::pm_app.jobs, s, 3, columns => ARRAY['tenant', 'payload'])) AS shared,
       (SELECT count(*) FROM generate_series(0, 2) s,
               my_items(NULL::pm_app.jobs, s, 3, columns => ARRAY['tenant']) WHERE tenant <> 'a') AS hidden_rows_seen,
       (SELECT count(*) FROM generate_series(0, 2) s,
               my_items(NULL::pm_app.jobs, s, 3, columns => ARRAY['payload']) WHERE secret IS NOT NULL) AS secrets_seen;
SELECT pc_try('SELECT * FROM my_items(NULL::pm_app.jobs, 0, 3)') AS all_columns;
SELECT claim_slot('pm', 2) AS claimed, release_slot('pm') AS released;
SELECT count(*) AS leased FROM claim_lease('pm_lease', 2, 'worker');
RESET ROLE;
-- the owner is not subject to its own policy (no FORCE): it counts all 40
SET ROLE pm_owner;
SELECT sum(items) AS owner_counted FROM slot_counts('pm_app.jobs', 3);
RESET ROLE;

-- A malicious object of the same name earlier in the worker's search_path:
-- a table pm_evil.jobs, and functions named like pg_claim's mappings. A
-- relation is resolved once, from the name the caller wrote, and the
-- generated query names it and every function schema-qualified.
CREATE SCHEMA pm_evil AUTHORIZATION pm_nobody;
GRANT USAGE ON SCHEMA pm_evil TO pm_worker;
SET ROLE pm_nobody;
CREATE TABLE pm_evil.jobs (id bigint PRIMARY KEY, tenant text, payload text, secret text);
INSERT INTO pm_evil.jobs VALUES (1000, 'a', 'evil', 'evil');
CREATE TABLE pm_evil.calls (fn text);
GRANT SELECT ON pm_evil.jobs TO pm_worker;
GRANT INSERT, SELECT ON pm_evil.calls TO pm_worker;
CREATE FUNCTION pm_evil.slot_of(bigint, integer) RETURNS integer LANGUAGE sql AS
    $$ INSERT INTO pm_evil.calls VALUES ('slot_of') RETURNING 0 $$;
CREATE FUNCTION pm_evil.jump_slot(bigint, integer) RETURNS integer LANGUAGE sql AS
    $$ INSERT INTO pm_evil.calls VALUES ('jump_slot') RETURNING 0 $$;
CREATE FUNCTION pm_evil.next_token(bigint) RETURNS bigint LANGUAGE sql AS
    $$ INSERT INTO pm_evil.calls VALUES ('next_token') RETURNING 1::bigint $$;
CREATE TABLE pm_evil.pg_claim_leases (name text, slot integer, n integer, holder text, session boolean, token bigint, acquired_at timestamptz, expires_at timestamptz);
GRANT INSERT, UPDATE, SELECT ON pm_evil.pg_claim_leases TO pm_worker;
RESET ROLE;
SET ROLE pm_worker;
SET search_path = pm_evil, public;
SELECT (SELECT sum(items) FROM slot_counts('pm_app.jobs', 3)) AS counted,
       (SELECT sum(items) FROM slot_counts('pm_app.jobs', 3, method => 'jump')) AS counted_jump,
       (SELECT count(*) FROM my_items(NULL::pm_app.jobs, 0, 1, columns => ARRAY['payload'])) AS shared,
       (SELECT count(*) FROM my_items(NULL::pm_app.jobs, 0, 1, columns => ARRAY['payload']) WHERE id = 1000) AS evil_rows;
SELECT my_items_query('pm_app.jobs'::regtype, 0, 2, columns => ARRAY['payload']);
-- the lease functions pin their search_path: the look-alike table and
-- next_token are not used
SELECT count(*) AS leased FROM claim_lease('pm_path', 1, 'worker');
CREATE TEMP TABLE pg_claim_leases (name text, slot integer, n integer, holder text, session boolean, token bigint, acquired_at timestamptz, expires_at timestamptz);
SELECT count(*) AS leased_again FROM claim_lease('pm_path', 1, 'worker');
SELECT fence('pm_path', 0, (SELECT token FROM public.lease_holders('pm_path')));
SELECT (SELECT count(*) FROM pm_evil.pg_claim_leases) AS evil_table_rows,
       (SELECT count(*) FROM pg_temp.pg_claim_leases) AS temp_table_rows,
       (SELECT count(*) FROM pm_evil.calls) AS evil_calls;
RESET search_path;
DROP TABLE pg_temp.pg_claim_leases;
RESET ROLE;
SELECT slot, holder FROM lease_holders('pm_path');

-- The lease table cannot be written around: the worker may call the
-- functions but cannot read, forge, extend, delete, truncate or alter a
-- lease directly, nor call the internal helpers; a wrong token neither
-- releases, renews nor fences another holder's lease.
SET ROLE pm_worker;
SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ('SELECT * FROM pg_claim_leases'),
    ('INSERT INTO pg_claim_leases (name, slot, token) VALUES (''pm_lease'', 1, 1)'),
    ('UPDATE pg_claim_leases SET expires_at = ''infinity'''),
    ('DELETE FROM pg_claim_leases'),
    ('TRUNCATE pg_claim_leases'),
    ('ALTER TABLE pg_claim_leases DISABLE ROW LEVEL SECURITY'),
    ('SELECT next_token(1)'),
    ('SELECT lease_check(''x'', 0, 0, ''1 second'')')) v(t);
SELECT (SELECT token FROM lease_holders('pm_lease') WHERE slot = 0) AS t0 \gset
SELECT release_lease('pm_lease', 0, :t0 + 1) AS released_with_wrong_token,
       renew_lease('pm_lease', 0, :t0 - 1) IS NULL AS renewal_refused,
       lease_valid('pm_lease', 0, :t0 + 1) AS wrong_token_valid;
SELECT pc_try(format('SELECT fence(%L, 0, %s)', 'pm_lease', :t0 + 1)) AS fence_with_wrong_token;
-- another holder name claims a standby slot, never the held one
SELECT slot FROM claim_lease('pm_lease', 2, 'thief');
SELECT slot, holder FROM lease_holders('pm_lease') ORDER BY slot;
-- but tokens are not secrets: lease_holders shows them, and a role that may
-- call the functions can release another holder's lease with its token
SELECT release_lease('pm_lease', 1, (SELECT token FROM lease_holders('pm_lease') WHERE slot = 1))
    AS released_with_token_shown;
SELECT slot, holder, expired FROM lease_holders('pm_lease') ORDER BY slot;
RESET ROLE;

-- Back to the defaults for the tests that follow.
GRANT EXECUTE ON FUNCTION claim_slot(text, integer), claim_slot(text, integer, interval),
    claim_lease(text, integer, text, interval) TO PUBLIC;
REVOKE EXECUTE ON FUNCTION claim_slot(text, integer), claim_slot(text, integer, interval),
    claim_lease(text, integer, text, interval) FROM pm_worker;
DELETE FROM pg_claim_leases WHERE name LIKE 'pm%';
DROP SCHEMA pm_evil CASCADE;
DROP SCHEMA pm_app CASCADE;
DROP ROLE pm_owner;
DROP ROLE pm_worker;
DROP ROLE pm_nobody;
