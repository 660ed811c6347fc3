-- The writer's half of the fence lock (sql/leases.sql, "Locks carry the
-- fencing guarantee"): every change of a lease that can end a holder's right
-- to write (its holder, token, owner or session flag changes, or its expiry
-- moves earlier, or the row goes) takes the slot's fence lock
-- (key1, 271581184 + slot) exclusive to the end of the changing transaction,
-- waiting for the transactions that passed fence / lease_valid on the slot
-- in READ COMMITTED; and, when it commits, tells every session to forget
-- what it knew of the leases (src/leases/check.rs keeps, per session, the
-- rows that passed, so that the next check of the same token reads nothing).
-- A renewal that extends expires_at fires nothing; one that would move it
-- earlier first takes the fence lock with a try, and keeps the later expiry
-- when it cannot (sql/leases.sql), so the trigger does not wait.
--
-- The triggers fire ALWAYS, also with session_replication_role = replica.

CREATE FUNCTION @extschema@.pg_claim_leases_guard()
RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.pg_claim_lease_handover(OLD.name, OLD.slot);
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_leases_guard() FROM PUBLIC;

CREATE TRIGGER pg_claim_leases_guard AFTER UPDATE ON @extschema@.pg_claim_leases
FOR EACH ROW
WHEN (OLD.name IS DISTINCT FROM NEW.name OR OLD.slot IS DISTINCT FROM NEW.slot
      OR OLD.holder IS DISTINCT FROM NEW.holder OR OLD.token IS DISTINCT FROM NEW.token
      OR OLD.owner IS DISTINCT FROM NEW.owner OR OLD.session IS DISTINCT FROM NEW.session
      OR (OLD.expires_at IS DISTINCT FROM NEW.expires_at
          AND NOT coalesce(NEW.expires_at > OLD.expires_at, false)))
EXECUTE FUNCTION @extschema@.pg_claim_leases_guard();
CREATE TRIGGER pg_claim_leases_guard_delete AFTER DELETE ON @extschema@.pg_claim_leases
FOR EACH ROW EXECUTE FUNCTION @extschema@.pg_claim_leases_guard();
ALTER TABLE @extschema@.pg_claim_leases ENABLE ALWAYS TRIGGER pg_claim_leases_guard;
ALTER TABLE @extschema@.pg_claim_leases ENABLE ALWAYS TRIGGER pg_claim_leases_guard_delete;
REVOKE ALL ON FUNCTION @extschema@.pg_claim_lease_handover(text, integer) FROM PUBLIC;
