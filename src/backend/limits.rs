//! Fixed limits shared by the advisory key layout (`crate::locks`) and the
//! settings (`settings`). Both import them from here, so neither imports the
//! other for a number.

/// The largest `n` (slots) and `P` (partitions) the key layout allows, and
/// the largest `pg_claim.max_locks_per_session`.
pub const MAX_KEY_INDEX: i32 = 1 << 20;
