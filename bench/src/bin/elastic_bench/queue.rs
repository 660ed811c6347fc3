//! The `FOR UPDATE SKIP LOCKED` queue with the same handler, batches and
//! pool as the lease fleet, one connection per worker through the pooler,
//! in two forms:
//!
//! - `queue`: a visibility timeout, as pgmq's `read` does it, so that no
//!   transaction (and no server connection) is held while the handler
//!   runs: the claim is one autocommit statement that takes the next pending
//!   rows whose `vt` has passed (`FOR UPDATE SKIP LOCKED`) and sets their
//!   `vt` 30 s ahead; after the handler, a second autocommit statement marks
//!   them done. Two statements and two row writes per batch.
//! - `queue_tx`: the textbook form: `BEGIN`, the next pending rows
//!   `FOR UPDATE SKIP LOCKED`, the handler inside the transaction, then the
//!   write and `COMMIT`. The transaction holds its server connection while
//!   the handler runs, so a pool of P connections serves at most P batches
//!   at a time.

use crate::work::{first_column, handle, mark_done_sql, rows_of, Counters, POOLED_NAME, TABLE};
use pg_claim_support::{connect, describe};
use postgres::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The visibility timeout of `queue`: far longer than a batch, so no claim
/// runs out during a run.
const VT: &str = "30 seconds";

/// What a queue's workers share.
#[derive(Clone)]
pub struct Queue {
    pub dsn: String,
    /// `queue` or `queue_tx`.
    pub method: String,
    pub batch: usize,
    pub per_row: Duration,
}

/// One queue worker until `stop`; it starts its batches when `go` is set.
pub fn worker(q: &Queue, go: &AtomicBool, stop: &AtomicBool, counters: &Arc<Counters>) {
    let (dsn, method, batch, per_row) = (&q.dsn, q.method.as_str(), q.batch, q.per_row);
    let mut conn = match connect(dsn, POOLED_NAME) {
        Ok(c) => c,
        Err(e) => {
            counters.error(format!("connect: {}", describe(&e)));
            return;
        }
    };
    while !go.load(Ordering::SeqCst) {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
    // Both forms read the payload with the ids, as the leases' my_items does.
    let claim = if method == "queue" {
        format!(
            "UPDATE {TABLE} i SET vt = clock_timestamp() + interval '{VT}'
               FROM (SELECT id FROM {TABLE} WHERE NOT done AND vt <= clock_timestamp()
                      ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED) c
              WHERE i.id = c.id RETURNING i.id, i.payload"
        )
    } else {
        format!(
            "BEGIN; SELECT id, payload FROM {TABLE} WHERE NOT done ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED"
        )
    };
    while !stop.load(Ordering::SeqCst) {
        if let Err(e) = batch_once(&mut conn, method, &claim, per_row, counters) {
            let _ = conn.batch_execute("ROLLBACK");
            counters.error(format!("{method}: {}", describe(&e)));
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// One batch: claim, handle, write.
fn batch_once(
    conn: &mut Client,
    method: &str,
    claim: &str,
    per_row: Duration,
    counters: &Counters,
) -> Result<(), postgres::Error> {
    let t = Instant::now();
    let mut ids = first_column(&conn.simple_query(claim)?);
    if counters.measuring() {
        counters.fetch.push(t);
    }
    ids.sort_unstable();
    if ids.is_empty() {
        // Drained (or every pending row claimed by others).
        if method == "queue_tx" {
            conn.batch_execute("COMMIT")?;
        }
        thread::sleep(Duration::from_millis(5));
        return Ok(());
    }
    handle(ids.len(), per_row);
    let write = if method == "queue_tx" {
        format!("{}; COMMIT", mark_done_sql(&ids))
    } else {
        mark_done_sql(&ids)
    };
    let t = Instant::now();
    let marked = rows_of(&conn.simple_query(&write)?, 0);
    if counters.measuring() {
        counters.write.push(t);
    }
    counters.items.fetch_add(marked, Ordering::Relaxed);
    counters.batches.fetch_add(1, Ordering::Relaxed);
    counters
        .repeated
        .fetch_add(ids.len() as u64 - marked, Ordering::Relaxed);
    Ok(())
}
