//! `slot_holders`: who holds which slot of a name now, read from the lock
//! table and joined with pg_stat_activity.

use super::registry;
use crate::backend::error::internal;
use crate::backend::limits::MAX_N;
use crate::locks::{locks_of, name_key, EXCLUSIVE};
use pgrx::prelude::*;

/// Who holds which slot of `name` now.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, strict, parallel_unsafe)]
fn slot_holders(
    name: &str,
) -> TableIterator<
    'static,
    (
        name!(slot, Option<i32>),
        name!(pid, Option<i32>),
        name!(application_name, Option<String>),
        name!(client_addr, Option<pgrx::datum::Inet>),
        name!(backend_start, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(state, Option<String>),
    ),
> {
    let key1 = name_key(name);
    if !registry::owns_key(name) {
        // another name's key: its holders are not this name's
        return TableIterator::new(Vec::new());
    }
    let mut holders: Vec<(i32, i32)> = locks_of(key1, 0, MAX_N)
        .into_iter()
        .filter(|l| l.granted && l.mode == EXCLUSIVE)
        .map(|l| (l.key2, l.pid))
        .collect();
    holders.sort_unstable();
    holders.dedup();
    if holders.is_empty() {
        return TableIterator::new(Vec::new());
    }
    let list = |f: fn(&(i32, i32)) -> i32| {
        holders
            .iter()
            .map(|h| f(h).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    // Only integers are formatted into the query.
    let sql = format!(
        "SELECT h.slot, h.pid, a.application_name::pg_catalog.text, a.client_addr, a.backend_start,
                a.state::pg_catalog.text
         FROM ROWS FROM (pg_catalog.unnest('{{{}}}'::pg_catalog.int4[]),
                         pg_catalog.unnest('{{{}}}'::pg_catalog.int4[]))
              WITH ORDINALITY AS h(slot, pid, o)
         LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) h.pid
         ORDER BY h.o",
        list(|h| h.0),
        list(|h| h.1)
    );
    let rows = Spi::connect(|client| {
        let table = client.select(&sql, None, &[])?;
        let mut out = Vec::with_capacity(holders.len());
        for row in table {
            out.push((
                row.get::<i32>(1)?,
                row.get::<i32>(2)?,
                row.get::<String>(3)?,
                row.get::<pgrx::datum::Inet>(4)?,
                row.get::<pgrx::datum::TimestampWithTimeZone>(5)?,
                row.get::<String>(6)?,
            ));
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })
    .unwrap_or_else(|e| internal("read pg_stat_activity", e));
    TableIterator::new(rows)
}
