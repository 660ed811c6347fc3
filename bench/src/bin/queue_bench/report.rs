//! What the benchmark prints and writes: a line per run, the summary table
//! (median run per method and W) as markdown, and the ratio lines.

use crate::config::{command_line, Config};
use crate::methods::label;
use crate::run::RunResult;
use pg_claim_support::{percentile, rank_index, thousands};
use std::fmt::Write as _;

/// The p50, p95 and p99 batch latencies of a run, in ms (nearest rank).
fn latency_percentiles(r: &RunResult) -> [f64; 3] {
    [50.0, 95.0, 99.0].map(|p| percentile(&r.lat, p).unwrap_or(0.0))
}

fn hot_text(hot: Option<f64>) -> String {
    hot.map_or_else(|| "n/a".to_string(), |h| format!("{:.0}%", h * 100.0))
}

/// The line printed after each run.
pub fn run_line(round: usize, r: &RunResult) -> String {
    let [p50, p95, p99] = latency_percentiles(r);
    format!(
        "  round {} W={:2} {:18} {:>9} items/s  p50 {p50:7.2} ms  p95 {p95:7.2} ms  p99 {p99:7.2} ms  {:.1} s  HOT {}  duplicates {} missing {}",
        round + 1,
        r.w,
        r.method,
        thousands(r.items_per_s as u64),
        r.seconds,
        hot_text(r.hot),
        r.duplicates,
        r.missing
    )
}

/// The summarized items/s of `method` at `w` workers, if it was run.
fn items_per_s(table: &[RunResult], method: &str, w: usize) -> Option<f64> {
    table
        .iter()
        .find(|r| r.method == method && r.w == w)
        .map(|r| r.items_per_s)
}

/// One row per (method, W): the median run by items/s over the rounds (by
/// nearest rank: with an even number of rounds, the lower middle one).
pub fn summarize(cfg: &Config, results: &[RunResult]) -> Vec<RunResult> {
    let mut out = Vec::new();
    for &w in &cfg.workers {
        for m in &cfg.methods {
            let mut runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| &r.method == m && r.w == w)
                .collect();
            let Some(median) = rank_index(runs.len(), 50.0) else {
                continue;
            };
            runs.sort_by(|a, b| a.items_per_s.total_cmp(&b.items_per_s));
            let r = runs[median];
            out.push(RunResult {
                method: r.method.clone(),
                w,
                items_per_s: r.items_per_s,
                lat: r.lat.clone(),
                duplicates: runs.iter().map(|r| r.duplicates).sum(),
                missing: runs.iter().map(|r| r.missing).sum(),
                seconds: r.seconds,
                hot: r.hot,
            });
        }
    }
    out
}

/// The summary table, with the parameters and the command that reproduces it.
pub fn markdown(cfg: &Config, table: &[RunResult], cores: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Items/s and batch latency (fetch to marked done) by number of workers W: {} items, {} per batch, \
         simulated work {} µs per item, table fillfactor {}, {} round(s) (median run shown), {cores} cores, \
         client and server on the same machine. HOT updates: the share of the run's updates of the work table \
         that wrote no index entry (`pg_stat_user_tables.n_tup_hot_upd / n_tup_upd`).\n\nProduced by `{}`.\n",
        thousands(cfg.items as u64),
        cfg.batch,
        cfg.work_us,
        cfg.fillfactor,
        cfg.rounds,
        command_line(cfg)
    );
    let _ = writeln!(
        s,
        "| W | method | items/s | p50 ms | p95 ms | p99 ms | HOT updates | duplicates | missing |"
    );
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in table {
        let [p50, p95, p99] = latency_percentiles(r);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {p50:.2} | {p95:.2} | {p99:.2} | {} | {} | {} |",
            r.w,
            label(&r.method),
            thousands(r.items_per_s as u64),
            hot_text(r.hot),
            r.duplicates,
            r.missing
        );
    }
    s
}

/// The ratio lines: pg_claim over SKIP LOCKED at every W, then each
/// comparison at W = 8 and W = 32.
pub fn print_ratios(cfg: &Config, table: &[RunResult]) {
    let by_w: Vec<String> = cfg
        .workers
        .iter()
        .filter_map(|&w| {
            let get = |m| items_per_s(table, m, w);
            Some(format!(
                "{:.2}x at W={w}",
                get("pg_claim")? / get("skip_locked")?
            ))
        })
        .collect();
    if !by_w.is_empty() {
        println!("pg_claim / SKIP LOCKED items/s by W: {}", by_w.join(", "));
    }
    // (numerator, denominators, what): a ratio to several denominators is
    // to the fastest of them.
    let ratios: [(&str, &[&str], &str); 6] = [
        ("pg_claim", &["skip_locked"], "pg_claim / SKIP LOCKED"),
        (
            "my_items",
            &["skip_locked"],
            "pg_claim with my_items / SKIP LOCKED",
        ),
        (
            "pg_claim_tx",
            &["skip_locked"],
            "pg_claim in a queue-style transaction / SKIP LOCKED",
        ),
        (
            "pg_claim",
            &["skip_locked_simple"],
            "pg_claim / SKIP LOCKED in two round trips",
        ),
        (
            "pg_claim",
            &["skip_locked", "skip_locked_simple"],
            "pg_claim / the faster SKIP LOCKED form",
        ),
        ("pg_claim", &["pgq"], "pg_claim / PgQ (queue per worker)"),
    ];
    for w in [8usize, 32] {
        let get = |m| items_per_s(table, m, w);
        for (i, (num, dens, what)) in ratios.iter().enumerate() {
            let den = dens
                .iter()
                .map(|d| get(d))
                .collect::<Option<Vec<f64>>>()
                .map(|v| v.into_iter().fold(f64::NEG_INFINITY, f64::max));
            if let (Some(a), Some(b)) = (get(num), den) {
                // The first line is the one the targets are set for.
                let target = match (i, w) {
                    (0, 8) => "  (target >= 2x)",
                    (0, 32) => "  (target >= 4x)",
                    _ => "",
                };
                println!("ratio: {what} items/s at W={w} = {:.2}x{target}", a / b);
            }
        }
    }
}
