//! Functions written against PostgreSQL's function manager directly.
//!
//! Most SQL functions are `#[pg_extern]` functions, whose C entry points
//! pgrx generates (`<rust name>_wrapper`). The ones that must read their
//! `FunctionCallInfo` themselves (the per-row mappings, the `my_items`
//! set-returning function, the `spread_agg` aggregate's transition and final
//! functions) are declared with [`pg_claim_fn!`](crate::pg_claim_fn), the one
//! place that writes their version-1 info record and their C names: the
//! function `pg_claim_<name>` and its record `pg_finfo_pg_claim_<name>`, which
//! the hand-written SQL in `sql/` names as `AS 'MODULE_PATHNAME',
//! 'pg_claim_<name>'`.
//!
//! [`role_shells!`](crate::role_shells) declares the `#[pg_extern]` shells
//! that pass the calling role to an internal SECURITY DEFINER function.

/// Declares a version-1 C function `pg_claim_<name>` and its info record
/// `pg_finfo_pg_claim_<name>`.
///
/// - `pg_claim_fn!(raw name, |fcinfo| body)`: the body runs as is. For the
///   per-row hot paths: the body must run every step that can raise a
///   PostgreSQL ERROR or panic inside `pgrx_extern_c_guard`.
/// - `pg_claim_fn!(guarded name, |fcinfo| body)`: the whole body runs under
///   `#[pg_guard]`, which turns panics and PostgreSQL ERRORs into a proper
///   ERROR.
/// - `pg_claim_fn!(alias old_symbol => name)`: also exports `name` under the C
///   name an earlier release's install script used (`old_symbol` and
///   `pg_finfo_old_symbol`), so that an installation still at that release
///   keeps working with this library until `ALTER EXTENSION pg_claim UPDATE`
///   points it at `pg_claim_<name>`.
#[macro_export]
macro_rules! pg_claim_fn {
    (@finfo $name:ident) => {
        const _: () = {
            #[export_name = concat!("pg_finfo_pg_claim_", stringify!($name))]
            #[doc(hidden)]
            pub extern "C" fn finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
                static V1: ::pgrx::pg_sys::Pg_finfo_record =
                    ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
                &V1
            }
        };
    };
    (raw $(#[$meta:meta])* $name:ident, |$fcinfo:ident| $body:block) => {
        $crate::pg_claim_fn!(@finfo $name);

        $(#[$meta])*
        ///
        /// # Safety
        /// Called only by PostgreSQL's function manager, with a valid
        /// `fcinfo` for the SQL signature declared in `sql/`.
        #[export_name = concat!("pg_claim_", stringify!($name))]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $name(
            $fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
        ) -> ::pgrx::pg_sys::Datum {
            $body
        }
    };
    (alias $old:ident => $name:ident) => {
        const _: () = {
            #[export_name = concat!("pg_finfo_", stringify!($old))]
            #[doc(hidden)]
            pub extern "C" fn finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
                static V1: ::pgrx::pg_sys::Pg_finfo_record =
                    ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
                &V1
            }

            /// # Safety
            /// As the function it stands for.
            #[export_name = stringify!($old)]
            #[doc(hidden)]
            pub unsafe extern "C-unwind" fn old(
                fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
            ) -> ::pgrx::pg_sys::Datum {
                // SAFETY: the same call, forwarded
                unsafe { $name(fcinfo) }
            }
        };
    };
    (guarded $(#[$meta:meta])* $name:ident, |$fcinfo:ident| $body:block) => {
        // what #[pg_guard] does: panics and PostgreSQL ERRORs become an ERROR
        $crate::pg_claim_fn!(raw $(#[$meta])* $name, |$fcinfo| {
            ::pgrx::pg_sys::panic::pgrx_extern_c_guard(|| $body)
        });
    };
}

/// Declares SQL functions that are thin SECURITY INVOKER shells around an
/// internal SECURITY DEFINER function of the extension (the leases'
/// `pg_claim_lease_*`, docs/leases.md): each is a `#[pg_extern]` function
/// that calls `internal(the calling role, its own arguments...)` through the
/// function manager
/// ([`call_as_caller`](crate::backend::internal::call_as_caller)) and turns
/// the result into its own with `convert`.
///
/// ```text
/// role_shells! {
///     /// What it does.
///     #[pg_extern(volatile, parallel_unsafe)]
///     fn name(a: Option<T>, b: Option<U> = "'30 seconds'", ...) -> R
///         where { an early return, before the call }
///         = internal_function via convert;
///     ...
/// }
/// ```
///
/// Every argument is an `Option` (SQL NULL passes through to the internal
/// function, which raises its argument errors); `= "SQL"` gives it a
/// default, as pgrx's `default!`. The internal function's signature is
/// `(oid, ...)` with the SQL types of the arguments' Rust types. `convert`
/// is an `unsafe fn(Option<Datum>) -> R` whose `# Safety` names the result
/// type it reads: the internal function's, declared in `sql/`. The optional
/// `where` block runs first (a check that answers without the call).
#[macro_export]
macro_rules! role_shells {
    // The parameters, one at a time, into `[name (type) (signature type)]`.
    (@params $head:tt $ret:tt $pre:tt $call:tt [$($done:tt)*]
        $arg:ident: Option<$ty:ty> = $default:tt $(, $($rest:tt)*)?) => {
        $crate::role_shells!(@params $head $ret $pre $call
            [$($done)* [$arg ($ty) (::pgrx::default!(Option<$ty>, $default))]] $($($rest)*)?);
    };
    (@params $head:tt $ret:tt $pre:tt $call:tt [$($done:tt)*]
        $arg:ident: Option<$ty:ty> $(, $($rest:tt)*)?) => {
        $crate::role_shells!(@params $head $ret $pre $call
            [$($done)* [$arg ($ty) (Option<$ty>)]] $($($rest)*)?);
    };
    (@params [$($head:tt)*] [$($ret:ty)?] [$($pre:block)?] [$internal:ident $convert:path]
        [$([$arg:ident ($ty:ty) ($($sig:tt)*)])*]) => {
        $($head)* ($($arg: $($sig)*),*) $(-> $ret)? {
            $($pre;)?
            let internal = stringify!($internal);
            let types = [$(<$ty as ::pgrx::datum::IntoDatum>::type_oid()),*];
            let args = [$($arg.and_then(::pgrx::datum::IntoDatum::into_datum)),*];
            let convert = $convert;
            // SAFETY: each argument is passed as the datum of its own type,
            // the type the internal function is looked up with; `convert`
            // reads the result as the internal function declares it; an
            // ERROR of the call leaves nothing to drop on these frames (the
            // arguments are borrowed or Copy, the datums palloc'd)
            unsafe { convert($crate::backend::internal::call_as_caller(internal, &types, &args)) }
        }
    };
    (
        $(#[$attr:meta])*
        fn $name:ident($($params:tt)*) $(-> $ret:ty)?
        $(where $pre:block)?
        = $internal:ident via $convert:path;
        $($more:tt)*
    ) => {
        $crate::role_shells!(@params [$(#[$attr])* fn $name] [$($ret)?] [$($pre)?]
            [$internal $convert] [] $($params)*);
        $crate::role_shells!($($more)*);
    };
    () => {};
}
