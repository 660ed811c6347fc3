//! What the methods share: the work table, the handler, the statements'
//! plumbing in the simple query protocol (PgBouncer 1.18 in transaction
//! mode has no prepared statements), and the counters a run reads.

use postgres::{Client, SimpleQueryMessage};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// The work table of every run.
pub const TABLE: &str = "bench_elastic_items";

/// The `application_name` of every connection through the pooler: one
/// name for all, since PgBouncer sends a `SET application_name` to the
/// server connection it lends a client whenever their names differ (an
/// extra statement and round trip before many transactions).
pub const POOLED_NAME: &str = "elastic_bench";

/// A fresh work table of `items` pending rows with the index `method`
/// reads: leases the slot expression index of the pending rows (what
/// `my_items(..., pending => 'done')` uses), the queues the pending ids.
/// `vt` is the queue's visibility timeout; the lease fleet leaves it alone.
///
/// Below the pending rows the table holds a quarter as many rows already
/// done, a working table's history, so that the statistics the planner
/// reads say that the partial indexes are the smaller ones. On a table
/// with no done row at all, the primary key and the queue's partial index
/// tie for its `ORDER BY id LIMIT b`, and from about 100,000 rows on the
/// planner reads the primary key, which walks every row done so far on
/// each claim (the queue's items/s then fell by half at W = 16).
pub fn fresh_table(
    admin: &mut Client,
    method: &str,
    items: i64,
    n: i32,
) -> Result<(), postgres::Error> {
    let index = if method == "leases" {
        format!("CREATE INDEX {TABLE}_slot ON {TABLE} ((slot_of(id, {n})), id) WHERE NOT done")
    } else {
        format!("CREATE INDEX {TABLE}_pending ON {TABLE} (id) WHERE NOT done")
    };
    let history = items / 4;
    admin.batch_execute(&format!(
        "SET client_min_messages = warning;
         DROP TABLE IF EXISTS {TABLE};
         CREATE TABLE {TABLE} (id bigint PRIMARY KEY, payload text NOT NULL,
                               done boolean NOT NULL DEFAULT false,
                               vt timestamptz NOT NULL DEFAULT '-infinity');
         INSERT INTO {TABLE} (id, payload, done)
              SELECT g, md5(g::text), g <= {history} FROM generate_series(1, {history} + {items}) g;
         {index};
         RESET client_min_messages"
    ))?;
    admin.batch_execute(&format!("VACUUM ANALYZE {TABLE}"))
}

/// The rows left to do.
pub fn pending(admin: &mut Client) -> Result<i64, postgres::Error> {
    Ok(admin
        .query_one(&format!("SELECT count(*) FROM {TABLE} WHERE NOT done"), &[])?
        .get(0))
}

/// The I/O-bound handler: `per_row` of waiting per row, outside any
/// transaction and without any server connection.
pub fn handle(rows: usize, per_row: Duration) {
    if rows > 0 && !per_row.is_zero() {
        thread::sleep(per_row * rows as u32);
    }
}

/// `ids` as an SQL literal: `'{1,2,3}'::bigint[]`.
pub fn ids_literal(ids: &[i64]) -> String {
    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    format!("'{{{}}}'::bigint[]", list.join(","))
}

/// The first column of every row a simple query returned, as bigints.
pub fn first_column(msgs: &[SimpleQueryMessage]) -> Vec<i64> {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .collect()
}

/// The row count of the `k`-th statement of a simple query (0-based), as
/// its CommandComplete message gives it.
pub fn rows_of(msgs: &[SimpleQueryMessage], k: usize) -> u64 {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::CommandComplete(c) => Some(*c),
            _ => None,
        })
        .nth(k)
        .unwrap_or(0)
}

/// The write that ends every batch of every method: marks the batch's rows
/// done, skipping rows already done (so a row handled twice is counted).
pub fn mark_done_sql(ids: &[i64]) -> String {
    format!(
        "UPDATE {TABLE} SET done = true WHERE id = ANY({}) AND NOT done",
        ids_literal(ids)
    )
}

/// Latencies of one kind of statement, in ms, as the client sees them.
#[derive(Default)]
pub struct Latencies(Mutex<Vec<f64>>);

impl Latencies {
    pub fn push(&self, since: Instant) {
        let ms = since.elapsed().as_secs_f64() * 1000.0;
        self.0.lock().expect("latency list").push(ms);
    }

    /// The samples, sorted.
    pub fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.lock().expect("latency list").clone();
        v.sort_by(f64::total_cmp);
        v
    }
}

/// What a run's workers count. Latencies are kept only while `measuring`
/// (the timed window).
#[derive(Default)]
pub struct Counters {
    /// Rows the batch writes marked done.
    pub items: AtomicU64,
    /// Batches written.
    pub batches: AtomicU64,
    /// Rows handled whose write found them done already (handled twice).
    pub repeated: AtomicU64,
    /// Rows of batches whose write `fence` refused (PC001): handled, not
    /// written, left to the slot's new holder.
    pub refused: AtomicU64,
    /// Statements that failed otherwise.
    pub errors: AtomicU64,
    /// The first such error.
    pub first_error: Mutex<Option<String>>,
    pub measuring: AtomicBool,
    /// Fetching a batch (`my_items`, the queue's claim).
    pub fetch: Latencies,
    /// The batch's write transaction.
    pub write: Latencies,
    /// `claim_leases` calls.
    pub lease: Latencies,
}

impl Counters {
    pub fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().expect("first error");
        if first.is_none() {
            *first = Some(what);
        }
    }

    pub fn measuring(&self) -> bool {
        self.measuring.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals() {
        assert_eq!(ids_literal(&[1, 22, 333]), "'{1,22,333}'::bigint[]");
        assert_eq!(ids_literal(&[]), "'{}'::bigint[]");
    }
}
