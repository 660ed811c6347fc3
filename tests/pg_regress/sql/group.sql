-- dynamic groups in one session: membership, positions, partitions, errors, key layout
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- not a member yet: NULL index, zero members
SELECT * FROM group_position('regress_mailer');
SELECT count(*) FROM group_members('regress_mailer');

-- join (twice is harmless: one lock, one member)
SELECT group_join('regress_mailer');
SELECT group_join('regress_mailer');
SELECT * FROM group_position('regress_mailer');
SELECT index, pid = pg_backend_pid() AS is_me, application_name,
       backend_start = (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()) AS same_start
FROM group_members('regress_mailer');

-- membership is a shared advisory lock at (crc32(name), 0x20000000)
SELECT classid = crc32('regress_mailer')::oid AS key1, objid = 536870912 AS key2, objsubid, mode
FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();

-- the only member takes every partition
SELECT claim_partitions('regress_mailer', 6);
SELECT my_partitions('regress_mailer');
-- partition p is an exclusive lock at (crc32(name), 0x30000000 + p)
SELECT array_agg((objid::bigint - 805306368)::int ORDER BY objid) AS partitions_in_pg_locks
FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
  AND classid = crc32('regress_mailer')::oid AND mode = 'ExclusiveLock';
-- a second call changes nothing
SELECT claim_partitions('regress_mailer', 6) = my_partitions('regress_mailer') AS stable;

-- this session may change P while no other member uses another one
SELECT claim_partitions('regress_mailer', 3);
SELECT count(*) AS partition_locks FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND mode = 'ExclusiveLock';

-- the worker's query: only rows of the partitions this session holds
CREATE TABLE regress_group_items (id int PRIMARY KEY);
INSERT INTO regress_group_items SELECT generate_series(1, 30);
SELECT count(*) FROM regress_group_items WHERE slot_of(id, 3) = ANY(my_partitions('regress_mailer'));
DROP TABLE regress_group_items;

-- bad partition counts
SELECT claim_partitions('regress_mailer', 0);
SELECT claim_partitions('regress_mailer', -5);
SELECT claim_partitions('regress_mailer', 4097);
-- NULL in, NULL out (STRICT)
SELECT claim_partitions(NULL, 8) IS NULL AS null_name, claim_partitions('regress_mailer', NULL) IS NULL AS null_p;

-- leaving releases everything; the second leave reports false
SELECT group_leave('regress_mailer');
SELECT group_leave('regress_mailer');
SELECT my_partitions('regress_mailer');
SELECT * FROM group_position('regress_mailer');
SELECT count(*) AS advisory_locks_left FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();

-- claim_partitions joins the group by itself
SELECT claim_partitions('regress_auto', 2);
SELECT * FROM group_position('regress_auto');
SELECT group_leave('regress_auto');

-- function markings: my_partitions is STABLE (index-friendly) and PARALLEL RESTRICTED
SELECT proname, provolatile, proparallel, proisstrict FROM pg_proc
WHERE proname IN ('group_join', 'group_leave', 'group_position', 'group_members', 'claim_partitions', 'my_partitions')
ORDER BY proname;
