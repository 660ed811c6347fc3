//! What the benchmark prints and draws: a line per run, the summary table
//! (the median run per method and W), the ratio lines, the rebalancing
//! figures and the SVG plot.

use crate::config::{command_line, Config};
use crate::rebalance::{Rebalance, EVENTS};
use crate::run::RunResult;
use pg_claim_bench::plot::{Chart, Series};
use pg_claim_support::{median, rank_index, thousands};
use std::fmt::Write as _;

/// The method's name in the table and the plot's legend.
pub fn label(m: &str) -> &'static str {
    match m {
        "leases" => "pg_claim (claim_leases + my_items + fence)",
        "queue" => "SKIP LOCKED queue (visibility timeout)",
        _ => "SKIP LOCKED queue (transaction held)",
    }
}

fn color(m: &str) -> &'static str {
    match m {
        "leases" => "#1f77b4",
        "queue" => "#d62728",
        _ => "#8c564b",
    }
}

/// The handler's bound: W workers each handling `batch` rows per
/// `batch * work`, with no time at all spent on the database.
pub fn bound(cfg: &Config, w: usize) -> f64 {
    if cfg.work.is_zero() {
        f64::INFINITY
    } else {
        w as f64 / cfg.work.as_secs_f64()
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// CPU seconds per second of the window, as a share of one core.
fn cores(cpu_s: f64, r: &RunResult) -> String {
    pct(cpu_s / r.seconds)
}

/// The line printed after each run.
pub fn run_line(r: &RunResult) -> String {
    format!(
        "  round {} W={:2} {:8} {:>7} items/s  {:>6.0} batches/s  fetch p50 {:.2} ms  write p50 {:.2} ms{}  CPU: server {} pgbouncer {} client {} (of one core), machine {} busy{}  refused {} repeated {}",
        r.round + 1,
        r.w,
        r.method,
        thousands(r.items_per_s as u64),
        r.batches_per_s,
        r.fetch_p50,
        r.write_p50,
        r.lease_p50
            .map_or(String::new(), |l| format!("  claim_leases p50 {l:.2} ms")),
        cores(r.cpu.server, r),
        r.cpu.pooler.map_or("n/a".to_string(), |p| cores(p, r)),
        cores(r.cpu.client, r),
        pct(r.cpu.machine_busy),
        r.startup
            .map_or(String::new(), |s| format!("  balanced after start {s:.2} s")),
        r.refused,
        r.repeated
    )
}

/// The items/s of `method` at `w` in the summary, if it was run.
fn items_per_s(table: &[RunResult], method: &str, w: usize) -> Option<f64> {
    table
        .iter()
        .find(|r| r.method == method && r.w == w)
        .map(|r| r.items_per_s)
}

/// One row per (W, method): the median run by items/s over the rounds
/// (nearest rank).
pub fn summarize(cfg: &Config, results: &[RunResult]) -> Vec<RunResult> {
    let mut out = Vec::new();
    for &w in &cfg.workers {
        for m in &cfg.methods {
            let mut runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| &r.method == m && r.w == w)
                .collect();
            runs.sort_by(|a, b| a.items_per_s.total_cmp(&b.items_per_s));
            if let Some(i) = rank_index(runs.len(), 50.0) {
                out.push(runs[i].clone());
            }
        }
    }
    out
}

/// The summary table as markdown, with the command that reproduces it.
pub fn markdown(cfg: &Config, table: &[RunResult], ncores: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Items/s through PgBouncer (pool_mode = transaction, {} server connections) by workers W on n = {}: \
         batches of {}, a handler of {} µs per row outside any transaction, {} s windows after {} s of warm-up, \
         median of {} round(s), {ncores} cores, client, pooler and server on the same machine. \
         The lease fleet's batch write: `{}`. \
         Bound: W workers doing nothing but the handler. CPU: seconds of CPU per second of the window \
         (100% = one core) of the server backends, PgBouncer and the client; machine: the busy share of all cores.\n\n\
         Produced by `{}`.\n",
        cfg.pool,
        cfg.n,
        cfg.batch,
        cfg.work.as_micros(),
        cfg.seconds,
        cfg.warmup,
        cfg.rounds,
        cfg.fence.shown(),
        command_line(cfg)
    );
    let _ = writeln!(
        s,
        "| W | method | items/s | of the bound | fetch p50 ms | write p50 ms | CPU server | CPU PgBouncer | CPU client | machine busy |"
    );
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in table {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} |",
            r.w,
            label(&r.method),
            thousands(r.items_per_s as u64),
            pct(r.items_per_s / bound(cfg, r.w)),
            r.fetch_p50,
            r.write_p50,
            cores(r.cpu.server, r),
            r.cpu.pooler.map_or("n/a".to_string(), |p| cores(p, r)),
            cores(r.cpu.client, r),
            pct(r.cpu.machine_busy)
        );
    }
    s
}

/// The ratio lines: leases over each queue form at every W (of the
/// medians, then of each round's pair of runs), and the scaling from the
/// smallest W to 16 (or the largest).
pub fn print_ratios(cfg: &Config, table: &[RunResult], results: &[RunResult]) {
    for q in cfg.methods.iter().filter(|m| *m != "leases") {
        for &w in &cfg.workers {
            let (Some(a), Some(b)) = (items_per_s(table, "leases", w), items_per_s(table, q, w))
            else {
                continue;
            };
            let of = |k: usize, m: &str| {
                results
                    .iter()
                    .find(|r| r.round == k && r.w == w && r.method == m)
                    .map(|r| r.items_per_s)
            };
            let rounds: Vec<String> = (0..cfg.rounds)
                .filter_map(|k| Some(format!("{:.2}", of(k, "leases")? / of(k, q)?)))
                .collect();
            let target = if q == "queue" { "  (target >= 1x)" } else { "" };
            println!(
                "ratio: leases / {} items/s at W={w} = {:.2}x{target}  (each round: {})",
                label(q),
                a / b,
                rounds.join(", ")
            );
        }
    }
    let (Some(&lo), Some(&hi)) = (
        cfg.workers.iter().min(),
        cfg.workers
            .iter()
            .find(|&&w| w == 16)
            .or(cfg.workers.iter().max()),
    ) else {
        return;
    };
    if lo == hi {
        return;
    }
    for m in &cfg.methods {
        if let (Some(a), Some(b)) = (items_per_s(table, m, hi), items_per_s(table, m, lo)) {
            let target = if m == "leases" && (lo, hi) == (4, 16) {
                "  (target >= 3x)"
            } else {
                ""
            };
            println!(
                "ratio: {} items/s W={hi} / W={lo} = {:.2}x{target}",
                label(m),
                a / b
            );
        }
    }
}

/// The rebalancing lines: per kind of event, the median time to balance
/// and the median number of slots moved, with every sample.
pub fn print_rebalance(cfg: &Config, r: &Rebalance) {
    println!(
        "rebalancing: {} workers on n = {} slots, ttl {} ms (claim_leases every {} ms), batches of {} with the handler running; \
         {} round(s) of join, leave (max => 0), join, kill; balanced = every slot held once, shares at most 1 apart",
        cfg.rebalance_workers,
        cfg.n,
        cfg.ttl.as_millis(),
        (cfg.ttl / 3).as_millis(),
        cfg.batch,
        cfg.rebalance_rounds
    );
    println!(
        "  start: {} workers balanced {:.2} s after they started",
        cfg.rebalance_workers, r.startup
    );
    for kind in EVENTS {
        let ev: Vec<_> = r.events.iter().filter(|e| e.kind == kind).collect();
        if ev.is_empty() {
            continue;
        }
        let what = match kind {
            "join" => "a worker joins",
            "leave" => "one leaves (max => 0)",
            _ => "one is killed (ttl)",
        };
        let secs = median(ev.iter().map(|e| e.seconds).collect());
        let moved = median(ev.iter().map(|e| e.moved as f64).collect());
        let samples: Vec<String> = ev
            .iter()
            .map(|e| {
                format!(
                    "{:.2} s / {} moved (minimum {}, {} -> {}, {} rows refused)",
                    e.seconds, e.moved, e.minimum, e.from, e.to, e.refused
                )
            })
            .collect();
        println!(
            "  {what:24} balanced after {secs:.2} s, {moved:.0} slots moved (median; each: {})",
            samples.join("; ")
        );
    }
}

/// The plot: items/s against W for each method and the handler's bound.
pub fn svg(cfg: &Config, table: &[RunResult], ncores: usize) -> String {
    let mut series: Vec<Series> = cfg
        .methods
        .iter()
        .map(|m| Series {
            label: label(m).to_string(),
            color: color(m).to_string(),
            points: table
                .iter()
                .filter(|r| &r.method == m)
                .map(|r| (r.w, r.items_per_s))
                .collect(),
            dashed: false,
        })
        .collect();
    if !cfg.work.is_zero() {
        series.push(Series {
            label: "bound (W workers, handler only)".to_string(),
            color: "#999999".to_string(),
            points: cfg.workers.iter().map(|&w| (w, bound(cfg, w))).collect(),
            dashed: true,
        });
    }
    pg_claim_bench::plot::svg(&Chart {
        title: format!(
            "Items/s vs workers W through PgBouncer (n = {}, {} per batch, {ncores} cores)",
            cfg.n, cfg.batch
        ),
        subtitle: format!(
            "handler {} µs per row outside transactions; pool of {} server connections; median of {} round(s)",
            cfg.work.as_micros(),
            cfg.pool,
            cfg.rounds
        ),
        workers: cfg.workers.clone(),
        y_label: "items/s".to_string(),
        series,
    })
}
