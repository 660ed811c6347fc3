//! Where the check reads: pg_claim's table `pg_claim_leases`, found in the
//! extension's schema and checked to be a member of the extension, its
//! primary key index, whether the guard triggers fire, and the attribute
//! numbers of the columns the check reads.

use crate::backend::error::raise;
use crate::backend::internal::extension;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{CStr, CString};

/// The columns of `pg_claim_leases` the check reads, by attribute number.
#[derive(Clone, Copy)]
pub(super) struct Columns {
    pub(super) slot: i32,
    pub(super) token: i32,
    pub(super) holder: i32,
    pub(super) session: i32,
    pub(super) expires_at: i32,
    pub(super) owner: i32,
    pub(super) last: i32,
}

/// The table, its primary key index and its columns, found once per backend
/// (and again after an invalidation of the table).
#[derive(Clone, Copy)]
pub(super) struct Leases {
    pub(super) table: pg_sys::Oid,
    pub(super) index: pg_sys::Oid,
    pub(super) cols: Columns,
    /// the triggers of `sql/leases_guard.sql` are there and fire ALWAYS:
    /// the fence lock carries the guarantee in READ COMMITTED
    pub(super) guarded: bool,
}

const HINT: &str = "The installation of pg_claim in this database is incomplete or was altered: \
                    run ALTER EXTENSION pg_claim UPDATE, or reinstall the extension.";

/// The relation `name` of schema `nsp`, a member of extension `ext`; raises
/// 42P01 otherwise.
fn member_relation(name: &str, nsp: pg_sys::Oid, ext: pg_sys::Oid) -> pg_sys::Oid {
    let cname = CString::new(name).expect("relation names contain no NUL");
    // SAFETY: catalog look-ups by name and by object
    let oid = unsafe { pg_sys::get_relname_relid(cname.as_ptr(), nsp) };
    let member = oid != pg_sys::InvalidOid
        // SAFETY: a pg_depend look-up of an existing relation
        && unsafe { pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, oid) } == ext;
    if !member {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("pg_claim's relation {name} does not exist in the extension's schema"),
            HINT,
        );
    }
    oid
}

/// The primary key index of `table` (an index belongs to its table, not to
/// the extension), and whether the guard triggers are there and fire ALWAYS.
fn primary_key_and_guard(table: pg_sys::Oid) -> (pg_sys::Oid, bool) {
    // SAFETY: the relcache entry of an existing table, opened and closed
    // here; RelationGetIndexList fills rd_pkindex; the trigger descriptor
    // is read while the relation is open
    let (index, guarded) = unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::list_free(pg_sys::RelationGetIndexList(rel));
        let index = (*rel).rd_pkindex;
        let mut guards = 0;
        let td = (*rel).trigdesc;
        if !td.is_null() {
            for i in 0..(*td).numtriggers.max(0) as usize {
                let t = (*td).triggers.add(i);
                let name = CStr::from_ptr((*t).tgname).to_bytes();
                if (name == b"pg_claim_leases_guard" || name == b"pg_claim_leases_guard_delete")
                    && (*t).tgenabled as u8 == pg_sys::TRIGGER_FIRES_ALWAYS
                {
                    guards += 1;
                }
            }
        }
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        (index, guards == 2)
    };
    if index == pg_sys::InvalidOid {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            "pg_claim's table pg_claim_leases has no primary key".to_string(),
            HINT,
        );
    }
    (index, guarded)
}

fn attnum(table: pg_sys::Oid, column: &str) -> i32 {
    let cname = CString::new(column).expect("column names contain no NUL");
    // SAFETY: a syscache look-up
    let n = unsafe { pg_sys::get_attnum(table, cname.as_ptr()) };
    if n <= 0 {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            format!("pg_claim's table pg_claim_leases has no column {column}"),
            HINT,
        );
    }
    n as i32
}

/// The table, its index and columns, looked up in the catalogs; raises
/// when the installation lacks one of them.
pub(super) fn find() -> Leases {
    let (ext, nsp) = extension();
    let table = member_relation("pg_claim_leases", nsp, ext);
    let (index, guarded) = primary_key_and_guard(table);
    let cols = Columns {
        slot: attnum(table, "slot"),
        token: attnum(table, "token"),
        holder: attnum(table, "holder"),
        session: attnum(table, "session"),
        expires_at: attnum(table, "expires_at"),
        owner: attnum(table, "owner"),
        last: 0,
    };
    let last = [
        cols.slot,
        cols.token,
        cols.holder,
        cols.session,
        cols.expires_at,
        cols.owner,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    Leases {
        table,
        index,
        cols: Columns { last, ..cols },
        guarded,
    }
}
