//! The extension's internal functions, found by exact signature and called
//! directly through the function manager.
//!
//! Some SQL functions are thin Rust shells (SECURITY INVOKER) around an
//! internal SECURITY DEFINER function that reads and writes a table no role
//! may touch directly (docs/leases.md). Their EXECUTE privilege is revoked
//! from PUBLIC: a direct function-manager call by OID needs none, and a role
//! cannot call them by name. [`internal_fn`] finds such a function by its
//! exact signature in the extension's schema and refuses anything that is not
//! a member of the extension, so no overload or look-alike that a role
//! planted anywhere can stand in for it; [`call`] calls it with SQL NULLs
//! allowed both ways.

use crate::backend::catalog::namespace_name;
use crate::backend::error::raise;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::CString;

const HINT: &str = "The installation of pg_claim in this database is incomplete or was altered: \
                    run ALTER EXTENSION pg_claim UPDATE, or reinstall the extension.";

/// The OID and schema of the installed `pg_claim` extension.
pub fn extension() -> (pg_sys::Oid, pg_sys::Oid) {
    // SAFETY: a catalog look-up by name; missing_ok
    let ext = unsafe { pg_sys::get_extension_oid(c"pg_claim".as_ptr(), true) };
    if ext == pg_sys::InvalidOid {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            "extension \"pg_claim\" is not installed in this database".to_string(),
            "Run CREATE EXTENSION pg_claim in this database.",
        );
    }
    (ext, extension_schema(ext))
}

/// The schema of extension `ext` (`pg_extension.extnamespace`), read as
/// PostgreSQL's own `get_extension_schema` does (not exported before 16).
fn extension_schema(ext: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: a standard index scan of pg_extension by OID, closed before
    // returning; the tuple is read while the scan is open.
    unsafe {
        let rel = pg_sys::table_open(
            pg_sys::ExtensionRelationId,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        );
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyInit(
            &mut key,
            pg_sys::Anum_pg_extension_oid as pg_sys::AttrNumber,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::RegProcedure::from(pg_sys::F_OIDEQ),
            pg_sys::Datum::from(ext),
        );
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::Oid::from(pg_sys::ExtensionOidIndexId),
            true,
            std::ptr::null_mut(),
            1,
            &mut key,
        );
        let tuple = pg_sys::systable_getnext(scan);
        let nsp = if tuple.is_null() {
            pg_sys::InvalidOid
        } else {
            (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_extension>(tuple)).extnamespace
        };
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        nsp
    }
}

/// One looked-up internal function: its name, argument types, OID and schema.
struct Entry {
    name: String,
    argtypes: Vec<pg_sys::Oid>,
    oid: pg_sys::Oid,
    namespace: pg_sys::Oid,
}

thread_local! {
    /// The internal functions this backend looked up (a handful).
    static FOUND: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

/// The OID of the internal function `name(argtypes)` of the extension: the
/// function of exactly that signature in the extension's schema, which must
/// be a member of the extension; raises 42883 otherwise. Cached per backend
/// and checked again (one syscache probe) at every use, so a dropped and
/// re-created extension is found anew.
pub fn internal_fn(name: &str, argtypes: &[pg_sys::Oid]) -> pg_sys::Oid {
    let cached = FOUND.with(|f| {
        f.borrow()
            .iter()
            .find(|e| e.name == name && e.argtypes == argtypes)
            .map(|e| (e.oid, e.namespace))
    });
    if let Some((oid, nsp)) = cached {
        // SAFETY: a syscache look-up; InvalidOid when the function is gone
        if unsafe { pg_sys::get_func_namespace(oid) } == nsp {
            return oid;
        }
        FOUND.with(|f| f.borrow_mut().retain(|e| e.oid != oid));
    }
    let Some(oid) = internal_fn_if_installed(name, argtypes) else {
        let schema = crate::backend::catalog::quote_ident(&namespace_name(extension().1));
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
            format!(
                "pg_claim's internal function {schema}.{} does not exist",
                signature(name, argtypes)
            ),
            HINT,
        );
    };
    // SAFETY: a syscache look-up of an existing function
    let namespace = unsafe { pg_sys::get_func_namespace(oid) };
    FOUND.with(|f| {
        f.borrow_mut().push(Entry {
            name: name.to_owned(),
            argtypes: argtypes.to_vec(),
            oid,
            namespace,
        })
    });
    oid
}

/// As [`internal_fn`], but None when the extension's schema has no function
/// of that signature: an installation whose SQL objects are still those of
/// an earlier release (before `ALTER EXTENSION pg_claim UPDATE`) that did not
/// have it. A function of that signature that is not a member of the
/// extension is still an ERROR.
pub fn internal_fn_if_installed(name: &str, argtypes: &[pg_sys::Oid]) -> Option<pg_sys::Oid> {
    let (ext, nsp) = extension();
    let cname = CString::new(name).expect("internal function names contain no NUL");
    // SAFETY: buildoidvector copies the array into a palloc'd oidvector; the
    // syscache look-up by (name, argument types, schema) is the one
    // PostgreSQL's own exact-signature look-ups use.
    let oid = unsafe {
        let args = pg_sys::buildoidvector(argtypes.as_ptr(), argtypes.len() as i32);
        pg_sys::GetSysCacheOid(
            pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP as i32,
            pg_sys::Anum_pg_proc_oid as pg_sys::AttrNumber,
            pg_sys::Datum::from(cname.as_ptr()),
            pg_sys::Datum::from(args),
            pg_sys::Datum::from(nsp),
            pg_sys::Datum::from(0usize),
        )
    };
    if oid == pg_sys::InvalidOid {
        return None;
    }
    let schema = namespace_name(nsp);
    // SAFETY: a pg_depend look-up of an existing function
    let owner = unsafe { pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, oid) };
    if owner != ext {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "function {schema}.{name} is not pg_claim's own: it is not a member of the extension"
            ),
            "Someone created a function with the name and argument types of pg_claim's internal function; drop it and reinstall or update the extension.",
        );
    }
    Some(oid)
}

/// `name(argtypes)` as a message shows it.
fn signature(name: &str, argtypes: &[pg_sys::Oid]) -> String {
    let types: Vec<String> = argtypes
        .iter()
        .map(|&t| crate::backend::catalog::type_name(t))
        .collect();
    format!("{name}({})", types.join(", "))
}

/// Call the function `oid` with `args` (None: SQL NULL) under the default
/// collation, directly through the function manager (its SECURITY DEFINER
/// and SET clauses apply as for any call). None when it returned NULL.
///
/// # Safety
/// `args` must match the function's argument types, and `oid` must be a
/// function that returns no set. An ERROR of the function jumps over the
/// caller's frames: they must hold nothing that needs dropping.
pub unsafe fn call(oid: pg_sys::Oid, args: &[Option<pg_sys::Datum>]) -> Option<pg_sys::Datum> {
    // SAFETY: the caller's promises; the FmgrInfo and the call info live
    // for the call, in the current memory context
    unsafe {
        let flinfo =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::FmgrInfo>()) as *mut pg_sys::FmgrInfo;
        pg_sys::fmgr_info(oid, flinfo);
        let size = std::mem::size_of::<pg_sys::FunctionCallInfoBaseData>()
            + args.len() * std::mem::size_of::<pg_sys::NullableDatum>();
        let fcinfo = pg_sys::palloc0(size) as pg_sys::FunctionCallInfo;
        (*fcinfo).flinfo = flinfo;
        (*fcinfo).fncollation = pg_sys::DEFAULT_COLLATION_OID;
        (*fcinfo).nargs = args.len() as i16;
        let slots = (*fcinfo).args.as_mut_slice(args.len());
        for (slot, arg) in slots.iter_mut().zip(args) {
            *slot = pg_sys::NullableDatum {
                value: arg.unwrap_or(pg_sys::Datum::from(0)),
                isnull: arg.is_none(),
            };
        }
        let Some(f) = (*flinfo).fn_addr else {
            crate::backend::error::internal("call an internal function", "no entry point");
        };
        // Called as PostgreSQL calls a function: an ERROR it raises
        // propagates unchanged (its own SQLSTATE, such as PC001, its DETAIL
        // and CONTEXT), which pgrx's FFI guard would turn into XX000. The
        // frames it unwinds through (this one, `call_as_caller`, the
        // shells of `role_shells!`, define_fleet and drop_fleet, and pgrx's
        // wrapper) own nothing that needs dropping: their data is on the
        // stack or palloc'd.
        let result = f(fcinfo);
        let isnull = (*fcinfo).isnull;
        pg_sys::pfree(fcinfo.cast());
        pg_sys::pfree(flinfo.cast());
        if isnull {
            None
        } else {
            Some(result)
        }
    }
}

/// The calling role (`GetUserId()`), as the datum of an `oid` argument.
pub fn caller() -> Option<pg_sys::Datum> {
    // SAFETY: GetUserId reads the backend's current user
    Some(pg_sys::Datum::from(unsafe { pg_sys::GetUserId() }))
}

/// The most arguments [`call_as_caller`] passes, the role included.
const MAX_ARGS: usize = 8;

/// Call the internal function `name(oid, argtypes...)` with the calling
/// role first, then `args` (what [`role_shells!`](crate::role_shells)
/// calls).
///
/// # Safety
/// Each of `args` is NULL or a datum of the type at the same place of
/// `argtypes`, and the function returns no set; as for [`call`], an ERROR
/// of the function jumps over the caller's frames, which must hold nothing
/// that needs dropping.
pub unsafe fn call_as_caller(
    name: &str,
    argtypes: &[pg_sys::Oid],
    args: &[Option<pg_sys::Datum>],
) -> Option<pg_sys::Datum> {
    let n = args.len();
    assert!(n == argtypes.len() && n < MAX_ARGS, "{name}: {n} arguments");
    // on the stack: an ERROR of the call jumps over this frame
    let mut types = [pg_sys::OIDOID; MAX_ARGS];
    types[1..=n].copy_from_slice(argtypes);
    let oid = internal_fn(name, &types[..=n]);
    let mut all: [Option<pg_sys::Datum>; MAX_ARGS] = [None; MAX_ARGS];
    all[0] = caller();
    all[1..=n].copy_from_slice(args);
    // SAFETY: the caller's promises, for the function of exactly these
    // argument types
    unsafe { call(oid, &all[..=n]) }
}

/// Attribute `attno` (from 1) of a composite value an internal function
/// returned (OUT parameters), converted to `T`.
///
/// # Safety
/// `row` must be a composite datum whose attribute `attno` has type `T`.
pub unsafe fn field<T: FromDatum>(row: pg_sys::Datum, attno: i16) -> Option<T> {
    // SAFETY: the caller's promise; detoasting a composite yields its header
    unsafe {
        let header = pg_sys::pg_detoast_datum(row.cast_mut_ptr()) as pg_sys::HeapTupleHeader;
        let mut isnull = false;
        let d = pg_sys::GetAttributeByNum(header, attno, &mut isnull);
        T::from_datum(d, isnull)
    }
}
