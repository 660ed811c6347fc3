//! Fixed limits shared by the advisory key layout (`crate::locks`), the
//! settings (`settings`) and the concepts that take `n` (claim, items, wake).
//! All of them import the numbers from here, so none imports another for a
//! number.

/// The largest `n` (slots) and `P` (partitions) the key layout allows, and
/// the largest `pg_claim.max_locks_per_session`.
pub const MAX_KEY_INDEX: i32 = 1 << 20;

/// The largest `n` (slots of a name) pg_claim takes: the key layout's slot
/// range (`claim_slot`, `claim_slots`, `slot_counts`, `notify_slot`).
pub const MAX_N: i32 = MAX_KEY_INDEX;
