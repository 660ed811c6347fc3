//! One place that turns pg_claim's errors into PostgreSQL ERRORs with a
//! specific SQLSTATE, a message naming the offending value, and a hint, in
//! PostgreSQL's own style: the message in lower case without a final period,
//! the hint a full sentence. Input checks that several concepts share live
//! here too.

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

/// The hint of every error that means pg_claim itself went wrong.
pub const BUG_HINT: &str = "This is a bug in pg_claim; please report it.";

/// Raise SQLSTATE XX000 for a step that cannot fail unless pg_claim is wrong.
#[cold]
#[track_caller]
pub fn internal(what: &str, e: impl std::fmt::Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("pg_claim could not {what}: {e}"),
        BUG_HINT,
    )
}

/// The hint for a bad `n` of the mappings and of a share.
pub const N_HINT: &str =
    "The argument n is the number of slots the keys are split into: pass the worker count (1 or more).";

/// Raise the ERROR for an `n` below 1, with the concept's hint.
#[cold]
#[inline(never)]
pub fn n_below_one(n: i32, hint: &str) -> ! {
    invalid_parameter(format!("n must be at least 1, got {n}"), hint)
}

/// Validate a slot count `n` for the pure mapping functions.
#[inline(always)]
pub fn check_n(n: i32) {
    if n < 1 {
        n_below_one(n, N_HINT)
    }
}
