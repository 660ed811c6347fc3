//! my_items' `pending` column: the predicate that selects the pending rows,
//! as SQL text and as the planner expression an index predicate is compared
//! with.

use super::catalog::Table;
use super::columns::ColumnUse;
use super::plan::{self, PendingForm};
use crate::backend::catalog::{format_type_exact, quote_ident};
use crate::backend::error::raise;
use pgrx::pg_sys;
use pgrx::prelude::*;

impl Table {
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
    pub(super) fn clause(&self) -> *mut pg_sys::Node {
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
