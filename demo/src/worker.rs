//! The worker loop, the one to copy: claim a slot, find where its share
//! stands in the processing log, then process the share batch by batch, each
//! batch logged and marked done in one transaction.

use crate::config::{Config, NAME};
use crate::state::{lock, set_standby, State};
use pg_claim_support::{backend_pid, connect, describe, is_connection_loss, ms, thousands};
use postgres::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// A worker (or standby): claim a slot, walk its share, hold the slot until
/// the whole table is done. A standby waits for a slot in short rounds so it
/// notices the end of the run.
pub fn worker(
    role: String,
    cfg: &Config,
    state: &State,
    finished: &AtomicBool,
    stop_standby: Option<&AtomicBool>,
    start: Instant,
) {
    let standby = stop_standby.is_some();
    let fail = |msg: String| {
        let mut s = lock(state);
        s.events.push(format!("ERROR {role}: {msg}"));
        s.failures.push(format!("{role}: {msg}"));
    };
    let mut c = match connect(&cfg.dsn, &format!("demo-{role}")) {
        Ok(c) => c,
        Err(e) => return fail(format!("connect: {}", describe(&e))),
    };
    let pid = match backend_pid(&mut c) {
        Ok(pid) => pid,
        Err(e) => return fail(describe(&e)),
    };
    let slot = match claim(&mut c, cfg, state, &role, pid, stop_standby) {
        Ok(Some(slot)) => slot,
        Ok(None) => return, // a standby that was never needed
        Err(msg) => return fail(msg),
    };
    let claimed_at = Instant::now();
    let su = slot as usize;

    // Where this share stands: the log is written in the same transaction as
    // the done flags, in key order, so its max id per slot is the frontier.
    let (mut after, already): (Option<i64>, i64) = match c.query_one(
        "SELECT max(item_id), count(*) FROM processing_log WHERE slot = $1",
        &[&slot],
    ) {
        Ok(r) => (r.get(0), r.get(1)),
        Err(e) => return fail(format!("reading the log: {}", describe(&e))),
    };
    if standby && cfg.resume_from_start {
        after = None;
    }
    {
        let mut s = lock(state);
        let kill_time = s.kill_time;
        let v = &mut s.slots[su];
        v.holder = Some((role.clone(), pid));
        v.done = already as u64;
        v.samples.clear();
        if standby {
            let lat = kill_time.map(|k| claimed_at.saturating_duration_since(k));
            if s.takeover.is_none() {
                s.takeover = lat;
            }
            let resume = match after {
                Some(a) => format!(
                    "resuming after item {} ({} of its items already processed)",
                    a,
                    thousands(already as u64)
                ),
                None => "starting at the beginning of the share".to_string(),
            };
            let lat_s = lat
                .map(|d| format!("{} after the kill", ms(d)))
                .unwrap_or_default();
            s.events.push(format!(
                "[{:6.2}s] TAKEOVER {role} (pid {pid}) claimed slot {slot} {lat_s}; {resume}",
                start.elapsed().as_secs_f64()
            ));
            if let Some(e) = s.standbys.iter_mut().find(|e| e.0 == role) {
                e.2 = format!("took over slot {slot}");
            }
        }
    }

    let work = Duration::from_micros(cfg.work_us * cfg.batch as u64);
    loop {
        if finished.load(Ordering::SeqCst) {
            return; // the run was stopped (timeout)
        }
        match process_batch(&mut c, cfg, slot, after, work, state) {
            Ok(Some(last)) => after = Some(last),
            Ok(None) => break,
            Err(e) if is_connection_loss(&e) => {
                let mut s = lock(state);
                let v = &mut s.slots[su];
                // A standby may already hold the slot again.
                if v.holder.as_ref().is_some_and(|h| h.1 == pid) {
                    v.holder = None;
                }
                let lost = match std::mem::take(&mut v.uncommitted) {
                    0 => "no transaction was open".to_string(),
                    k => format!("its open transaction with {k} log rows was rolled back"),
                };
                s.events.push(format!(
                    "[{:6.2}s] DEAD  {role} (pid {pid}) lost its connection ({lost}): {}",
                    start.elapsed().as_secs_f64(),
                    describe(&e)
                ));
                return;
            }
            Err(e) => return fail(format!("slot {slot}: {}", describe(&e))),
        }
    }
    lock(state).slots[su].finished = true;
    // Keep the slot until the whole table is done, as a long-running worker
    // would keep polling its share for new items.
    while !finished.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(20));
    }
}

/// The worker's slot: a worker claims one of the n free slots at once; a
/// standby registers as waiting and asks in rounds of 500 ms until a slot
/// frees (`Ok(None)` when it is told to stop first).
fn claim(
    c: &mut Client,
    cfg: &Config,
    state: &State,
    role: &str,
    pid: i32,
    stop_standby: Option<&AtomicBool>,
) -> Result<Option<i32>, String> {
    let n = cfg.slots as i32;
    let Some(stop) = stop_standby else {
        let r = c
            .query_one(
                "SELECT claim_slot($1, $2, interval '30 seconds')",
                &[&NAME, &n],
            )
            .map_err(|e| format!("claim_slot: {}", describe(&e)))?;
        return match r.get::<_, Option<i32>>(0) {
            Some(s) => Ok(Some(s)),
            None => Err("no slot free after 30 s".into()),
        };
    };
    lock(state)
        .standbys
        .push((role.to_string(), pid, "waiting".into()));
    loop {
        if stop.load(Ordering::SeqCst) {
            set_standby(state, role, "stopped (never needed)".into());
            return Ok(None);
        }
        // claim_slot(name, n, wait): NULL after `wait` when all n are held.
        let r = c
            .query_one(
                "SELECT claim_slot($1, $2, interval '500 milliseconds')",
                &[&NAME, &n],
            )
            .map_err(|e| format!("claim_slot: {}", describe(&e)))?;
        if let Some(s) = r.get::<_, Option<i32>>(0) {
            return Ok(Some(s));
        }
    }
}

/// One transaction: the next batch of the share after `after`, logged and
/// marked done, plus the simulated work. Returns the batch's last id, or
/// `None` when the share is exhausted.
fn process_batch(
    c: &mut Client,
    cfg: &Config,
    slot: i32,
    after: Option<i64>,
    work: Duration,
    state: &State,
) -> Result<Option<i64>, postgres::Error> {
    let n = cfg.slots as i32;
    let mut tx = c.transaction()?;
    let ids: Vec<i64> = tx
        .query(
            "SELECT id FROM my_items(NULL::work_items, $1, $2, after => $3, batch => $4)",
            &[
                &slot,
                &n,
                &after.map(|a| a.to_string()),
                &(cfg.batch as i32),
            ],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let Some(&last) = ids.last() else {
        tx.commit()?;
        return Ok(None);
    };
    let logged = tx.execute(
        "INSERT INTO processing_log (item_id, slot, worker_pid, processed_at)
         SELECT id, $2, pg_backend_pid(), clock_timestamp() FROM unnest($1::bigint[]) AS id",
        &[&ids, &slot],
    )?;
    tx.execute(
        "UPDATE work_items SET done = true WHERE id = ANY($1)",
        &[&ids],
    )?;
    lock(state).slots[slot as usize].uncommitted = logged;
    // The rest of the batch's work happens inside the same transaction.
    thread::sleep(work);
    tx.commit()?;
    let mut s = lock(state);
    let v = &mut s.slots[slot as usize];
    v.uncommitted = 0;
    v.done += logged;
    Ok(Some(last))
}
