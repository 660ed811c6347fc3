//! The lease-mode worker of an elastic fleet, the loop to copy behind a
//! transaction-mode pooler (PgBouncer `pool_mode = transaction`). Each
//! worker is two threads on two connections:
//!
//! - the lease thread calls `claim_leases` every third of the TTL and
//!   publishes the result, every slot the worker holds with its token, as a
//!   map slot -> token (a slot missing from a result was given back: the
//!   work loop stops working on it at once);
//! - the work loop walks the held slots round robin, one batch of a slot's
//!   share per turn: `my_items` after the slot's cursor (read from the
//!   processing log when the worker gets the slot with a new token), the
//!   work outside any transaction, then one transaction that starts with
//!   `fence` and logs the batch and marks it done. `PC001` drops the slot
//!   until the next `claim_leases` result.
//!
//! When the worker stops, its lease thread gives every slot back with
//! `claim_leases(..., max => 0)`, which also takes the worker out of the
//! live set: the other workers' next calls share its slots out.
//!
//! ```sql
//! -- lease thread, every ttl/3: every slot the holder holds after the call
//! SELECT slot, token FROM claim_leases('demo', 8, 'worker-1', ttl => interval '2 s');
//! -- work loop, for a slot of the map with a token it has no cursor for:
//! SELECT max(item_id) FROM processing_log WHERE slot = 5;                    -- where the share stands
//! -- per batch:
//! SELECT id FROM my_items(NULL::work_items, 5, 8, after => '79997', batch => 500);
//! -- ... the work on the batch, outside any transaction ...
//! BEGIN;
//! SELECT fence('demo', 5, 1795450180678128);                                -- PC001: lost
//! INSERT INTO processing_log ... ; UPDATE work_items SET done = true ... ;
//! COMMIT;
//! -- on stop:
//! SELECT * FROM claim_leases('demo', 8, 'worker-1', max => 0);               -- gives every slot back
//! ```
//!
//! Every statement goes through `query_typed`: one unnamed statement sent
//! with its parameters in a single message (Parse, Bind, Execute, Sync), so
//! the pooler runs it on one server connection. The crate's `query` and
//! `execute` prepare a named statement first, which PgBouncer 1.18 in
//! transaction mode may send to another server connection than the one
//! that runs it ("prepared statement "s3" does not exist").

use crate::config::{Config, NAME};
use crate::state::{lock, stamp, Pause, State};
use pg_claim_support::{connect, describe, ms, sqlstate, thousands};
use postgres::types::Type;
use postgres::Client;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// What a worker's `stop` holds: running, leaving mid-run (announced), or
/// stopping at the end of the run.
pub const RUN: u8 = 0;
pub const LEAVE: u8 = 1;
pub const END: u8 = 2;

/// A running worker, as the coordinator sees it.
pub struct Handle {
    pub role: String,
    pub stop: Arc<AtomicU8>,
    pub thread: JoinHandle<()>,
}

/// One lease of the map: its token and, when it took a paused worker's
/// lease over, that takeover (reported by the work loop once it knows where
/// the share stands).
#[derive(Clone)]
struct Lease {
    token: i64,
    taken: Option<Taken>,
}

/// A slot taken from the paused worker: its token and expiry, when it
/// paused, and when the taking call returned (`acquired`: on the server's
/// clock, in seconds since the epoch).
#[derive(Clone)]
struct Taken {
    victim: String,
    token: i64,
    expired: Option<f64>,
    paused: Instant,
    claimed: Instant,
    acquired: f64,
}

/// The map the lease thread publishes: every slot the worker holds, and
/// when the `claim_leases` call that returned it was sent (its leases last
/// at least a TTL from then).
#[derive(Default)]
struct Held {
    slots: BTreeMap<i32, Lease>,
    sent: Option<Instant>,
}

/// What the two threads of a worker share.
struct Worker<'a> {
    role: String,
    cfg: &'a Config,
    state: &'a State,
    start: Instant,
    held: Mutex<Held>,
    /// The worker is paused (both threads stop) until then.
    paused: Mutex<Option<Instant>>,
    /// The work loop has stopped: the lease thread gives the slots back.
    work_done: std::sync::atomic::AtomicBool,
    stop: &'a AtomicU8,
}

fn held<'w>(w: &'w Worker) -> MutexGuard<'w, Held> {
    w.held.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts a worker of the elastic fleet as `role`; it runs until `stop`
/// is set (`LEAVE` or `END`), then gives its slots back.
pub fn spawn(role: String, cfg: &Config, state: &State, start: Instant) -> Handle {
    let stop = Arc::new(AtomicU8::new(RUN));
    let (cfg, state, stop2, role2) = (cfg.clone(), state.clone(), stop.clone(), role.clone());
    let thread = thread::spawn(move || lease_worker(role2, &cfg, &state, &stop2, start));
    Handle { role, stop, thread }
}

fn lease_worker(role: String, cfg: &Config, state: &State, stop: &AtomicU8, start: Instant) {
    let w = Worker {
        role,
        cfg,
        state,
        start,
        held: Mutex::new(Held::default()),
        paused: Mutex::new(None),
        work_done: std::sync::atomic::AtomicBool::new(false),
        stop,
    };
    let fail = |msg: String| {
        let mut s = lock(state);
        s.events
            .push(stamp(start, &format!("ERROR {}: {msg}", w.role)));
        s.failures.push(format!("{}: {msg}", w.role));
    };
    // Through a pooler these are client connections: the server connection
    // under each changes from one transaction to the next.
    let mut lc = match connect(&cfg.worker_dsn, &format!("demo-{}-leases", w.role)) {
        Ok(c) => c,
        Err(e) => return fail(format!("connect: {}", describe(&e))),
    };
    let mut wc = match connect(&cfg.worker_dsn, &format!("demo-{}", w.role)) {
        Ok(c) => c,
        Err(e) => return fail(format!("connect: {}", describe(&e))),
    };
    thread::scope(|sc| {
        let lease_thread = sc.spawn(|| {
            if let Err(msg) = lease_loop(&w, &mut lc) {
                fail(msg);
            }
        });
        if let Err(msg) = work_loop(&w, &mut wc) {
            fail(msg);
        }
        w.work_done.store(true, Ordering::SeqCst);
        let _ = lease_thread.join();
    });
}

/// The lease thread: `claim_leases` every third of the TTL, the result
/// published as the worker's map; once the work loop has stopped, every
/// slot given back with `max => 0`.
fn lease_loop(w: &Worker, c: &mut Client) -> Result<(), String> {
    let every = w.cfg.ttl / 3;
    let ttl = w.cfg.ttl.as_secs_f64();
    let n = w.cfg.slots as i32;
    let mut last_ok = Instant::now();
    loop {
        if w.work_done.load(Ordering::SeqCst) {
            return leave(w, c);
        }
        // A paused worker calls nothing.
        let paused = *w.paused.lock().unwrap_or_else(|p| p.into_inner());
        if paused.is_some() {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        let sent = Instant::now();
        let r = c.query_typed(
            "SELECT slot, token, extract(epoch FROM expires_at)::float8
               FROM claim_leases($1, $2, $3, ttl => make_interval(secs => $4))",
            &[
                (&NAME, Type::TEXT),
                (&n, Type::INT4),
                (&w.role.as_str(), Type::TEXT),
                (&ttl, Type::FLOAT8),
            ],
        );
        match r {
            Ok(rows) => {
                last_ok = sent;
                let got = rows
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect();
                publish(w, got, sent);
            }
            Err(e) => {
                // Keep the map until a TTL after the last success, then
                // clear it: its leases may have expired by then.
                let msg = format!("claim_leases: {}", describe(&e));
                let mut s = lock(w.state);
                s.events
                    .push(stamp(w.start, &format!("ERROR {}: {msg}", w.role)));
                s.failures.push(format!("{}: {msg}", w.role));
                drop(s);
                if last_ok.elapsed() >= w.cfg.ttl {
                    held(w).slots.clear();
                }
            }
        }
        let next = sent + every;
        while Instant::now() < next && !w.work_done.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Replaces the worker's map with a `claim_leases` result and shows the
/// holders on the slots' lines; a slot taken from the paused worker carries
/// that takeover for the work loop to report.
fn publish(w: &Worker, got: Vec<(i32, i64, f64)>, sent: Instant) {
    let claimed = Instant::now();
    let mut h = held(w);
    let mut s = lock(w.state);
    let mut slots = BTreeMap::new();
    for (slot, token, expires) in got {
        let old = h.slots.get(&slot).filter(|l| l.token == token);
        let v = &mut s.slots[slot as usize];
        let taken = match old {
            Some(l) => l.taken.clone(),
            None => {
                // newly taken: was it the paused worker's lease?
                let before = (v.token, v.expires);
                let victim = s.pause.as_ref().filter(|p| {
                    p.role != w.role
                        && p.held
                            .iter()
                            .any(|&(ps, pt)| ps == slot && Some(pt) == before.0)
                });
                let taken = victim.map(|p| Taken {
                    victim: p.role.clone(),
                    token: before.0.unwrap_or(0),
                    expired: before.1,
                    paused: p.at,
                    claimed,
                    // claim_leases set expires_at = its clock_timestamp() + ttl
                    acquired: expires - w.cfg.ttl.as_secs_f64(),
                });
                let v = &mut s.slots[slot as usize];
                v.holder = Some((w.role.clone(), 0));
                v.token = Some(token);
                taken
            }
        };
        s.slots[slot as usize].expires = Some(expires);
        slots.insert(slot, Lease { token, taken });
    }
    // Slots given back (or lost): their lines show no holder until the
    // next holder takes them.
    for (slot, l) in &h.slots {
        if !slots.contains_key(slot) {
            let v = &mut s.slots[*slot as usize];
            if v.token == Some(l.token) {
                v.holder = None;
            }
        }
    }
    h.slots = slots;
    h.sent = Some(sent);
}

/// Gives every slot back: `claim_leases(..., max => 0)` returns no row and
/// takes the worker out of the live set. A mid-run leave is reported.
fn leave(w: &Worker, c: &mut Client) -> Result<(), String> {
    let n = w.cfg.slots as i32;
    let ttl = w.cfg.ttl.as_secs_f64();
    let had: Vec<i32> = held(w).slots.keys().copied().collect();
    let rows = c
        .query_typed(
            "SELECT slot FROM claim_leases($1, $2, $3, max => 0, ttl => make_interval(secs => $4))",
            &[
                (&NAME, Type::TEXT),
                (&n, Type::INT4),
                (&w.role.as_str(), Type::TEXT),
                (&ttl, Type::FLOAT8),
            ],
        )
        .map_err(|e| format!("claim_leases(max => 0): {}", describe(&e)))?;
    let old = std::mem::take(&mut held(w).slots);
    let mut s = lock(w.state);
    for (slot, l) in &old {
        let v = &mut s.slots[*slot as usize];
        if v.token == Some(l.token) {
            v.holder = None;
        }
    }
    if !rows.is_empty() {
        let kept: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
        let msg = format!("claim_leases(max => 0) returned slots {kept:?} instead of no row");
        s.events
            .push(stamp(w.start, &format!("ERROR {}: {msg}", w.role)));
        s.failures.push(format!("{}: {msg}", w.role));
    }
    if w.stop.load(Ordering::SeqCst) == LEAVE {
        let line = stamp(
            w.start,
            &format!(
                "LEAVE {} finished its batch and called claim_leases('{NAME}', {n}, '{}', max => 0): \
                 gave back slots {had:?}, returned {} rows; the others' next calls share them out",
                w.role,
                w.role,
                rows.len()
            ),
        );
        s.events.push(line.clone());
        s.left = Some(line);
    }
    Ok(())
}

/// The work loop: round robin over the held slots, one batch per turn,
/// until the worker is told to stop.
fn work_loop(w: &Worker, c: &mut Client) -> Result<(), String> {
    let cfg = w.cfg;
    let n = cfg.slots as i32;
    // slot -> (the token it was read under, the last id done)
    let mut cursors: HashMap<i32, (i64, Option<i64>)> = HashMap::new();
    let mut last_slot = -1;
    while w.stop.load(Ordering::SeqCst) == RUN {
        let Some((slot, lease)) = next_slot(w, last_slot) else {
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        last_slot = slot;
        let after = match cursors.get(&slot) {
            Some(&(t, after)) if t == lease.token => after,
            _ => {
                let after = frontier(w, c, slot, &lease)?;
                cursors.insert(slot, (lease.token, after));
                after
            }
        };
        let ids: Vec<i64> = c
            .query_typed(
                "SELECT id FROM my_items(NULL::work_items, $1, $2, after => $3, batch => $4)",
                &[
                    (&slot, Type::INT4),
                    (&n, Type::INT4),
                    (&after.map(|a| a.to_string()), Type::TEXT),
                    (&(cfg.batch as i32), Type::INT4),
                ],
            )
            .map_err(|e| format!("my_items: {}", describe(&e)))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let (Some(&first), Some(&last)) = (ids.first(), ids.last()) else {
            lock(w.state).slots[slot as usize].finished = true;
            continue;
        };
        // The work on the batch, outside any transaction: a transaction
        // holds a server connection of the pool for as long as it is open.
        thread::sleep(Duration::from_micros(cfg.work_us) * ids.len() as u32);
        // Given back during the work (a worker joined, say): the slot's
        // next holder does the batch; writing it would only meet PC001.
        if !still_held(w, slot, lease.token) {
            lock(w.state).dropped_batches += 1;
            continue;
        }
        // The GC pause, at the worst moment: after the check, before the write.
        let paused = pause_if_asked(w, slot, &lease, &ids);
        match write(c, &w.role, slot, lease.token, &ids) {
            Ok(()) => {
                cursors.insert(slot, (lease.token, Some(last)));
                let mut s = lock(w.state);
                let v = &mut s.slots[slot as usize];
                // counted on the slot's line while this token is its latest
                // (the next holder counts from the log)
                if v.token == Some(lease.token) {
                    v.done += ids.len() as u64;
                }
                if let Some(pause) = paused {
                    s.late_write_rejected = Some(false);
                    let line = stamp(
                        w.start,
                        &format!(
                            "NOT REJECTED {} (slot {slot}, token {}) wrote its {} items {:.2} s after it paused: fence let a late write through",
                            w.role,
                            lease.token,
                            ids.len(),
                            pause.as_secs_f64()
                        ),
                    );
                    s.events.push(line);
                    s.failures.push(format!(
                        "{}: its late write was not rejected by fence",
                        w.role
                    ));
                }
            }
            Err(e) if sqlstate(&e) == "PC001" => {
                // Dropped until the next claim_leases result.
                {
                    let mut h = held(w);
                    if h.slots.get(&slot).is_some_and(|l| l.token == lease.token) {
                        h.slots.remove(&slot);
                    }
                }
                let msg = e
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_default();
                let (woke, why) = match paused {
                    Some(p) => (
                        format!(", woken from a {:.2} s pause,", p.as_secs_f64()),
                        "after its leases expired and were taken over",
                    ),
                    None => (String::new(), "after its lease was given back"),
                };
                let line = stamp(
                    w.start,
                    &format!(
                        "REJECTED {} (slot {slot}, token {}){woke} tried to write {} items (ids {first} .. {last}) {why}: PC001, {msg}",
                        w.role,
                        lease.token,
                        ids.len()
                    ),
                );
                let mut s = lock(w.state);
                if paused.is_some() {
                    s.late_write_rejected = Some(true);
                }
                s.events.push(line.clone());
                s.rejected.push(line);
            }
            Err(e) => return Err(format!("slot {slot}: {}", describe(&e))),
        }
    }
    Ok(())
}

/// The next slot to work on after `last_slot`, round robin over the map's
/// unfinished slots; none while the map is older than a TTL (its leases may
/// have expired: wait for the next `claim_leases` result).
fn next_slot(w: &Worker, last_slot: i32) -> Option<(i32, Lease)> {
    let h = held(w);
    if h.sent.is_none_or(|t| t.elapsed() >= w.cfg.ttl) {
        return None;
    }
    let s = lock(w.state);
    let open = |(slot, _): &(&i32, &Lease)| !s.slots[**slot as usize].finished;
    let pick = h
        .slots
        .range(last_slot + 1..)
        .find(open)
        .or_else(|| h.slots.iter().find(open));
    pick.map(|(slot, l)| (*slot, l.clone()))
}

fn still_held(w: &Worker, slot: i32, token: i64) -> bool {
    held(w).slots.get(&slot).is_some_and(|l| l.token == token)
}

/// Where the share of a slot the worker holds with a new token stands: the
/// log's max id of the slot (the log is written in key order behind the
/// fence, so it is a prefix of the share, and no earlier holder's write can
/// commit any more once `claim_leases` gave this token). The slot's line
/// counts from the log; a takeover of the paused worker's lease is
/// reported.
fn frontier(w: &Worker, c: &mut Client, slot: i32, lease: &Lease) -> Result<Option<i64>, String> {
    let r = c
        .query_typed_one(
            "SELECT max(item_id), count(*) FROM processing_log WHERE slot = $1",
            &[(&slot, Type::INT4)],
        )
        .map_err(|e| format!("reading the log: {}", describe(&e)))?;
    let (mut after, already): (Option<i64>, i64) = (r.get(0), r.get(1));
    if w.cfg.resume_from_start {
        after = None;
    }
    let mut s = lock(w.state);
    let v = &mut s.slots[slot as usize];
    if v.token == Some(lease.token) {
        v.done = already as u64;
        v.samples.clear();
    }
    let Some(t) = &lease.taken else {
        return Ok(after);
    };
    let after_expiry = match t.expired {
        Some(e) if t.acquired >= e => format!(
            ", {} after that lease expired",
            ms(Duration::from_secs_f64(t.acquired - e))
        ),
        _ => String::new(),
    };
    let resume = match after {
        Some(a) => format!(
            "resuming after item {a} ({} of its items already processed)",
            thousands(already as u64)
        ),
        None => "starting at the beginning of the share".to_string(),
    };
    let line = stamp(
        w.start,
        &format!(
            "TAKEOVER {} took slot {slot} (token {}) from the paused {} (token {}) {:.2} s after it paused{after_expiry}; {resume}",
            w.role,
            lease.token,
            t.victim,
            t.token,
            t.claimed.saturating_duration_since(t.paused).as_secs_f64()
        ),
    );
    if s.takeover.is_none() {
        s.takeover = Some(t.claimed.saturating_duration_since(t.paused));
    }
    s.events.push(line.clone());
    s.takeover_lines.push(line);
    Ok(after)
}

/// The batch's writes, in one transaction behind `fence`: when it passes,
/// the slot cannot change hands before `COMMIT`; when the lease was given
/// back or taken over it raises `PC001` and nothing is written.
fn write(
    c: &mut Client,
    role: &str,
    slot: i32,
    token: i64,
    ids: &[i64],
) -> Result<(), postgres::Error> {
    let mut tx = c.transaction()?;
    tx.query_typed(
        "SELECT fence($1, $2, $3)",
        &[
            (&NAME, Type::TEXT),
            (&slot, Type::INT4),
            (&token, Type::INT8),
        ],
    )?;
    tx.query_typed(
        "INSERT INTO processing_log (item_id, slot, worker_pid, processed_at, worker, token)
         SELECT id, $2, pg_backend_pid(), clock_timestamp(), $3, $4 FROM unnest($1::bigint[]) AS id",
        &[
            (&ids, Type::INT8_ARRAY),
            (&slot, Type::INT4),
            (&role, Type::TEXT),
            (&token, Type::INT8),
        ],
    )?;
    tx.query_typed(
        "UPDATE work_items SET done = true WHERE id = ANY($1)",
        &[(&ids, Type::INT8_ARRAY)],
    )?;
    tx.commit()
}

/// The GC pause: when the coordinator asked for it, the worker that is
/// about to write a batch of the victim slot stops, both its threads, for
/// longer than the TTL: its lease thread calls nothing, so its leases
/// expire and the other workers take its slots. Returns how long it paused,
/// if it did.
fn pause_if_asked(w: &Worker, slot: i32, lease: &Lease, ids: &[i64]) -> Option<Duration> {
    let cfg = w.cfg;
    if slot as usize != cfg.kill_slot {
        return None;
    }
    {
        // the map first: the lease thread locks the map, then the state
        let (mine, last_claim) = {
            let h = held(w);
            let mine: Vec<(i32, i64)> = h.slots.iter().map(|(s, l)| (*s, l.token)).collect();
            (mine, h.sent.map(|t| ms(t.elapsed())).unwrap_or_default())
        };
        let mut s = lock(w.state);
        if !std::mem::take(&mut s.pause_request) {
            return None;
        }
        *w.paused.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + cfg.pause);
        let (done, total) = (s.slots[slot as usize].done, s.slots[slot as usize].total);
        let slots: Vec<i32> = mine.iter().map(|m| m.0).collect();
        let line = stamp(
            w.start,
            &format!(
                "PAUSE {} (slots {slots:?}) stops for {:.2} s as in a GC pause, its lease thread too (TTL {:.2} s, \
                 last claim_leases sent {last_claim} ago), about to write {} items of slot {slot} \
                 (ids {} .. {}, token {}) at {}/{} items of the slot ({:.0}%)",
                w.role,
                cfg.pause.as_secs_f64(),
                cfg.ttl.as_secs_f64(),
                ids.len(),
                ids[0],
                ids[ids.len() - 1],
                lease.token,
                thousands(done),
                thousands(total),
                100.0 * done as f64 / total.max(1) as f64
            ),
        );
        s.events.push(line);
        s.pause = Some(Pause {
            role: w.role.clone(),
            held: mine,
            at: Instant::now(),
        });
    }
    let at = Instant::now();
    thread::sleep(cfg.pause);
    *w.paused.lock().unwrap_or_else(|p| p.into_inner()) = None;
    Some(at.elapsed())
}
