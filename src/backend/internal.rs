//! The extension's internal SQL functions, called from Rust directly through
//! the function manager by OID.
//!
//! An internal function (for example `pg_claim_register_name(text)`) is
//! SECURITY DEFINER with EXECUTE revoked from PUBLIC: roles cannot call it,
//! but a direct fmgr call checks no privilege, so the public Rust functions
//! can. The function is looked up by its exact signature in the extension's
//! schema and must be a member of the extension: an object of the same name
//! that someone else created there is never called.

use crate::backend::catalog::namespace_name;
use crate::backend::error::raise;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::ffi::CString;

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

/// The OID of the extension's function `name` with exactly the argument
/// types `argtypes`, in the extension's schema. ERROR when there is none or
/// when the function there is not a member of the extension.
#[allow(dead_code)] // the claiming functions use `internal_fn_if_installed`
pub fn internal_fn(name: &str, argtypes: &[pg_sys::Oid]) -> pg_sys::Oid {
    match internal_fn_if_installed(name, argtypes) {
        Some(oid) => oid,
        None => {
            let schema = namespace_name(extension().1);
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                format!("pg_claim's internal function {schema}.{name} is missing"),
                "The extension's objects were changed by hand: reinstall it (DROP EXTENSION pg_claim; CREATE EXTENSION pg_claim) or run ALTER EXTENSION pg_claim UPDATE.",
            )
        }
    }
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
