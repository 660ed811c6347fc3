//! Failing items: record_failure, failure_due, failing_items, clear_failure,
//! item_failures (reference: docs/failures.md).
//!
//! All in SQL (`sql/failures.sql`): a table written only through SECURITY
//! DEFINER functions, each one statement, like the leases. The pg_regress
//! test `failures` checks it, including one poison item in a share of 10,000.

// The functions call failure_check and pg_claim_need_read_committed (of
// sql/leases.sql) only inside PL/pgSQL bodies, schema-qualified and
// exact-typed, resolved when they run: the file needs nothing created before it.
pgrx::extension_sql_file!("../sql/failures.sql", name = "failures");
