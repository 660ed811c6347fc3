//! The lease-mode worker, the loop to copy behind a transaction-mode pooler
//! (PgBouncer `pool_mode = transaction`): claim a lease, renew it every third
//! of its TTL, find where the share stands in the processing log, then
//! process the share batch by batch, each batch logged and marked done in one
//! transaction that starts with `fence`. A worker whose lease was taken over
//! (it paused past its TTL) has its write rejected (`PC001`), drops the batch
//! and claims again, as a standby.
//!
//! ```sql
//! SELECT slot, token FROM claim_lease('demo', 4, 'worker-1', interval '2 s');  -- no row: a standby
//! SELECT renew_lease('demo', 1, 1795450180678128, interval '2 s');             -- every ttl/3; NULL: lost
//! SELECT max(item_id) FROM processing_log WHERE slot = 1;                      -- where my share stands
//! SELECT id FROM my_items(NULL::work_items, 1, 4, after => '79997', batch => 500);
//! -- ... the work on the batch, outside any transaction ...
//! BEGIN;
//! SELECT fence('demo', 1, 1795450180678128);                                  -- PC001: lost
//! INSERT INTO processing_log ... ; UPDATE work_items SET done = true ... ;
//! COMMIT;
//! ```
//!
//! Every statement goes through `query_typed`: one unnamed statement sent
//! with its parameters in a single message (Parse, Bind, Execute, Sync), so
//! the pooler runs it on one server connection. The crate's `query` and
//! `execute` prepare a named statement first, which PgBouncer 1.18 in
//! transaction mode may send to another server connection than the one
//! that runs it ("prepared statement "s3" does not exist").

use crate::config::{Config, NAME};
use crate::state::{lock, set_standby, stamp, Pause, State};
use pg_claim_support::{connect, describe, ms, sqlstate, thousands};
use postgres::types::Type;
use postgres::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// A lease this worker holds: its slot, its fencing token and its expiry
/// (seconds since the epoch on the server's clock).
struct Lease {
    slot: i32,
    token: i64,
    expires: f64,
}

/// How a walk of the share ended.
enum End {
    /// The lease was lost (a NULL renewal, or `fence` raised `PC001`).
    Lost,
    /// The run is over; the lease was released.
    Stopped,
}

/// A lease worker, or a standby when `standby`: claim a lease (a standby
/// polls until one is free), walk its share, hold the lease until the whole
/// table is done. A worker that loses its lease claims again as a standby.
pub fn lease_worker(
    role: String,
    cfg: &Config,
    state: &State,
    finished: &AtomicBool,
    stop_standbys: &AtomicBool,
    mut standby: bool,
    start: Instant,
) {
    let fail = |msg: String| {
        let mut s = lock(state);
        s.events.push(format!("ERROR {role}: {msg}"));
        s.failures.push(format!("{role}: {msg}"));
    };
    // Through a pooler this is a client connection: the server connection
    // under it changes from one transaction to the next.
    let mut c = match connect(&cfg.worker_dsn, &format!("demo-{role}")) {
        Ok(c) => c,
        Err(e) => return fail(format!("connect: {}", describe(&e))),
    };
    let mut rejoined = false;
    loop {
        let lease = match claim(&mut c, cfg, state, &role, standby, rejoined, stop_standbys) {
            Ok(Some(lease)) => lease,
            Ok(None) => return, // a standby that was never needed
            Err(msg) => return fail(msg),
        };
        let after = match took(&mut c, cfg, state, &role, &lease, standby, start) {
            Ok(after) => after,
            Err(msg) => return fail(msg),
        };
        match walk(&mut c, cfg, state, &role, &lease, after, finished, start) {
            Ok(End::Lost) => {
                // Claim again: every slot is leased, so as a standby.
                standby = true;
                rejoined = true;
            }
            Ok(End::Stopped) => return,
            Err(msg) => return fail(msg),
        }
    }
}

/// A lease: a worker claims one of the n free slots at once; a standby
/// registers as waiting and polls `claim_lease` until a lease is free or
/// expired (`Ok(None)` when it is told to stop first).
fn claim(
    c: &mut Client,
    cfg: &Config,
    state: &State,
    role: &str,
    standby: bool,
    rejoined: bool,
    stop: &AtomicBool,
) -> Result<Option<Lease>, String> {
    let n = cfg.slots as i32;
    let ttl = cfg.ttl.as_secs_f64();
    let mut try_claim = || -> Result<Option<Lease>, String> {
        let rows = c
            .query_typed(
                "SELECT slot, token, extract(epoch FROM expires_at)::float8
                   FROM claim_lease($1, $2, $3, make_interval(secs => $4))",
                &[
                    (&NAME, Type::TEXT),
                    (&n, Type::INT4),
                    (&role, Type::TEXT),
                    (&ttl, Type::FLOAT8),
                ],
            )
            .map_err(|e| format!("claim_lease: {}", describe(&e)))?;
        Ok(rows.first().map(|r| Lease {
            slot: r.get(0),
            token: r.get(1),
            expires: r.get(2),
        }))
    };
    if !standby {
        return match try_claim()? {
            Some(lease) => Ok(Some(lease)),
            None => Err("claim_lease returned no row: all slots are leased".into()),
        };
    }
    {
        let mut s = lock(state);
        match s.standbys.iter_mut().find(|e| e.0 == role) {
            Some(e) => e.2 = "waiting".into(),
            None => s.standbys.push((role.to_string(), 0, "waiting".into())),
        }
    }
    let every = (cfg.ttl / 20).min(Duration::from_millis(100));
    loop {
        if stop.load(Ordering::SeqCst) {
            let why = if rejoined {
                "stopped"
            } else {
                "stopped (never needed)"
            };
            set_standby(state, role, why.into());
            return Ok(None);
        }
        if let Some(lease) = try_claim()? {
            return Ok(Some(lease));
        }
        thread::sleep(every);
    }
}

/// After a claim: where the share stands (the log's max id of the slot, as
/// in session mode: the log is written in key order behind the fence, so it
/// is a prefix of the share), shown on the slot's line; a standby's claim is
/// a takeover, reported with its time from the previous lease's expiry.
fn took(
    c: &mut Client,
    cfg: &Config,
    state: &State,
    role: &str,
    lease: &Lease,
    standby: bool,
    start: Instant,
) -> Result<Option<i64>, String> {
    let slot = lease.slot;
    let r = c
        .query_typed_one(
            "SELECT max(item_id), count(*) FROM processing_log WHERE slot = $1",
            &[(&slot, Type::INT4)],
        )
        .map_err(|e| format!("reading the log: {}", describe(&e)))?;
    let (mut after, already): (Option<i64>, i64) = (r.get(0), r.get(1));
    if standby && cfg.resume_from_start {
        after = None;
    }
    let claimed_at = Instant::now();
    let mut s = lock(state);
    let v = &mut s.slots[slot as usize];
    let before = (v.holder.take(), v.token, v.expires);
    v.holder = Some((role.to_string(), 0));
    v.token = Some(lease.token);
    v.expires = Some(lease.expires);
    v.done = already as u64;
    v.samples.clear();
    if !standby {
        return Ok(after);
    }
    // claim_lease set expires_at = its clock_timestamp() + ttl
    let acquired = lease.expires - cfg.ttl.as_secs_f64();
    let after_expiry = before
        .2
        .map(|e| ms(Duration::from_secs_f64((acquired - e).max(0.0))));
    let old = match (&before.0, before.1) {
        (Some((r, _)), Some(t)) => format!("{r} (token {t})"),
        _ => "its previous holder".to_string(),
    };
    let paused = s
        .pause
        .as_ref()
        .filter(|p| p.slot == slot && p.token == before.1.unwrap_or(0))
        .map(|p| (p.role.clone(), claimed_at.saturating_duration_since(p.at)));
    let when = match (&paused, &after_expiry) {
        (Some((victim, since)), Some(exp)) => format!(
            "{:.2} s after {victim} paused, {exp} after its lease (token {}) expired",
            since.as_secs_f64(),
            before.1.unwrap_or(0)
        ),
        (None, Some(exp)) => format!("{exp} after the lease of {old} expired"),
        _ => format!("from {old}"),
    };
    let resume = match after {
        Some(a) => format!(
            "resuming after item {a} ({} of its items already processed)",
            thousands(already as u64)
        ),
        None => "starting at the beginning of the share".to_string(),
    };
    let line = stamp(
        start,
        &format!(
            "TAKEOVER {role} claimed slot {slot} (token {}) {when}; {resume}",
            lease.token
        ),
    );
    if let Some((_, since)) = paused {
        s.takeover = Some(since);
        s.takeover_line = Some(line.clone());
    }
    s.events.push(line);
    if let Some(e) = s.standbys.iter_mut().find(|e| e.0 == role) {
        e.2 = format!("took over slot {slot}");
    }
    Ok(after)
}

/// Walks the share of `lease` after `after`, batch by batch, renewing the
/// lease every third of its TTL; then holds the lease (renewing) until the
/// whole table is done, and releases it.
#[allow(clippy::too_many_arguments)]
fn walk(
    c: &mut Client,
    cfg: &Config,
    state: &State,
    role: &str,
    lease: &Lease,
    mut after: Option<i64>,
    finished: &AtomicBool,
    start: Instant,
) -> Result<End, String> {
    let (slot, token) = (lease.slot, lease.token);
    let su = slot as usize;
    let n = cfg.slots as i32;
    let renew_every = cfg.ttl / 3;
    let mut renewed = Instant::now(); // the claim was one
    let mut share_done = false;
    loop {
        if finished.load(Ordering::SeqCst) {
            // The run is over: give the lease back.
            c.query_typed(
                "SELECT release_lease($1, $2, $3)",
                &[
                    (&NAME, Type::TEXT),
                    (&slot, Type::INT4),
                    (&token, Type::INT8),
                ],
            )
            .map_err(|e| format!("release_lease: {}", describe(&e)))?;
            return Ok(End::Stopped);
        }
        if renewed.elapsed() >= renew_every {
            if !renew(c, cfg, state, role, lease, start)? {
                return Ok(End::Lost);
            }
            renewed = Instant::now();
        }
        if share_done {
            // Keep the lease until the whole table is done, as a
            // long-running worker would keep polling its share.
            thread::sleep(Duration::from_millis(20));
            continue;
        }
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
            share_done = true;
            lock(state).slots[su].finished = true;
            continue;
        };
        let paused = pause_if_asked(cfg, state, role, lease, &ids, renewed, start);
        // The work on the batch, outside any transaction: a transaction
        // holds a server connection of the pool for as long as it is open.
        thread::sleep(Duration::from_micros(cfg.work_us) * ids.len() as u32);
        match write(c, role, lease, &ids) {
            Ok(()) => {
                let mut s = lock(state);
                s.slots[su].done += ids.len() as u64;
                if let Some(pause) = paused {
                    s.late_write_rejected = Some(false);
                    let line = stamp(
                        start,
                        &format!(
                            "NOT REJECTED {role} (slot {slot}, token {token}) wrote its {} items {:.2} s after it paused: fence let a late write through",
                            ids.len(),
                            pause.as_secs_f64()
                        ),
                    );
                    s.events.push(line);
                    s.failures
                        .push(format!("{role}: its late write was not rejected by fence"));
                }
            }
            Err(e) if sqlstate(&e) == "PC001" => {
                let msg = e
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_default();
                let woke = match paused {
                    Some(p) => format!(", woken from a {:.2} s pause,", p.as_secs_f64()),
                    None => String::new(),
                };
                let line = stamp(
                    start,
                    &format!(
                        "REJECTED {role} (slot {slot}, token {token}){woke} tried to write {} items (ids {first} .. {last}) after its lease was taken over: PC001, {msg}",
                        ids.len()
                    ),
                );
                let mut s = lock(state);
                if paused.is_some() {
                    s.late_write_rejected = Some(true);
                }
                s.events.push(line.clone());
                s.rejected.push(line);
                return Ok(End::Lost);
            }
            Err(e) => return Err(format!("slot {slot}: {}", describe(&e))),
        }
        after = Some(last);
    }
}

/// The batch's writes, in one transaction behind `fence`: when it passes,
/// the slot cannot change hands before `COMMIT`; when the lease was taken
/// over it raises `PC001` and nothing is written.
fn write(c: &mut Client, role: &str, lease: &Lease, ids: &[i64]) -> Result<(), postgres::Error> {
    let mut tx = c.transaction()?;
    tx.query_typed(
        "SELECT fence($1, $2, $3)",
        &[
            (&NAME, Type::TEXT),
            (&lease.slot, Type::INT4),
            (&lease.token, Type::INT8),
        ],
    )?;
    tx.query_typed(
        "INSERT INTO processing_log (item_id, slot, worker_pid, processed_at, worker, token)
         SELECT id, $2, pg_backend_pid(), clock_timestamp(), $3, $4 FROM unnest($1::bigint[]) AS id",
        &[
            (&ids, Type::INT8_ARRAY),
            (&lease.slot, Type::INT4),
            (&role, Type::TEXT),
            (&lease.token, Type::INT8),
        ],
    )?;
    tx.query_typed(
        "UPDATE work_items SET done = true WHERE id = ANY($1)",
        &[(&ids, Type::INT8_ARRAY)],
    )?;
    tx.commit()
}

/// Renews the lease; `Ok(false)` when `renew_lease` returned NULL (the lease
/// expired and was taken over), reported as a lost lease.
fn renew(
    c: &mut Client,
    cfg: &Config,
    state: &State,
    role: &str,
    lease: &Lease,
    start: Instant,
) -> Result<bool, String> {
    let until: Option<f64> = c
        .query_typed_one(
            "SELECT extract(epoch FROM renew_lease($1, $2, $3, make_interval(secs => $4)))::float8",
            &[
                (&NAME, Type::TEXT),
                (&lease.slot, Type::INT4),
                (&lease.token, Type::INT8),
                (&cfg.ttl.as_secs_f64(), Type::FLOAT8),
            ],
        )
        .map_err(|e| format!("renew_lease: {}", describe(&e)))?
        .get(0);
    let mut s = lock(state);
    let v = &mut s.slots[lease.slot as usize];
    match until {
        Some(u) => {
            if v.token == Some(lease.token) {
                v.expires = Some(u);
            }
            Ok(true)
        }
        None => {
            let line = stamp(
                start,
                &format!(
                    "LOST {role} (slot {}, token {}): renew_lease returned NULL, its lease expired and was taken over; it drops its share and claims again",
                    lease.slot, lease.token
                ),
            );
            s.events.push(line.clone());
            s.rejected.push(line);
            Ok(false)
        }
    }
}

/// The GC pause: when the coordinator asked the holder of the victim slot to
/// pause, this worker stops right after fetching a batch, renewing nothing,
/// for longer than its TTL. Returns how long it paused, if it did.
fn pause_if_asked(
    cfg: &Config,
    state: &State,
    role: &str,
    lease: &Lease,
    ids: &[i64],
    renewed: Instant,
    start: Instant,
) -> Option<Duration> {
    let su = lease.slot as usize;
    {
        let mut s = lock(state);
        if su != cfg.kill_slot || !std::mem::take(&mut s.pause_request) {
            return None;
        }
        let (done, total) = (s.slots[su].done, s.slots[su].total);
        let line = stamp(
            start,
            &format!(
                "PAUSE {role} (slot {}, token {}) stops for {:.2} s as in a GC pause (TTL {:.2} s, last renewal {} ago), \
                 renewing nothing, holding {} fetched, unprocessed items (ids {} .. {}) at {}/{} items ({:.0}%)",
                lease.slot,
                lease.token,
                cfg.pause.as_secs_f64(),
                cfg.ttl.as_secs_f64(),
                ms(renewed.elapsed()),
                ids.len(),
                ids[0],
                ids[ids.len() - 1],
                thousands(done),
                thousands(total),
                100.0 * done as f64 / total.max(1) as f64
            ),
        );
        s.events.push(line);
        s.pause = Some(Pause {
            role: role.to_string(),
            slot: lease.slot,
            token: lease.token,
            at: Instant::now(),
        });
    }
    let at = Instant::now();
    thread::sleep(cfg.pause);
    Some(at.elapsed())
}
