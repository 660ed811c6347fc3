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

/// Make sure no ERROR of pg_claim carries a Rust backtrace, whatever the
/// server's environment. pgrx's panic hook captures
/// `std::backtrace::Backtrace::capture()` on every ERROR that passes through
/// Rust (a PostgreSQL ERROR inside `my_items`' query too) and appends it to
/// the ERROR's DETAIL when capturing is enabled, which the standard library
/// decides once per process from RUST_LIB_BACKTRACE, else RUST_BACKTRACE.
/// Called from `_PG_init`, before anything in this library can panic: it
/// makes that one decision with RUST_LIB_BACKTRACE=0, then restores the
/// environment as it was, so the server and its child processes see no
/// change. The test `tests/backtrace/run.sh` starts a server with
/// RUST_BACKTRACE=1 and checks the DETAIL of errors through my_items.
pub fn disable_backtraces() {
    const VAR: &str = "RUST_LIB_BACKTRACE";
    let saved = std::env::var_os(VAR);
    // SAFETY: a PostgreSQL backend runs one thread; nothing reads the
    // environment concurrently
    unsafe { std::env::set_var(VAR, "0") };
    drop(std::backtrace::Backtrace::capture());
    // SAFETY: as above
    unsafe {
        match saved {
            Some(v) => std::env::set_var(VAR, v),
            None => std::env::remove_var(VAR),
        }
    }
}
