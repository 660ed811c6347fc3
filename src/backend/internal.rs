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

use crate::backend::error::raise;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::CString;

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

const HINT: &str = "The installation of pg_claim in this database is incomplete or was altered: \
                    run ALTER EXTENSION pg_claim UPDATE, or reinstall the extension.";

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
    let (oid, namespace) = look_up(name, argtypes);
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

/// `name(argtypes)` as a message shows it.
fn signature(name: &str, argtypes: &[pg_sys::Oid]) -> String {
    let types: Vec<String> = argtypes
        .iter()
        .map(|&t| crate::backend::catalog::type_name(t))
        .collect();
    format!("{name}({})", types.join(", "))
}

fn look_up(name: &str, argtypes: &[pg_sys::Oid]) -> (pg_sys::Oid, pg_sys::Oid) {
    let ext = Spi::get_two::<pg_sys::Oid, pg_sys::Oid>(
        "SELECT e.oid, e.extnamespace FROM pg_catalog.pg_extension e \
         WHERE e.extname OPERATOR(pg_catalog.=) 'pg_claim'::pg_catalog.name",
    );
    let (ext, nsp) = match ext {
        Ok((Some(ext), Some(nsp))) => (ext, nsp),
        _ => raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
            format!(
                "pg_claim's internal function {} cannot be found: the extension is not installed in this database",
                signature(name, argtypes)
            ),
            "Run CREATE EXTENSION pg_claim in this database.",
        ),
    };
    let cname = CString::new(name).unwrap_or_default();
    let nargs = i32::try_from(argtypes.len()).unwrap_or(0);
    // SAFETY: buildoidvector copies the OIDs; GetSysCacheOid probes
    // pg_proc's (name, argument types, schema) index: an exact signature
    // in exactly this schema, never a search_path resolution.
    let oid = unsafe {
        let vec = pg_sys::buildoidvector(argtypes.as_ptr(), nargs);
        pg_sys::GetSysCacheOid(
            pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP as i32,
            pg_sys::Anum_pg_proc_oid as pg_sys::AttrNumber,
            pg_sys::Datum::from(cname.as_ptr()),
            pg_sys::Datum::from(vec),
            pg_sys::Datum::from(nsp),
            pg_sys::Datum::from(0),
        )
    };
    let member = oid != pg_sys::InvalidOid
        // SAFETY: a pg_depend look-up of an existing function
        && unsafe { pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, oid) } == ext;
    if !member {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
            format!(
                "pg_claim's internal function {}.{} {}",
                crate::backend::catalog::quote_ident(&crate::backend::catalog::namespace_name(nsp)),
                signature(name, argtypes),
                if oid == pg_sys::InvalidOid {
                    "does not exist"
                } else {
                    "is not a member of the extension pg_claim"
                }
            ),
            HINT,
        );
    }
    (oid, nsp)
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
        // frames it unwinds through (this one, the callers in src/lease.rs
        // and pgrx's wrapper) own nothing that needs dropping: their data
        // is on the stack or palloc'd.
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
