-- range_slot (README.md, docs/choosing-a-mapping.md). The number of bounds <= key, by binary search:
-- slot 0 is below bounds[1], slot i holds [bounds[i], bounds[i+1]).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

-- the definition on a small example, including keys equal to a bound
SELECT k, range_slot(k, ARRAY[10, 20, 30]) AS slot
FROM (VALUES (-2147483648), (9), (10), (11), (19), (20), (29), (30), (31), (2147483647)) v(k);
SELECT range_slot(5, '{}'::int[]) AS no_bounds_one_slot, range_slot(5, ARRAY[5]) AS single_bound_equal,
       range_slot(4, ARRAY[5]) AS single_bound_below,
       range_slot(NULL::int, ARRAY[5]) IS NULL AS null_key, range_slot(5, NULL::int[]) IS NULL AS null_bounds;

-- A reference written here: a plain binary search with the type's < operator.
CREATE FUNCTION rs_ref(key anyelement, bounds anyarray) RETURNS int
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    lo int := 0;                                   -- bounds known to be <= key
    hi int := coalesce(array_length(bounds, 1), 0);
    mid int;
BEGIN
    WHILE lo < hi LOOP
        mid := (lo + hi) / 2;
        IF key < bounds[mid + 1] THEN hi := mid; ELSE lo := mid + 1; END IF;
    END LOOP;
    RETURN lo;
END $$;

-- Random data, deterministic (derived from md5 of a counter). For several
-- bounds sizes: sorted distinct random bounds, checked on random keys, on
-- every bound itself, and on the values just below and above every bound.

-- integer
CREATE TABLE rs_int AS
SELECT sz, ARRAY(SELECT DISTINCT ('x' || substr(md5(sz || 'b' || g), 1, 8))::bit(32)::int AS v
                 FROM generate_series(1, sz) g ORDER BY v) AS b
FROM unnest(ARRAY[1, 2, 7, 64, 1000]) sz;
SELECT sz, cardinality(b) AS bounds,
       bool_and(range_slot(k, b) = rs_ref(k, b)) AS matches_reference,
       count(DISTINCT range_slot(k, b)) = cardinality(b) + 1 AS every_slot_seen
FROM rs_int,
     LATERAL (SELECT ('x' || substr(md5('k' || g), 1, 8))::bit(32)::int FROM generate_series(1, 3000) g
              UNION ALL SELECT x FROM unnest(b) x
              UNION ALL SELECT x - 1 FROM unnest(b) x WHERE x > -2147483648
              UNION ALL SELECT x + 1 FROM unnest(b) x WHERE x < 2147483647
              UNION ALL VALUES (-2147483648), (2147483647)) k(k)
GROUP BY sz, b ORDER BY sz;

-- text (mixed case, digits, non-ASCII), in the database's default collation
CREATE TABLE rs_text AS
SELECT sz, ARRAY(SELECT DISTINCT v FROM (
                   SELECT left(CASE WHEN g % 3 = 0 THEN upper(md5(sz || 't' || g)) ELSE md5(sz || 't' || g) END
                               || CASE WHEN g % 5 = 0 THEN 'é日' ELSE '' END, 1 + g % 9) AS v
                   FROM generate_series(1, sz) g) s ORDER BY v) AS b
FROM unnest(ARRAY[1, 5, 50, 400]) sz;
SELECT sz, cardinality(b) AS bounds,
       bool_and(range_slot(k, b) = rs_ref(k, b)) AS matches_reference,
       count(DISTINCT range_slot(k, b)) = cardinality(b) + 1 AS every_slot_seen
FROM rs_text,
     LATERAL (SELECT left(md5('k' || g), 1 + g % 7) || CASE WHEN g % 4 = 0 THEN 'ü' ELSE '' END
              FROM generate_series(1, 3000) g
              UNION ALL SELECT x FROM unnest(b) x
              UNION ALL SELECT x || ' ' FROM unnest(b) x
              UNION ALL SELECT left(x, length(x) - 1) FROM unnest(b) x
              UNION ALL VALUES (''), ('~~~~')) k(k)
GROUP BY sz, b ORDER BY sz;

-- timestamptz
CREATE TABLE rs_ts AS
SELECT sz, ARRAY(SELECT DISTINCT timestamptz '2020-01-01 00:00:00+00'
                      + ('x' || substr(md5(sz || 'ts' || g), 1, 7))::bit(28)::int * interval '1.5 seconds' AS v
                 FROM generate_series(1, sz) g ORDER BY v) AS b
FROM unnest(ARRAY[1, 4, 24, 365]) sz;
SELECT sz, cardinality(b) AS bounds,
       bool_and(range_slot(k, b) = rs_ref(k, b)) AS matches_reference,
       count(DISTINCT range_slot(k, b)) = cardinality(b) + 1 AS every_slot_seen
FROM rs_ts,
     LATERAL (SELECT timestamptz '2020-01-01 00:00:00+00'
                     + ('x' || substr(md5('k' || g), 1, 7))::bit(28)::int * interval '1.5 seconds'
              FROM generate_series(1, 3000) g
              UNION ALL SELECT x FROM unnest(b) x
              UNION ALL SELECT x - interval '1 microsecond' FROM unnest(b) x
              UNION ALL SELECT x + interval '1 microsecond' FROM unnest(b) x
              UNION ALL VALUES ('-infinity'::timestamptz), ('infinity')) k(k)
GROUP BY sz, b ORDER BY sz;

-- different bounds on every row of one call site
SELECT bool_and(range_slot(g, b) = rs_ref(g, b)) AS per_row_bounds_match
FROM generate_series(-5, 45) g, (SELECT b FROM rs_int UNION ALL VALUES (ARRAY[10, 20]), (ARRAY[5, 25, 35]), ('{}')) v(b);

-- bounds stored in a table, large enough to be TOASTed (read per row, or
-- through a scalar subquery), give the same slots as the reference
CREATE TABLE rs_stored (id int PRIMARY KEY, b bigint[]);
INSERT INTO rs_stored
SELECT i, ARRAY(SELECT g * (i + 2) FROM generate_series(1, 3000) g) FROM generate_series(1, 3) i;
INSERT INTO rs_stored VALUES (4, ARRAY(SELECT CASE WHEN g = 2500 THEN 7 ELSE g * 3 END FROM generate_series(1, 3000) g));
SELECT id, pg_column_size(b) < cardinality(b) * 8 AS compressed FROM rs_stored ORDER BY id;
SELECT bool_and(range_slot(k::bigint, b) = rs_ref(k::bigint, b)) AS stored_per_row_match, count(*)
FROM rs_stored, generate_series(-3, 15003, 7) k WHERE id <= 3;
SELECT bool_and(range_slot(k::bigint, (SELECT b FROM rs_stored WHERE id = 2))
                = rs_ref(k::bigint, (SELECT b FROM rs_stored WHERE id = 2))) AS stored_subquery_match
FROM generate_series(-3, 15003, 7) k;
-- a stored array that is not sorted is found too, and one that changes is re-read
SELECT range_slot(1::bigint, b) FROM rs_stored WHERE id = 4;
UPDATE rs_stored SET b = b || 100000::bigint WHERE id = 1;
SELECT range_slot(99999::bigint, b) AS before_new_bound, range_slot(100000::bigint, b) AS at_new_bound
FROM rs_stored WHERE id = 1;
DROP TABLE rs_stored;

-- collation: the call's collation orders the keys and the bounds
SELECT range_slot('b' COLLATE "C", ARRAY['B', 'a', 'c']) AS c_order,
       range_slot('b' COLLATE "und-x-icu", ARRAY['a', 'B', 'c']) AS icu_order;

-- time ranges with equal-depth bounds from the data (see docs/choosing-a-mapping.md)
CREATE TABLE rs_events (at timestamptz);
INSERT INTO rs_events
SELECT timestamptz '2024-01-01 00:00+00' + (g ^ 1.5) * interval '1 second' FROM generate_series(1, 10000) g;
SELECT range_slot(at, (SELECT percentile_disc(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY at) FROM rs_events)) AS slot,
       count(*)
FROM rs_events GROUP BY 1 ORDER BY 1;

-- with PARTITION BY RANGE on the same bounds, slot i is partition i
CREATE TABLE rs_part (at timestamptz) PARTITION BY RANGE (at);
CREATE TABLE rs_part_0 PARTITION OF rs_part FOR VALUES FROM (MINVALUE) TO ('2024-01-10 00:00+00');
CREATE TABLE rs_part_1 PARTITION OF rs_part FOR VALUES FROM ('2024-01-10 00:00+00') TO ('2024-02-01 00:00+00');
CREATE TABLE rs_part_2 PARTITION OF rs_part FOR VALUES FROM ('2024-02-01 00:00+00') TO ('2024-02-01 00:00:00.000001+00');
CREATE TABLE rs_part_3 PARTITION OF rs_part FOR VALUES FROM ('2024-02-01 00:00:00.000001+00') TO (MAXVALUE);
INSERT INTO rs_part SELECT at FROM rs_events;
INSERT INTO rs_part VALUES ('-infinity'), ('2024-01-10 00:00+00'), ('2024-02-01 00:00+00'), ('2024-02-01 00:00:00.000001+00'), ('infinity');
SELECT range_slot(at, '{2024-01-10 00:00+00, 2024-02-01 00:00+00, 2024-02-01 00:00:00.000001+00}'::timestamptz[]) AS slot,
       tableoid::regclass AS stored_in, count(*)
FROM rs_part GROUP BY 1, 2 ORDER BY 1;
DROP TABLE rs_part;

-- errors: bad bounds are SQLSTATE 22023, naming the position; unorderable types 42883
\set VERBOSITY default
SELECT range_slot(1, ARRAY[1, NULL, 3]);
SELECT range_slot(1, ARRAY[1, 3, 3]);
SELECT range_slot(1, ARRAY[10, 3, 30]);
SELECT range_slot('x'::text, ARRAY['a', 'c', 'b']);
SELECT range_slot(1, '[0:2]={5,3,1}'::int[]);
SELECT range_slot(1, ARRAY[[1, 2], [3, 4]]);
SELECT range_slot('b' COLLATE "und-x-icu", ARRAY['B', 'a', 'c']);
SELECT range_slot(point '(1,1)', ARRAY[point '(0,0)']);
SELECT range_slot(1, ARRAY['a', 'b']);
\set VERBOSITY sqlstate
SELECT range_slot(1, ARRAY[NULL::int]);
SELECT range_slot(1, ARRAY[2, 1]);
SELECT range_slot(point '(1,1)', ARRAY[point '(0,0)']);
\set VERBOSITY default
-- a bad row fails even after good rows at the same call site
SELECT range_slot(g, CASE WHEN g < 3 THEN ARRAY[1, 2] ELSE ARRAY[2, 1] END) FROM generate_series(1, 5) g;

-- planner markings: IMMUTABLE STRICT PARALLEL SAFE, no SET clause
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       p.provolatile, p.proisstrict, p.proparallel, p.proconfig
FROM pg_proc p WHERE p.proname = 'range_slot';

DROP TABLE rs_int, rs_text, rs_ts, rs_events;
DROP FUNCTION rs_ref(anyelement, anyarray);
