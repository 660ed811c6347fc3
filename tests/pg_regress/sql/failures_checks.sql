-- Failure records: every function refuses an item over 1024 bytes with
-- 22023; record_failure and clear_failure refuse REPEATABLE READ and
-- SERIALIZABLE at once with 0A000 (never 23505 or 40001); a back-off that
-- mixes months and days is judged by its real length; the table is part of a
-- dump (pg_extension_config_dump; the restore: tests/dump/run.sh).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

SELECT t AS statement, pc_try(t) AS result FROM (VALUES
    ($$SELECT failure_due('fc', repeat('x', 2000))$$),
    ($$SELECT failure_due(repeat('x', 2000), '1')$$),
    ($$SELECT record_failure('fc', repeat('x', 1025), 'e')$$),
    ($$SELECT clear_failure('fc', '1', repeat('x', 1025))$$),
    ($$SELECT failing_items(repeat('x', 1025))$$),
    ($$SELECT item_failures(repeat('x', 1025))$$),
    ($$SELECT item_failures(repeat('x', 1025), '1')$$),
    ($$SELECT item_failures('fc', '1', repeat('x', 1025))$$)
) v(t);
SELECT failure_due('fc', repeat('x', 1024)) AS at_1024_bytes,
       (SELECT count(*) FROM item_failures('fc', repeat('x', 1024))) AS keyed_at_1024_bytes;

-- REPEATABLE READ / SERIALIZABLE
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pc_try($$SELECT record_failure('fc', '1', 'e')$$) AS record_rr,
       pc_try($$SELECT clear_failure('fc', '1')$$) AS clear_rr;
SELECT failure_due('fc', '1') AS reading_works, count(*) AS failing FROM failing_items('fc');
SELECT count(*) AS keyed_reading_works FROM item_failures('fc', '1');
COMMIT;
SET default_transaction_isolation = 'serializable';
SELECT pc_try($$SELECT record_failure('fc', '1', 'e')$$) AS record_serializable;
RESET default_transaction_isolation;
SELECT count(*) AS records FROM item_failures('fc');

-- back-off intervals that mix months and days (the outcome depends on the
-- calendar: shown as whether it matches the real length)
SELECT b,
       pc_try(format('SELECT record_failure(%L, %L, %L, 3, %L)', 'fc', b, 'e', b)) LIKE '22023:%'
         = (now() + b::interval < now() OR now() + b::interval > now() + interval '1 day')
         AS judged_by_real_length
FROM unnest(ARRAY['-1 mon 31 days', '1 mon -29 days', '-1 mon 30 days 1 hour', '1 mon -30 days 1 hour']) b;
-- a back-off that passes waits its real length
SELECT coalesce(bool_and(retry_at - last_failed_at BETWEEN interval '0' AND interval '1 day'), true) AS waits_real_length
FROM item_failures('fc');
SELECT pc_try($$SELECT record_failure('fc', '2', 'e', 3, '-1 mon 25 days')$$) AS negative;

-- the failure records are dumped with the extension, the leases are not
SELECT c.relname, x.extcondition IS NOT NULL AS dumped
FROM pg_extension x CROSS JOIN LATERAL unnest(x.extconfig) AS t(cfg)
JOIN pg_class c ON c.oid = t.cfg
WHERE x.extname = 'pg_claim' AND c.relname IN ('pg_claim_failures', 'pg_claim_leases');

DELETE FROM pg_claim_failures WHERE name = 'fc';
