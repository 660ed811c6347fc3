//! Index advice: on a large table with no index that serves the slot filter,
//! a NOTICE with the CREATE INDEX to run.

use super::catalog::{open_index, ExtSchema, Table};
use super::columns::Key;
use super::pending::Pending;
use super::plan::{self, Mapping};
use super::resolve::{key_arg, param_type};
use crate::backend::catalog::cstr_to_string;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::PgList;
use std::cell::RefCell;
use std::collections::HashSet;

/// Tables larger than this (pg_class.reltuples) without an index on the
/// slot expression get a NOTICE with the CREATE INDEX to run.
pub const ADVISE_INDEX_ROWS: f32 = 10_000.0;

thread_local! {
    static ADVISED: RefCell<HashSet<(u32, String)>> = RefCell::new(HashSet::new());
}

impl Table {
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
        self.slot_index(key, m, ext, n, pending, None)
    }

    /// Whether an index as [`Self::has_slot_index`] finds has the column
    /// `then` (the key) as its second column: `((<mapping>(route, n)),
    /// key)`, which serves a share's pages in key order.
    pub fn has_slot_key_index(
        &self,
        route: &Key,
        then: &Key,
        m: &Mapping,
        ext: &ExtSchema,
        n: i32,
        pending: Option<&Pending>,
    ) -> bool {
        self.slot_index(route, m, ext, n, pending, Some(then.attnum))
    }

    fn slot_index(
        &self,
        key: &Key,
        m: &Mapping,
        ext: &ExtSchema,
        n: i32,
        pending: Option<&Pending>,
        second: Option<pg_sys::AttrNumber>,
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
                if let Some(att) = second {
                    let cols = (*form).indnkeyatts as usize;
                    if cols < 2 || (*form).indkey.values.as_slice(2)[1] != att {
                        continue;
                    }
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

/// `node` is `<ext>.<func>(<key, through casts>, <n>)` with the key argument
/// of type `want_arg`.
///
/// # Safety
/// `node` is a node of an index expression of an open, locked index
/// (`RelationGetIndexExpressions`), valid for the call.
unsafe fn slot_expr_matches(
    node: *mut pg_sys::Node,
    func: &str,
    ext_ns: pg_sys::Oid,
    attnum: i16,
    want_arg: pg_sys::Oid,
    n: i32,
) -> bool {
    // SAFETY: the caller passes an index expression of an open, locked index
    // (RelationGetIndexExpressions); every node is cast to a struct only
    // after is_a checked its tag, lists are read within their length, and
    // the catalog look-ups are on the oid of a function the expression calls.
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
