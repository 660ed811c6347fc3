//! One place that turns pg_claim's errors into PostgreSQL ERRORs with a
//! specific SQLSTATE, a message naming the offending value, and a hint.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// Raise an ERROR. Never returns: PostgreSQL aborts the statement.
#[track_caller]
pub fn raise(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    ErrorReport::new(code, message, "pg_claim")
        .set_hint(hint)
        .report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// Raise SQLSTATE 22023 (invalid_parameter_value).
#[track_caller]
pub fn invalid_parameter(message: String, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        message,
        hint,
    )
}

/// Validate a slot count `n` for the pure mapping functions.
#[inline(always)]
pub fn check_n(n: i32) {
    if n < 1 {
        bad_n(n)
    }
}

#[cold]
#[inline(never)]
fn bad_n(n: i32) -> ! {
    invalid_parameter(
        format!("n must be at least 1, got {n}"),
        "n is the number of slots the keys are split into; pass the worker count (1 or more).",
    )
}
