//! A worker's share of a table: my_items, my_items_query, slot_counts, slot_skew,
//! and seeing the fleet: slot_backlog, define_fleet, drop_fleet (`backlog`) (reference: docs/my_items.md).
//!
//! `my_items(NULL::tbl, slot, n, ...)` returns `SETOF tbl`: it is a C
//! set-returning function (`srf`) that gets its query text from
//! `share_query` (validated against the catalogs: the table opened in
//! `catalog`, its columns in `columns`, the pending predicate in `pending`,
//! hash-partition routing in `partitions`, index advice in `advice`, the
//! mapping call's resolution in `resolve`; written by the pure `plan`, cached
//! per session in `cache`) and runs it through a plan
//! kept for the session. `my_items_query` returns the same text;
//! `slot_counts` is a PL/pgSQL wrapper that runs `slot_counts_query`'s text
//! with `RETURN QUERY EXECUTE`. All three are `pg_claim_fn!` functions that
//! read their arguments by position (`arg`), so that an installation still
//! at 0.2.0, whose SQL declarations have fewer arguments, keeps working with
//! this library (under the C names 0.2.0 used) until it is updated. Identifiers come from the catalogs (the row
//! type's relation, its columns), always quoted; argument values reach the
//! queries only as parameters.

mod advice;
mod backlog;
mod cache;
mod catalog;
mod columns;
mod partitions;
mod pending;
mod plan;
mod resolve;
mod srf;

use crate::backend::error::{invalid_parameter, n_below_one, raise, N_HINT};
use crate::pg_claim_fn;
use pgrx::fcinfo::pg_getarg;
use pgrx::prelude::*;
use pgrx::FromDatum;
use plan::{Method, ShareQuery};

fn null_arg(name: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{name} must not be null"),
        "The slot is this worker's slot (0 .. n-1) and n the number of slots.",
    )
}

fn check_slot_n(slot: i32, n: i32) {
    if n < 1 {
        n_below_one(n, N_HINT);
    }
    if slot < 0 || slot >= n {
        invalid_parameter(
            format!("slot must be between 0 and {} (n = {n}), got {slot}", n - 1),
            "Slots are numbered 0 .. n-1: pass the slot claim_slot returned.",
        );
    }
}

fn parse_method(method: Option<&str>) -> Method {
    let name = method.unwrap_or("auto");
    Method::parse(name).unwrap_or_else(|| {
        invalid_parameter(
            format!("unsupported method \"{name}\""),
            &format!("The method is one of: {}.", plan::METHOD_NAMES),
        )
    })
}

/// The mapping expression for `method` on the resolved route column (the
/// key unless `route` names another), or an ERROR naming its type. `arg` is
/// the argument that named the column: "key" or "route".
fn slot_mapping(method: Method, col: &columns::Key, arg: &str) -> plan::Mapping {
    plan::mapping(method, col.kind).unwrap_or_else(|why| {
        raise(
            PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
            format!(
                "method \"{}\" cannot map {arg} column {} of type {}",
                method.name(),
                col.quoted,
                col.type_name
            ),
            &format!(
                "The {why}; use method => 'pg_hash', or {arg} => a column of a supported type."
            ),
        )
    })
}

/// The route column: `route` if given, else the key; and the argument that
/// named it, for errors.
fn route_of(
    table: &catalog::Table,
    key: &columns::Key,
    route: Option<&str>,
) -> (columns::Key, &'static str) {
    match route {
        Some(name) => (table.route(name), "route"),
        None => (key.clone(), "key"),
    }
}

/// Argument `num` of the current call, or None when it is NULL or the call
/// has fewer arguments (a declaration of an earlier release: no `route`, no
/// `pending`).
///
/// # Safety
/// `fcinfo` is the current call's, and argument `num` (if passed) is a `T`.
unsafe fn arg<T: FromDatum>(fcinfo: pg_sys::FunctionCallInfo, num: usize) -> Option<T> {
    // SAFETY: as the caller promises; num is checked against nargs
    unsafe {
        if num < (*fcinfo).nargs as usize {
            pg_getarg::<T>(fcinfo, num)
        } else {
            None
        }
    }
}

pg_claim_fn!(guarded
/// `my_items_query(rel oid, slot, n, key, method, after, batch, columns,
/// route, pending) RETURNS text`: the query `my_items` runs for these
/// arguments (parameters: $1 slot, $2 n, $3 after, $4 batch; n is also
/// written into the slot expression so it matches an expression index in a
/// cached, generic plan). Exposed so users can see and EXPLAIN it. Its
/// arguments after `rel` are my_items' own, in the same positions.
///
my_items_query, |fcinfo| {
    // SAFETY: this call's fcinfo, declared in sql/items.sql
    unsafe {
        let reltype = arg::<pg_sys::Oid>(fcinfo, 0).unwrap_or_else(|| null_arg("rel"));
        share_query(fcinfo, reltype)
            .into_datum()
            .unwrap_or_else(|| crate::backend::error::internal("return the query text", ""))
    }
});
// the C name of 0.2.0's declaration (a pgrx wrapper then)
pg_claim_fn!(alias my_items_query_wrapper => my_items_query);

/// Validate the arguments of a my_items or my_items_query call (slot, n,
/// key, method, after, batch, columns, route, pending, after the row type)
/// and return the query text for the share (cached per session).
///
/// # Safety
/// `fcinfo` is the current call of my_items or my_items_query.
pub(crate) unsafe fn share_query(fcinfo: pg_sys::FunctionCallInfo, reltype: pg_sys::Oid) -> String {
    // SAFETY: as the caller promises
    let (func, slot, n, key, method, after, batch, columns, route, pending) = unsafe {
        (
            catalog::calling_function(fcinfo),
            arg::<i32>(fcinfo, 1),
            arg::<i32>(fcinfo, 2),
            arg::<&str>(fcinfo, 3),
            arg::<&str>(fcinfo, 4),
            arg::<&str>(fcinfo, 5).is_some(),
            arg::<i32>(fcinfo, 6),
            arg::<Vec<Option<String>>>(fcinfo, 7),
            arg::<&str>(fcinfo, 8),
            arg::<&str>(fcinfo, 9),
        )
    };
    let columns = columns.map(|c| {
        c.into_iter()
            .map(|name| {
                name.unwrap_or_else(|| {
                    raise(
                        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                        "columns must not contain null".to_string(),
                        "Name the columns to read, e.g. columns => ARRAY['id', 'email'].",
                    )
                })
            })
            .collect::<Vec<String>>()
    });
    let slot = slot.unwrap_or_else(|| null_arg("slot"));
    let n = n.unwrap_or_else(|| null_arg("n"));
    check_slot_n(slot, n);
    if let Some(b) = batch {
        if b < 1 {
            invalid_parameter(
                format!("batch must be at least 1, got {b}"),
                "The batch is the most rows one call returns; leave it NULL for the whole share.",
            );
        }
    }
    let method = parse_method(method);
    let cache_key = cache::QueryKey {
        func: func.to_u32(),
        // SAFETY: set for every backend
        user: unsafe { pg_sys::GetUserId() }.to_u32(),
        reltype: reltype.to_u32(),
        slot,
        n,
        key: key.map(str::to_string),
        method: method.name(),
        after,
        batch: batch.is_some(),
        columns: columns.clone(),
        route: route.map(str::to_string),
        pending: pending.map(str::to_string),
    };
    catalog::lock_row_type(reltype);
    if let Some(sql) = cache::get(&cache_key) {
        return sql;
    }
    let ext = catalog::extension_schema(func);
    let table = catalog::Table::from_row_type(reltype);
    let key = table.key(key, "my_items");
    let (route, route_arg) = route_of(&table, &key, route);
    let mapping = slot_mapping(method, &route, route_arg);
    let pending = pending.map(|name| table.pending(name));

    let gt_op = if after {
        key.greater_than()
    } else {
        String::new()
    };
    let select_list = table.select_list(&key, columns.as_deref());

    // A table hash-partitioned by the route column with modulus n: the
    // share is one partition, read directly, when that returns exactly the
    // same rows.
    let partition = if method == Method::PgHash && table.is_partitioned() {
        table.hash_partition_for(&route, n, slot)
    } else {
        None
    };
    let mut deps = vec![table.relid];
    // an index ((<mapping>(route, n)), key) to page through in key order
    let slot_key_index = partition.is_none()
        && (after || batch.is_some())
        && table.has_slot_key_index(&route, &key, &mapping, &ext, n, pending.as_ref());
    let query = |from: &str, filter: Option<String>| {
        let filtered = filter.is_some();
        plan::share_sql(&ShareQuery {
            from,
            columns: (partition.is_some() || columns.is_some()).then_some(&select_list[..]),
            key: &key.quoted,
            key_type: &key.type_name,
            gt_op: &gt_op,
            route: &route.quoted,
            route_not_null: filter.is_none() && !route.not_null,
            // SAFETY: a syscache look-up of the route column's (base) type
            route_is_row: unsafe { pg_sys::type_is_rowtype(route.type_oid) },
            pending: pending.as_ref().map(|p| p.sql.as_str()),
            filter,
            after,
            batch: batch.is_some(),
            slot_key_index: slot_key_index && filtered,
        })
    };
    let sql = match &partition {
        Some((child_oid, child)) => {
            deps.push(*child_oid);
            query(child, None)
        }
        None => {
            resolve::check_mapping_resolves(&mapping, &route, &ext);
            table.advise_index(&key, &route, &mapping, &ext, n, pending.as_ref());
            query(
                &table.quoted,
                Some(mapping.expr(
                    &ext.quoted,
                    &resolve::key_arg(&mapping, &route),
                    &n.to_string(),
                )),
            )
        }
    };
    cache::put(cache_key, sql.clone(), deps);
    sql
}

/// The most slots `slot_counts` lists (one row each, empty ones included):
/// the most `claim_slot` hands out.
const MAX_COUNTED_SLOTS: i32 = crate::backend::limits::MAX_N;

pg_claim_fn!(guarded
/// `slot_counts_query(rel oid, n, key, method, route) RETURNS text`: the
/// query `slot_counts` runs (parameter: $1 n): rows per slot of the route
/// column (the key unless `route` names another).
///
slot_counts_query, |fcinfo| {
    // SAFETY: this call's fcinfo, declared in sql/items.sql
    unsafe {
        counts_query(
            fcinfo,
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
// the C name of 0.2.0's declaration (a pgrx wrapper then)
pg_claim_fn!(alias slot_counts_query_wrapper => slot_counts_query);

/// The text of slot_counts_query.
///
/// # Safety
/// `fcinfo` is the current call of slot_counts_query.
unsafe fn counts_query(
    fcinfo: pg_sys::FunctionCallInfo,
    rel: Option<pg_sys::Oid>,
    n: Option<i32>,
    key: Option<&str>,
    method: Option<&str>,
    route: Option<&str>,
) -> String {
    let relid = rel.unwrap_or_else(|| null_arg("rel"));
    let n = n.unwrap_or_else(|| null_arg("n"));
    check_slot_n(0, n);
    if n > MAX_COUNTED_SLOTS {
        invalid_parameter(
            format!("n must be at most {MAX_COUNTED_SLOTS} for slot_counts, got {n}"),
            "The function slot_counts lists every slot 0 .. n-1; for more slots, count the non-empty ones yourself: SELECT slot_of(key, n), count(*) FROM tbl GROUP BY 1.",
        );
    }
    // A long count stops soon after its client goes away.
    crate::backend::settings::apply_client_check(false);
    let method = parse_method(method);
    let table = catalog::Table::from_regclass(relid);
    // with route, the key plays no part in a count (a named one must exist)
    let (route, route_arg) = match route {
        Some(name) => {
            if key.is_some() {
                table.key(key, "slot_counts");
            }
            (table.route(name), "route")
        }
        None => (table.key(key, "slot_counts"), "key"),
    };
    let mapping = slot_mapping(method, &route, route_arg);
    // SAFETY: as the caller promises
    let ext = catalog::extension_schema(unsafe { catalog::calling_function(fcinfo) });
    resolve::check_mapping_resolves(&mapping, &route, &ext);
    plan::counts_sql(
        &table.quoted,
        &mapping.expr(&ext.quoted, &resolve::key_arg(&mapping, &route), "$1"),
    )
}

extension_sql_file!("../sql/items.sql", name = "my_items_sql");
// slot_partition: the hash partition that holds a slot's rows (catalog
// reads only, in PL/pgSQL).
extension_sql_file!("../sql/slot_partition.sql", name = "slot_partition");
// slot_backlog, define_fleet, drop_fleet and the views fleet_slots and fleets
// (src/items/backlog.rs); the view fleets calls item_failures.
extension_sql_file!(
    "../sql/fleets.sql",
    name = "fleets",
    requires = ["my_items_sql", "failures", "slot_status"]
);

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn setup() {
        Spi::run(
            "CREATE TABLE t_items (id bigint PRIMARY KEY, v text);
             INSERT INTO t_items SELECT g - 50, 'v' || g FROM generate_series(1, 100) g;",
        )
        .unwrap();
    }

    #[pg_test]
    fn share_equals_filter() {
        setup();
        let ok = Spi::get_one::<bool>(
            "SELECT bool_and(
                 (SELECT array_agg(id ORDER BY id) FROM my_items(NULL::t_items, s, 7))
                 IS NOT DISTINCT FROM
                 (SELECT array_agg(id ORDER BY id) FROM t_items WHERE slot_of(id, 7) = s))
             FROM generate_series(0, 6) s",
        );
        assert_eq!(ok, Ok(Some(true)));
    }

    #[pg_test]
    fn query_text_is_schema_qualified_and_parameterised() {
        setup();
        let q = Spi::get_one::<String>(
            "SELECT my_items_query('t_items'::regtype, 1, 4, after => '0', batch => 10)",
        )
        .unwrap()
        .unwrap();
        assert!(
            q.contains(".slot_of(id, 4) OPERATOR(pg_catalog.=) $1"),
            "{q}"
        );
        assert!(
            q.ends_with("id OPERATOR(pg_catalog.>) $3::bigint ORDER BY id LIMIT $4"),
            "{q}"
        );
    }

    #[pg_test(error = "slot must be between 0 and 3 (n = 4), got 4")]
    fn slot_out_of_range() {
        setup();
        let _ = Spi::get_one::<i64>("SELECT count(*) FROM my_items(NULL::t_items, 4, 4)");
    }

    #[pg_test(error = "unsupported method \"modulo\"")]
    fn unknown_method() {
        setup();
        let _ = Spi::get_one::<i64>(
            "SELECT count(*) FROM my_items(NULL::t_items, 0, 4, method => 'modulo')",
        );
    }
}
