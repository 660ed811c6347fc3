//! The columns of an opened table as the share query reads them: the key
//! (named, or the single-column primary key) with its ordering, the route
//! column, and the select list, each checked against the caller's column
//! privileges.

use super::catalog::{can_select_column, can_select_table, open_index, permission_denied, Table};
use super::plan::KeyKind;
use crate::backend::catalog::{format_type_exact, quote_ident};
use crate::backend::error::{internal, raise};
use pgrx::pg_sys;
use pgrx::prelude::*;

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
        self.btree_operator(pg_sys::BTGreaterStrategyNumber as i16)
            .unwrap_or_else(|| {
                raise(
                    PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                    format!(
                        "key column {} of type {} has no default btree ordering, so after cannot page it",
                        self.quoted, self.type_name
                    ),
                    "Page on a key of an orderable type: key => 'column_name'.",
                )
            })
    }

    /// The key type's `=` from its default btree operator class, as
    /// `OPERATOR(schema.=)`; an ERROR when the type has none (then failure
    /// records cannot be joined to rows by key).
    pub fn equals(&self) -> String {
        self.btree_operator(pg_sys::BTEqualStrategyNumber as i16)
            .unwrap_or_else(|| {
                raise(
                    PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                    format!(
                        "key column {} of type {} has no default btree equality",
                        self.quoted, self.type_name
                    ),
                    "Name a key of a type with a default btree operator class: key => 'column_name'.",
                )
            })
    }

    /// The operator of btree strategy `strategy` of the key type's default
    /// btree operator class, written `OPERATOR(schema.op)` so that no
    /// operator earlier in the caller's `search_path` can stand in for it.
    fn btree_operator(&self, strategy: i16) -> Option<String> {
        // SAFETY: catalog look-ups on an existing type
        unsafe {
            let opclass = pg_sys::GetDefaultOpClass(self.decl_type, pg_sys::BTREE_AM_OID);
            let op = if opclass == pg_sys::InvalidOid {
                pg_sys::InvalidOid
            } else {
                let family = pg_sys::get_opclass_family(opclass);
                let input = pg_sys::get_opclass_input_type(opclass);
                pg_sys::get_opfamily_member(family, input, input, strategy)
            };
            (op != pg_sys::InvalidOid).then(|| format!("OPERATOR({})", qualified_operator(op)))
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

/// Why the share query reads a column, for the hint when it may not.
#[derive(Clone, Copy)]
pub(super) enum ColumnUse {
    Key,
    Route,
    Pending,
    Age,
    Listed,
    All,
}

/// One column of a table, as the share query reads it.
#[derive(Clone)]
pub(super) struct Column {
    pub(super) attnum: i16,
    pub(super) name: String,
    pub(super) type_oid: pg_sys::Oid,
    pub(super) typmod: i32,
    pub(super) collation: pg_sys::Oid,
    pub(super) not_null: bool,
}

impl Table {
    pub(super) fn columns(&self) -> Vec<Column> {
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
    pub(super) fn check_column(&self, c: &Column, why: ColumnUse) {
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
                ColumnUse::Age => format!(
                    "The oldest pending row is found by this column: GRANT SELECT ({q}) ON {t} to this role, or leave age out."
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

    pub(super) fn no_such_column(&self, name: &str, arg: &str) -> ! {
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
