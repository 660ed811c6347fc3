//! Leases and fencing tokens: claim_lease, renew_lease, release_lease,
//! lease_holders, fence, lease_valid, my_token (reference: docs/leases.md).
//!
//! The whole concept is SQL (`sql/leases.sql`): a table written only through
//! SECURITY DEFINER functions, each one statement, so that it works through
//! transaction-mode poolers; its correctness rests on row locks, which the
//! file's header explains. The tests here and in `tests/isolation` check it.

// The functions call my_slot and crc32 only inside PL/pgSQL bodies, which
// are resolved when they run: the file needs nothing created before it.
pgrx::extension_sql_file!("../sql/leases.sql", name = "leases");
