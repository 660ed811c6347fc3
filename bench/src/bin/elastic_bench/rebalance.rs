//! Rebalancing: a fleet of K workers (8 by default) on n slots, working
//! (the same handler and batches as the throughput runs), then in turn a
//! worker joins, the oldest leaves gracefully (`max => 0`), another joins,
//! and the oldest is killed (no give-back: its leases run out after their
//! ttl). Each event comes at another point of the period of the members'
//! `claim_leases` calls. For each event: the time from the event (the joiner's start, the
//! leave, the kill) until the running workers hold every slot once with
//! shares at most one apart, and the slots that changed holder (taken with
//! a new token) in that time. At the end, every row marked done must have
//! been written by exactly one batch.

use crate::config::Config;
use crate::fleet::{self, Fleet, Member};
use crate::run::{first_error, items_for, wait_balanced};
use crate::work::{fresh_table, pending, Counters};
use pg_claim_support::describe;
use postgres::Client;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The lease name of the rebalancing runs.
const NAME: &str = "bench_elastic_rebalance";

/// The kinds of event, in the order they happen in each round.
pub const EVENTS: [&str; 3] = ["join", "leave", "kill"];

/// One event's measurement.
pub struct Event {
    pub kind: &'static str,
    /// Workers before and after.
    pub from: usize,
    pub to: usize,
    pub seconds: f64,
    pub moved: u64,
    /// The fewest slots that must move: the joiner's share, or the
    /// leaver's slots.
    pub minimum: usize,
    /// Rows of batches `fence` refused meanwhile (PC001).
    pub refused: u64,
}

/// What the whole sequence measured.
pub struct Rebalance {
    /// From the first K workers' start to their balanced fleet.
    pub startup: f64,
    pub events: Vec<Event>,
}

fn taken(members: &[Arc<Member>]) -> u64 {
    members.iter().map(|m| m.taken.load(Ordering::SeqCst)).sum()
}

/// Runs the sequence `cfg.rebalance_rounds` times on one fleet.
pub fn run(admin: &mut Client, cfg: &Config) -> Result<Rebalance, String> {
    let k = cfg.rebalance_workers;
    // joins take about a call period each, a kill a ttl more
    let per_round = 4.0 * (cfg.ttl.as_secs_f64() / 3.0) * 3.0 + cfg.ttl.as_secs_f64();
    let items = items_for(cfg, k + 1, 5.0 + cfg.rebalance_rounds as f64 * per_round);
    fresh_table(admin, "leases", items, cfg.n).map_err(|e| describe(&e))?;
    let counters = Arc::new(Counters::default());
    let f = Fleet {
        dsn: cfg.pooler_dsn.clone(),
        name: NAME.to_string(),
        n: cfg.n,
        batch: cfg.batch,
        per_row: cfg.work,
        ttl: cfg.ttl,
        fence: cfg.fence,
    };
    let timeout = Duration::from_secs(30) + cfg.ttl * 3;
    let pid = std::process::id();
    let mut next_id = 0usize;
    // the first K spread their calls over the period; a joiner calls at once
    let mut spawn = |members: &mut Vec<Arc<Member>>, first_call: Duration| {
        let m = fleet::spawn(
            &f,
            format!("rebalance:{pid}:{next_id}"),
            first_call,
            &counters,
        );
        next_id += 1;
        m.start_work();
        members.push(m);
    };
    let mut members: Vec<Arc<Member>> = Vec::new();
    let t0 = Instant::now();
    for i in 0..k {
        spawn(&mut members, cfg.ttl / 3 * i as u32 / k as u32);
    }
    let not_balanced = |members: &[Arc<Member>], what: &str| {
        let shares: Vec<usize> = members
            .iter()
            .filter(|m| m.running())
            .map(|m| m.held().len())
            .collect();
        for m in members {
            m.leave();
        }
        format!(
            "not balanced within {:.0} s after {what}: shares {shares:?}{}",
            timeout.as_secs_f64(),
            first_error(&counters)
        )
    };
    let startup = wait_balanced(&members, cfg.n, t0, timeout)
        .ok_or_else(|| not_balanced(&members, "the start"))?
        .as_secs_f64();
    let mut events = Vec::new();
    let period = cfg.ttl / 3;
    for round in 0..cfg.rebalance_rounds {
        for (j, kind) in ["join", "leave", "join", "kill"].into_iter().enumerate() {
            // Each event at another point of the members' call period:
            // after 0.618.. (the golden ratio's fraction) times the event's
            // number of periods, modulo one.
            let k = (round * 4 + j + 1) as f64;
            thread::sleep(period.mul_f64((k * 0.618_033_988_75).fract()));
            let from = members.iter().filter(|m| m.running()).count();
            let (moved0, refused0) = (taken(&members), counters.refused.load(Ordering::SeqCst));
            let t = Instant::now();
            let minimum = match kind {
                "join" => {
                    spawn(&mut members, Duration::ZERO);
                    cfg.n as usize / (from + 1)
                }
                _ => {
                    let oldest = members
                        .iter()
                        .find(|m| m.running())
                        .expect("a running member")
                        .clone();
                    let held = oldest.held().len();
                    if kind == "leave" {
                        oldest.leave();
                    } else {
                        oldest.kill();
                    }
                    held
                }
            };
            let took = wait_balanced(&members, cfg.n, t, timeout)
                .ok_or_else(|| not_balanced(&members, kind))?;
            events.push(Event {
                kind: EVENTS.iter().find(|e| **e == kind).expect("event kind"),
                from,
                to: members.iter().filter(|m| m.running()).count(),
                seconds: took.as_secs_f64(),
                moved: taken(&members) - moved0,
                minimum,
                refused: counters.refused.load(Ordering::SeqCst) - refused0,
            });
            // the ones that left are done with: wait for their threads
            for m in members.iter().filter(|m| !m.running()) {
                m.join();
            }
            members.retain(|m| m.running());
        }
    }
    for m in &members {
        m.leave();
    }
    for m in &members {
        m.join();
    }
    let errors = counters.errors.load(Ordering::SeqCst);
    if errors > 0 {
        return Err(format!(
            "{errors} statement(s) failed{}",
            first_error(&counters)
        ));
    }
    // Every row marked done was written by one batch, and no batch found a
    // row of its own already done (handled and written by another holder).
    let done = items - pending(admin).map_err(|e| describe(&e))?;
    let (written, repeated) = (
        counters.items.load(Ordering::SeqCst),
        counters.repeated.load(Ordering::SeqCst),
    );
    if done != written as i64 || repeated > 0 {
        return Err(format!(
            "{done} rows are done, the workers marked {written}, and {repeated} rows of their batches were done already"
        ));
    }
    Ok(Rebalance { startup, events })
}
