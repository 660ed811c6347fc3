-- Timing helper shared by the SQL benchmarks: runs each query `runs` times,
-- interleaved (query 1, 2, 3, 1, 2, 3, ...) so machine noise hits all of them
-- alike, and returns the median wall time of each in milliseconds: the
-- nearest-rank median (percentile_disc), the percentile definition of the
-- Rust benchmarks too (support/src/stats.rs); for an odd number of runs, the
-- middle one as with any definition.
CREATE SCHEMA IF NOT EXISTS bench;
CREATE OR REPLACE FUNCTION bench.time_queries(queries text[], runs int)
RETURNS TABLE (query text, median_ms float8)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    samples float8[][] := array_fill(0::float8, ARRAY[array_length(queries, 1), runs]);
    i int;
    r int;
BEGIN
    -- one warm-up pass fills shared buffers and caches plans
    FOREACH query IN ARRAY queries LOOP EXECUTE query; END LOOP;
    FOR r IN 1 .. runs LOOP
        FOR i IN 1 .. array_length(queries, 1) LOOP
            t0 := clock_timestamp();
            EXECUTE queries[i];
            samples[i][r] := extract(epoch FROM clock_timestamp() - t0) * 1000;
        END LOOP;
    END LOOP;
    FOR i IN 1 .. array_length(queries, 1) LOOP
        query := queries[i];
        SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY s) INTO median_ms
        FROM unnest(samples[i:i][1:runs]) s;
        RETURN NEXT;
    END LOOP;
END $$;
