//! The job spreader: spread_agg (reference: docs/spreading.md).
//!
//! `spread_agg(job anyelement, grp text, feeders integer ORDER BY ...) → anyarray`
//! collects the jobs with their groups, then returns them in the order of the
//! feeder algorithm (`order`), which is plain Rust.
//!
//! The aggregate is written against the fmgr interface directly (a polymorphic
//! `anyelement` → `anyarray` aggregate with an `internal` state):
//! - the transition state is a Rust struct owned by the aggregate's memory
//!   context (dropped by a reset callback when that context is reset or
//!   deleted, including on error); job values that are passed by reference are
//!   copied into that context, detoasted, as `array_agg` does;
//! - groups map to dense ids by first appearance; NULL is one group of its own;
//! - the final function (`FINALFUNC_EXTRA`, so PostgreSQL resolves `anyarray`
//!   from the job type) builds the array with `construct_md_array`.

mod groups;
mod order;

use crate::backend::error::{invalid_parameter, raise};
use crate::pg_claim_fn;
use groups::GroupIds;
use order::{spread_order_by, GroupOrder};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;
use std::ffi::c_char;

/// Argument positions of the transition and final functions (0 is the state).
const ARG_JOB: usize = 1;
const ARG_GRP: usize = 2;
const ARG_FEEDERS: usize = 3;
const ARG_LARGEST_FIRST: usize = 4;

/// The transition state of one spread_agg call.
struct SpreadState {
    elem_type: pg_sys::Oid,
    typlen: i16,
    typbyval: bool,
    typalign: c_char,
    /// `feeders` of the first row; every row must pass the same value.
    feeders: i32,
    /// `largest_first` of the first row (false for the 3-argument form).
    largest_first: bool,
    /// Per job, in input order: its value (copied into the aggregate
    /// context when passed by reference), whether it is NULL, its group id.
    jobs: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    groups: Vec<u32>,
    /// Group text → id, by first appearance. Group ids in `groups` are
    /// 0 for the NULL group and 1 + this table's id for the others.
    ids: GroupIds,
}

#[cold]
fn bad_feeders(feeders: Option<i32>) -> ! {
    match feeders {
        None => raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            "feeders must not be null".to_string(),
            "The argument feeders is how many groups are served side by side: pass 1 or more.",
        ),
        Some(f) => invalid_parameter(
            format!("feeders must be at least 1, got {f}"),
            "The argument feeders is how many groups are served side by side (jobs of one group \
             end up about feeders positions apart): pass 1 or more.",
        ),
    }
}

#[cold]
fn changed_argument(what: &str, first: String, now: String) -> ! {
    invalid_parameter(
        format!(
            "{what} must be the same for every row of one spread_agg call, got {now} after {first}"
        ),
        "Pass a constant, e.g. spread_agg(id, customer, 4 ORDER BY created_at).",
    )
}

/// Argument `n` of the current call (None: NULL).
///
/// # Safety
/// `fcinfo` is the current call's, with more than `n` arguments.
unsafe fn arg(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<pg_sys::Datum> {
    pgrx::fcinfo::pg_getarg_datum(fcinfo, n)
}

/// The number of arguments of the current call.
///
/// # Safety
/// `fcinfo` is the current call's.
unsafe fn nargs(fcinfo: pg_sys::FunctionCallInfo) -> usize {
    (*fcinfo).nargs as usize
}

/// The aggregate memory context, or an ERROR when called outside an aggregate.
///
/// # Safety
/// `fcinfo` is the current call's.
unsafe fn agg_context(fcinfo: pg_sys::FunctionCallInfo, func: &str) -> pg_sys::MemoryContext {
    let mut cx: pg_sys::MemoryContext = std::ptr::null_mut();
    if pg_sys::AggCheckCallContext(fcinfo, &mut cx) == 0 || cx.is_null() {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("{func} can only be called as part of the spread_agg aggregate"),
            "Call spread_agg(job, grp, feeders ORDER BY ...) instead.",
        )
    }
    cx
}

/// Copy a by-reference job value into `cx` (varlena values detoasted).
///
/// # Safety
/// `value` is a non-NULL by-reference datum of a type of length `typlen`,
/// and `cx` a live memory context.
unsafe fn copy_job(value: pg_sys::Datum, typlen: i16, cx: pg_sys::MemoryContext) -> pg_sys::Datum {
    PgMemoryContexts::For(cx).switch_to(|_| match typlen {
        -1 => pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(value.cast_mut_ptr())),
        len => {
            let src: *const u8 = value.cast_mut_ptr();
            let size = if len == -2 {
                std::ffi::CStr::from_ptr(src as *const c_char)
                    .to_bytes()
                    .len()
                    + 1
            } else {
                len as usize
            };
            let dst = pg_sys::palloc(size) as *mut u8;
            std::ptr::copy_nonoverlapping(src, dst, size);
            pg_sys::Datum::from(dst)
        }
    })
}

pg_claim_fn!(guarded
/// Transition function of both spread_agg forms:
/// `(internal, anyelement, text, integer[, boolean]) → internal`, not strict.
spread_agg_trans, |fcinfo| {
    let cx = agg_context(fcinfo, "spread_agg_trans");
    let feeders = arg(fcinfo, ARG_FEEDERS).map(|d| d.value() as i32);
    let largest_first = if nargs(fcinfo) > ARG_LARGEST_FIRST {
        match arg(fcinfo, ARG_LARGEST_FIRST) {
            Some(d) => d.value() != 0,
            None => raise(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                "largest_first must not be null".to_string(),
                "Pass true to take the largest groups first, false for first appearance.",
            ),
        }
    } else {
        false
    };

    let state: *mut SpreadState = match arg(fcinfo, 0) {
        Some(d) => d.cast_mut_ptr(),
        None => {
            let feeders = match feeders {
                Some(f) if f >= 1 => f,
                other => bad_feeders(other),
            };
            let elem_type = pg_sys::get_fn_expr_argtype((*fcinfo).flinfo, ARG_JOB as i32);
            if elem_type == pg_sys::InvalidOid {
                raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    "could not determine the type of spread_agg's job argument".to_string(),
                    "Cast the job to a concrete type.",
                )
            }
            let mut typlen = 0i16;
            let mut typbyval = false;
            let mut typalign: c_char = 0;
            pg_sys::get_typlenbyvalalign(elem_type, &mut typlen, &mut typbyval, &mut typalign);
            PgMemoryContexts::For(cx).leak_and_drop_on_delete(SpreadState {
                elem_type,
                typlen,
                typbyval,
                typalign,
                feeders,
                largest_first,
                jobs: Vec::new(),
                nulls: Vec::new(),
                groups: Vec::new(),
                ids: GroupIds::default(),
            })
        }
    };
    let state = &mut *state;

    if feeders != Some(state.feeders) {
        match feeders {
            Some(f) if f >= 1 => {
                changed_argument("feeders", state.feeders.to_string(), f.to_string())
            }
            other => bad_feeders(other),
        }
    }
    if largest_first != state.largest_first {
        changed_argument(
            "largest_first",
            state.largest_first.to_string(),
            largest_first.to_string(),
        )
    }

    let group = match arg(fcinfo, ARG_GRP) {
        None => 0,
        Some(d) => {
            let text = pg_sys::pg_detoast_datum_packed(d.cast_mut_ptr());
            let key = pgrx::varlena::varlena_to_byte_slice(text);
            1 + state.ids.id(key)
        }
    };
    let (job, is_null) = match arg(fcinfo, ARG_JOB) {
        None => (pg_sys::Datum::from(0usize), true),
        Some(d) if state.typbyval => (d, false),
        Some(d) => (copy_job(d, state.typlen, cx), false),
    };
    state.jobs.push(job);
    state.nulls.push(is_null);
    state.groups.push(group);
    pg_sys::Datum::from(state as *mut SpreadState)
});

pg_claim_fn!(guarded
/// Final function of both spread_agg forms:
/// `(internal, anyelement, text, integer[, boolean]) → anyarray`
/// (`FINALFUNC_EXTRA`), not strict. NULL when there were no rows.
spread_agg_final, |fcinfo| {
    agg_context(fcinfo, "spread_agg_final");
    let Some(d) = arg(fcinfo, 0) else {
        (*fcinfo).isnull = true;
        return pg_sys::Datum::from(0usize);
    };
    let state = &*d.cast_mut_ptr::<SpreadState>();
    let group_order = if state.largest_first {
        GroupOrder::LargestFirst
    } else {
        GroupOrder::FirstAppearance
    };
    let spread = spread_order_by(&state.groups, state.feeders as usize, group_order);
    let mut elems: Vec<pg_sys::Datum> = spread.order.iter().map(|&i| state.jobs[i]).collect();
    let mut nulls: Vec<bool> = spread.order.iter().map(|&i| state.nulls[i]).collect();
    drop(spread);
    let mut dims = [elems.len() as i32];
    let mut lbs = [1i32];
    let array = pg_sys::construct_md_array(
        elems.as_mut_ptr(),
        nulls.as_mut_ptr(),
        1,
        dims.as_mut_ptr(),
        lbs.as_mut_ptr(),
        state.elem_type,
        state.typlen as i32,
        state.typbyval,
        state.typalign,
    );
    pg_sys::Datum::from(array)
});

// pg_claim 0.1.0 named these two C functions without the prefix.
pg_claim_fn!(alias spread_agg_trans => spread_agg_trans);
pg_claim_fn!(alias spread_agg_final => spread_agg_final);

extension_sql_file!("../sql/spread.sql", name = "spread_agg");
