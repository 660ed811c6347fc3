//! The two ways of draining a table FIFO per group, and one worker's loop.
//!
//! - `pg_claim`: each worker `claim_slot(name, W)`, then walks its share,
//!   the groups whose `slot_of(grp, W)` is its slot, in id order with
//!   `my_items(..., route => 'grp', pending => 'done', after, batch)`
//!   (index `((slot_of(grp, W)), id) WHERE NOT done`); a group has one
//!   worker, which takes its items in id order, several per batch.
//! - `queue`: the head of each group (its smallest pending id), oldest
//!   first, locked with `FOR UPDATE SKIP LOCKED`, as pgmq's round-robin
//!   grouped read does: a locked head is a group in flight, so it is
//!   skipped, and a group's next item is seen only once its head is done.
//!   One item per group per transaction. The heads are found with a skip
//!   scan of the index `(grp, id) WHERE NOT done` (one probe per group
//!   with pending items), where pgmq groups every pending message.

use pg_claim_support::{connect, describe};
use postgres::Client;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

pub const METHODS: [&str; 2] = ["pg_claim", "queue"];

/// The method's label in the table.
pub fn label(m: &str) -> &'static str {
    match m {
        "pg_claim" => "pg_claim (claim_slot + my_items route)",
        _ => "queue (group heads, SKIP LOCKED)",
    }
}

/// The index each method reads its work through.
pub fn index_sql(method: &str, w: usize) -> String {
    match method {
        "pg_claim" => format!(
            "CREATE INDEX ord_items_share ON ord_items ((slot_of(grp, {w})), id) WHERE NOT done"
        ),
        _ => "CREATE INDEX ord_items_heads ON ord_items (grp, id) WHERE NOT done".to_string(),
    }
}

/// The queue's fetch: the oldest unlocked group heads, up to `batch`.
fn queue_fetch_sql(batch: i64) -> String {
    format!(
        "WITH RECURSIVE heads (grp, id) AS (
             (SELECT grp, id FROM ord_items WHERE NOT done ORDER BY grp, id LIMIT 1)
             UNION ALL
             SELECT n.grp, n.id FROM heads h CROSS JOIN LATERAL
                 (SELECT grp, id FROM ord_items WHERE NOT done AND grp > h.grp ORDER BY grp, id LIMIT 1) n
         )
         SELECT i.id FROM heads h JOIN ord_items i ON i.id = h.id
         WHERE NOT i.done
         ORDER BY i.id LIMIT {batch}
         FOR UPDATE OF i SKIP LOCKED"
    )
}

/// Both methods' marking statement: marks the items done and logs them, in
/// id order, with the time of processing.
const MARK_SQL: &str = "WITH d AS (UPDATE ord_items SET done = true WHERE id = ANY($1) AND NOT done
                                  RETURNING id, grp, created_at)
     INSERT INTO ord_log (item, grp, created_at, processed_at)
     SELECT id, grp, created_at, clock_timestamp() FROM d ORDER BY id";

/// What the workers of a run share: the count of processed items and the
/// signal to stop.
pub struct Shared {
    pub processed: AtomicI64,
    pub stop: AtomicBool,
}

/// One worker: connect, claim a slot (pg_claim), wait for the start, then
/// process batches until told to stop. Returns its error, if any.
pub fn worker(
    dsn: &str,
    method: &str,
    name: &str,
    w: usize,
    batch: i64,
    shared: &Shared,
    barrier: &Barrier,
) -> Result<(), String> {
    let ready = connect(dsn, &format!("{name}-worker")).map_err(|e| describe(&e));
    let prepared = ready.and_then(|mut c| {
        let fetch = prepare(&mut c, method, name, w, batch).map_err(|e| describe(&e))?;
        Ok((c, fetch))
    });
    barrier.wait();
    let (mut c, (slot, fetch, mark)) = prepared?;
    drain(&mut c, method, slot, &fetch, &mark, shared).map_err(|e| describe(&e))
}

type Prepared = (i32, postgres::Statement, postgres::Statement);

fn prepare(
    c: &mut Client,
    method: &str,
    name: &str,
    w: usize,
    batch: i64,
) -> Result<Prepared, postgres::Error> {
    let (slot, fetch) = if method == "pg_claim" {
        let slot: Option<i32> = c
            .query_one("SELECT claim_slot($1, $2)", &[&name, &(w as i32)])?
            .get(0);
        // W workers and W slots: every worker gets one
        let slot = slot.expect("every worker of a run gets a slot");
        let fetch = format!(
            "SELECT id FROM my_items(NULL::ord_items, $1, {w}, route => 'grp', pending => 'done',
                                     after => $2::bigint::text, batch => {batch})"
        );
        (slot, fetch)
    } else {
        (-1, queue_fetch_sql(batch))
    };
    Ok((slot, c.prepare(&fetch)?, c.prepare(MARK_SQL)?))
}

/// Batches until `shared.stop`: pg_claim fetches outside a transaction (its
/// claim is the slot) and marks in one statement; the queue fetches, marks
/// and commits in one transaction (its row locks are the claim). An empty
/// fetch waits 1 ms, in both.
fn drain(
    c: &mut Client,
    method: &str,
    slot: i32,
    fetch: &postgres::Statement,
    mark: &postgres::Statement,
    shared: &Shared,
) -> Result<(), postgres::Error> {
    let mut after: Option<i64> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let ids: Vec<i64> = if method == "pg_claim" {
            let rows = c.query(fetch, &[&slot, &after])?;
            let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            if !ids.is_empty() {
                let n = c.execute(mark, &[&ids])?;
                shared.processed.fetch_add(n as i64, Ordering::Relaxed);
            }
            ids
        } else {
            let mut tx = c.transaction()?;
            let ids: Vec<i64> = tx.query(fetch, &[])?.iter().map(|r| r.get(0)).collect();
            if !ids.is_empty() {
                let n = tx.execute(mark, &[&ids])?;
                tx.commit()?;
                shared.processed.fetch_add(n as i64, Ordering::Relaxed);
            }
            ids
        };
        match ids.last() {
            Some(&last) => after = Some(last),
            None => {
                after = None; // a new pass over the share: its first pending item
                thread::sleep(Duration::from_millis(1));
            }
        }
    }
    Ok(())
}
