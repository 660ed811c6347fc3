//! pg_claim: split one dataset between many workers without a queue.
//!
//! Modules, one per SQL concept:
//! - `hashing`: pure key → slot arithmetic (no PostgreSQL dependency)
//! - `mapping`: the SQL key → slot functions (`slot_of`, `crc32`, `jump_slot`, ...)
//! - `error`:   SQLSTATE + message + hint reporting
//! - `locks`:   the advisory lock key layout and lock primitives

::pgrx::pg_module_magic!(name, version);

pub mod error;
pub mod hashing;
pub mod locks;
pub mod mapping;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
