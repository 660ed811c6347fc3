SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- The worked example of the design: feeders = 2, groups in order
-- x=[x1..x4], y=[y1,y2], z=[z1], w=[w1..w3].
CREATE TABLE spread_jobs (seq int PRIMARY KEY, job text, grp text);
INSERT INTO spread_jobs VALUES
  (1, 'x1', 'x'), (2, 'x2', 'x'), (3, 'x3', 'x'), (4, 'x4', 'x'),
  (5, 'y1', 'y'), (6, 'y2', 'y'), (7, 'z1', 'z'),
  (8, 'w1', 'w'), (9, 'w2', 'w'), (10, 'w3', 'w');
SELECT spread_agg(job, grp, 2 ORDER BY seq) FROM spread_jobs;
-- each job with its position, as a queue would receive them
SELECT pos, job
FROM unnest((SELECT spread_agg(job, grp, 2 ORDER BY seq) FROM spread_jobs))
     WITH ORDINALITY AS u(job, pos)
ORDER BY pos;
-- the same jobs arriving interleaved: groups still come in order of first
-- appearance, each group keeps its own input order
SELECT spread_agg(job, grp, 2 ORDER BY s)
FROM (VALUES (1, 'x1', 'x'), (2, 'y1', 'y'), (3, 'x2', 'x'), (4, 'z1', 'z'),
             (5, 'w1', 'w'), (6, 'y2', 'y'), (7, 'x3', 'x'), (8, 'w2', 'w'),
             (9, 'x4', 'x'), (10, 'w3', 'w')) v(s, job, grp);
-- the ORDER BY in the call is the input order
SELECT spread_agg(job, grp, 2 ORDER BY seq DESC) FROM spread_jobs;
-- largest groups first (x=4, w=3, y=2, z=1)
SELECT spread_agg(job, grp, 2, true ORDER BY seq) FROM spread_jobs;
SELECT spread_agg(job, grp, 2, false ORDER BY seq) = spread_agg(job, grp, 2 ORDER BY seq)
  AS false_is_first_appearance
FROM spread_jobs;

-- feeders = 1 drains group after group in order of first appearance: with
-- contiguous groups that is the input order ...
SELECT spread_agg(job, grp, 1 ORDER BY seq) = array_agg(job ORDER BY seq) AS input_order
FROM spread_jobs;
-- ... and with interleaved groups a stable grouping by first appearance
SELECT spread_agg(job, grp, 1 ORDER BY s)
FROM (VALUES (1, 'b1', 'b'), (2, 'a1', 'a'), (3, 'b2', 'b'), (4, 'c1', 'c'),
             (5, 'a2', 'a'), (6, 'b3', 'b')) v(s, job, grp);

-- feeders larger than the number of groups: a plain round robin over them
SELECT spread_agg(job, grp, 100 ORDER BY seq) FROM spread_jobs;
SELECT spread_agg(job, grp, 2147483647 ORDER BY seq) = spread_agg(job, grp, 4 ORDER BY seq)
  AS huge_feeders_same_as_group_count
FROM spread_jobs;
-- one group: input order whatever the feeders
SELECT spread_agg(job, 'all', 3 ORDER BY seq) FROM spread_jobs;
-- one job per group: input order whatever the feeders
SELECT spread_agg(job, job, 3 ORDER BY seq) FROM spread_jobs;

-- NULL jobs are kept; NULL groups form one group of their own, placed by
-- its first appearance like any other
SELECT spread_agg(job, grp, 2 ORDER BY s)
FROM (VALUES (1, 'a1', 'a'), (2, NULL, 'a'), (3, 'n1', NULL), (4, 'b1', 'b'),
             (5, 'n2', NULL), (6, 'a3', 'a'), (7, NULL, NULL), (8, 'b2', 'b')) v(s, job, grp);
-- the text 'NULL' is an ordinary group, distinct from NULL
-- (one group would keep the input order n1 n2 t1 t2)
SELECT spread_agg(job, grp, 5 ORDER BY s)
FROM (VALUES (1, 'n1', NULL), (2, 'n2', NULL), (3, 't1', 'NULL'), (4, 't2', 'NULL')) v(s, job, grp);
-- no rows: NULL, like array_agg
SELECT spread_agg(job, grp, 2) IS NULL AS empty_is_null FROM spread_jobs WHERE false;

-- job types: integer, bigint, uuid, numeric, a table's row type, an anonymous row
SELECT spread_agg(i, (i % 3)::text, 2 ORDER BY i) FROM generate_series(1, 10) i;
SELECT spread_agg(i::bigint * 10000000000, (i % 2)::text, 2 ORDER BY i) FROM generate_series(1, 4) i;
SELECT pg_typeof(spread_agg(i::bigint, 'g', 2)) FROM generate_series(1, 2) i;
SELECT spread_agg(('00000000-0000-0000-0000-00000000000' || i)::uuid, (i % 2)::text, 2 ORDER BY i)
FROM generate_series(1, 4) i;
SELECT spread_agg(i / 4.0, (i % 2)::text, 2 ORDER BY i) FROM generate_series(1, 4) i;
SELECT spread_agg(j, j.grp, 2 ORDER BY j.seq) FROM spread_jobs j;
SELECT (spread_agg(j, j.grp, 2 ORDER BY j.seq))[6].job AS sixth FROM spread_jobs j;
SELECT spread_agg(ROW(seq, job), grp, 3 ORDER BY seq) FROM spread_jobs;
-- long values stored out of line (TOAST) survive
CREATE TABLE spread_long (seq int, body text, grp text);
ALTER TABLE spread_long ALTER COLUMN body SET STORAGE EXTERNAL;
INSERT INTO spread_long SELECT seq, repeat(job, 3000 + seq), grp FROM spread_jobs;
SELECT array_agg(length(v) ORDER BY p) AS lengths, array_agg(left(v, 2) ORDER BY p) AS heads
FROM unnest((SELECT spread_agg(body, grp, 2 ORDER BY seq) FROM spread_long))
     WITH ORDINALITY u(v, p);
SELECT (SELECT spread_agg(body, grp, 2 ORDER BY seq) FROM spread_long)
     = (SELECT array_agg(body ORDER BY array_position(ARRAY[1, 5, 2, 6, 3, 7, 4, 8, 9, 10], seq))
        FROM spread_long) AS same_values;
DROP TABLE spread_long;

-- one spread per GROUP BY group
SELECT batch, spread_agg(job, grp, 2 ORDER BY seq)
FROM spread_jobs, (VALUES (1), (2)) b(batch)
WHERE seq <= 6 + batch
GROUP BY batch ORDER BY batch;

-- the same through hash aggregation (many states alive at once)
SET enable_sort = off;
EXPLAIN (COSTS OFF)
SELECT b, spread_agg(i, (i % 3)::text, 2)
FROM generate_series(1, 10) i, generate_series(1, 3) b
GROUP BY b;
SELECT count(*) AS batches,
       bool_and(s = '{1,2,4,5,7,8,10,3,6,9}') AS all_spread_alike
FROM (SELECT b, spread_agg(i, (i % 3)::text, 2) AS s
      FROM generate_series(1, 10) i, generate_series(1, 3) b
      GROUP BY b) x;
RESET enable_sort;

-- Against a reference written here in PL/pgSQL, literally simulating the
-- feeders of the design, over many group layouts (with NULL groups).
CREATE FUNCTION spread_reference(grps text[], feeders int) RETURNS int[]
LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(array_length(grps, 1), 0);
    names text[] := '{}';
    rank int[] := '{}';
    sizes int[] := '{}';
    starts int[] := '{}';
    fill int[];
    sorted int[] := array_fill(0, ARRAY[n]);
    pos int[] := array_fill(1, ARRAY[feeders]);
    stop int[] := array_fill(0, ARRAY[feeders]);
    next_group int := 1;
    out int[] := '{}';
    r int;
    f int;
BEGIN
    FOR i IN 1 .. n LOOP
        r := array_position(names, grps[i]);  -- finds NULL too
        IF r IS NULL THEN
            names := names || grps[i];
            sizes := sizes || 0;
            r := array_length(names, 1);
        END IF;
        rank := rank || r;
        sizes[r] := sizes[r] + 1;
    END LOOP;
    starts := array_fill(1, ARRAY[greatest(array_length(names, 1), 1)]);
    FOR g IN 2 .. coalesce(array_length(names, 1), 0) LOOP
        starts[g] := starts[g - 1] + sizes[g - 1];
    END LOOP;
    fill := starts;
    FOR i IN 1 .. n LOOP
        sorted[fill[rank[i]]] := i;
        fill[rank[i]] := fill[rank[i]] + 1;
    END LOOP;
    WHILE coalesce(array_length(out, 1), 0) < n LOOP
        FOR f IN 1 .. feeders LOOP
            IF pos[f] > stop[f] THEN
                IF next_group > coalesce(array_length(names, 1), 0) THEN
                    CONTINUE;
                END IF;
                pos[f] := starts[next_group];
                stop[f] := starts[next_group] + sizes[next_group] - 1;
                next_group := next_group + 1;
            END IF;
            out := out || sorted[pos[f]];
            pos[f] := pos[f] + 1;
        END LOOP;
    END LOOP;
    RETURN out;
END $$;
WITH layouts AS (
    SELECT s, f, i,
           CASE WHEN (i * 13 + s) % 17 = 0 THEN NULL
                ELSE ((i * 7919 + s * 104729) % (s % 11 + 1))::text END AS grp
    FROM generate_series(1, 60) s, generate_series(1, 7) f,
         generate_series(1, 10 + s % 37) i
), compared AS (
    SELECT s, f,
           spread_agg(i, grp, f ORDER BY i) AS got,
           spread_reference(array_agg(grp ORDER BY i), f) AS want
    FROM layouts GROUP BY s, f
)
SELECT count(*) AS layouts, count(*) FILTER (WHERE got = want) AS equal FROM compared;

-- A larger input: 100,000 jobs in 1,000 groups of skewed sizes, 8 feeders.
-- Every job exactly once, each group in input order, and two jobs of one
-- group closer than 8 apart only in the tail (after some feeder ran out).
CREATE TABLE spread_big AS
SELECT i AS id, 'customer-' || ((i * 7919) % (1 + (i % 1000))) AS grp
FROM generate_series(1, 100000) i;
CREATE TEMP TABLE spread_out AS
SELECT u.id, u.pos
FROM unnest((SELECT spread_agg(id, grp, 8 ORDER BY id) FROM spread_big))
     WITH ORDINALITY AS u(id, pos);
SELECT count(*) AS jobs, count(DISTINCT id) AS distinct_jobs FROM spread_out;
WITH x AS (
    SELECT o.pos, b.grp, o.id,
           o.pos - lag(o.pos) OVER w AS gap,
           o.id > lag(o.id) OVER w AS in_input_order
    FROM spread_out o JOIN spread_big b USING (id)
    WINDOW w AS (PARTITION BY b.grp ORDER BY o.pos)
)
SELECT count(DISTINCT grp) AS groups,
       count(gap) AS pairs,
       bool_and(in_input_order) AS groups_keep_input_order,
       max(gap) AS max_gap,
       count(*) FILTER (WHERE gap < 8) AS closer_than_8,
       min(pos) FILTER (WHERE gap < 8) > 100000 - 8 * 50 AS close_pairs_only_near_the_end,
       bool_and(gap = 8) FILTER (WHERE pos <= 90000) AS exactly_8_apart_before
FROM x;

-- Errors
SELECT spread_agg(job, grp, 0) FROM spread_jobs;
SELECT spread_agg(job, grp, -3) FROM spread_jobs;
SELECT spread_agg(job, grp, NULL) FROM spread_jobs;
SELECT spread_agg(job, grp, CASE WHEN seq < 5 THEN 2 ELSE 3 END ORDER BY seq) FROM spread_jobs;
SELECT spread_agg(job, grp, CASE WHEN seq < 5 THEN 2 END ORDER BY seq) FROM spread_jobs;
SELECT spread_agg(job, grp, 2, NULL) FROM spread_jobs;
SELECT spread_agg(job, grp, 2, seq > 5 ORDER BY seq) FROM spread_jobs;
SELECT spread_agg(ARRAY[seq], grp, 2) FROM spread_jobs;
-- an error in the middle of the input aborts cleanly; the next call works
SELECT spread_agg(10 / (seq - 5), grp, 2 ORDER BY seq) FROM spread_jobs;
SELECT spread_agg(seq, grp, 2 ORDER BY seq) FROM spread_jobs;
-- no rows: no error even with bad feeders (nothing to spread)
SELECT spread_agg(job, grp, 0) IS NULL AS no_rows FROM spread_jobs WHERE false;

DROP FUNCTION spread_reference(text[], int);
DROP TABLE spread_big;
DROP TABLE spread_jobs;
