-- spread_agg: a polymorphic aggregate whose transition and final functions
-- are version-1 C functions (src/spread.rs).
CREATE FUNCTION @extschema@.spread_agg_trans(internal, anyelement, text, integer)
RETURNS internal LANGUAGE c PARALLEL SAFE
AS 'MODULE_PATHNAME', 'pg_claim_spread_agg_trans';

CREATE FUNCTION @extschema@.spread_agg_final(internal, anyelement, text, integer)
RETURNS anyarray LANGUAGE c PARALLEL SAFE
AS 'MODULE_PATHNAME', 'pg_claim_spread_agg_final';

CREATE AGGREGATE @extschema@.spread_agg(job anyelement, grp text, feeders integer) (
    SFUNC = @extschema@.spread_agg_trans,
    STYPE = internal,
    FINALFUNC = @extschema@.spread_agg_final,
    FINALFUNC_EXTRA,
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE @extschema@.spread_agg(anyelement, text, integer) IS
'the jobs reordered by the feeder algorithm: jobs of one group spaced feeders apart, groups taken in order of first appearance';

CREATE FUNCTION @extschema@.spread_agg_trans(internal, anyelement, text, integer, boolean)
RETURNS internal LANGUAGE c PARALLEL SAFE
AS 'MODULE_PATHNAME', 'pg_claim_spread_agg_trans';

CREATE FUNCTION @extschema@.spread_agg_final(internal, anyelement, text, integer, boolean)
RETURNS anyarray LANGUAGE c PARALLEL SAFE
AS 'MODULE_PATHNAME', 'pg_claim_spread_agg_final';

CREATE AGGREGATE @extschema@.spread_agg(job anyelement, grp text, feeders integer, largest_first boolean) (
    SFUNC = @extschema@.spread_agg_trans,
    STYPE = internal,
    FINALFUNC = @extschema@.spread_agg_final,
    FINALFUNC_EXTRA,
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE @extschema@.spread_agg(anyelement, text, integer, boolean) IS
'spread_agg with a choice of group order: largest_first takes the largest groups first (equal sizes by first appearance)';
