//! Claiming an identity: claim_slot, release_slot, my_slot, slot_holders (DESIGN.md §2).

/// Registers pg_claim's configuration parameters (`pg_claim.*`); called from `_PG_init`.
pub fn init_gucs() {}
