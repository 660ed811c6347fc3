//! One (method, W) run: a fresh table, W workers started together, their
//! batch latencies, and the checks of what they did.

use crate::check::{hot_share, lost_and_repeated};
use crate::config::Config;
use crate::setup::prepare;
use crate::worker::worker;
use pg_claim_support::describe;
use postgres::Client;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

/// What one (method, W) run measured.
pub struct RunResult {
    pub method: String,
    pub w: usize,
    pub items_per_s: f64,
    /// Batch (transaction) latencies in ms, sorted.
    pub lat: Vec<f64>,
    pub duplicates: i64,
    pub missing: i64,
    pub seconds: f64,
    /// The share of the run's updates of the work table that were HOT
    /// (heap-only: no index entry written), from `pg_stat_user_tables`;
    /// None when the statistics did not arrive in time.
    pub hot: Option<f64>,
}

pub fn run_one(
    admin: &mut Client,
    cfg: &Config,
    method: &str,
    w: usize,
) -> Result<RunResult, String> {
    prepare(admin, cfg, method, w).map_err(|e| format!("preparing: {}", describe(&e)))?;
    let barrier = Arc::new(Barrier::new(w + 1));
    let mut handles = Vec::new();
    for i in 0..w {
        let (cfg, barrier, method) = (cfg.clone(), barrier.clone(), method.to_string());
        handles.push(thread::spawn(move || worker(&cfg, &method, w, i, &barrier)));
    }
    barrier.wait(); // every worker connected and holds its slot
    let start = Instant::now();
    let mut lat = Vec::new();
    let mut refetched = 0i64;
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(d)) => {
                lat.extend(d.lat);
                refetched += d.refetched;
            }
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("worker thread panicked".to_string()),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    let (repeated, missing) =
        lost_and_repeated(admin).map_err(|e| format!("checking: {}", describe(&e)))?;
    lat.sort_by(|a, b| a.total_cmp(b));
    let hot =
        hot_share(admin, cfg.items).map_err(|e| format!("reading statistics: {}", describe(&e)))?;
    Ok(RunResult {
        method: method.to_string(),
        w,
        items_per_s: cfg.items as f64 / seconds,
        lat,
        duplicates: repeated + refetched,
        missing,
        seconds,
        hot,
    })
}
