//! Seeing the fleet: the queries behind `slot_backlog` (pending rows per
//! slot, and the oldest) and the view `fleet_slots` (failure records per
//! slot), and `define_fleet` / `drop_fleet`, which check a definition with
//! the caller's privileges and store it through internal SECURITY DEFINER
//! functions of `sql/fleets.sql` (reference: docs/my_items.md, "Backlog and
//! fleets").
//!
//! The table, key, route, pending column and mapping resolve exactly as for
//! `slot_counts` and `my_items` (`catalog`, `columns`, `pending`, `resolve`);
//! the `age` column is checked here. The SQL text is written by the pure
//! functions at the end, with every identifier already quoted.

use super::catalog::{self, Table};
use super::columns::{ColumnUse, Key};
use super::{arg, parse_method, slot_mapping};
use crate::backend::catalog::{format_type_exact, quote_ident};
use crate::backend::error::{invalid_parameter, raise};
use crate::backend::internal::{call, caller, internal_fn};
use crate::pg_claim_fn;
use pgrx::prelude::*;

fn null_value(name: &str, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{name} must not be null"),
        hint,
    )
}

const ARGS_HINT: &str = "Pass the table, n and the pending column, e.g. \
                         slot_backlog('outbox', 8, 'sent_at') or slot_backlog('jobs', 8, 'done').";

/// What a backlog (or a fleet definition) resolved to.
struct Resolved {
    table: String,
    /// the mapping call on the route column, n written in (so it matches an
    /// expression index)
    slot_expr: String,
    pending: Option<String>,
    /// the quoted age column
    age: Option<String>,
    /// the quoted key column (failure records name items by it), when asked
    key: Option<String>,
}

/// Check the arguments of slot_backlog (or define_fleet: `pending` may then
/// be NULL) with the caller's privileges, and resolve them.
#[allow(clippy::too_many_arguments)]
fn resolve(
    func: pg_sys::Oid,
    fn_name: &str,
    relid: Option<pg_sys::Oid>,
    n: Option<i32>,
    pending: Option<&str>,
    key: Option<&str>,
    route: Option<&str>,
    method: Option<&str>,
    age: Option<&str>,
    want_key: bool,
) -> Resolved {
    let relid = relid.unwrap_or_else(|| null_value("tbl", ARGS_HINT));
    let n = check_n(n, fn_name);
    if pending.is_none() && fn_name == "slot_backlog" {
        null_value(
            "pending",
            "Name the column that says which rows are pending: a boolean done flag (pending while NOT done) \
             or a column set when a row is done (pending while it IS NULL); to count every row, use slot_counts.",
        );
    }
    if pending.is_none() && age.is_some() {
        invalid_parameter(
            format!(
                "age needs a pending column, got age => '{}' without pending",
                age.unwrap_or_default()
            ),
            "age names the column whose smallest value among the pending rows is the oldest: pass pending too.",
        );
    }
    let method = parse_method(method);
    let table = Table::from_regclass_for(relid, fn_name);
    // with route, the key plays no part in a count (a named one must exist)
    let (route, route_arg) = match route {
        Some(name) => {
            if key.is_some() {
                table.key(key, fn_name);
            }
            (table.route(name), "route")
        }
        None => (table.key(key, fn_name), "key"),
    };
    let mapping = slot_mapping(method, &route, route_arg);
    let ext = catalog::extension_schema(func);
    super::resolve::check_mapping_resolves(&mapping, &route, &ext);
    let pending = pending.map(|p| table.pending(p).sql);
    let age = age.map(|name| age_column(&table, name));
    let key = want_key.then(|| table.key(key, fn_name).quoted);
    Resolved {
        slot_expr: mapping.expr(
            &ext.quoted,
            &super::resolve::key_arg(&mapping, &route),
            &n.to_string(),
        ),
        table: table.quoted.clone(),
        pending,
        age,
        key,
    }
}

/// n, checked: 1 .. the most slots pg_claim hands out.
fn check_n(n: Option<i32>, fn_name: &str) -> i32 {
    let n = n.unwrap_or_else(|| null_value("n", ARGS_HINT));
    let max = crate::backend::limits::MAX_N;
    if n < 1 || n > max {
        invalid_parameter(
            format!("n must be between 1 and {max} for {fn_name}, got {n}"),
            "n is the number of slots the fleet's keys are split into: the n its workers pass to claim_slot or claim_leases.",
        );
    }
    n
}

/// The quoted age column: it must exist, be readable, and be a timestamp
/// or timestamptz (or a domain over one).
fn age_column(table: &Table, name: &str) -> String {
    let col = table
        .columns()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| table.no_such_column(name, "age"));
    table.check_column(&col, ColumnUse::Age);
    // SAFETY: syscache look-up on an existing type
    let base = unsafe { pg_sys::getBaseType(col.type_oid) };
    let quoted = quote_ident(&col.name);
    if base != pg_sys::TIMESTAMPTZOID && base != pg_sys::TIMESTAMPOID {
        raise(
            PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
            format!(
                "age column {quoted} of {} is of type {}, not a timestamp",
                table.quoted,
                format_type_exact(col.type_oid, col.typmod)
            ),
            "age names a timestamptz or timestamp column, such as created_at: the oldest pending row is the one whose value is smallest.",
        );
    }
    quoted
}

pg_claim_fn!(guarded
/// `slot_backlog_query(rel oid, n, pending, key, route, method, age)
/// RETURNS text`: the query `slot_backlog` runs (parameter: $1 n).
///
slot_backlog_query, |fcinfo| {
    // SAFETY: this call's fcinfo, declared in sql/fleets.sql
    unsafe { backlog_query(fcinfo, false) }
});

pg_claim_fn!(guarded
/// `pg_claim_fleet_backlog_query(rel oid, n, pending, key, route, method,
/// age) RETURNS text` (internal): slot_backlog's query with a fourth
/// column, `claimable`, the oldest pending row whose key is not one of the
/// items $2 (text[]: the fleet's dead items and those waiting for a retry).
/// Parameters: $1 n, $2 the items.
///
fleet_backlog_query, |fcinfo| {
    // SAFETY: this call's fcinfo, declared in sql/fleets.sql
    unsafe { backlog_query(fcinfo, true) }
});

/// The text of slot_backlog_query, or with `claimable` of
/// pg_claim_fleet_backlog_query (both take the same seven arguments).
///
/// # Safety
/// `fcinfo` is the current call of one of the two, with seven arguments.
unsafe fn backlog_query(fcinfo: pg_sys::FunctionCallInfo, claimable: bool) -> pg_sys::Datum {
    // SAFETY: as the caller promises
    unsafe {
        let r = resolve(
            catalog::calling_function(fcinfo),
            "slot_backlog",
            arg::<pg_sys::Oid>(fcinfo, 0),
            arg::<i32>(fcinfo, 1),
            arg::<&str>(fcinfo, 2),
            arg::<&str>(fcinfo, 3),
            arg::<&str>(fcinfo, 4),
            arg::<&str>(fcinfo, 5),
            arg::<&str>(fcinfo, 6),
            claimable,
        );
        // A long count stops soon after its client goes away.
        crate::backend::settings::apply_client_check(false);
        let pending = r.pending.as_deref().unwrap_or("true");
        let sql = match r.key.as_deref() {
            Some(key) => claimable_sql(&r.table, &r.slot_expr, pending, r.age.as_deref(), key),
            None => backlog_sql(&r.table, &r.slot_expr, pending, r.age.as_deref()),
        };
        sql.into_datum()
            .unwrap_or_else(|| crate::backend::error::internal("return the query text", ""))
    }
}

pg_claim_fn!(guarded
/// `pg_claim_fleet_failures_query(rel oid, n, key, route, method) RETURNS
/// text` (internal): the query that maps a fleet's failure records to
/// slots. Parameters: $1 the items (text[]), $2 whether each is dead
/// (boolean[]). Items are cast to the key column's type: an item that is no
/// value of it raises a data exception, which the caller handles.
///
fleet_failures_query, |fcinfo| {
    // SAFETY: this call's fcinfo, declared in sql/fleets.sql
    unsafe {
        failures_query(
            catalog::calling_function(fcinfo),
            arg::<pg_sys::Oid>(fcinfo, 0),
            arg::<i32>(fcinfo, 1),
            arg::<&str>(fcinfo, 2),
            arg::<&str>(fcinfo, 3),
            arg::<&str>(fcinfo, 4),
        )
        .into_datum()
        .unwrap_or_else(|| crate::backend::error::internal("return the query text", ""))
    }
});

/// The text of pg_claim_fleet_failures_query.
fn failures_query(
    func: pg_sys::Oid,
    relid: Option<pg_sys::Oid>,
    n: Option<i32>,
    key: Option<&str>,
    route: Option<&str>,
    method: Option<&str>,
) -> String {
    let relid = relid.unwrap_or_else(|| null_value("tbl", ARGS_HINT));
    let n = check_n(n, "define_fleet");
    let method = parse_method(method);
    let table = Table::from_regclass_for(relid, "define_fleet");
    let key = table.key(key, "define_fleet");
    let ext = catalog::extension_schema(func);
    let item = Key {
        quoted: format!("(f.item)::{}", key.type_name),
        ..key.clone()
    };
    match route {
        None => {
            let mapping = slot_mapping(method, &key, "key");
            super::resolve::check_mapping_resolves(&mapping, &key, &ext);
            let expr = mapping.expr(
                &ext.quoted,
                &super::resolve::key_arg(&mapping, &item),
                &n.to_string(),
            );
            failures_sql(&expr, None)
        }
        Some(name) => {
            let route = table.route(name);
            let mapping = slot_mapping(method, &route, "route");
            super::resolve::check_mapping_resolves(&mapping, &route, &ext);
            let mapped = Key {
                quoted: format!("t.{}", route.quoted),
                ..route.clone()
            };
            let expr = mapping.expr(
                &ext.quoted,
                &super::resolve::key_arg(&mapping, &mapped),
                &n.to_string(),
            );
            let join = format!(
                "JOIN {} AS t ON t.{} {} {} WHERE t.{} IS NOT NULL",
                table.quoted,
                key.quoted,
                key.equals(),
                item.quoted,
                route.quoted
            );
            failures_sql(&expr, Some(&join))
        }
    }
}

/// Check define_fleet's arguments with the caller's privileges, as
/// slot_backlog and the view fleet_slots will use them.
///
/// # Safety
/// `fcinfo` is the current call of define_fleet.
unsafe fn check_definition(fcinfo: pg_sys::FunctionCallInfo) {
    // SAFETY: as the caller promises
    unsafe {
        let name = arg::<&str>(fcinfo, 0).unwrap_or_else(|| {
            null_value(
                "name",
                "The name is the fleet's: the name its workers pass to claim_slot or claim_leases, e.g. define_fleet('mailer', 'outbox', 8, 'sent_at').",
            )
        });
        if name.len() > 1024 {
            invalid_parameter(
                format!(
                    "name must be at most 1024 bytes, got {} bytes (starting \"{}\")",
                    name.len(),
                    name.chars().take(20).collect::<String>()
                ),
                "The name identifies the worker fleet: use a short name such as 'mailer'.",
            );
        }
        let func = catalog::calling_function(fcinfo);
        let relid = arg::<pg_sys::Oid>(fcinfo, 1);
        let n = arg::<i32>(fcinfo, 2);
        let key = arg::<&str>(fcinfo, 4);
        let route = arg::<&str>(fcinfo, 5);
        let method = arg::<&str>(fcinfo, 6);
        resolve(
            func,
            "define_fleet",
            relid,
            n,
            arg::<&str>(fcinfo, 3),
            key,
            route,
            method,
            arg::<&str>(fcinfo, 7),
            false,
        );
        failures_query(func, relid, n, key, route, method);
    }
}

/// Argument `num` of the current call as passed (None: NULL).
///
/// # Safety
/// `fcinfo` is the current call's, with at least `num + 1` arguments.
unsafe fn raw(fcinfo: pg_sys::FunctionCallInfo, num: usize) -> Option<pg_sys::Datum> {
    // SAFETY: as the caller promises
    unsafe {
        let a = (*fcinfo).args.as_slice((*fcinfo).nargs as usize)[num];
        (!a.isnull).then_some(a.value)
    }
}

pg_claim_fn!(guarded
/// `define_fleet(name, tbl, n, pending, key, route, method, age) RETURNS
/// void`: check the definition with the caller's privileges, then store it
/// for the caller's role through `pg_claim_fleet_put`.
///
define_fleet, |fcinfo| {
    // SAFETY: this call's fcinfo, declared in sql/fleets.sql with 8 arguments;
    // nothing on this frame needs dropping when the internal call raises
    unsafe {
        check_definition(fcinfo);
        const OID: pg_sys::Oid = pg_sys::OIDOID;
        const TEXT: pg_sys::Oid = pg_sys::TEXTOID;
        let put = internal_fn(
            "pg_claim_fleet_put",
            &[OID, TEXT, OID, pg_sys::INT4OID, TEXT, TEXT, TEXT, TEXT, TEXT],
        );
        let args = [
            caller(),
            raw(fcinfo, 0),
            raw(fcinfo, 1),
            raw(fcinfo, 2),
            raw(fcinfo, 3),
            raw(fcinfo, 4),
            raw(fcinfo, 5),
            raw(fcinfo, 6),
            raw(fcinfo, 7),
        ];
        call(put, &args);
        (*fcinfo).isnull = true;
        pg_sys::Datum::from(0)
    }
});

pg_claim_fn!(guarded
/// `drop_fleet(name) RETURNS boolean`: forget a definition (the caller's
/// role must have the privileges of the role that wrote it); true when the
/// fleet was defined.
///
drop_fleet, |fcinfo| {
    // SAFETY: this call's fcinfo, declared in sql/fleets.sql with 1 argument
    unsafe {
        if arg::<&str>(fcinfo, 0).is_none() {
            null_value("name", "Pass the name of a fleet defined with define_fleet.");
        }
        let drop = internal_fn("pg_claim_fleet_drop", &[pg_sys::OIDOID, pg_sys::TEXTOID]);
        let args = [caller(), raw(fcinfo, 0)];
        call(drop, &args).unwrap_or(pg_sys::Datum::from(false))
    }
});

/// The query behind `slot_backlog`: pending rows per slot 0..n-1, zero for
/// empty slots, and the smallest `age` among them (NULL without one).
/// Parameter: $1 n. Every operator, function and type is schema-qualified.
pub fn backlog_sql(rel: &str, slot_expr: &str, pending: &str, age: Option<&str>) -> String {
    backlog_sql_with(rel, slot_expr, pending, age, None)
}

/// The fleet views' backlog query: [`backlog_sql`]'s columns and
/// `claimable`, the smallest `age` among the pending rows whose key, as
/// text, is not one of the items $2 (text[]). Parameters: $1 n, $2 items.
pub fn claimable_sql(
    rel: &str,
    slot_expr: &str,
    pending: &str,
    age: Option<&str>,
    key: &str,
) -> String {
    backlog_sql_with(rel, slot_expr, pending, age, Some(key))
}

/// [`backlog_sql`], with the column `claimable` when `key` is given.
fn backlog_sql_with(
    rel: &str,
    slot_expr: &str,
    pending: &str,
    age: Option<&str>,
    key: Option<&str>,
) -> String {
    let min_age = |filter: &str| match age {
        Some(a) => format!("pg_catalog.min({a}){filter}::pg_catalog.timestamptz"),
        None => "NULL::pg_catalog.timestamptz".to_string(),
    };
    let (outer, inner) = match key {
        Some(k) => (
            ", c.claimable".to_string(),
            format!(
                ", {} AS claimable",
                min_age(&format!(
                    " FILTER (WHERE NOT (({k})::pg_catalog.text OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[])))"
                ))
            ),
        ),
        None => (String::new(), String::new()),
    };
    let oldest = min_age("");
    format!(
        "SELECT g.slot, COALESCE(c.backlog, 0::pg_catalog.int8) AS backlog, c.oldest{outer} \
         FROM pg_catalog.generate_series(0, $1 OPERATOR(pg_catalog.-) 1) AS g(slot) \
         LEFT JOIN (SELECT {slot_expr} AS slot, pg_catalog.count(*) AS backlog, {oldest} AS oldest{inner} \
                    FROM {rel} WHERE {pending} GROUP BY 1) AS c ON c.slot OPERATOR(pg_catalog.=) g.slot \
         ORDER BY g.slot"
    )
}

/// The query that counts failure records per slot: `slot_expr` maps the
/// item (cast to the key's type), or the joined row's route column.
/// Parameters: $1 items (text[]), $2 dead (boolean[]).
pub fn failures_sql(slot_expr: &str, join: Option<&str>) -> String {
    format!(
        "SELECT {slot_expr} AS slot, \
         pg_catalog.count(*) FILTER (WHERE NOT f.dead) AS failing, \
         pg_catalog.count(*) FILTER (WHERE f.dead) AS dead \
         FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.bool[])) AS f(item, dead) {}\
         GROUP BY 1",
        join.map(|j| format!("{j} ")).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_sql_shapes() {
        assert_eq!(
            backlog_sql("public.outbox", "s.slot_of(id, 8)", "sent_at IS NULL", Some("created_at")),
            "SELECT g.slot, COALESCE(c.backlog, 0::pg_catalog.int8) AS backlog, c.oldest \
             FROM pg_catalog.generate_series(0, $1 OPERATOR(pg_catalog.-) 1) AS g(slot) \
             LEFT JOIN (SELECT s.slot_of(id, 8) AS slot, pg_catalog.count(*) AS backlog, \
             pg_catalog.min(created_at)::pg_catalog.timestamptz AS oldest \
             FROM public.outbox WHERE sent_at IS NULL GROUP BY 1) AS c ON c.slot OPERATOR(pg_catalog.=) g.slot \
             ORDER BY g.slot"
        );
        assert!(backlog_sql("t", "e", "NOT done", None)
            .contains("NULL::pg_catalog.timestamptz AS oldest"));
    }

    #[test]
    fn claimable_sql_shapes() {
        let q = claimable_sql(
            "public.outbox",
            "s.slot_of(id, 8)",
            "sent_at IS NULL",
            Some("created_at"),
            "id",
        );
        assert!(q.contains(
            "pg_catalog.min(created_at) FILTER (WHERE NOT ((id)::pg_catalog.text \
             OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[])))::pg_catalog.timestamptz AS claimable"
        ));
        assert!(q.starts_with("SELECT g.slot, COALESCE(c.backlog, 0::pg_catalog.int8) AS backlog, c.oldest, c.claimable"));
        assert!(claimable_sql("t", "e", "NOT done", None, "k")
            .contains("NULL::pg_catalog.timestamptz AS claimable"));
    }

    #[test]
    fn failures_sql_shapes() {
        assert_eq!(
            failures_sql("s.slot_of((f.item)::pg_catalog.int8, 4)", None),
            "SELECT s.slot_of((f.item)::pg_catalog.int8, 4) AS slot, \
             pg_catalog.count(*) FILTER (WHERE NOT f.dead) AS failing, \
             pg_catalog.count(*) FILTER (WHERE f.dead) AS dead \
             FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.bool[])) \
             AS f(item, dead) GROUP BY 1"
        );
        assert!(failures_sql("e", Some("JOIN t ON x"))
            .ends_with("AS f(item, dead) JOIN t ON x GROUP BY 1"));
    }
}
