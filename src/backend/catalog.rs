//! Catalog look-ups that every concept uses: C strings, identifier quoting,
//! schema, relation and type names, collations. Names leave here quoted
//! where SQL needs it (`quote_identifier`).

use pgrx::pg_sys;
use std::ffi::{CStr, CString};

/// A Rust string from a C string PostgreSQL returned (empty for NULL).
pub fn cstr_to_string(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: PostgreSQL returns NUL-terminated strings
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// A type exactly as a column declares it, modifier included and
/// schema-qualified, in a form that reads back as the same type:
/// `character(5)`, `numeric(10,2)`, `public.my_domain` (SQL-standard names are
/// keywords, which `search_path` cannot capture).
pub fn format_type_exact(typid: pg_sys::Oid, typmod: i32) -> String {
    // SAFETY: format_type_extended accepts an existing type and any typmod
    unsafe {
        cstr_to_string(pg_sys::format_type_extended(
            typid,
            typmod,
            (pg_sys::FORMAT_TYPE_TYPEMOD_GIVEN | pg_sys::FORMAT_TYPE_FORCE_QUALIFY)
                as pg_sys::bits16,
        ))
    }
}

/// `quote_identifier`: double-quotes a name only when SQL needs it.
pub fn quote_ident(name: &str) -> String {
    let c = CString::new(name).unwrap_or_default();
    // SAFETY: c is a valid C string; the result is either c itself or palloc'd
    unsafe { cstr_to_string(pg_sys::quote_identifier(c.as_ptr())) }
}

/// A schema's name (empty when it is gone).
pub fn namespace_name(nsp: pg_sys::Oid) -> String {
    // SAFETY: a syscache look-up; NULL when the namespace is gone
    unsafe { cstr_to_string(pg_sys::get_namespace_name(nsp)) }
}

/// `schema.relation`, each part quoted where needed.
pub fn qualified_rel_name(relid: pg_sys::Oid) -> String {
    // SAFETY: syscache look-ups
    let (nsp, name) = unsafe {
        (
            pg_sys::get_rel_namespace(relid),
            cstr_to_string(pg_sys::get_rel_name(relid)),
        )
    };
    format!(
        "{}.{}",
        quote_ident(&namespace_name(nsp)),
        quote_ident(&name)
    )
}

/// The name of an existing type as SQL prints it (`integer`, `point`,
/// `my_domain`), for messages.
pub fn type_name(typoid: pg_sys::Oid) -> String {
    // SAFETY: an existing type; format_type_be returns a palloc'd C string.
    unsafe { cstr_to_string(pg_sys::format_type_be(typoid)) }
}

/// The collation a call compares or hashes with: the call's own collation
/// (the column's, for `pg_hash_slot(col, n)`), else the type's default, as a
/// table column of that type without a COLLATE clause would have.
pub fn effective_collation(fncollation: pg_sys::Oid, typoid: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: catalog lookups on a valid type OID.
    unsafe {
        if !pg_sys::type_is_collatable(typoid) {
            pg_sys::InvalidOid
        } else if fncollation != pg_sys::InvalidOid {
            fncollation
        } else {
            pg_sys::get_typcollation(typoid)
        }
    }
}
