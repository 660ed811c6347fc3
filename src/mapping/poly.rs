//! Polymorphic arguments taken as their bare Datum.
//!
//! pgrx's `AnyElement`/`AnyArray` ask the server for the argument's type on
//! every call. The mapping functions need the type only when they build their
//! per-call-site cache (the type of an argument cannot change for a call site),
//! so they take these instead and look the type up once.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::prelude::*;
use pgrx::FromDatum;

/// An `anyelement` argument.
#[derive(Clone, Copy)]
pub(super) struct AnyDatum(pub pg_sys::Datum);

/// An `anyarray` argument.
#[derive(Clone, Copy)]
pub(super) struct AnyArrayDatum(pub pg_sys::Datum);

pgrx::impl_sql_translatable!(AnyDatum, arg_only = "anyelement");
pgrx::impl_sql_translatable!(AnyArrayDatum, arg_only = "anyarray");

macro_rules! bare_datum {
    ($ty:ident) => {
        impl FromDatum for $ty {
            /// # Safety
            /// As [`FromDatum::from_polymorphic_datum`]: `datum` is the argument the
            /// server passed (kept as it is, whatever its type).
            #[inline]
            unsafe fn from_polymorphic_datum(
                datum: pg_sys::Datum,
                is_null: bool,
                _typoid: pg_sys::Oid,
            ) -> Option<Self> {
                if is_null {
                    None
                } else {
                    Some($ty(datum))
                }
            }
        }

        // SAFETY: the argument is taken as the bare Datum the server passed,
        // whatever its type (the type is looked up separately, `arg_type`),
        // so no type is assumed that the datum might not have.
        unsafe impl<'fcx> ArgAbi<'fcx> for $ty {
            /// # Safety
            /// As [`ArgAbi::unbox_arg_unchecked`]: `arg` is an argument of the current
            /// call.
            #[inline]
            unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
                // The functions are STRICT: the server never calls them with NULL.
                let index = arg.index();
                // SAFETY: from_polymorphic_datum above keeps the datum as it
                // is, which is right for any type the argument has.
                unsafe { arg.unbox_arg_using_from_datum() }
                    .unwrap_or_else(|| panic!("argument {index} must not be null"))
            }
        }
    };
}

bare_datum!(AnyDatum);
bare_datum!(AnyArrayDatum);

/// The type of argument `i` of the call, as the parser resolved it.
pub(super) fn arg_type(fcinfo: pg_sys::FunctionCallInfo, i: i32) -> pg_sys::Oid {
    // SAFETY: fcinfo is the current call's.
    unsafe { pg_sys::get_fn_expr_argtype((*fcinfo).flinfo, i) }
}
