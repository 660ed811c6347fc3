//! The methods the benchmark compares: their names, labels and colours, and
//! which of them claim a slot.

/// Every method, in the order of the table and the plot's legend.
pub const METHODS: [&str; 6] = [
    "pg_claim",
    "my_items",
    "pg_claim_tx",
    "skip_locked",
    "skip_locked_simple",
    "pgq",
];
/// `--methods` when not given: all of them.
pub const DEFAULT_METHODS: &str =
    "pg_claim,my_items,pg_claim_tx,skip_locked,skip_locked_simple,pgq";

/// The method's name in the table and the plot's legend.
pub fn label(m: &str) -> &'static str {
    match m {
        "pg_claim" => "pg_claim (claim_slot + slot_of index)",
        "my_items" => "pg_claim (claim_slot + my_items)",
        "pg_claim_tx" => "pg_claim (in a queue-style transaction)",
        "skip_locked" => "FOR UPDATE SKIP LOCKED queue",
        "skip_locked_simple" => "FOR UPDATE SKIP LOCKED queue (two round trips)",
        _ => "PgQ (one queue + consumer per worker)",
    }
}

/// The method's line colour in the plot.
pub fn color(m: &str) -> &'static str {
    match m {
        "pg_claim" => "#1f77b4",
        "my_items" => "#2ca02c",
        "pg_claim_tx" => "#9467bd",
        "skip_locked" => "#d62728",
        "skip_locked_simple" => "#8c564b",
        _ => "#ff7f0e",
    }
}

/// Whether the method's workers claim a slot and walk its share (the others
/// take from a queue).
pub fn claims_slot(method: &str) -> bool {
    matches!(method, "pg_claim" | "my_items" | "pg_claim_tx")
}
