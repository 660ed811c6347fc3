//! The headline benchmark: one table of work items drained by W workers, each
//! fetching a batch of items, then marking it done and logging it in one
//! statement, with
//!
//! - `pg_claim`:    each worker `claim_slot('bench', W)`, then its share in key
//!   order through the expression index `((slot_of(id, W)), id)`;
//! - `my_items`:    the same, with `my_items(NULL::bench_items, slot, W, after, batch)`;
//! - `pg_claim_tx`: the `pg_claim` fetch inside the queues' transaction
//!   (`BEGIN; fetch; mark; COMMIT`), to show what the loop shape is worth;
//! - `skip_locked`: the standard queue, `WHERE NOT done ORDER BY id LIMIT b
//!   FOR UPDATE SKIP LOCKED` with a partial index on pending ids;
//! - `skip_locked_simple`: the same queue in two round trips per batch, the
//!   loop length of `pg_claim`;
//! - `pgq`:         PgQ, one queue per worker with one consumer each (events
//!   routed to queue `id mod W` by the producer; at W = 1 this is
//!   PgQ's standard single consumer), batches of b events.
//!
//! Items/s and batch latency percentiles per W, a duplicate check per run, a
//! markdown table and an SVG plot. Run through `scripts/bench queue`.
//!
//! The modules, one job each: `config` (the options), `methods` (what is
//! compared), `setup` (a fresh table and queues per run), `worker` (a
//! worker's loop), `run` (one method at one W), `check` (duplicates, missing
//! items, HOT share), `report` (the lines, the table and the ratios) and
//! `plot` (the SVG).

mod check;
mod config;
mod methods;
mod plot;
mod report;
mod run;
mod setup;
mod worker;

use pg_claim_support::{connect, describe, ensure_extension, thousands};
use std::thread;

fn main() {
    let cfg = match config::parse_config() {
        Ok(Some(cfg)) => cfg,
        Ok(None) => {
            println!("{}", config::usage());
            return;
        }
        Err(e) => {
            eprintln!("queue_bench: {e}");
            std::process::exit(2);
        }
    };
    match run(cfg) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("queue_bench: {e}");
            std::process::exit(2);
        }
    }
}

/// Every round of every W and method, then the summary; `Ok(false)` when
/// some run lost or repeated an item.
fn run(mut cfg: config::Config) -> Result<bool, String> {
    let mut admin = connect(&cfg.dsn, "bench-admin").map_err(|e| describe(&e))?;
    ensure_extension(&mut admin, "pg_claim")
        .map_err(|e| format!("CREATE EXTENSION pg_claim: {}", describe(&e)))?;
    if cfg.methods.iter().any(|m| m == "pgq") {
        if let Err(e) = ensure_extension(&mut admin, "pgq") {
            println!(
                "PgQ is not available ({}); install postgresql-15-pgq3. Skipping it.",
                describe(&e)
            );
            cfg.methods.retain(|m| m != "pgq");
        }
    }
    let cores = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "queue benchmark: {} items, batches of {}, simulated work {} us per item, W = {:?}, {} round(s), {} cores",
        thousands(cfg.items as u64),
        cfg.batch,
        cfg.work_us,
        cfg.workers,
        cfg.rounds,
        cores
    );
    let mut results = Vec::new();
    for round in 0..cfg.rounds {
        for &w in &cfg.workers {
            // Rotate the order of the methods from round to round, so none
            // always runs first (or right after another's checkpoint).
            let k = cfg.methods.len();
            for j in 0..k {
                let m = &cfg.methods[(j + round) % k];
                let r = run::run_one(&mut admin, &cfg, m, w)
                    .map_err(|e| format!("{m} at W={w}: {e}"))?;
                println!("{}", report::run_line(round, &r));
                results.push(r);
            }
        }
    }
    let table = report::summarize(&cfg, &results);
    let valid = results.iter().all(|r| r.duplicates == 0 && r.missing == 0);
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| format!("{}: {e}", cfg.out_dir))?;
    let md_path = format!("{}/queue-results.md", cfg.out_dir);
    let svg_path = format!("{}/queue-throughput.svg", cfg.out_dir);
    let md = report::markdown(&cfg, &table, cores);
    std::fs::write(&md_path, &md).map_err(|e| format!("{md_path}: {e}"))?;
    std::fs::write(&svg_path, plot::svg(&cfg, &table, cores))
        .map_err(|e| format!("{svg_path}: {e}"))?;
    println!();
    print!("{md}");
    println!();
    println!("table written to {md_path}, plot to {svg_path}");
    report::print_ratios(&cfg, &table);
    if !valid {
        println!("FAIL: some run processed an item twice or missed one (see the table)");
    }
    Ok(valid)
}
