//! Opening the relation behind my_items' row type or slot_counts' regclass,
//! as PostgreSQL's own commands do: existence, kind and privilege checks
//! before any lock, AccessShareLock to the end of the transaction, and the
//! check that a concurrent DROP did not win; and pg_claim's own schema, for
//! schema-qualified calls in generated SQL. The other look-ups on the opened
//! table are by job: `columns` (key, route, select list), `pending`,
//! `partitions` (hash-partition routing), `advice` (index advice) and
//! `resolve` (the generated mapping call). Names leave here quoted.

use crate::backend::catalog::{namespace_name, qualified_rel_name, quote_ident, type_name};
use crate::backend::error::{internal, raise};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgRelation;

fn wrong_object(message: String, hint: &str) -> ! {
    raise(PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE, message, hint)
}

/// pg_claim's schema, for schema-qualified calls in generated SQL.
pub struct ExtSchema {
    /// its oid
    pub oid: pg_sys::Oid,
    /// its name as stored
    pub name: String,
    /// its name, quoted where needed
    pub quoted: String,
    /// the pg_claim function being called (a member of the extension)
    pub func: pg_sys::Oid,
}

/// The oid of the running SQL function (one of pg_claim's own).
///
/// # Safety
/// `fcinfo` is the current call's.
pub unsafe fn calling_function(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Oid {
    // SAFETY: the function manager fills flinfo for every call
    unsafe { (*(*fcinfo).flinfo).fn_oid }
}

/// pg_claim's schema: the schema of the pg_claim function being called
/// (`calling_function`), wherever the extension was installed.
pub fn extension_schema(func: pg_sys::Oid) -> ExtSchema {
    // SAFETY: syscache look-up of an existing function
    let oid = unsafe { pg_sys::get_func_namespace(func) };
    if oid == pg_sys::InvalidOid {
        internal("find its own schema", func.to_u32());
    }
    let name = namespace_name(oid);
    ExtSchema {
        oid,
        quoted: quote_ident(&name),
        name,
        func,
    }
}

/// A table (or partitioned table, materialized view, foreign table), opened
/// with AccessShareLock for the rest of the transaction.
pub struct Table {
    pub(super) rel: PgRelation,
    pub relid: pg_sys::Oid,
    pub relkind: u8,
    pub quoted: String,
}

fn relkind_word(kind: u8) -> &'static str {
    match kind {
        b'v' => "a view",
        b'c' => "a composite type",
        b'S' => "a sequence",
        b'i' | b'I' => "an index",
        b't' => "a TOAST table",
        _ => "not a table",
    }
}

/// The role whose privileges a query runs with now.
fn current_user() -> pg_sys::Oid {
    // SAFETY: set for every backend
    unsafe { pg_sys::GetUserId() }
}

pub(super) fn permission_denied(message: String, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        message,
        hint,
    )
}

/// Whether the current user has `SELECT` on the whole relation.
pub(super) fn can_select_table(relid: pg_sys::Oid) -> bool {
    // SAFETY: an ACL check on an existing relation
    unsafe {
        pg_sys::pg_class_aclcheck(relid, current_user(), pg_sys::ACL_SELECT as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Whether the current user has `SELECT` on column `attnum` (through the
/// table or the column).
pub(super) fn can_select_column(relid: pg_sys::Oid, attnum: i16) -> bool {
    // SAFETY: an ACL check on an existing relation
    unsafe {
        pg_sys::pg_attribute_aclcheck(
            relid,
            attnum,
            current_user(),
            pg_sys::ACL_SELECT as pg_sys::AclMode,
        ) == pg_sys::AclResult::ACLCHECK_OK
    }
}

fn undefined_table(relid: pg_sys::Oid, concurrently: bool) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
        if concurrently {
            format!(
                "relation with oid {} was dropped by another session",
                relid.to_u32()
            )
        } else {
            format!("relation with oid {} does not exist", relid.to_u32())
        },
        "Pass an existing table; if another session drops and re-creates it, call again.",
    )
}

/// Lock a relation for reading as PostgreSQL's own commands do: check that
/// the caller may read it (SELECT on the table or on at least one column;
/// the columns the query reads are checked once they are known) before
/// taking any lock, then take AccessShareLock, held to the end of the
/// transaction, and check that the relation was not dropped meanwhile (taking
/// the lock processes the invalidations of a concurrent DROP).
fn lock_readable(relid: pg_sys::Oid, quoted: impl Fn() -> String, fn_name: &str) {
    // SAFETY: an ACL check on a relation that existed a moment ago; if it
    // was dropped since, PostgreSQL reports 42P01
    let any_column = || unsafe {
        pg_sys::pg_attribute_aclcheck_all(
            relid,
            current_user(),
            pg_sys::ACL_SELECT as pg_sys::AclMode,
            pg_sys::AclMaskHow::ACLMASK_ANY,
        ) == pg_sys::AclResult::ACLCHECK_OK
    };
    if !can_select_table(relid) && !any_column() {
        permission_denied(
            format!("permission denied for table {}", quoted()),
            &format!("The function {fn_name} reads the table with the caller's privileges; GRANT SELECT on it to this role."),
        );
    }
    // SAFETY: lock manager calls on a relation oid; the syscache look-up
    // after the lock sees every committed DROP
    unsafe {
        pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as _);
        if pg_sys::get_rel_relkind(relid) == 0 {
            pg_sys::UnlockRelationOid(relid, pg_sys::AccessShareLock as _);
            undefined_table(relid, true);
        }
    }
}

/// Before the cached query of a row type is used: lock the type's table for
/// reading (as the first call did), so that a table dropped meanwhile gives
/// 42P01 instead of a plan or a row type that no longer exists.
pub fn lock_row_type(typid: pg_sys::Oid) {
    // SAFETY: syscache look-ups; InvalidOid for a type that does not exist
    let relid = unsafe { pg_sys::get_typ_typrelid(typid) };
    if relid == pg_sys::InvalidOid {
        return; // from_row_type reports it
    }
    lock_readable(relid, || qualified_rel_name(relid), "my_items");
    // the type itself may have gone with the table
    // SAFETY: syscache look-up after the invalidations were processed
    if unsafe { pg_sys::get_typ_typrelid(typid) } != relid {
        undefined_table(relid, true);
    }
}

impl Table {
    /// Open a relation as PostgreSQL's own commands do: check that it exists
    /// and that the caller may read it before taking any lock, then lock it
    /// (AccessShareLock, held to the end of the transaction) and check again
    /// that it was not dropped meanwhile.
    fn open(relid: pg_sys::Oid, allowed: &[u8], fn_name: &str) -> Table {
        // SAFETY: syscache look-up
        let relkind = unsafe { pg_sys::get_rel_relkind(relid) } as u8;
        if relkind == 0 {
            undefined_table(relid, false);
        }
        let quoted = qualified_rel_name(relid);
        if !allowed.contains(&relkind) {
            wrong_object(
                format!("{fn_name} needs a table, but {quoted} is {}", relkind_word(relkind)),
                &format!(
                    "The function {fn_name} reads tables, partitioned tables, materialized views and foreign tables; \
                     for a view, filter it yourself: WHERE slot_of(key, n) = slot."
                ),
            );
        }
        lock_readable(relid, || quoted.clone(), fn_name);
        // SAFETY: locked above and still there; the relcache entry is closed
        // (the lock kept) on drop
        let rel = unsafe { PgRelation::from_pg_owned(pg_sys::RelationIdGetRelation(relid)) };
        Table {
            rel,
            relid,
            relkind,
            quoted,
        }
    }

    /// The table whose row type is `typid` (my_items' `NULL::tbl` argument).
    pub fn from_row_type(typid: pg_sys::Oid) -> Table {
        // SAFETY: syscache look-ups; both return 0 for a type that does not exist
        let (typtype, relid) =
            unsafe { (pg_sys::get_typtype(typid), pg_sys::get_typ_typrelid(typid)) };
        if typtype == 0 {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                format!("type with oid {} does not exist", typid.to_u32()),
                "Pass the table's row type: my_items_query('my_table'::regtype, slot, n), or SELECT * FROM my_items(NULL::my_table, slot, n).",
            );
        }
        if relid == pg_sys::InvalidOid {
            let tname = type_name(typid);
            wrong_object(
                format!("my_items needs a table's row type, got type {tname}"),
                "Pass a typed NULL of the table: SELECT * FROM my_items(NULL::my_table, slot, n).",
            );
        }
        Table::open(relid, b"rpmf", "my_items")
    }

    /// The relation named by slot_counts' regclass argument (views allowed:
    /// counting needs no index).
    pub fn from_regclass(relid: pg_sys::Oid) -> Table {
        Table::from_regclass_for(relid, "slot_counts")
    }

    /// The relation named by the regclass argument of `fn_name`
    /// (slot_counts, slot_backlog, define_fleet; views allowed).
    pub fn from_regclass_for(relid: pg_sys::Oid, fn_name: &str) -> Table {
        Table::open(relid, b"rpmfv", fn_name)
    }

    pub fn is_partitioned(&self) -> bool {
        self.relkind == b'p'
    }
}

/// An index of a table this session has open, locked like the table, or
/// None when `DROP INDEX CONCURRENTLY` removed it meanwhile.
pub(super) fn open_index(oid: pg_sys::Oid) -> Option<PgRelation> {
    // SAFETY: try_relation_open locks, then returns NULL when the index is
    // gone; the relcache entry is closed (not unlocked) on drop
    unsafe {
        let r = pg_sys::try_relation_open(oid, pg_sys::AccessShareLock as _);
        (!r.is_null()).then(|| PgRelation::from_pg_owned(r))
    }
}
