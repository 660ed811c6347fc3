//! The lease-mode worker of an elastic fleet, the loop to copy behind a
//! transaction-mode pooler (PgBouncer `pool_mode = transaction`). The loop
//! is `pg_claim_support::elastic`'s (which the elastic benchmark runs too);
//! this module gives it the demo's statements and its reporting. Each
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
//! - balance by remaining work: the worker counts a slot's rows after its
//!   cursor when it gets the slot, and each batch's transaction reports the
//!   slot's weight, those rows less the ones walked since, beside the fence
//!   (`report_backlog`); a slot it answers is wanted by another holder is
//!   given back after the batch (`release_lease`), so the holder with less
//!   work takes it at its next `claim_leases`.
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
//! SELECT count(*) FROM my_items(NULL::work_items, 5, 8, after => '79997');  -- its weight
//! -- per batch:
//! SELECT id FROM my_items(NULL::work_items, 5, 8, after => '79997', batch => 500);
//! -- ... the work on the batch, outside any transaction ...
//! BEGIN;
//! SELECT fence('demo', 5, 1795450180678128),                               -- PC001: lost
//!        report_backlog('demo', 5, 1795450180678128, 4500);                 -- {2}: slot 2 is wanted
//! INSERT INTO processing_log ... ; UPDATE work_items SET done = true ... ;
//! COMMIT;
//! SELECT release_lease('demo', 2, 1795450180671234);                        -- after the batch
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
use pg_claim_support::elastic::{self, Lease, Map, Phase, Written};
use pg_claim_support::{connect, describe, ms, sqlstate, thousands};
use postgres::types::Type;
use postgres::Client;
use std::collections::HashMap;
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

/// A worker, as the shared loop runs it.
struct Worker<'a> {
    role: String,
    cfg: &'a Config,
    state: &'a State,
    start: Instant,
    /// The takeovers of the paused worker's leases among the leases held,
    /// by (slot, token): reported by the work loop once it knows where the
    /// share stands.
    taken: Mutex<HashMap<(i32, i64), Taken>>,
    /// The worker is paused (both threads stop) until then.
    paused: Mutex<Option<Instant>>,
    /// Per slot: the token and the rows left after the cursor (counted when
    /// the worker got the slot, less the rows written since): its weight.
    left: Mutex<HashMap<i32, (i64, i64)>>,
    /// The slots the last batch's `report_backlog` said are wanted elsewhere.
    wanted: Mutex<Vec<i32>>,
    stop: &'a AtomicU8,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts a worker of the elastic fleet as `role`; it runs until `stop`
/// is set (`LEAVE` or `END`), then gives its slots back.
pub fn spawn(role: String, cfg: &Config, state: &State, start: Instant) -> Handle {
    let stop = Arc::new(AtomicU8::new(RUN));
    let (cfg, state, stop2, role2) = (cfg.clone(), state.clone(), stop.clone(), role.clone());
    let thread = thread::spawn(move || {
        let w = Worker {
            role: role2,
            cfg: &cfg,
            state: &state,
            start,
            taken: Mutex::new(HashMap::new()),
            paused: Mutex::new(None),
            left: Mutex::new(HashMap::new()),
            wanted: Mutex::new(Vec::new()),
            stop: &stop2,
        };
        elastic::run(&w, &Map::default());
    });
    Handle { role, stop, thread }
}

impl Worker<'_> {
    /// An error of this worker: an event and a failure of the run.
    fn fail(&self, msg: &str) {
        let mut s = lock(self.state);
        s.events
            .push(stamp(self.start, &format!("ERROR {}: {msg}", self.role)));
        s.failures.push(format!("{}: {msg}", self.role));
    }

    /// claim_leases' parameters: the name, n, the holder and the TTL.
    fn claim_args(&self) -> (i32, f64) {
        (self.cfg.slots as i32, self.cfg.ttl.as_secs_f64())
    }
}

impl elastic::Member for Worker<'_> {
    fn ttl(&self) -> Duration {
        self.cfg.ttl
    }

    fn phase(&self) -> Phase {
        match self.stop.load(Ordering::SeqCst) {
            RUN => Phase::Run,
            _ => Phase::Leave,
        }
    }

    // Through a pooler these are client connections: the server connection
    // under each changes from one transaction to the next.
    fn connect(&self, what: &str) -> Result<Client, String> {
        let name = match what {
            "leases" => format!("demo-{}-leases", self.role),
            _ => format!("demo-{}", self.role),
        };
        connect(&self.cfg.worker_dsn, &name).map_err(|e| format!("connect: {}", describe(&e)))
    }

    fn claim(&self, c: &mut Client, leave: bool) -> Result<Vec<Lease>, postgres::Error> {
        let (n, ttl) = self.claim_args();
        let args: [(&(dyn postgres::types::ToSql + Sync), Type); 4] = [
            (&NAME, Type::TEXT),
            (&n, Type::INT4),
            (&self.role.as_str(), Type::TEXT),
            (&ttl, Type::FLOAT8),
        ];
        if leave {
            let rows = c.query_typed(
                "SELECT slot FROM claim_leases($1, $2, $3, max => 0, ttl => make_interval(secs => $4))",
                &args,
            )?;
            return Ok(rows
                .iter()
                .map(|r| Lease {
                    slot: r.get(0),
                    token: 0,
                    expires: None,
                })
                .collect());
        }
        let rows = c.query_typed(
            "SELECT slot, token, extract(epoch FROM expires_at)::float8
               FROM claim_leases($1, $2, $3, ttl => make_interval(secs => $4))",
            &args,
        )?;
        Ok(rows
            .iter()
            .map(|r| Lease {
                slot: r.get(0),
                token: r.get(1),
                expires: Some(r.get(2)),
            })
            .collect())
    }

    /// Shows the holders on the slots' lines; a slot taken from the paused
    /// worker carries that takeover for the work loop to report.
    fn claimed(&self, _sent: Instant, before: &[(i32, i64)], after: &[Lease]) {
        let claimed = Instant::now();
        let mut taken = guard(&self.taken);
        let mut s = lock(self.state);
        for l in after {
            if !before.contains(&(l.slot, l.token)) {
                // newly taken: was it the paused worker's lease?
                let v = &s.slots[l.slot as usize];
                let prior = (v.token, v.expires);
                let victim = s.pause.as_ref().filter(|p| {
                    p.role != self.role
                        && p.held
                            .iter()
                            .any(|&(ps, pt)| ps == l.slot && Some(pt) == prior.0)
                });
                if let Some(p) = victim {
                    let t = Taken {
                        victim: p.role.clone(),
                        token: prior.0.unwrap_or(0),
                        expired: prior.1,
                        paused: p.at,
                        claimed,
                        // claim_leases set expires_at = its clock_timestamp() + ttl
                        acquired: l.expires.unwrap_or(0.0) - self.cfg.ttl.as_secs_f64(),
                    };
                    taken.insert((l.slot, l.token), t);
                }
                let v = &mut s.slots[l.slot as usize];
                v.holder = Some((self.role.clone(), 0));
                v.token = Some(l.token);
            }
            s.slots[l.slot as usize].expires = l.expires;
        }
        taken.retain(|k, _| after.iter().any(|l| (l.slot, l.token) == *k));
        // Slots given back (or lost): their lines show no holder until the
        // next holder takes them.
        for &(slot, token) in before {
            if !after.iter().any(|l| l.slot == slot) {
                let v = &mut s.slots[slot as usize];
                if v.token == Some(token) {
                    v.holder = None;
                }
            }
        }
    }

    /// Keeps the map until a TTL after the last success (the loop clears
    /// it then: its leases may have expired).
    fn claim_failed(&self, e: &postgres::Error) {
        self.fail(&format!("claim_leases: {}", describe(e)));
    }

    /// `claim_leases(..., max => 0)` returns no row and takes the worker out
    /// of the live set. A mid-run leave is reported.
    fn gave_back(&self, had: &[(i32, i64)], result: Result<Vec<Lease>, postgres::Error>) {
        let rows = match result {
            Ok(rows) => rows,
            Err(e) => return self.fail(&format!("claim_leases(max => 0): {}", describe(&e))),
        };
        let (n, _) = self.claim_args();
        let mut s = lock(self.state);
        for &(slot, token) in had {
            let v = &mut s.slots[slot as usize];
            if v.token == Some(token) {
                v.holder = None;
            }
        }
        if !rows.is_empty() {
            let kept: Vec<i32> = rows.iter().map(|r| r.slot).collect();
            let msg = format!("claim_leases(max => 0) returned slots {kept:?} instead of no row");
            s.events
                .push(stamp(self.start, &format!("ERROR {}: {msg}", self.role)));
            s.failures.push(format!("{}: {msg}", self.role));
        }
        if self.stop.load(Ordering::SeqCst) == LEAVE {
            let slots: Vec<i32> = had.iter().map(|h| h.0).collect();
            let line = stamp(
                self.start,
                &format!(
                    "LEAVE {} finished its batch and called claim_leases('{NAME}', {n}, '{}', max => 0): \
                     gave back slots {slots:?}, returned {} rows; the others' next calls share them out",
                    self.role,
                    self.role,
                    rows.len()
                ),
            );
            s.events.push(line.clone());
            s.left = Some(line);
        }
    }

    /// A paused worker calls nothing.
    fn paused(&self) -> bool {
        guard(&self.paused).is_some()
    }

    /// A map older than a TTL gives no slot: its leases may have expired
    /// (wait for the next `claim_leases` result).
    fn stale_after(&self) -> Option<Duration> {
        Some(self.cfg.ttl)
    }

    fn idle(&self) -> Duration {
        Duration::from_millis(10)
    }

    fn open(&self, slot: i32) -> bool {
        !lock(self.state).slots[slot as usize].finished
    }

    /// Where the share of a slot the worker holds with a new token stands:
    /// the log's max id of the slot (the log is written in key order behind
    /// the fence, so it is a prefix of the share, and no earlier holder's
    /// write can commit any more once `claim_leases` gave this token). The
    /// slot's line counts from the log; a takeover of the paused worker's
    /// lease is reported.
    fn start(&self, c: &mut Client, slot: i32, token: i64) -> Result<Option<i64>, String> {
        let r = c
            .query_typed_one(
                "SELECT max(item_id), count(*) FROM processing_log WHERE slot = $1",
                &[(&slot, Type::INT4)],
            )
            .map_err(|e| format!("reading the log: {}", describe(&e)))?;
        let (mut after, already): (Option<i64>, i64) = (r.get(0), r.get(1));
        if self.cfg.resume_from_start {
            after = None;
        }
        let (n, _) = self.claim_args();
        let left: i64 = c
            .query_typed_one(
                "SELECT count(*) FROM my_items(NULL::work_items, $1, $2, after => $3)",
                &[
                    (&slot, Type::INT4),
                    (&n, Type::INT4),
                    (&after.map(|a| a.to_string()), Type::TEXT),
                ],
            )
            .map_err(|e| format!("counting the share: {}", describe(&e)))?
            .get(0);
        guard(&self.left).insert(slot, (token, left));
        let taken = guard(&self.taken).remove(&(slot, token));
        let mut s = lock(self.state);
        let v = &mut s.slots[slot as usize];
        if v.token == Some(token) {
            v.done = already as u64;
            v.samples.clear();
        }
        let Some(t) = taken else {
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
            self.start,
            &format!(
                "TAKEOVER {} took slot {slot} (token {token}) from the paused {} (token {}) {:.2} s after it paused{after_expiry}; {resume}",
                self.role,
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

    fn fetch(
        &self,
        c: &mut Client,
        slot: i32,
        after: Option<i64>,
    ) -> Result<Option<Vec<i64>>, String> {
        let (n, _) = self.claim_args();
        let rows = c
            .query_typed(
                "SELECT id FROM my_items(NULL::work_items, $1, $2, after => $3, batch => $4)",
                &[
                    (&slot, Type::INT4),
                    (&n, Type::INT4),
                    (&after.map(|a| a.to_string()), Type::TEXT),
                    (&(self.cfg.batch as i32), Type::INT4),
                ],
            )
            .map_err(|e| format!("my_items: {}", describe(&e)))?;
        Ok(Some(rows.iter().map(|r| r.get(0)).collect()))
    }

    fn finished(&self, slot: i32) {
        lock(self.state).slots[slot as usize].finished = true;
    }

    /// The work on the batch, outside any transaction: a transaction holds
    /// a server connection of the pool for as long as it is open.
    fn work(&self, ids: &[i64]) {
        thread::sleep(Duration::from_micros(self.cfg.work_us) * ids.len() as u32);
    }

    fn write(
        &self,
        c: &mut Client,
        map: &Map,
        slot: i32,
        token: i64,
        ids: &[i64],
    ) -> Result<Written, String> {
        // Given back during the work (a worker joined, say): the slot's
        // next holder does the batch; writing it would only meet PC001.
        if !map.holds(slot, token) {
            lock(self.state).dropped_batches += 1;
            return Ok(Written::Skipped);
        }
        // The GC pause, at the worst moment: after the check, before the write.
        let paused = self.pause_if_asked(map, slot, token, ids);
        let weight = guard(&self.left)
            .get(&slot)
            .filter(|(t, _)| *t == token)
            .map(|(_, left)| (left - ids.len() as i64).max(0));
        match write(c, &self.role, slot, token, ids, weight) {
            Ok(wanted) => {
                if let Some(w) = weight {
                    guard(&self.left).insert(slot, (token, w));
                }
                *guard(&self.wanted) = wanted.unwrap_or_default();
                self.written(slot, token, ids, paused);
                Ok(Written::Done)
            }
            Err(e) if sqlstate(&e) == "PC001" => {
                self.rejected(slot, token, ids, paused, &e);
                Ok(Written::Refused)
            }
            Err(e) => Err(format!("slot {slot}: {}", describe(&e))),
        }
    }

    fn take_wanted(&self) -> Vec<i32> {
        std::mem::take(&mut *guard(&self.wanted))
    }

    /// A slot wanted by a holder with less work, given back after the batch.
    fn release(&self, c: &mut Client, slot: i32, token: i64) -> Result<(), String> {
        c.query_typed(
            "SELECT release_lease($1, $2, $3)",
            &[
                (&NAME, Type::TEXT),
                (&slot, Type::INT4),
                (&token, Type::INT8),
            ],
        )
        .map_err(|e| format!("release_lease: {}", describe(&e)))?;
        let left = guard(&self.left).remove(&slot).map(|(_, l)| l).unwrap_or(0);
        let mut s = lock(self.state);
        let v = &mut s.slots[slot as usize];
        if v.token == Some(token) {
            v.holder = None;
        }
        s.handovers += 1;
        let line = format!(
            "HANDOVER {} gave slot {slot} back after its batch ({} rows left): wanted by a holder with less work",
            self.role,
            thousands(left as u64)
        );
        s.events.push(stamp(self.start, &line));
        Ok(())
    }

    fn failed(&self, msg: String) {
        self.fail(&msg);
    }
}

impl Worker<'_> {
    /// A batch written: counted on the slot's line while this token is its
    /// latest (the next holder counts from the log); a paused worker's late
    /// write that got through is a failure.
    fn written(&self, slot: i32, token: i64, ids: &[i64], paused: Option<Duration>) {
        let mut s = lock(self.state);
        let v = &mut s.slots[slot as usize];
        if v.token == Some(token) {
            v.done += ids.len() as u64;
        }
        if let Some(pause) = paused {
            s.late_write_rejected = Some(false);
            let line = stamp(
                self.start,
                &format!(
                    "NOT REJECTED {} (slot {slot}, token {token}) wrote its {} items {:.2} s after it paused: fence let a late write through",
                    self.role,
                    ids.len(),
                    pause.as_secs_f64()
                ),
            );
            s.events.push(line);
            s.failures.push(format!(
                "{}: its late write was not rejected by fence",
                self.role
            ));
        }
    }

    /// A batch `fence` rejected (PC001): the slot is dropped until the next
    /// `claim_leases` result.
    fn rejected(
        &self,
        slot: i32,
        token: i64,
        ids: &[i64],
        paused: Option<Duration>,
        e: &postgres::Error,
    ) {
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
            self.start,
            &format!(
                "REJECTED {} (slot {slot}, token {token}){woke} tried to write {} items (ids {} .. {}) {why}: PC001, {msg}",
                self.role,
                ids.len(),
                ids[0],
                ids[ids.len() - 1]
            ),
        );
        let mut s = lock(self.state);
        if paused.is_some() {
            s.late_write_rejected = Some(true);
        }
        s.events.push(line.clone());
        s.rejected.push(line);
    }

    /// The GC pause: when the coordinator asked for it, the worker that is
    /// about to write a batch of the victim slot stops, both its threads,
    /// for longer than the TTL: its lease thread calls nothing, so its
    /// leases expire and the other workers take its slots. Returns how long
    /// it paused, if it did.
    fn pause_if_asked(&self, map: &Map, slot: i32, token: i64, ids: &[i64]) -> Option<Duration> {
        let cfg = self.cfg;
        if slot as usize != cfg.kill_slot {
            return None;
        }
        {
            let mine = map.held();
            let last_claim = map.sent().map(|t| ms(t.elapsed())).unwrap_or_default();
            let mut s = lock(self.state);
            if !std::mem::take(&mut s.pause_request) {
                return None;
            }
            *guard(&self.paused) = Some(Instant::now() + cfg.pause);
            let (done, total) = (s.slots[slot as usize].done, s.slots[slot as usize].total);
            let slots: Vec<i32> = mine.iter().map(|m| m.0).collect();
            let line = stamp(
                self.start,
                &format!(
                    "PAUSE {} (slots {slots:?}) stops for {:.2} s as in a GC pause, its lease thread too (TTL {:.2} s, \
                     last claim_leases sent {last_claim} ago), about to write {} items of slot {slot} \
                     (ids {} .. {}, token {token}) at {}/{} items of the slot ({:.0}%)",
                    self.role,
                    cfg.pause.as_secs_f64(),
                    cfg.ttl.as_secs_f64(),
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
                role: self.role.clone(),
                held: mine,
                at: Instant::now(),
            });
        }
        let at = Instant::now();
        thread::sleep(cfg.pause);
        *guard(&self.paused) = None;
        Some(at.elapsed())
    }
}

/// The batch's writes, in one transaction behind `fence`: when it passes,
/// the slot cannot change hands before `COMMIT`; when the lease was given
/// back or taken over it raises `PC001` and nothing is written. Beside the
/// fence, the slot's weight (`report_backlog`); the slots of the worker
/// another holder wants are returned.
fn write(
    c: &mut Client,
    role: &str,
    slot: i32,
    token: i64,
    ids: &[i64],
    weight: Option<i64>,
) -> Result<Option<Vec<i32>>, postgres::Error> {
    let mut tx = c.transaction()?;
    let wanted: Option<Vec<i32>> = tx
        .query_typed_one(
            "SELECT fence($1, $2, $3)::text, report_backlog($1, $2, $3, $4)",
            &[
                (&NAME, Type::TEXT),
                (&slot, Type::INT4),
                (&token, Type::INT8),
                (&weight, Type::INT8),
            ],
        )?
        .get(1);
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
    tx.commit()?;
    Ok(wanted)
}
