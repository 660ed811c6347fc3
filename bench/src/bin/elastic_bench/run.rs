//! One throughput run: a method at W workers on a fresh table, a timed
//! window after a warm-up, and what the window measured.

use crate::config::Config;
use crate::cpu::{self, Used};
use crate::fleet::{self, Fleet, Member};
use crate::queue::{self, Queue};
use crate::statements;
use crate::work::{fresh_table, pending, Counters};
use pg_claim_support::{describe, percentile};
use postgres::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The lease name of the throughput runs.
pub const NAME: &str = "bench_elastic";

/// What one (method, W) run measured in its timed window.
#[derive(Clone)]
pub struct RunResult {
    pub round: usize,
    pub method: String,
    pub w: usize,
    pub items_per_s: f64,
    pub batches_per_s: f64,
    /// p50 of fetching a batch, of its write transaction, of claim_leases (ms).
    pub fetch_p50: f64,
    pub write_p50: f64,
    pub lease_p50: Option<f64>,
    pub cpu: Used,
    pub seconds: f64,
    /// Leases: from the members' start to a balanced fleet.
    pub startup: Option<f64>,
    /// Server time per statement, where pg_stat_statements is loaded.
    pub statements: Option<String>,
    /// Over the whole run: rows handled twice, rows of batches refused by
    /// fence, failed statements.
    pub repeated: u64,
    pub refused: u64,
    pub errors: u64,
}

/// Items a run may process at most: W workers at the handler's bound for
/// the warm-up, the window and a second more, with a margin.
pub fn items_for(cfg: &Config, w: usize, seconds: f64) -> i64 {
    let per_worker = if cfg.work.is_zero() {
        20_000.0
    } else {
        1.0 / cfg.work.as_secs_f64()
    };
    ((w as f64 * per_worker * seconds * 1.3) as i64).max(cfg.n as i64 * 100)
}

/// Whether the running members hold every slot once, their counts at most
/// one apart.
pub fn balanced(members: &[Arc<Member>], n: i32) -> bool {
    let mut seen = vec![false; n as usize];
    let (mut lo, mut hi, mut total) = (usize::MAX, 0, 0);
    for m in members.iter().filter(|m| m.running()) {
        let held = m.held();
        for &s in &held {
            match seen.get_mut(s as usize) {
                Some(x) if !*x => *x = true,
                _ => return false,
            }
        }
        lo = lo.min(held.len());
        hi = hi.max(held.len());
        total += held.len();
    }
    total == n as usize && hi - lo <= 1
}

/// Polls `balanced` every millisecond until `timeout`; the time it took.
pub fn wait_balanced(
    members: &[Arc<Member>],
    n: i32,
    since: Instant,
    timeout: Duration,
) -> Option<Duration> {
    loop {
        if balanced(members, n) {
            return Some(since.elapsed());
        }
        if since.elapsed() > timeout {
            return None;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `method` with `w` workers.
pub fn run_one(
    admin: &mut Client,
    cfg: &Config,
    round: usize,
    method: &str,
    w: usize,
) -> Result<RunResult, String> {
    let db = |e: postgres::Error| describe(&e);
    let items = items_for(cfg, w, cfg.warmup + cfg.seconds + 1.0);
    fresh_table(admin, method, items, cfg.n).map_err(db)?;
    let counters = Arc::new(Counters::default());
    let pooler_pid = cfg.pooler_pidfile.as_deref().and_then(cpu::pid_from_file);
    let mut startup = None;
    let (go, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut members = Vec::new();
    let mut threads = Vec::new();
    if method == "leases" {
        let f = Fleet {
            dsn: cfg.pooler_dsn.clone(),
            name: NAME.to_string(),
            n: cfg.n,
            batch: cfg.batch,
            per_row: cfg.work,
            ttl: cfg.ttl,
            fence: cfg.fence,
        };
        let t0 = Instant::now();
        for i in 0..w {
            members.push(fleet::spawn(
                &f,
                format!("bench:{}:{i}", std::process::id()),
                cfg.ttl / 3 * i as u32 / w as u32,
                &counters,
            ));
        }
        let took = wait_balanced(&members, cfg.n, t0, Duration::from_secs(30) + cfg.ttl * 3);
        let Some(took) = took else {
            for m in &members {
                m.leave();
            }
            let shares: Vec<usize> = members.iter().map(|m| m.held().len()).collect();
            return Err(format!(
                "the fleet of {w} was not balanced within {:.0} s: shares {shares:?}{}",
                (Duration::from_secs(30) + cfg.ttl * 3).as_secs_f64(),
                first_error(&counters)
            ));
        };
        startup = Some(took.as_secs_f64());
        for m in &members {
            m.start_work();
        }
    } else {
        let q = Queue {
            dsn: cfg.pooler_dsn.clone(),
            method: method.to_string(),
            batch: cfg.batch,
            per_row: cfg.work,
        };
        for _ in 0..w {
            let (q, go, stop, c) = (q.clone(), go.clone(), stop.clone(), counters.clone());
            threads.push(thread::spawn(move || queue::worker(&q, &go, &stop, &c)));
        }
        go.store(true, Ordering::SeqCst);
    }
    thread::sleep(Duration::from_secs_f64(cfg.warmup));
    let before = cpu::sample(admin, pooler_pid.as_deref()).map_err(db)?;
    let (items0, batches0) = (
        counters.items.load(Ordering::SeqCst),
        counters.batches.load(Ordering::SeqCst),
    );
    let stats = cfg.statements && statements::reset(admin).is_ok();
    counters.measuring.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs_f64(cfg.seconds));
    let (items1, batches1) = (
        counters.items.load(Ordering::SeqCst),
        counters.batches.load(Ordering::SeqCst),
    );
    let seconds = t0.elapsed().as_secs_f64();
    counters.measuring.store(false, Ordering::SeqCst);
    let after = cpu::sample(admin, pooler_pid.as_deref()).map_err(db)?;
    let statements = if stats {
        Some(statements::summary(admin, seconds).map_err(db)?)
    } else {
        None
    };
    for m in &members {
        m.leave();
    }
    for m in &members {
        m.join();
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    let left = pending(admin).map_err(db)?;
    let written = counters.items.load(Ordering::SeqCst);
    if items - left != written as i64 {
        return Err(format!(
            "{} rows are done but the workers marked {written}",
            items - left
        ));
    }
    if left == 0 {
        eprintln!("warning: {method} at W={w} drained the table; its rate is a lower bound");
    }
    let p50 = |l: &crate::work::Latencies| percentile(&l.sorted(), 50.0);
    Ok(RunResult {
        round,
        method: method.to_string(),
        w,
        items_per_s: (items1 - items0) as f64 / seconds,
        batches_per_s: (batches1 - batches0) as f64 / seconds,
        fetch_p50: p50(&counters.fetch).unwrap_or(0.0),
        write_p50: p50(&counters.write).unwrap_or(0.0),
        lease_p50: p50(&counters.lease),
        cpu: cpu::used(&before, &after),
        seconds,
        startup,
        statements,
        repeated: counters.repeated.load(Ordering::SeqCst),
        refused: counters.refused.load(Ordering::SeqCst),
        errors: counters.errors.load(Ordering::SeqCst),
    })
    .and_then(|r| {
        if r.errors > 0 {
            Err(format!(
                "{} statement(s) failed{}",
                r.errors,
                first_error(&counters)
            ))
        } else {
            Ok(r)
        }
    })
}

/// ": the first error", or "".
pub fn first_error(c: &Counters) -> String {
    c.first_error
        .lock()
        .expect("first error")
        .as_ref()
        .map_or(String::new(), |e| format!(": {e}"))
}
