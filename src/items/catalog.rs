//! Catalog look-ups for my_items / slot_counts: the table behind a row type
//! or regclass, its key column, its hash partitions, and whether an index
//! serves the slot filter. Names leave here quoted (`quote_identifier`).

use super::plan::{self, ArgForm, KeyKind, Mapping};
use crate::error::raise;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::{PgList, PgRelation};
use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::{CStr, CString};

/// Tables larger than this (pg_class.reltuples) without an index on the
/// slot expression get a NOTICE with the CREATE INDEX to run.
pub const ADVISE_INDEX_ROWS: f32 = 10_000.0;

fn cstr_to_string(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: PostgreSQL returns NUL-terminated strings
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// `quote_identifier`: double-quotes a name only when SQL needs it.
pub fn quote_ident(name: &str) -> String {
    let c = CString::new(name).unwrap_or_default();
    // SAFETY: c is a valid C string; the result is either c itself or palloc'd
    unsafe { cstr_to_string(pg_sys::quote_identifier(c.as_ptr())) }
}

fn namespace_name(nsp: pg_sys::Oid) -> String {
    // SAFETY: a syscache look-up; NULL when the namespace is gone
    unsafe { cstr_to_string(pg_sys::get_namespace_name(nsp)) }
}

fn qualified_rel_name(relid: pg_sys::Oid) -> String {
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

fn wrong_object(message: String, hint: &str) -> ! {
    raise(PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE, message, hint)
}

fn internal(what: &str, e: impl std::fmt::Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("pg_claim could not {what}: {e}"),
        "please report this as a bug",
    )
}

/// pg_claim's schema, for schema-qualified calls in generated SQL.
pub struct ExtSchema {
    /// its oid
    pub oid: pg_sys::Oid,
    /// its name, quoted where needed
    pub quoted: String,
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
    ExtSchema {
        oid,
        quoted: quote_ident(&namespace_name(oid)),
    }
}

/// The resolved key column.
pub struct Key {
    pub attnum: i16,
    pub quoted: String,
    /// the column's type, schema-qualified where needed (for `$3::type`)
    pub type_name: String,
    pub type_oid: pg_sys::Oid,
    pub kind: KeyKind,
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

impl Table {
    fn open(relid: pg_sys::Oid, allowed: &[u8], fn_name: &str) -> Table {
        // SAFETY: syscache look-up
        let relkind = unsafe { pg_sys::get_rel_relkind(relid) } as u8;
        if relkind == 0 {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("relation with oid {} does not exist", relid.to_u32()),
                "pass an existing table",
            );
        }
        let quoted = qualified_rel_name(relid);
        if !allowed.contains(&relkind) {
            wrong_object(
                format!("{fn_name} needs a table, but {quoted} is {}", relkind_word(relkind)),
                &format!(
                    "{fn_name} reads tables, partitioned tables, materialized views and foreign tables; \
                     for a view, filter it yourself: WHERE slot_of(key, n) = slot"
                ),
            );
        }
        // SAFETY: relid exists; the lock is held to the end of the transaction
        let rel = unsafe { PgRelation::with_lock(relid, pg_sys::AccessShareLock as _) };
        Table {
            rel,
            relid,
            relkind,
            quoted,
        }
    }

    /// The table whose row type is `typid` (my_items' `NULL::tbl` argument).
    pub fn from_row_type(typid: pg_sys::Oid) -> Table {
        // SAFETY: syscache look-up
        let relid = unsafe { pg_sys::get_typ_typrelid(typid) };
        if relid == pg_sys::InvalidOid {
            // SAFETY: format_type_be handles any oid
            let tname = unsafe { cstr_to_string(pg_sys::format_type_be(typid)) };
            wrong_object(
                format!("my_items needs a table's row type, got type {tname}"),
                "pass a typed NULL of the table: SELECT * FROM my_items(NULL::my_table, slot, n)",
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

    fn columns(&self) -> Vec<(i16, String, pg_sys::Oid)> {
        self.rel
            .tuple_desc()
            .iter()
            .filter(|a| !a.is_dropped())
            .map(|a| (a.attnum, a.name().to_string(), a.atttypid))
            .collect()
    }

    /// The table's columns in order, quoted, for reading a partition as the
    /// parent's row type.
    pub fn column_list(&self) -> Vec<String> {
        self.columns().iter().map(|c| quote_ident(&c.1)).collect()
    }

    /// The key column: `name` if given, else the single-column primary key.
    pub fn key(&self, name: Option<&str>, fn_name: &str) -> Key {
        let cols = self.columns();
        let (attnum, colname, typid) = match name {
            Some(name) => cols
                .iter()
                .find(|c| c.1 == name)
                .cloned()
                .unwrap_or_else(|| {
                    let names: Vec<String> = cols.iter().map(|c| quote_ident(&c.1)).collect();
                    raise(
                        PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                        format!("column \"{name}\" of {} does not exist", self.quoted),
                        &format!(
                            "key is a column name as stored (case-sensitive, without quotes); {} has: {}",
                            self.quoted,
                            names.join(", ")
                        ),
                    )
                }),
            None => {
                let pk = self.primary_key();
                let mut hint = format!("name the key column: {fn_name}(..., key => 'column_name')");
                if fn_name == "my_items" {
                    hint.push_str("; paging with after needs it unique and not null");
                }
                match pk.as_deref() {
                    None => raise(
                        PgSqlErrorCode::ERRCODE_INVALID_COLUMN_REFERENCE,
                        format!("{} has no primary key to use as the key", self.quoted),
                        &hint,
                    ),
                    Some([one]) => cols
                        .iter()
                        .find(|c| c.0 == *one)
                        .cloned()
                        .unwrap_or_else(|| internal("find the primary key column", one)),
                    Some(many) => {
                        let names: Vec<String> = many
                            .iter()
                            .filter_map(|a| cols.iter().find(|c| c.0 == *a))
                            .map(|c| quote_ident(&c.1))
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
        // SAFETY: syscache look-ups on an existing type
        let (base, type_name) = unsafe {
            (
                pg_sys::getBaseType(typid),
                cstr_to_string(pg_sys::format_type_be_qualified(typid)),
            )
        };
        let kind = match base {
            pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID => KeyKind::Int,
            pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::BPCHAROID => KeyKind::Text,
            pg_sys::BYTEAOID => KeyKind::Bytea,
            pg_sys::UUIDOID => KeyKind::Uuid,
            _ => KeyKind::Other,
        };
        Key {
            attnum,
            quoted: quote_ident(&colname),
            type_name,
            type_oid: base,
            kind,
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
            let idx = PgRelation::with_lock(pk, pg_sys::AccessShareLock as _);
            let form = idx.rd_index;
            if form.is_null() {
                return None;
            }
            let nkeys = (*form).indnkeyatts as usize;
            Some((*form).indkey.values.as_slice(nkeys).to_vec())
        }
    }

    /// The partition that holds `slot` when this table is hash-partitioned
    /// by exactly the key with modulus `n` in every partition; its
    /// qualified name.
    pub fn hash_partition_for(
        &self,
        key: &Key,
        n: i32,
        slot: i32,
    ) -> Option<(pg_sys::Oid, String)> {
        let rows: Vec<(pg_sys::Oid, Option<(i32, i32)>)> = Spi::connect(|client| {
            let table = client.select(
                "SELECT c.oid, pg_catalog.pg_get_expr(c.relpartbound, c.oid)
                 FROM pg_catalog.pg_partitioned_table pt
                 JOIN pg_catalog.pg_inherits i ON i.inhparent = pt.partrelid AND NOT i.inhdetachpending
                 JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
                 WHERE pt.partrelid = $1 AND pt.partstrat = 'h' AND pt.partnatts = 1
                   AND pt.partattrs[0] = $2",
                None,
                &[self.relid.into(), key.attnum.into()],
            )?;
            let mut out = Vec::new();
            for row in table {
                let oid: Option<pg_sys::Oid> = row.get(1)?;
                let bound: Option<String> = row.get(2)?;
                if let Some(oid) = oid {
                    out.push((oid, bound.as_deref().and_then(plan::parse_hash_bound)));
                }
            }
            Ok::<_, pgrx::spi::Error>(out)
        })
        .unwrap_or_else(|e| internal("read the partitions", e));
        let bounds: Vec<Option<(i32, i32)>> = rows.iter().map(|r| r.1).collect();
        plan::partition_for_slot(&bounds, n, slot)
            .map(|i| (rows[i].0, qualified_rel_name(rows[i].0)))
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
    /// expression, a NOTICE (once per session per table and expression)
    /// with the CREATE INDEX that makes the share an index scan.
    pub fn advise_index(&self, key: &Key, m: &Mapping, ext: &ExtSchema, n: i32) {
        let Some(rows) = self.large() else { return };
        let expr = m.expr(&ext.quoted, &key.quoted, &n.to_string());
        let seen = (self.relid.to_u32(), expr.clone());
        if ADVISED.with(|a| a.borrow().contains(&seen)) {
            return;
        }
        if self.has_slot_index(key, m, ext, n) {
            return;
        }
        ADVISED.with(|a| a.borrow_mut().insert(seen));
        let create = plan::create_index_sql(&self.quoted, &expr, &key.quoted);
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
            format!(
                "no index on {} starts with {expr}: every my_items call on it reads all of its ~{rows:.0} rows",
                self.quoted
            ),
            "pg_claim",
        )
        .set_hint(format!("create the index that serves every slot and batch: {create}"))
        .report(PgLogLevel::NOTICE);
    }

    /// Whether a valid, non-partial index has the slot expression
    /// `<ext>.<func>(key, n)` as its first column.
    fn has_slot_index(&self, key: &Key, m: &Mapping, ext: &ExtSchema, n: i32) -> bool {
        // the type of the mapping function's first argument
        let want_arg = match (m.arg, m.func, key.kind) {
            (ArgForm::KeyAsText, _, _) => pg_sys::TEXTOID,
            (_, "jump_slot", KeyKind::Int) => pg_sys::INT8OID,
            (_, "pg_hash_slot", _) => key.type_oid,
            (_, _, KeyKind::Text) => pg_sys::TEXTOID,
            _ => key.type_oid,
        };
        // SAFETY: relcache and node inspection on an open, locked relation
        unsafe {
            let list =
                PgList::<pg_sys::Oid>::from_pg(pg_sys::RelationGetIndexList(self.rel.as_ptr()));
            for idxoid in list.iter_oid() {
                let idx = PgRelation::with_lock(idxoid, pg_sys::AccessShareLock as _);
                let form = idx.rd_index;
                if form.is_null() || !(*form).indisvalid || (*form).indnkeyatts < 1 {
                    continue;
                }
                if (*form).indkey.values.as_slice(1)[0] != 0 {
                    continue; // first column is a plain column
                }
                if !pg_sys::RelationGetIndexPredicate(idx.as_ptr()).is_null() {
                    continue; // partial index
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
