-- The public lease functions of the portable edition: what src/leases.rs
-- does in the extension, in SQL. Each calls the internal SECURITY DEFINER
-- function of sql/leases.sql, sql/leases_fleet.sql or sql/leases_resize.sql
-- with the calling role's oid first. The extension passes the current user, which a C function
-- reads before any SECURITY DEFINER switch; a SQL function cannot, so these
-- functions are SECURITY DEFINER themselves and pass the session's role (the
-- role of SET ROLE, else the session user), which no SECURITY DEFINER
-- function changes and no role can set to a role it is not a member of. A
-- call from inside another SECURITY DEFINER function therefore acts for the
-- session's role, not for that function's owner (docs/portable.md).

CREATE FUNCTION @extschema@.pg_claim_caller() RETURNS oid
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.quote_ident(CASE WHEN pg_catalog.current_setting('role') = 'none' THEN SESSION_USER::text
                                       ELSE pg_catalog.current_setting('role') END)::pg_catalog.regrole::oid
$$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_caller() FROM PUBLIC;

CREATE FUNCTION @extschema@.claim_lease(name text, n integer, holder text, ttl interval DEFAULT '30 seconds')
RETURNS TABLE (slot integer, token bigint, expires_at timestamptz)
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.slot, c.token, c.expires_at
    FROM @extschema@.pg_claim_lease_claim(@extschema@.pg_claim_caller(), name, n, holder, ttl) c
    WHERE c.slot IS NOT NULL AND c.token IS NOT NULL AND c.expires_at IS NOT NULL
$$;

CREATE FUNCTION @extschema@.claim_leases(name text, n integer, holder text, max integer DEFAULT NULL,
                                         ttl interval DEFAULT '30 seconds')
RETURNS TABLE (slot integer, token bigint, expires_at timestamptz)
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT u.slot, u.token, u.expires_at
    FROM @extschema@.pg_claim_leases_claim(@extschema@.pg_claim_caller(), name, n, holder, max, ttl) c,
         ROWS FROM (pg_catalog.unnest(c.slots), pg_catalog.unnest(c.tokens), pg_catalog.unnest(c.expires)) WITH ORDINALITY AS u(slot, token, expires_at, o)
    WHERE u.slot IS NOT NULL AND u.token IS NOT NULL AND u.expires_at IS NOT NULL
    ORDER BY u.o
$$;

CREATE FUNCTION @extschema@.report_backlog(name text, slot integer, token bigint, remaining bigint,
                                           fenced_batches boolean DEFAULT false)
RETURNS integer[]
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_lease_report(@extschema@.pg_claim_caller(), name, slot, token, remaining,
                                             fenced_batches)
$$;

CREATE FUNCTION @extschema@.renew_lease(name text, slot integer, token bigint, ttl interval DEFAULT '30 seconds')
RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_lease_renew(@extschema@.pg_claim_caller(), name, slot, token, ttl)
$$;

CREATE FUNCTION @extschema@.release_lease(name text, slot integer, token bigint)
RETURNS boolean
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_lease_release(@extschema@.pg_claim_caller(), name, slot, token)
$$;

CREATE FUNCTION @extschema@.lease_holders(name text)
RETURNS TABLE (slot integer, holder text, token bigint, acquired_at timestamptz,
               expires_at timestamptz, expired boolean)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT u.slot, u.holder, u.token, u.acquired_at, u.expires_at, u.expired
    FROM @extschema@.pg_claim_lease_holders(@extschema@.pg_claim_caller(), name) c,
         ROWS FROM (pg_catalog.unnest(c.slots), pg_catalog.unnest(c.holders), pg_catalog.unnest(c.tokens),
                   pg_catalog.unnest(c.acquired), pg_catalog.unnest(c.expires), pg_catalog.unnest(c.expired))
             WITH ORDINALITY AS u(slot, holder, token, acquired_at, expires_at, expired, o)
    WHERE u.slot IS NOT NULL
    ORDER BY u.o
$$;

CREATE FUNCTION @extschema@.lease_valid(name text, slot integer, token bigint)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_lease_valid(@extschema@.pg_claim_caller(), name, slot, token)
$$;

CREATE FUNCTION @extschema@.fence(name text, slot integer, token bigint)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_lease_fence(@extschema@.pg_claim_caller(), name, slot, token)
$$;

CREATE FUNCTION @extschema@.my_token(name text)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN name IS NOT NULL
                THEN @extschema@.pg_claim_lease_my_token(@extschema@.pg_claim_caller(), name) END
$$;

CREATE FUNCTION @extschema@.resize_fleet(name text, n integer)
RETURNS integer
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_leases_resize(@extschema@.pg_claim_caller(), name, n)
$$;

CREATE FUNCTION @extschema@.fleet_n(name text)
RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_fleet_n(@extschema@.pg_claim_caller(), name)
$$;

CREATE FUNCTION @extschema@.cap_fleet(name text, g integer)
RETURNS integer
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_leases_cap(@extschema@.pg_claim_caller(), name, g)
$$;

CREATE FUNCTION @extschema@.fleet_cap(name text)
RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT @extschema@.pg_claim_fleet_cap(@extschema@.pg_claim_caller(), name)
$$;

-- (their comments: sql/lease_comments.sql, as in the extension)

-- An earlier edition's index on the leases' expiry, which made every renewal
-- a non-HOT update (sql/leases_fleet.sql says why it is gone).
DROP INDEX IF EXISTS @extschema@.pg_claim_leases_expiry;
