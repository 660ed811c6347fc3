//! The elastic lease fleet: each member is a lease thread and a work
//! thread, each with a connection of its own through the pooler.
//!
//! - lease thread: every ttl/3, `claim_leases(name, n, holder, ttl => ttl)`
//!   (autocommit); the result, every slot the member holds with its token,
//!   replaces the member's map. On an error the map is kept until a ttl
//!   has passed since the last success, then cleared. On leave:
//!   `claim_leases(name, n, holder, max => 0)`; on kill: nothing (the
//!   leases run out after their ttl).
//! - work thread: the slots of the map in turn; per batch
//!   `my_items(NULL::table, slot, n, after => cursor, batch => B,
//!   pending => 'done')`, the handler outside any transaction, then the
//!   batch's write in one transaction behind `fence` (or `lease_valid`),
//!   sent as one message (see `FenceForm`). PC001 (or no row written
//!   behind `lease_valid`) drops the slot from the map until the next
//!   `claim_leases`.

use crate::work::{first_column, handle, mark_done_sql, rows_of, Counters, POOLED_NAME, TABLE};
use pg_claim_support::{connect, describe, sqlstate};
use postgres::Client;
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
    held: Mutex<Vec<(i32, i64)>>,
    state: AtomicU8,
    /// Set when the work thread may start its batches.
    go: AtomicBool,
    /// Set when the work thread has ended (a leaving member gives its
    /// slots back after its last batch is written).
    work_ended: AtomicBool,
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
        self.held
            .lock()
            .expect("held")
            .iter()
            .map(|h| h.0)
            .collect()
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
        held: Mutex::new(Vec::new()),
        state: AtomicU8::new(RUNNING),
        go: AtomicBool::new(false),
        work_ended: AtomicBool::new(false),
        taken: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        calls: AtomicU64::new(0),
        threads: Mutex::new(Vec::new()),
    });
    let lease = {
        let (f, m, c) = (fleet.clone(), m.clone(), counters.clone());
        thread::spawn(move || lease_loop(&f, &m, first_call, &c))
    };
    let work = {
        let (f, m, c) = (fleet.clone(), m.clone(), counters.clone());
        thread::spawn(move || {
            work_loop(&f, &m, &c);
            m.work_ended.store(true, Ordering::SeqCst);
        })
    };
    m.threads.lock().expect("threads").extend([lease, work]);
    m
}

/// Sleeps until `until`, waking early when the member leaves or is killed;
/// whether it is still running.
fn sleep_running(m: &Member, until: Instant) -> bool {
    loop {
        if !m.running() {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        thread::sleep((until - now).min(Duration::from_millis(5)));
    }
}

/// The lease thread (see the module's comment).
fn lease_loop(f: &Fleet, m: &Member, first_call: Duration, counters: &Counters) {
    let claim = format!(
        "SELECT slot, token FROM claim_leases('{}', {}, '{}', ttl => '{} milliseconds')",
        f.name,
        f.n,
        m.holder,
        f.ttl.as_millis()
    );
    let period = f.ttl / 3;
    let mut conn: Option<Client> = None;
    sleep_running(m, Instant::now() + first_call);
    let mut last_ok = Instant::now();
    let mut next = Instant::now();
    loop {
        match m.state.load(Ordering::SeqCst) {
            KILLED => return,
            LEAVING => {
                let deadline = Instant::now() + f.ttl;
                while !m.work_ended.load(Ordering::SeqCst) && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                leave(f, m, conn.take(), counters);
                return;
            }
            _ => {}
        }
        let asked = Instant::now();
        let result = match conn.as_mut() {
            Some(c) => c.simple_query(&claim),
            None => match connect(&f.dsn, POOLED_NAME) {
                Ok(c) => conn.insert(c).simple_query(&claim),
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(msgs) => {
                if counters.measuring() {
                    counters.lease.push(asked);
                }
                let slots = first_column_i32(&msgs);
                let tokens = second_column(&msgs);
                let now: Vec<(i32, i64)> = slots.into_iter().zip(tokens).collect();
                replace_map(m, now);
                m.calls.fetch_add(1, Ordering::SeqCst);
                last_ok = asked;
            }
            Err(e) => {
                counters.error(format!("claim_leases: {}", describe(&e)));
                conn = None;
                if asked.duration_since(last_ok) >= f.ttl {
                    replace_map(m, Vec::new());
                }
            }
        }
        next = (next + period).max(Instant::now());
        if !sleep_running(m, next) {
            continue; // leaving or killed: handled at the top
        }
    }
}

/// Installs the result of a `claim_leases` call as the member's map,
/// counting the slots taken (new, or with a new token) and dropped.
fn replace_map(m: &Member, now: Vec<(i32, i64)>) {
    let mut held = m.held.lock().expect("held");
    let before: HashMap<i32, i64> = held.iter().copied().collect();
    let after: HashMap<i32, i64> = now.iter().copied().collect();
    let taken = now.iter().filter(|(s, t)| before.get(s) != Some(t)).count();
    let dropped = held.iter().filter(|(s, t)| after.get(s) != Some(t)).count();
    m.taken.fetch_add(taken as u64, Ordering::SeqCst);
    m.dropped.fetch_add(dropped as u64, Ordering::SeqCst);
    *held = now;
}

/// Gives every slot back and leaves the live set: `max => 0`.
fn leave(f: &Fleet, m: &Member, conn: Option<Client>, counters: &Counters) {
    let sql = format!(
        "SELECT count(*) FROM claim_leases('{}', {}, '{}', max => 0)",
        f.name, f.n, m.holder
    );
    let conn = match conn {
        Some(c) => Ok(c),
        None => connect(&f.dsn, POOLED_NAME),
    };
    match conn.and_then(|mut c| c.simple_query(&sql)) {
        Ok(_) => replace_map(m, Vec::new()),
        Err(e) => counters.error(format!("claim_leases(max => 0): {}", describe(&e))),
    }
}

fn first_column_i32(msgs: &[postgres::SimpleQueryMessage]) -> Vec<i32> {
    first_column(msgs).into_iter().map(|v| v as i32).collect()
}

fn second_column(msgs: &[postgres::SimpleQueryMessage]) -> Vec<i64> {
    msgs.iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(1).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .collect()
}

/// The work thread (see the module's comment).
fn work_loop(f: &Fleet, m: &Member, counters: &Counters) {
    let mut conn = match connect(&f.dsn, POOLED_NAME) {
        Ok(c) => c,
        Err(e) => {
            counters.error(format!("connect: {}", describe(&e)));
            return;
        }
    };
    while !m.go.load(Ordering::SeqCst) {
        if !m.running() {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
    // slot -> (token, cursor): a slot taken anew starts from its beginning.
    let mut cursors: HashMap<i32, (i64, Option<i64>)> = HashMap::new();
    let mut last_slot = -1;
    let mut empty_in_a_row = 0usize;
    while m.running() {
        let held = m.held.lock().expect("held").clone();
        let Some(&(slot, token)) = held
            .iter()
            .find(|h| h.0 > last_slot)
            .or_else(|| held.first())
        else {
            thread::sleep(Duration::from_millis(5));
            continue;
        };
        last_slot = slot;
        let cursor = cursors.entry(slot).or_insert((token, None));
        if cursor.0 != token {
            *cursor = (token, None);
        }
        let fetch = format!(
            "SELECT id, payload FROM my_items(NULL::{TABLE}, {slot}, {}, after => {}, batch => {}, pending => 'done')",
            f.n,
            cursor.1.map_or("NULL".to_string(), |c| format!("'{c}'")),
            f.batch
        );
        let t = Instant::now();
        let ids = match conn.simple_query(&fetch) {
            Ok(msgs) => first_column(&msgs),
            Err(e) => {
                counters.error(format!("my_items: {}", describe(&e)));
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if counters.measuring() {
            counters.fetch.push(t);
        }
        if ids.is_empty() {
            // The share is walked to its end: from its beginning next time;
            // when every held slot came back empty, the table is drained.
            cursor.1 = None;
            empty_in_a_row += 1;
            if empty_in_a_row >= held.len() {
                thread::sleep(Duration::from_millis(5));
            }
            continue;
        }
        empty_in_a_row = 0;
        cursor.1 = ids.last().copied();
        handle(ids.len(), f.per_row);
        if m.state.load(Ordering::SeqCst) == KILLED {
            return; // the batch is abandoned, as by a killed process
        }
        let (write, k) = f.fence.write_sql(&f.name, slot, token, &ids);
        let t = Instant::now();
        let refused = match conn.simple_query(&write) {
            Ok(msgs) => {
                let marked = rows_of(&msgs, k);
                if f.fence == FenceForm::LeaseValid && marked == 0 {
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
                if f.fence == FenceForm::Block {
                    let _ = conn.batch_execute("ROLLBACK");
                }
                if sqlstate(&e) == "PC001" {
                    true
                } else {
                    counters.error(format!("fenced write: {}", describe(&e)));
                    false
                }
            }
        };
        if refused {
            // The lease is gone: drop the slot until the next claim_leases
            // says otherwise.
            counters
                .refused
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            m.held
                .lock()
                .expect("held")
                .retain(|h| !(h.0 == slot && h.1 == token));
        }
    }
}
