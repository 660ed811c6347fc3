//! The elastic lease fleet: each member runs the loop of
//! `pg_claim_support::elastic` (a lease thread and a work thread, each with
//! a connection of its own through the pooler) with the benchmark's
//! statements, all in the simple query protocol:
//!
//! - lease thread: every ttl/3, `claim_leases(name, n, holder, ttl => ttl)`
//!   (autocommit); on leave `claim_leases(name, n, holder, max => 0)`; on
//!   kill nothing (the leases run out after their ttl).
//! - work thread: per batch `my_items(NULL::table, slot, n, after =>
//!   cursor, batch => B, pending => 'done')` (a slot taken anew starts from
//!   the beginning of its share), the handler outside any transaction, then
//!   the batch's write in one transaction behind `fence` (or
//!   `lease_valid`), sent as one message (see `FenceForm`). PC001 (or no
//!   row written behind `lease_valid`) drops the slot from the map until
//!   the next `claim_leases`.

use crate::work::{first_column, handle, mark_done_sql, rows_of, Counters, POOLED_NAME, TABLE};
use pg_claim_support::elastic::{self, Lease, Map, Phase, Written};
use pg_claim_support::{connect, describe, sqlstate};
use postgres::{Client, SimpleQueryMessage};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const RUNNING: u8 = 0;
const LEAVING: u8 = 1;
const KILLED: u8 = 2;

/// How a batch's write is fenced; each form is one message to the server
/// and one transaction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FenceForm {
    /// `SELECT fence(...); UPDATE ...`: two statements in one simple
    /// query message, which the server runs as one transaction (an error
    /// in `fence` rolls it back).
    Implicit,
    /// `BEGIN; SELECT fence(...); UPDATE ...; COMMIT` in one message.
    Block,
    /// One statement: `UPDATE ... AND (SELECT lease_valid(...))`; no row
    /// written means the lease is gone.
    LeaseValid,
}

impl FenceForm {
    pub const NAMES: [&'static str; 3] = ["implicit", "block", "lease_valid"];

    pub fn parse(s: &str) -> Result<FenceForm, String> {
        match s {
            "implicit" => Ok(FenceForm::Implicit),
            "block" => Ok(FenceForm::Block),
            "lease_valid" => Ok(FenceForm::LeaseValid),
            _ => Err(format!(
                "unknown fence form {s:?}; known: {}",
                FenceForm::NAMES.join(", ")
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FenceForm::Implicit => "implicit",
            FenceForm::Block => "block",
            FenceForm::LeaseValid => "lease_valid",
        }
    }

    /// The statement text as the report shows it.
    pub fn shown(self) -> &'static str {
        match self {
            FenceForm::Implicit => "SELECT fence(...); UPDATE ... (one message, one transaction)",
            FenceForm::Block => "BEGIN; SELECT fence(...); UPDATE ...; COMMIT (one message)",
            FenceForm::LeaseValid => "UPDATE ... AND (SELECT lease_valid(...))",
        }
    }

    /// The batch's write, and which of its statements is the UPDATE
    /// (0-based).
    fn write_sql(self, name: &str, slot: i32, token: i64, ids: &[i64]) -> (String, usize) {
        let update = mark_done_sql(ids);
        match self {
            FenceForm::Implicit => (
                format!("SELECT fence('{name}', {slot}, {token}); {update}"),
                1,
            ),
            FenceForm::Block => (
                format!("BEGIN; SELECT fence('{name}', {slot}, {token}); {update}; COMMIT"),
                2,
            ),
            FenceForm::LeaseValid => (
                format!("{update} AND (SELECT lease_valid('{name}', {slot}, {token}))"),
                0,
            ),
        }
    }
}

/// What a fleet's members share: the lease name and its parameters.
#[derive(Clone)]
pub struct Fleet {
    pub dsn: String,
    pub name: String,
    pub n: i32,
    pub batch: usize,
    pub per_row: Duration,
    pub ttl: Duration,
    pub fence: FenceForm,
}

/// One member's state, read by the benchmark while it runs.
pub struct Member {
    pub holder: String,
    /// slot -> token, as the last `claim_leases` returned it (less slots
    /// that `fence` refused since).
    map: Map,
    state: AtomicU8,
    /// Set when the work thread may start its batches.
    go: AtomicBool,
    /// Slots this member took (a slot with a new token), over its life.
    pub taken: AtomicU64,
    /// Slots that left this member's map (given back or lost).
    pub dropped: AtomicU64,
    /// Successful `claim_leases` calls.
    pub calls: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Member {
    /// The slots held now, in slot order.
    pub fn held(&self) -> Vec<i32> {
        self.map.held().into_iter().map(|h| h.0).collect()
    }

    /// Whether the member is still in the fleet (not leaving or killed).
    pub fn running(&self) -> bool {
        self.state.load(Ordering::SeqCst) == RUNNING
    }

    /// Lets its work thread start.
    pub fn start_work(&self) {
        self.go.store(true, Ordering::SeqCst);
    }

    /// Leaves gracefully: the work thread stops after its batch, then the
    /// lease thread gives every slot back (`max => 0`).
    pub fn leave(&self) {
        self.state.store(LEAVING, Ordering::SeqCst);
    }

    /// Stops at once, as a killed process does: no more calls, no
    /// give-back, an unwritten batch abandoned.
    pub fn kill(&self) {
        self.state.store(KILLED, Ordering::SeqCst);
    }

    /// Waits for both threads to end (after `leave` or `kill`).
    pub fn join(&self) {
        let handles: Vec<_> = self.threads.lock().expect("threads").drain(..).collect();
        for h in handles {
            let _ = h.join();
        }
    }
}

/// Starts a member: its lease thread calls `claim_leases` after
/// `first_call` (members started together spread their calls over the
/// period, as members started at different moments do); its work thread
/// connects and waits for `start_work`.
pub fn spawn(
    fleet: &Fleet,
    holder: String,
    first_call: Duration,
    counters: &Arc<Counters>,
) -> Arc<Member> {
    let m = Arc::new(Member {
        holder,
        map: Map::default(),
        state: AtomicU8::new(RUNNING),
        go: AtomicBool::new(false),
        taken: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        calls: AtomicU64::new(0),
        threads: Mutex::new(Vec::new()),
    });
    let run = Run {
        claim: format!(
            "SELECT slot, token FROM claim_leases('{}', {}, '{}', ttl => '{} milliseconds')",
            fleet.name,
            fleet.n,
            m.holder,
            fleet.ttl.as_millis()
        ),
        leave: format!(
            "SELECT count(*) FROM claim_leases('{}', {}, '{}', max => 0)",
            fleet.name, fleet.n, m.holder
        ),
        f: fleet.clone(),
        m: m.clone(),
        counters: counters.clone(),
        first_call,
    };
    let thread = thread::spawn(move || elastic::run(&run, &run.m.map));
    m.threads.lock().expect("threads").push(thread);
    m
}

/// A member as the shared loop runs it: the benchmark's statements and
/// counters.
struct Run {
    f: Fleet,
    m: Arc<Member>,
    counters: Arc<Counters>,
    first_call: Duration,
    claim: String,
    leave: String,
}

impl elastic::Member for Run {
    fn ttl(&self) -> Duration {
        self.f.ttl
    }

    fn phase(&self) -> Phase {
        match self.m.state.load(Ordering::SeqCst) {
            RUNNING => Phase::Run,
            LEAVING => Phase::Leave,
            _ => Phase::Kill,
        }
    }

    fn connect(&self, what: &str) -> Result<Client, String> {
        connect(&self.f.dsn, POOLED_NAME).map_err(|e| {
            let msg = format!("connect ({what}): {}", describe(&e));
            if what == "leases" {
                // counted as a failed claim_leases call, as before
                self.counters
                    .error(format!("claim_leases: {}", describe(&e)));
            } else {
                self.counters.error(format!("connect: {}", describe(&e)));
            }
            msg
        })
    }

    fn claim(&self, c: &mut Client, leave: bool) -> Result<Vec<Lease>, postgres::Error> {
        if leave {
            c.simple_query(&self.leave)?;
            return Ok(Vec::new());
        }
        let msgs = c.simple_query(&self.claim)?;
        let slots = first_column(&msgs);
        let tokens = second_column(&msgs);
        Ok(slots
            .into_iter()
            .zip(tokens)
            .map(|(slot, token)| Lease {
                slot: slot as i32,
                token,
                expires: None,
            })
            .collect())
    }

    fn claimed(&self, sent: Instant, before: &[(i32, i64)], after: &[Lease]) {
        if self.counters.measuring() {
            self.counters.lease.push(sent);
        }
        count_moves(&self.m, before, after);
        self.m.calls.fetch_add(1, Ordering::SeqCst);
    }

    fn lost(&self, before: &[(i32, i64)]) {
        count_moves(&self.m, before, &[]);
    }

    fn claim_failed(&self, e: &postgres::Error) {
        self.counters
            .error(format!("claim_leases: {}", describe(e)));
    }

    fn gave_back(&self, had: &[(i32, i64)], result: Result<Vec<Lease>, postgres::Error>) {
        match result {
            Ok(_) => count_moves(&self.m, had, &[]),
            Err(e) => self
                .counters
                .error(format!("claim_leases(max => 0): {}", describe(&e))),
        }
    }

    fn first_call(&self) -> Duration {
        self.first_call
    }

    fn ready(&self) -> bool {
        self.m.go.load(Ordering::SeqCst)
    }

    fn fetch(
        &self,
        c: &mut Client,
        slot: i32,
        after: Option<i64>,
    ) -> Result<Option<Vec<i64>>, String> {
        let fetch = format!(
            "SELECT id, payload FROM my_items(NULL::{TABLE}, {slot}, {}, after => {}, batch => {}, pending => 'done')",
            self.f.n,
            after.map_or("NULL".to_string(), |c| format!("'{c}'")),
            self.f.batch
        );
        let t = Instant::now();
        match c.simple_query(&fetch) {
            Ok(msgs) => {
                if self.counters.measuring() {
                    self.counters.fetch.push(t);
                }
                Ok(Some(first_column(&msgs)))
            }
            Err(e) => {
                self.counters.error(format!("my_items: {}", describe(&e)));
                thread::sleep(Duration::from_millis(10));
                Ok(None)
            }
        }
    }

    fn work(&self, ids: &[i64]) {
        handle(ids.len(), self.f.per_row);
    }

    fn write(
        &self,
        c: &mut Client,
        _map: &Map,
        slot: i32,
        token: i64,
        ids: &[i64],
    ) -> Result<Written, String> {
        let (write, k) = self.f.fence.write_sql(&self.f.name, slot, token, ids);
        let counters = &self.counters;
        let t = Instant::now();
        let refused = match c.simple_query(&write) {
            Ok(msgs) => {
                let marked = rows_of(&msgs, k);
                if self.f.fence == FenceForm::LeaseValid && marked == 0 {
                    // lease_valid was false: no row written
                    true
                } else {
                    counters.items.fetch_add(marked, Ordering::Relaxed);
                    counters.batches.fetch_add(1, Ordering::Relaxed);
                    counters
                        .repeated
                        .fetch_add(ids.len() as u64 - marked, Ordering::Relaxed);
                    if counters.measuring() {
                        counters.write.push(t);
                    }
                    false
                }
            }
            Err(e) => {
                if self.f.fence == FenceForm::Block {
                    let _ = c.batch_execute("ROLLBACK");
                }
                if sqlstate(&e) == "PC001" {
                    true
                } else {
                    counters.error(format!("fenced write: {}", describe(&e)));
                    false
                }
            }
        };
        if !refused {
            return Ok(Written::Done);
        }
        // The lease is gone: the slot leaves the map until the next
        // claim_leases says otherwise.
        counters
            .refused
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
        Ok(Written::Refused)
    }

    fn failed(&self, _msg: String) {
        // counted where it happened (connect)
    }
}

/// Counts the slots taken (new, or with a new token) and dropped between
/// two maps.
fn count_moves(m: &Member, before: &[(i32, i64)], after: &[Lease]) {
    let was: HashMap<i32, i64> = before.iter().copied().collect();
    let now: HashMap<i32, i64> = after.iter().map(|l| (l.slot, l.token)).collect();
    let taken = after
        .iter()
        .filter(|l| was.get(&l.slot) != Some(&l.token))
        .count();
    let dropped = before.iter().filter(|(s, t)| now.get(s) != Some(t)).count();
    m.taken.fetch_add(taken as u64, Ordering::SeqCst);
    m.dropped.fetch_add(dropped as u64, Ordering::SeqCst);
}

fn second_column(msgs: &[SimpleQueryMessage]) -> Vec<i64> {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(1).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .collect()
}
