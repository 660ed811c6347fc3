-- Who may claim (docs/claiming.md, "Who may claim"). Runs last in the
-- install script, and again in every upgrade script that adds such a
-- function.
--
-- The functions that take, renew or report claims are granted to PUBLIC by
-- the extension's owner, so that the owner can restrict who may claim with
-- REVOKE EXECUTE ... FROM PUBLIC and GRANT EXECUTE ... TO a role. (In a
-- trusted install the functions belong to the bootstrap superuser, and
-- PUBLIC's default EXECUTE is granted by that superuser: the installing
-- owner's REVOKE would change nothing.) So, for each of these functions:
-- EXECUTE to the extension's owner WITH GRANT OPTION, revoked from PUBLIC,
-- then granted to PUBLIC again by the extension's owner, from a temporary
-- SECURITY DEFINER function that belongs to the owner (SET ROLE is not
-- allowed in a trusted install script), dropped at once.
--
-- In an upgrade, a function whose EXECUTE was revoked from PUBLIC before
-- stays revoked. The functions are selected by name among the extension's members, so that
-- every overload is covered. The pure mappings (slot_of, crc32, ...) and the
-- caller-rights readers (my_items, slot_counts, ...) keep PUBLIC's default
-- EXECUTE from their owner.

-- The grants to PUBLIC, made by the extension's owner: this function is
-- given to the owner below and dropped once called.
CREATE FUNCTION @extschema@.pg_claim_grant_to_public(fns pg_catalog.regprocedure[])
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f pg_catalog.regprocedure;
BEGIN
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) FROM PUBLIC;

DO $grants$
DECLARE
    fns pg_catalog.regprocedure[];
    public_fns pg_catalog.regprocedure[];
    f pg_catalog.regprocedure;
    owner_ pg_catalog.text;
    path_ pg_catalog.text := pg_catalog.current_setting('search_path');
BEGIN
    -- function signatures below print schema-qualified
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    SELECT e.extowner::pg_catalog.regrole::pg_catalog.text INTO owner_
    FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim';
    SELECT pg_catalog.array_agg(p.oid::pg_catalog.regprocedure ORDER BY p.oid) INTO fns
    FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_proc p ON p.oid = d.objid
    WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
      AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
      AND d.deptype = 'e'
      AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_claim')
      AND (p.proname = ANY (ARRAY[
               'claim_slot', 'claim_slots', 'release_slot', 'my_slot', 'my_slots',
               'slot_holders', 'slot_status',
               'claim_lease', 'claim_leases', 'report_backlog', 'renew_lease', 'release_lease',
               'lease_holders', 'fence', 'lease_valid', 'my_token', 'resize_fleet', 'fleet_n',
               'cap_fleet', 'fleet_cap',
               'claim_partitions', 'my_partitions',
               'record_failure', 'failure_due', 'failing_items', 'clear_failure',
               'item_failures', 'has_failures', 'define_fleet', 'drop_fleet']::pg_catalog.name[])
           OR p.proname OPERATOR(pg_catalog.~~) 'group\_%');
    -- (in an upgrade, a function whose EXECUTE was already revoked from
    -- PUBLIC stays revoked)
    SELECT pg_catalog.array_agg(f2 ORDER BY f2::pg_catalog.oid) INTO public_fns
    FROM pg_catalog.unnest(fns) f2
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc p,
                  pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                  WHERE p.oid = f2::pg_catalog.oid AND a.grantee = 0 AND a.privilege_type = 'EXECUTE');
    FOREACH f IN ARRAY fns LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s WITH GRANT OPTION', f, owner_);
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]) OWNER TO %s', owner_);
    PERFORM @extschema@.pg_claim_grant_to_public(coalesce(public_fns, '{}'));
    PERFORM pg_catalog.set_config('search_path', path_, true);
END $grants$;

DROP FUNCTION @extschema@.pg_claim_grant_to_public(pg_catalog.regprocedure[]);
