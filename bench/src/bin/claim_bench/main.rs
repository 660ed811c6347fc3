//! Benchmark of slot claiming, run by bench/30-claim.sh against a throwaway
//! cluster (PGHOST/PGPORT/PGUSER from the environment):
//! - claim latency next to a bare pg_try_advisory_lock round trip, one session
//!   (`latency`);
//! - the cost of claiming the last free slot of n = 1024 (`last_slot`);
//! - takeover latency percentiles (standby blocked in claim_slot(name, n,
//!   wait)) (`takeover`).
//!
//! Medians and percentiles are nearest-rank (`pg_claim_support::percentile`).

mod last_slot;
mod latency;
mod takeover;

use pg_claim_support::{dsn_from_env, session};
use postgres::Client;
use std::time::Instant;

/// A session with pg_claim, named `app` in `pg_stat_activity`.
fn connect(app: &str) -> Client {
    session(&dsn_from_env(None), app)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Microseconds since `t`.
fn us_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

fn main() {
    let iters = env_usize("BENCH_ITERS", 2000);
    let rounds = env_usize("BENCH_ROUNDS", 7);
    let takeovers = env_usize("BENCH_TAKEOVERS", 40);

    let mut c = connect("bench_claim");
    latency::run(&mut c, iters, rounds);
    last_slot::run(&mut c, iters, rounds);
    takeover::run(takeovers);
}
