//! pg_claim: split one dataset between many workers without a queue.
//!
//! Modules, one per SQL concept:
//! - `hashing`: pure key → slot arithmetic (no PostgreSQL dependency)
//! - `mapping`: the SQL key → slot functions (`slot_of`, `crc32`, `jump_slot`, ...)
//! - `fast`:    slot_of and crc32 as plain version-1 C functions (the per-row hot path)
//! - `error`:   SQLSTATE + message + hint reporting
//! - `locks`:   the advisory lock key layout, lock primitives and the per-session lock bound
//! - `settings`: the `pg_claim.*` parameters and the dead-client check they switch on
//! - `claim`:   claim_slot, release_slot, my_slot, slot_holders
//! - `items`:   my_items, slot_counts
//! - `group`:   group membership, positions, claim_partitions
//! - `spread`:  spread_agg

::pgrx::pg_module_magic!(name, version);

pub mod claim;
pub mod error;
pub mod fast;
pub mod group;
pub mod hashing;
pub mod items;
pub mod locks;
pub mod mapping;
pub mod settings;
pub mod spread;

/// Called once when the library is loaded into a backend.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::init();
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
