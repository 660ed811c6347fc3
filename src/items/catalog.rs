//! Catalog look-ups for my_items / slot_counts: the table behind a row type
//! or regclass, its key column, its hash partitions, and whether an index
//! serves the slot filter. Names leave here quoted (`quote_identifier`).

use super::plan::{self, ArgForm, KeyKind, Mapping, PendingForm};
use crate::backend::catalog::{
    cstr_to_string, format_type_exact, namespace_name, qualified_rel_name, quote_ident, type_name,
};
use crate::backend::error::{internal, raise};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::{PgList, PgRelation};
use std::cell::RefCell;
use std::collections::HashSet;

/// Tables larger than this (pg_class.reltuples) without an index on the
/// slot expression get a NOTICE with the CREATE INDEX to run.
pub const ADVISE_INDEX_ROWS: f32 = 10_000.0;

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

thread_local! {
    static ADVISED: RefCell<HashSet<(u32, String)>> = RefCell::new(HashSet::new());
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

/// A resolved column the share is selected by: the key (paged on) or the
/// route column (mapped to a slot; the key unless `route` names another).
#[derive(Clone)]
pub struct Key {
    pub attnum: i16,
    pub quoted: String,
    /// the column's type with its modifier, schema-qualified (for `$3::type`):
    /// `character(5)`, never `character` alone, which reads back as `char(1)`
    pub type_name: String,
    /// the column's base type (a domain's underlying type)
    pub type_oid: pg_sys::Oid,
    /// the column's declared type (the domain itself, for a domain key)
    pub decl_type: pg_sys::Oid,
    /// the column's collation
    pub collation: pg_sys::Oid,
    /// whether the column is declared NOT NULL
    pub not_null: bool,
    pub kind: KeyKind,
}

impl Key {
    /// The key type's `>` from its default btree operator class, written
    /// `OPERATOR(schema.>)` so that no operator earlier in the caller's
    /// `search_path` can stand in for it; an ERROR when the type has no
    /// default ordering (then the share cannot be paged).
    pub fn greater_than(&self) -> String {
        // SAFETY: catalog look-ups on an existing type
        unsafe {
            let opclass = pg_sys::GetDefaultOpClass(self.decl_type, pg_sys::BTREE_AM_OID);
            let op = if opclass == pg_sys::InvalidOid {
                pg_sys::InvalidOid
            } else {
                let family = pg_sys::get_opclass_family(opclass);
                let input = pg_sys::get_opclass_input_type(opclass);
                pg_sys::get_opfamily_member(
                    family,
                    input,
                    input,
                    pg_sys::BTGreaterStrategyNumber as i16,
                )
            };
            if op == pg_sys::InvalidOid {
                raise(
                    PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                    format!(
                        "key column {} of type {} has no default btree ordering, so after cannot page it",
                        self.quoted, self.type_name
                    ),
                    "Page on a key of an orderable type: key => 'column_name'.",
                );
            }
            format!("OPERATOR({})", qualified_operator(op))
        }
    }
}

/// `schema.name` of an operator, the schema quoted where needed.
fn qualified_operator(op: pg_sys::Oid) -> String {
    Spi::get_one_with_args::<String>(
        "SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) o.oprname
         FROM pg_catalog.pg_operator o
         JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) o.oprnamespace
         WHERE o.oid OPERATOR(pg_catalog.=) $1",
        &[op.into()],
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| internal("read the key type's operator", op.to_u32()))
}

/// A table (or partitioned table, materialized view, foreign table), opened
/// with AccessShareLock for the rest of the transaction.
pub struct Table {
    rel: PgRelation,
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

/// Why the share query reads a column, for the hint when it may not.
#[derive(Clone, Copy)]
enum ColumnUse {
    Key,
    Route,
    Pending,
    Listed,
    All,
}

/// One column of a table, as the share query reads it.
#[derive(Clone)]
struct Column {
    attnum: i16,
    name: String,
    type_oid: pg_sys::Oid,
    typmod: i32,
    collation: pg_sys::Oid,
    not_null: bool,
}

/// The role whose privileges a query runs with now.
fn current_user() -> pg_sys::Oid {
    // SAFETY: set for every backend
    unsafe { pg_sys::GetUserId() }
}

fn permission_denied(message: String, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        message,
        hint,
    )
}

/// Whether the current user has `SELECT` on the whole relation.
fn can_select_table(relid: pg_sys::Oid) -> bool {
    // SAFETY: an ACL check on an existing relation
    unsafe {
        pg_sys::pg_class_aclcheck(relid, current_user(), pg_sys::ACL_SELECT as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Whether the current user has `SELECT` on column `attnum` (through the
/// table or the column).
fn can_select_column(relid: pg_sys::Oid, attnum: i16) -> bool {
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
        Table::open(relid, b"rpmfv", "slot_counts")
    }

    pub fn is_partitioned(&self) -> bool {
        self.relkind == b'p'
    }

    fn columns(&self) -> Vec<Column> {
        self.rel
            .tuple_desc()
            .iter()
            .filter(|a| !a.is_dropped())
            .map(|a| Column {
                attnum: a.attnum,
                name: a.name().to_string(),
                type_oid: a.atttypid,
                typmod: a.atttypmod,
                collation: a.attcollation,
                not_null: a.attnotnull,
            })
            .collect()
    }

    /// The select list that reads the table as its own row type: every
    /// column, or with `only` (my_items' `columns`) the named ones and the
    /// key, the others as typed NULLs, so a role with SELECT on some columns
    /// can still walk its share. An ERROR names a column that does not exist
    /// or that the caller may not read.
    pub fn select_list(&self, key: &Key, only: Option<&[String]>) -> Vec<String> {
        let cols = self.columns();
        if let Some(only) = only {
            for name in only {
                if !cols.iter().any(|c| &c.name == name) {
                    self.no_such_column(name, "columns");
                }
            }
        }
        let wanted = |c: &Column| {
            only.is_none_or(|o| c.attnum == key.attnum || o.iter().any(|n| n == &c.name))
        };
        let mut out = Vec::with_capacity(cols.len());
        for c in &cols {
            let q = quote_ident(&c.name);
            if wanted(c) {
                self.check_column(
                    c,
                    if only.is_some() {
                        ColumnUse::Listed
                    } else {
                        ColumnUse::All
                    },
                );
                out.push(q);
            } else {
                out.push(format!(
                    "NULL::{} AS {q}",
                    format_type_exact(c.type_oid, c.typmod)
                ));
            }
        }
        out
    }

    /// An ERROR unless the caller may read column `c` (through the table's
    /// or the column's privileges), as the query would raise when run.
    fn check_column(&self, c: &Column, why: ColumnUse) {
        if can_select_table(self.relid) || can_select_column(self.relid, c.attnum) {
            return;
        }
        let q = quote_ident(&c.name);
        let t = &self.quoted;
        permission_denied(
            format!("permission denied for column {q} of table {t}"),
            &match why {
                ColumnUse::Key => format!(
                    "The share is selected by its key: GRANT SELECT ({q}) ON {t} to this role."
                ),
                ColumnUse::Route => format!(
                    "The share is selected by its route column: GRANT SELECT ({q}) ON {t} to this role."
                ),
                ColumnUse::Pending => format!(
                    "The pending rows are selected by this column: GRANT SELECT ({q}) ON {t} to this role."
                ),
                ColumnUse::Listed => {
                    format!("Leave {q} out of columns, or GRANT SELECT ({q}) ON {t} to this role.")
                }
                ColumnUse::All => "This role may read only some columns: name them, \
                    my_items(..., columns => ARRAY['id', 'email']); the others come back NULL."
                    .to_string(),
            },
        );
    }

    fn no_such_column(&self, name: &str, arg: &str) -> ! {
        let names: Vec<String> = self
            .columns()
            .iter()
            .map(|c| quote_ident(&c.name))
            .collect();
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            format!("column \"{name}\" of {} does not exist", self.quoted),
            &format!(
                "{arg} takes column names as stored (case-sensitive, without quotes); {} has: {}",
                self.quoted,
                names.join(", ")
            ),
        )
    }

    /// The key column: `name` if given, else the single-column primary key.
    /// An ERROR when the caller may not read it.
    pub fn key(&self, name: Option<&str>, fn_name: &str) -> Key {
        let cols = self.columns();
        let col = match name {
            Some(name) => cols
                .iter()
                .find(|c| c.name == name)
                .cloned()
                .unwrap_or_else(|| self.no_such_column(name, "key")),
            None => {
                let pk = self.primary_key();
                let mut hint = format!("Name the key column: {fn_name}(..., key => 'column_name')");
                if fn_name == "my_items" {
                    hint.push_str("; paging with after needs it unique and not null");
                }
                hint.push('.');
                match pk.as_deref() {
                    None => raise(
                        PgSqlErrorCode::ERRCODE_INVALID_COLUMN_REFERENCE,
                        format!("{} has no primary key to use as the key", self.quoted),
                        &hint,
                    ),
                    Some([one]) => cols
                        .iter()
                        .find(|c| c.attnum == *one)
                        .cloned()
                        .unwrap_or_else(|| internal("find the primary key column", one)),
                    Some(many) => {
                        let names: Vec<String> = many
                            .iter()
                            .filter_map(|a| cols.iter().find(|c| c.attnum == *a))
                            .map(|c| quote_ident(&c.name))
                            .collect();
                        raise(
                            PgSqlErrorCode::ERRCODE_INVALID_COLUMN_REFERENCE,
                            format!(
                                "the primary key of {} has {} columns ({}), so there is no single key column",
                                self.quoted,
                                many.len(),
                                names.join(", ")
                            ),
                            &hint,
                        )
                    }
                }
            }
        };
        self.check_column(&col, ColumnUse::Key);
        key_of(&col)
    }

    /// The route column `name` (my_items' `route`): the column mapped to a
    /// slot when it is not the key. An ERROR when it does not exist or the
    /// caller may not read it.
    pub fn route(&self, name: &str) -> Key {
        let col = self
            .columns()
            .into_iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| self.no_such_column(name, "route"));
        self.check_column(&col, ColumnUse::Route);
        key_of(&col)
    }

    /// The pending column `name` (my_items' `pending`) and the predicate
    /// that selects the pending rows: a boolean "done" flag gives `NOT
    /// flag`, any other nullable column `column IS NULL`. An ERROR when it
    /// does not exist, the caller may not read it, or it cannot say which
    /// rows are pending (a non-boolean NOT NULL column).
    pub fn pending(&self, name: &str) -> Pending {
        let col = self
            .columns()
            .into_iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| self.no_such_column(name, "pending"));
        self.check_column(&col, ColumnUse::Pending);
        // SAFETY: syscache look-up on an existing type
        let base = unsafe { pg_sys::getBaseType(col.type_oid) };
        let quoted = quote_ident(&col.name);
        let form = if base == pg_sys::BOOLOID {
            PendingForm::NotFlag
        } else if !col.not_null {
            PendingForm::IsNull
        } else {
            raise(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                format!(
                    "pending column {quoted} of {} is of type {} and NOT NULL, so it cannot mark rows as pending",
                    self.quoted,
                    format_type_exact(col.type_oid, col.typmod)
                ),
                "Name a boolean column that is true once a row is done (pending rows: NOT done), \
                 or a nullable column set when it is done (pending rows: sent_at IS NULL).",
            )
        };
        Pending {
            sql: plan::pending_sql(form, &quoted),
            form,
            attnum: col.attnum,
            type_oid: col.type_oid,
            typmod: col.typmod,
            collation: col.collation,
        }
    }

    /// The attribute numbers of the primary key, if the table has one.
    fn primary_key(&self) -> Option<Vec<i16>> {
        // SAFETY: the relation is open and locked; RelationGetIndexList
        // fills rd_pkindex
        unsafe {
            let rel = self.rel.as_ptr();
            pg_sys::list_free(pg_sys::RelationGetIndexList(rel));
            let pk = (*rel).rd_pkindex;
            if pk == pg_sys::InvalidOid {
                return None;
            }
            let idx = open_index(pk)?;
            let form = idx.rd_index;
            if form.is_null() {
                return None;
            }
            let nkeys = (*form).indnkeyatts as usize;
            Some((*form).indkey.values.as_slice(nkeys).to_vec())
        }
    }

    /// The partition that holds `slot`, when reading it directly returns
    /// exactly the rows of the caller's own
    /// `SELECT ... FROM parent WHERE pg_hash_slot(key, n) = slot`
    /// (the caller leaves out rows whose key is NULL); its qualified name.
    /// That needs all of:
    /// - the table hash-partitioned by exactly the key, with modulus `n` in
    ///   every partition;
    /// - the partition key hashed as `pg_hash_slot` hashes it: the key type's
    ///   default hash operator class and the column's collation;
    /// - no row-level security on the table or the partition (a query on the
    ///   table applies the table's policies, one on the partition the
    ///   partition's), and `SELECT` on both for the caller (a query on the
    ///   table checks the table's privileges only).
    ///
    /// Otherwise None, and the share is read through the table with the
    /// slot filter.
    pub fn hash_partition_for(
        &self,
        key: &Key,
        n: i32,
        slot: i32,
    ) -> Option<(pg_sys::Oid, String)> {
        // SAFETY: the relation is open
        let parent_rls = unsafe { (*self.rel.rd_rel).relrowsecurity };
        if parent_rls || !can_select_table(self.relid) {
            return None;
        }
        // SAFETY: catalog look-up on an existing type
        let opclass = unsafe { pg_sys::GetDefaultOpClass(key.decl_type, pg_sys::HASH_AM_OID) };
        if opclass == pg_sys::InvalidOid {
            return None;
        }
        let rows: Vec<PartitionRow> = Spi::connect(|client| {
            let table = client.select(
                "SELECT c.oid, pg_catalog.pg_get_expr(c.relpartbound, c.oid), c.relrowsecurity
                 FROM pg_catalog.pg_partitioned_table pt
                 JOIN pg_catalog.pg_inherits i
                   ON i.inhparent OPERATOR(pg_catalog.=) pt.partrelid AND NOT i.inhdetachpending
                 JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
                 WHERE pt.partrelid OPERATOR(pg_catalog.=) $1
                   AND pt.partstrat OPERATOR(pg_catalog.=) 'h'
                   AND pt.partnatts OPERATOR(pg_catalog.=) 1
                   AND pt.partattrs[0] OPERATOR(pg_catalog.=) $2
                   AND pt.partclass[0] OPERATOR(pg_catalog.=) $3
                   AND pt.partcollation[0] OPERATOR(pg_catalog.=) $4::pg_catalog.oid",
                None,
                &[
                    self.relid.into(),
                    key.attnum.into(),
                    opclass.into(),
                    // as int8: pgrx passes the invalid oid 0 (no collation) as NULL
                    i64::from(key.collation.to_u32()).into(),
                ],
            )?;
            let mut out = Vec::new();
            for row in table {
                let oid: Option<pg_sys::Oid> = row.get(1)?;
                let bound: Option<String> = row.get(2)?;
                let rls: Option<bool> = row.get(3)?;
                if let Some(oid) = oid {
                    out.push((
                        oid,
                        bound.as_deref().and_then(plan::parse_hash_bound),
                        rls.unwrap_or(true),
                    ));
                }
            }
            Ok::<_, pgrx::spi::Error>(out)
        })
        .unwrap_or_else(|e| internal("read the partitions", e));
        let bounds: Vec<Option<(i32, i32)>> = rows.iter().map(|r| r.1).collect();
        let i = plan::partition_for_slot(&bounds, n, slot)?;
        let (child, _, child_rls) = rows[i];
        if child_rls || !can_select_table(child) {
            return None;
        }
        Some((child, qualified_rel_name(child)))
    }

    fn large(&self) -> Option<f64> {
        // SAFETY: the relation is open
        let reltuples = unsafe { (*self.rel.rd_rel).reltuples };
        if reltuples > ADVISE_INDEX_ROWS {
            return Some(reltuples as f64);
        }
        if reltuples < 0.0 && matches!(self.relkind, b'r' | b'm') {
            // never analyzed: judge by size (8 kB pages of ~100 rows)
            // SAFETY: a table with storage, open and locked
            let pages = unsafe {
                pg_sys::RelationGetNumberOfBlocksInFork(
                    self.rel.as_ptr(),
                    pg_sys::ForkNumber::MAIN_FORKNUM,
                )
            };
            if pages as f32 * 100.0 > ADVISE_INDEX_ROWS {
                return Some(pages as f64 * 100.0);
            }
        }
        None
    }

    /// On a large table with no index whose first column is the slot
    /// expression of the route column (and, with `pending`, whose predicate
    /// if any the pending rows satisfy), a NOTICE (once per session per
    /// table, expression and predicate) with the CREATE INDEX that makes the
    /// share an index scan in key order: `((<mapping>(route, n)), key)`,
    /// partial `WHERE <pending>` with `pending`.
    pub fn advise_index(
        &self,
        key: &Key,
        route: &Key,
        m: &Mapping,
        ext: &ExtSchema,
        n: i32,
        pending: Option<&Pending>,
    ) {
        let Some(rows) = self.large() else { return };
        let expr = m.expr(&ext.quoted, &key_arg(m, route), &n.to_string());
        let pred = pending.map(|p| p.sql.as_str());
        let seen = (
            self.relid.to_u32(),
            format!("{expr} WHERE {}", pred.unwrap_or("")),
        );
        if ADVISED.with(|a| a.borrow().contains(&seen)) {
            return;
        }
        if self.has_slot_index(route, m, ext, n, pending) {
            return;
        }
        ADVISED.with(|a| a.borrow_mut().insert(seen));
        let create = plan::create_index_sql(&self.quoted, &expr, &key.quoted, pred);
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
            format!(
                "no index on {} starts with {expr}: every my_items call on it reads all of its ~{rows:.0} rows",
                self.quoted
            ),
            "pg_claim",
        )
        .set_hint(format!("Create the index that serves every slot and batch: {create}"))
        .report(PgLogLevel::NOTICE);
    }

    /// Whether a valid index has the slot expression `<ext>.<func>(key, n)`
    /// (`key` being the route column) as its first column, and is either not
    /// partial or, with `pending`, partial with a predicate the pending rows
    /// satisfy (the planner's own test, `predicate_implied_by`).
    fn has_slot_index(
        &self,
        key: &Key,
        m: &Mapping,
        ext: &ExtSchema,
        n: i32,
        pending: Option<&Pending>,
    ) -> bool {
        // the type of the mapping function's first argument
        let want_arg = param_type(m, key).unwrap_or(key.type_oid);
        // SAFETY: relcache and node inspection on an open, locked relation
        unsafe {
            let list =
                PgList::<pg_sys::Oid>::from_pg(pg_sys::RelationGetIndexList(self.rel.as_ptr()));
            for idxoid in list.iter_oid() {
                let Some(idx) = open_index(idxoid) else {
                    continue;
                };
                let form = idx.rd_index;
                if form.is_null() || !(*form).indisvalid || (*form).indnkeyatts < 1 {
                    continue;
                }
                if (*form).indkey.values.as_slice(1)[0] != 0 {
                    continue; // first column is a plain column
                }
                let pred = pg_sys::RelationGetIndexPredicate(idx.as_ptr());
                if !pred.is_null() {
                    // a partial index serves only a share of pending rows it holds
                    let Some(p) = pending else { continue };
                    let clauses = pg_sys::lappend(std::ptr::null_mut(), p.clause().cast());
                    if !pg_sys::predicate_implied_by(pred, clauses, false) {
                        continue;
                    }
                }
                let exprs = PgList::<pg_sys::Node>::from_pg(pg_sys::RelationGetIndexExpressions(
                    idx.as_ptr(),
                ));
                let Some(first) = exprs.get_ptr(0) else {
                    continue;
                };
                if slot_expr_matches(first, m.func, ext.oid, key.attnum, want_arg, n) {
                    return true;
                }
            }
        }
        false
    }
}

/// A column resolved as the key or route: its quoted name, exact type and
/// the mapping family of its base type.
fn key_of(col: &Column) -> Key {
    // SAFETY: syscache look-up on an existing type
    let base = unsafe { pg_sys::getBaseType(col.type_oid) };
    let kind = match base {
        pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID => KeyKind::Int,
        pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::BPCHAROID => KeyKind::Text,
        pg_sys::BYTEAOID => KeyKind::Bytea,
        pg_sys::UUIDOID => KeyKind::Uuid,
        _ => KeyKind::Other,
    };
    Key {
        attnum: col.attnum,
        quoted: quote_ident(&col.name),
        type_name: format_type_exact(col.type_oid, col.typmod),
        type_oid: base,
        decl_type: col.type_oid,
        collation: col.collation,
        not_null: col.not_null,
        kind,
    }
}

/// The column that says which rows are pending, and the predicate.
pub struct Pending {
    /// the predicate, `NOT done` or `sent_at IS NULL` (column quoted)
    pub sql: String,
    pub form: PendingForm,
    pub attnum: i16,
    pub type_oid: pg_sys::Oid,
    pub typmod: i32,
    pub collation: pg_sys::Oid,
}

impl Pending {
    /// The predicate as a planner expression on the table's first range
    /// table entry, as an index predicate reads (`RelationGetIndexPredicate`).
    fn clause(&self) -> *mut pg_sys::Node {
        // SAFETY: node constructors in the current memory context
        unsafe {
            let var = pg_sys::makeVar(
                1,
                self.attnum,
                self.type_oid,
                self.typmod,
                self.collation,
                0,
            );
            match self.form {
                PendingForm::NotFlag => {
                    // a domain over boolean is relabelled, as the parser does
                    let arg: *mut pg_sys::Node = if self.type_oid == pg_sys::BOOLOID {
                        var.cast()
                    } else {
                        pg_sys::makeRelabelType(
                            var.cast(),
                            pg_sys::BOOLOID,
                            -1,
                            pg_sys::InvalidOid,
                            pg_sys::CoercionForm::COERCE_IMPLICIT_CAST,
                        )
                        .cast()
                    };
                    pg_sys::makeBoolExpr(
                        pg_sys::BoolExprType::NOT_EXPR,
                        pg_sys::lappend(std::ptr::null_mut(), arg.cast()),
                        -1,
                    )
                    .cast()
                }
                PendingForm::IsNull => {
                    let t: *mut pg_sys::NullTest =
                        pgrx::PgBox::<pg_sys::NullTest>::alloc_node(pg_sys::NodeTag::T_NullTest)
                            .into_pg();
                    (*t).arg = var.cast();
                    (*t).nulltesttype = pg_sys::NullTestType::IS_NULL;
                    (*t).argisrow = false;
                    (*t).location = -1;
                    t.cast()
                }
            }
        }
    }
}

/// A hash partition: its oid, its (modulus, remainder), whether it has
/// row-level security enabled.
type PartitionRow = (pg_sys::Oid, Option<(i32, i32)>, bool);

/// An index of a table this session has open, locked like the table, or
/// None when `DROP INDEX CONCURRENTLY` removed it meanwhile.
fn open_index(oid: pg_sys::Oid) -> Option<PgRelation> {
    // SAFETY: try_relation_open locks, then returns NULL when the index is
    // gone; the relcache entry is closed (not unlocked) on drop
    unsafe {
        let r = pg_sys::try_relation_open(oid, pg_sys::AccessShareLock as _);
        (!r.is_null()).then(|| PgRelation::from_pg_owned(r))
    }
}

/// `node` is `<ext>.<func>(<key, through casts>, <n>)` with the key argument
/// of type `want_arg`.
unsafe fn slot_expr_matches(
    node: *mut pg_sys::Node,
    func: &str,
    ext_ns: pg_sys::Oid,
    attnum: i16,
    want_arg: pg_sys::Oid,
    n: i32,
) -> bool {
    unsafe {
        if !pgrx::is_a(node, pg_sys::NodeTag::T_FuncExpr) {
            return false;
        }
        let fe = node as *mut pg_sys::FuncExpr;
        if pg_sys::get_func_namespace((*fe).funcid) != ext_ns
            || cstr_to_string(pg_sys::get_func_name((*fe).funcid)) != func
        {
            return false;
        }
        let args = PgList::<pg_sys::Node>::from_pg((*fe).args);
        if args.len() != 2 {
            return false;
        }
        let (Some(arg0), Some(arg1)) = (args.get_ptr(0), args.get_ptr(1)) else {
            return false;
        };
        if !pgrx::is_a(arg1, pg_sys::NodeTag::T_Const) {
            return false;
        }
        let c = arg1 as *mut pg_sys::Const;
        if (*c).consttype != pg_sys::INT4OID
            || (*c).constisnull
            || (*c).constvalue.value() as i32 != n
        {
            return false;
        }
        if pg_sys::getBaseType(pg_sys::exprType(arg0)) != want_arg {
            return false;
        }
        // strip casts down to the column
        let mut e = arg0;
        loop {
            if pgrx::is_a(e, pg_sys::NodeTag::T_RelabelType) {
                e = (*(e as *mut pg_sys::RelabelType)).arg as *mut pg_sys::Node;
            } else if pgrx::is_a(e, pg_sys::NodeTag::T_CoerceViaIO) {
                e = (*(e as *mut pg_sys::CoerceViaIO)).arg as *mut pg_sys::Node;
            } else if pgrx::is_a(e, pg_sys::NodeTag::T_FuncExpr)
                && (*(e as *mut pg_sys::FuncExpr)).funcformat
                    != pg_sys::CoercionForm::COERCE_EXPLICIT_CALL
            {
                let inner = PgList::<pg_sys::Node>::from_pg((*(e as *mut pg_sys::FuncExpr)).args);
                match inner.get_ptr(0) {
                    Some(p) => e = p,
                    None => return false,
                }
            } else {
                break;
            }
        }
        if !pgrx::is_a(e, pg_sys::NodeTag::T_Var) {
            return false;
        }
        let v = e as *mut pg_sys::Var;
        (*v).varattno == attnum && (*v).varlevelsup == 0
    }
}
