-- The comments of the lease functions (src/leases.rs), made once the
-- functions exist.
COMMENT ON FUNCTION @extschema@.claim_lease(text, integer, text, interval) IS
    'claim the lowest free or expired slot of name in 0 .. n-1 for holder until ttl from now: one row (slot, token, expires_at), or none when all are leased';
COMMENT ON FUNCTION @extschema@.claim_leases(text, integer, text, integer, interval) IS
    'renew, take and give back leases of name so that the live holders share its n slots evenly (at most max for this holder; max => 0: leave): every slot holder holds after the call';
COMMENT ON FUNCTION @extschema@.report_backlog(text, integer, bigint, bigint, boolean) IS
    'store remaining as the weight of the lease (its holder''s work left in the slot) for claim_leases'' balance, and fenced_batches (every batch of the slot passes fence before it reads: a lighter holder may take the slot between two batches): the slots of its holder that another holder wants (give them back after this batch; empty: none), NULL when token does not hold the lease';
COMMENT ON FUNCTION @extschema@.renew_lease(text, integer, bigint, interval) IS
    'extend a lease to ttl from now: the new expiry, or NULL when the lease was lost (taken over or released)';
COMMENT ON FUNCTION @extschema@.release_lease(text, integer, bigint) IS
    'give a lease back; false when this token does not hold it';
COMMENT ON FUNCTION @extschema@.lease_holders(text) IS
    'the leases and live session claims of name: slot, holder, token (NULL for leases of roles whose privileges the caller lacks), since when, until when, and whether the lease expired';
COMMENT ON FUNCTION @extschema@.lease_valid(text, integer, bigint) IS
    'whether token is the current token of slot of name; when true, the slot cannot change hands before the calling transaction ends';
COMMENT ON FUNCTION @extschema@.fence(text, integer, bigint) IS
    'raise PC001 unless token is the current token of slot of name; when it passes, the slot cannot change hands before the calling transaction ends';
COMMENT ON FUNCTION @extschema@.my_token(text) IS
    'the fencing token of this session''s claim_slot claim of name (NULL when it holds none), for fence and lease_valid';
COMMENT ON FUNCTION @extschema@.resize_fleet(text, integer) IS
    'set the number of slots of the lease fleet name to n online: waits for every fenced transaction of the old n, gives back every lease (old tokens fail fence), sets the members'' and the definition''s n; returns the old n';
COMMENT ON FUNCTION @extschema@.fleet_n(text) IS
    'the n of the lease fleet name: its live members'', else its define_fleet definition''s, else NULL';
COMMENT ON FUNCTION @extschema@.cap_fleet(text, integer) IS
    'let at most g holders of the lease fleet name hold slots at once (the other members wait as standbys and take over; NULL: no cap); returns the cap before';
COMMENT ON FUNCTION @extschema@.fleet_cap(text) IS
    'the cap of the lease fleet name (the most holders that hold its slots at once), NULL when it has none';
