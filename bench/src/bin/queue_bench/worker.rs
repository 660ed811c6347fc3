//! One worker of a run: connect, take its identity (a slot, or a queue),
//! prepare its statements, then drain its share or the queue batch by batch.

use crate::config::Config;
use crate::methods::claims_slot;
use pg_claim_support::{connect, describe};
use postgres::Client;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

/// One worker: connect, take its identity, wait for the start, then drain
/// its share (or the queue) batch by batch (see `drain`).
pub fn worker(
    cfg: &Config,
    method: &str,
    w: usize,
    i: usize,
    barrier: &Barrier,
) -> Result<Drained, String> {
    let mut c = match connect(&cfg.dsn, &format!("bench-{method}-{i}")) {
        Ok(c) => c,
        Err(e) => {
            barrier.wait();
            return Err(format!("connect: {}", describe(&e)));
        }
    };
    let prepared = prepare_worker(&mut c, method, w, i, cfg.batch);
    barrier.wait();
    let (slot, stmts) = prepared?;
    let work = Duration::from_micros(cfg.work_us * cfg.batch as u64);
    drain(&mut c, method, slot, &stmts, work, cfg.batch).map_err(|e| describe(&e))
}

/// A worker's prepared statements: fetch a batch, mark it done, log it, and
/// for PgQ open and finish the batch.
struct Stmts {
    fetch: postgres::Statement,
    mark: postgres::Statement,
    pgq: Option<(postgres::Statement, postgres::Statement)>,
}

/// The queue's fetch, the same in both SKIP LOCKED forms.
fn queue_fetch_sql(batch: i64) -> String {
    format!("SELECT id FROM bench_items WHERE NOT done ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED")
}

/// Every method's marking statement: marks the batch done, skipping items
/// already done, and logs what it marked. `ids` and `slot` are SQL
/// expressions (parameters, or literals in the simple protocol).
fn mark_sql(ids: &str, slot: &str) -> String {
    format!(
        "WITH d AS (UPDATE bench_items SET done = true WHERE id = ANY({ids}) AND NOT done RETURNING id)
         INSERT INTO bench_log (item_id, slot, worker_pid, processed_at)
         SELECT id, {slot}, pg_backend_pid(), clock_timestamp() FROM d"
    )
}

/// Claims the worker's identity and prepares its statements.
fn prepare_worker(
    c: &mut Client,
    method: &str,
    w: usize,
    i: usize,
    batch: i64,
) -> Result<(i32, Stmts), String> {
    let err = |e: postgres::Error| describe(&e);
    let slot: i32 = match method {
        m if claims_slot(m) => c
            .query_one("SELECT claim_slot('bench', $1)", &[&(w as i32)])
            .map_err(err)?
            .get::<_, Option<i32>>(0)
            // W workers and W slots: every worker gets one.
            .ok_or_else(|| format!("claim_slot('bench', {w}) returned NULL"))?,
        _ => i as i32,
    };
    let fetch = match method {
        "pg_claim" | "pg_claim_tx" => format!(
            "SELECT id FROM bench_items WHERE slot_of(id, {w}) = $1 AND id > $2 AND NOT done ORDER BY id LIMIT {batch}"
        ),
        "my_items" => format!(
            "SELECT id FROM my_items(NULL::bench_items, $1, {w}, after => $2::bigint::text, batch => {batch})"
        ),
        "skip_locked" | "skip_locked_simple" => queue_fetch_sql(batch),
        _ => "SELECT ev_data::bigint FROM pgq.get_batch_events($1)".to_string(),
    };
    let pgq = if method == "pgq" {
        Some((
            c.prepare("SELECT pgq.next_batch($1, 'bench')")
                .map_err(err)?,
            c.prepare("SELECT pgq.finish_batch($1)").map_err(err)?,
        ))
    } else {
        None
    };
    Ok((
        slot,
        Stmts {
            fetch: c.prepare(&fetch).map_err(err)?,
            mark: c.prepare(&mark_sql("$1", "$2")).map_err(err)?,
            pgq,
        },
    ))
}

/// What one worker did: batch latencies in ms, and how many fetched items
/// were already done (fetched for work a second time).
pub struct Drained {
    pub lat: Vec<f64>,
    pub refetched: i64,
}

/// One worker's loop until its share (or the queue) is empty. Every batch is
/// fetched, worked on, then marked done and logged by one statement. The
/// queues fetch, work and mark inside one transaction, since their row locks
/// (or PgQ batch) are the claim; a pg_claim worker's claim is its slot, so it
/// fetches outside any transaction and the marking statement is its own
/// transaction (`pg_claim_tx` runs the pg_claim fetch in the queues' loop
/// instead).
fn drain(
    c: &mut Client,
    method: &str,
    slot: i32,
    s: &Stmts,
    work: Duration,
    batch: i64,
) -> Result<Drained, postgres::Error> {
    if method == "skip_locked_simple" {
        return drain_simple(c, slot, work, batch);
    }
    let share = claims_slot(method);
    let in_tx = !matches!(method, "pg_claim" | "my_items");
    let mut lat = Vec::new();
    let mut refetched = 0i64;
    let mut after: i64 = i64::MIN;
    let queue = format!("bench_q{slot}");
    loop {
        let t = Instant::now();
        if in_tx {
            c.batch_execute("BEGIN")?;
        }
        let mut batch_id: Option<i64> = None;
        let rows = if share {
            c.query(&s.fetch, &[&slot, &after])?
        } else if let Some((next, _)) = &s.pgq {
            batch_id = c.query_one(next, &[&queue])?.get(0);
            match batch_id {
                Some(b) => c.query(&s.fetch, &[&b])?,
                None => Vec::new(),
            }
        } else {
            c.query(&s.fetch, &[])?
        };
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        if ids.is_empty() && batch_id.is_none() {
            if in_tx {
                c.batch_execute("COMMIT")?;
            }
            return Ok(Drained { lat, refetched });
        }
        if !work.is_zero() {
            thread::sleep(work);
        }
        if !ids.is_empty() {
            // The statement skips items already done, so the log never
            // holds one twice; an item skipped so was fetched for work a
            // second time, and is counted as a duplicate.
            let marked = c.execute(&s.mark, &[&ids, &slot])?;
            refetched += ids.len() as i64 - marked as i64;
            after = ids.iter().copied().max().unwrap_or(after);
        }
        if let (Some(b), Some((_, finish))) = (batch_id, &s.pgq) {
            c.query_one(finish, &[&b])?;
        }
        if in_tx {
            c.batch_execute("COMMIT")?;
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
}

/// The queue in two round trips per batch: `BEGIN` goes with the fetch and
/// `COMMIT` with the marking statement, in the simple query protocol (which
/// allows several statements per message but no parameters, so nothing is
/// prepared and the ids travel as a literal).
fn drain_simple(
    c: &mut Client,
    slot: i32,
    work: Duration,
    batch: i64,
) -> Result<Drained, postgres::Error> {
    let mut lat = Vec::new();
    let mut refetched = 0i64;
    loop {
        let t = Instant::now();
        let mut ids: Vec<i64> = Vec::new();
        let mut marked = 0i64;
        for m in c.simple_query(&format!("BEGIN; {}", queue_fetch_sql(batch)))? {
            if let postgres::SimpleQueryMessage::Row(r) = m {
                ids.extend(r.get(0).and_then(|v| v.parse::<i64>().ok()));
            }
        }
        if ids.is_empty() {
            c.batch_execute("COMMIT")?;
            return Ok(Drained { lat, refetched });
        }
        if !work.is_zero() {
            thread::sleep(work);
        }
        let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let ids_literal = format!("'{{{}}}'::bigint[]", list.join(","));
        for m in c.simple_query(&format!(
            "{}; COMMIT",
            mark_sql(&ids_literal, &slot.to_string())
        ))? {
            if let postgres::SimpleQueryMessage::CommandComplete(n) = m {
                marked += n as i64;
            }
        }
        refetched += ids.len() as i64 - marked;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
}
