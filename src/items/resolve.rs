//! The mapping call the generated SQL makes on the route column: its
//! exact-typed key argument, and the check (42723) that PostgreSQL's parser
//! resolves it to pg_claim's own function.

use super::catalog::ExtSchema;
use super::columns::Key;
use super::plan::{ArgForm, KeyKind, Mapping};
use crate::backend::catalog::{cstr_to_string, type_name};
use crate::backend::error::{internal, raise};
use pgrx::pg_sys;
use pgrx::prelude::*;

/// The type of the key parameter of the mapping function `m` calls for keys
/// like `key`: the exact type the generated SQL passes (casting the column
/// when its declared type differs), or None for the polymorphic
/// `pg_hash_slot`, which takes the column as it is.
pub fn param_type(m: &Mapping, key: &Key) -> Option<pg_sys::Oid> {
    match (m.arg, m.func, key.kind) {
        (ArgForm::KeyAsText, _, _) => Some(pg_sys::TEXTOID),
        (_, "pg_hash_slot", _) => None,
        (_, "jump_slot", KeyKind::Int) => Some(pg_sys::INT8OID),
        (_, _, KeyKind::Text) => Some(pg_sys::TEXTOID),
        _ => Some(key.type_oid),
    }
}

/// `pg_catalog.<name>` of a parameter type of the mapping functions.
fn param_type_name(t: pg_sys::Oid) -> &'static str {
    match t {
        pg_sys::INT2OID => "pg_catalog.int2",
        pg_sys::INT4OID => "pg_catalog.int4",
        pg_sys::INT8OID => "pg_catalog.int8",
        pg_sys::TEXTOID => "pg_catalog.text",
        pg_sys::BYTEAOID => "pg_catalog.bytea",
        pg_sys::UUIDOID => "pg_catalog.uuid",
        other => internal("name a mapping parameter type", other.to_u32()),
    }
}

/// The key argument of the mapping call on `key`, exact-typed: the quoted
/// column, cast to the parameter type when its declared type (a varchar,
/// char(n) or domain column) is another, so that the call matches only
/// pg_claim's own function of that signature and no overload anyone
/// creates for the declared type. An expression index built the natural
/// way (`slot_of(col, 8)` on a varchar column) holds the same expression:
/// PostgreSQL inserts the same cast implicitly there.
pub fn key_arg(m: &Mapping, key: &Key) -> String {
    match param_type(m, key) {
        Some(t) if m.arg == ArgForm::Key && t != key.decl_type => {
            format!("({})::{}", key.quoted, param_type_name(t))
        }
        _ => key.quoted.clone(),
    }
}

/// Check that the generated call `<ext>.<m.func>(<key_arg(m, key)>, <int4>)`
/// resolves to pg_claim's own function, as PostgreSQL's parser will resolve
/// it: a function created in pg_claim's schema with a better-matching
/// signature (for the polymorphic `pg_hash_slot`, any exact-typed
/// overload) would otherwise run in its place with the caller's rights.
/// SQLSTATE 42723 naming the function it would run.
pub fn check_mapping_resolves(m: &Mapping, key: &Key, ext: &ExtSchema) {
    let argtype = match param_type(m, key) {
        Some(t) => t,
        None => key.decl_type,
    };
    // SAFETY: parser look-ups in the current memory context; every
    // out-pointer is a local
    unsafe {
        let names = pg_sys::lappend(
            pg_sys::lappend(
                std::ptr::null_mut(),
                pg_sys::makeString(pg_sys::pstrdup(
                    std::ffi::CString::new(ext.name.as_str())
                        .unwrap_or_default()
                        .as_ptr(),
                ))
                .cast(),
            ),
            pg_sys::makeString(pg_sys::pstrdup(
                std::ffi::CString::new(m.func).unwrap_or_default().as_ptr(),
            ))
            .cast(),
        );
        let mut argtypes = [argtype, pg_sys::INT4OID];
        let mut funcid = pg_sys::InvalidOid;
        let mut rettype = pg_sys::InvalidOid;
        let mut retset = false;
        let mut nvargs = 0;
        let mut vatype = pg_sys::InvalidOid;
        let mut true_typeids: *mut pg_sys::Oid = std::ptr::null_mut();
        let mut argdefaults: *mut pg_sys::List = std::ptr::null_mut();
        let code = pg_sys::func_get_detail(
            names,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            2,
            argtypes.as_mut_ptr(),
            true,
            true,
            false,
            &mut funcid,
            &mut rettype,
            &mut retset,
            &mut nvargs,
            &mut vatype,
            &mut true_typeids,
            &mut argdefaults,
        );
        let own = pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, ext.func);
        let normal = code == pg_sys::FuncDetailCode::FUNCDETAIL_NORMAL;
        if normal
            && own != pg_sys::InvalidOid
            && pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, funcid) == own
        {
            return;
        }
        let call = format!("{}.{}({}, integer)", ext.quoted, m.func, type_name(argtype));
        let what = if normal {
            format!(
                "resolves to {}, which is not part of pg_claim",
                cstr_to_string(pg_sys::format_procedure_qualified(funcid))
            )
        } else if code == pg_sys::FuncDetailCode::FUNCDETAIL_MULTIPLE {
            "is ambiguous: more than one function of that name matches".to_string()
        } else {
            "resolves to no function of pg_claim".to_string()
        };
        raise(
            PgSqlErrorCode::ERRCODE_DUPLICATE_FUNCTION,
            format!(
                "the call {call} that maps key column {} {what}",
                key.quoted
            ),
            &format!(
                "Someone created a function named {} in pg_claim's schema {}; drop it, and keep that schema \
                 writable only by trusted roles (install pg_claim in a schema of its own).",
                m.func, ext.quoted
            ),
        )
    }
}
