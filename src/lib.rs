//! pg_claim: split one dataset between many workers without a queue.
//!
//! One module per SQL concept, each with its SQL surface (the functions, their
//! input checks and errors) in `<concept>.rs` and its pure logic, with unit
//! and property tests, in a submodule:
//! - `mapping`: key → slot functions (`slot_of`, `crc32`, `jump_slot`,
//!   `pg_hash_slot`, `range_slot`); pure core `mapping::hashing`
//! - `claim`:   `claim_slot`, `claim_slots`, `release_slot`, `my_slot`, `my_slots`,
//!   `slot_holders`, `slot_status` (SQL); pure core `claim::probe`
//! - `items`:   `my_items`, `my_items_query`, `slot_counts`, `slot_skew`; pure core `items::plan`
//! - `group`:   group membership, positions, `claim_partitions`; pure core `group::plan`
//! - `leases`:  leases and fencing tokens (`claim_lease`, `fence`, `my_token`, ...): Rust
//!   shells around internal SECURITY DEFINER functions in SQL
//! - failures: failing items (`record_failure`, `failing_items`, ...), all in
//!   SQL (`sql/failures.sql`, included below; no Rust module)
//! - tenants: `slot_of_spread`, `my_items_fair`, all in SQL (`sql/tenants.sql`,
//!   included below; no Rust module)
//! - `wake`:    `slot_channel` (SQL) and the C trigger function `notify_slot`
//! - `spread`:  `spread_agg`; pure core `spread::order`, `spread::groups`
//!
//! Shared by them: `locks` (the advisory lock key layout, lock primitives and
//! the per-session lock bound) and `backend` (errors, settings, the fmgr
//! macro, catalog helpers, internal functions called by OID). docs/architecture.md has the whole map.

::pgrx::pg_module_magic!(name, version);

mod backend;
mod claim;
mod group;
mod items;
mod leases;
mod locks;
mod mapping;
mod spread;
mod wake;

// The concepts written only in SQL, with no Rust code, have their files
// included here, in one place (the SQL of a concept with Rust code is
// included by its module: mapping, claim, items, spread, leases, wake).
//
// failures: record_failure, failure_due, failing_items, clear_failure,
// item_failures (reference: docs/failures.md). A table written only through
// SECURITY DEFINER functions, each one statement, like the leases; the
// pg_regress test `failures` checks it, including one poison item in a share
// of 10,000. The functions call failure_check and pg_claim_need_read_committed
// (of sql/leases.sql) only inside PL/pgSQL bodies, schema-qualified and
// exact-typed, resolved when they run: the file needs nothing created before it.
pgrx::extension_sql_file!("../sql/failures.sql", name = "failures");
// tenants: slot_of_spread, my_items_fair and my_items_fair_query, all in SQL
// and PL/pgSQL (the portable edition runs the same file)
pgrx::extension_sql_file!(
    "../sql/tenants.sql",
    name = "tenants",
    requires = ["slot_of_crc32_jump_slot"]
);

/// Called once when the library is loaded into a backend.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    backend::error::disable_backtraces();
    backend::settings::init();
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
