//! Elastic lease fleets against a queue, through PgBouncer in transaction
//! mode, with an I/O-bound handler (a wait per row, outside any
//! transaction): W workers share n slots with `claim_leases` (see `fleet`),
//! against the `FOR UPDATE SKIP LOCKED` queue with the same handler,
//! batches and pool (see `queue`). Items/s per W side by side in one run
//! (medians of rounds), where the CPU went (server, PgBouncer, client),
//! ratio lines, then the rebalancing of a working fleet when a worker
//! joins, leaves or is killed (see `rebalance`), and an SVG plot. Run
//! through `scripts/bench elastic` (bench/75-elastic.sh), which starts the
//! pooler.
//!
//! The modules, one job each: `config` (the options), `work` (the table,
//! the handler, the statements' plumbing, the counters), `fleet` (a lease
//! worker), `queue` (a queue worker), `cpu` (CPU time from /proc),
//! `statements` (server time per statement, from pg_stat_statements), `run`
//! (one method at one W), `rebalance` (join, leave, kill) and `report`
//! (the lines, the table, the ratios, the plot).

mod config;
mod cpu;
mod fleet;
mod queue;
mod rebalance;
mod report;
mod run;
mod statements;
mod work;

use pg_claim_support::{connect, describe, ensure_extension};
use std::thread;

fn main() {
    let cfg = match config::parse_config() {
        Ok(Some(cfg)) => cfg,
        Ok(None) => {
            println!("{}", config::usage());
            return;
        }
        Err(e) => {
            eprintln!("elastic_bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&cfg) {
        eprintln!("elastic_bench: {e}");
        std::process::exit(1);
    }
}

fn run(cfg: &config::Config) -> Result<(), String> {
    let mut admin = connect(&cfg.dsn, "elastic-admin").map_err(|e| describe(&e))?;
    ensure_extension(&mut admin, "pg_claim")
        .map_err(|e| format!("CREATE EXTENSION pg_claim: {}", describe(&e)))?;
    let cfg = &config::Config {
        statements: statements::available(&mut admin),
        ..cfg.clone()
    };
    let ncores = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "elastic leases through PgBouncer (transaction mode, {} server connections): n = {}, batches of {}, handler {} us per row, \
         ttl {} ms, fenced write: {}, W = {:?}, {} s windows, {} round(s), {ncores} cores",
        cfg.pool,
        cfg.n,
        cfg.batch,
        cfg.work.as_micros(),
        cfg.ttl.as_millis(),
        cfg.fence.shown(),
        cfg.workers,
        cfg.seconds,
        cfg.rounds
    );
    let mut results = Vec::new();
    for round in 0..cfg.rounds {
        for &w in &cfg.workers {
            // rotate the methods' order from round to round
            let k = cfg.methods.len();
            for j in 0..k {
                let m = &cfg.methods[(j + round) % k];
                let r = run::run_one(&mut admin, cfg, round, m, w)
                    .map_err(|e| format!("{m} at W={w}: {e}"))?;
                println!("{}", report::run_line(&r));
                if let Some(s) = &r.statements {
                    println!("      {s}");
                }
                results.push(r);
            }
        }
    }
    let table = report::summarize(cfg, &results);
    println!();
    print!("{}", report::markdown(cfg, &table, ncores));
    println!();
    report::print_ratios(cfg, &table, &results);
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| format!("{}: {e}", cfg.out_dir))?;
    let svg_path = format!("{}/elastic-throughput.svg", cfg.out_dir);
    std::fs::write(&svg_path, report::svg(cfg, &table, ncores))
        .map_err(|e| format!("{svg_path}: {e}"))?;
    println!("plot written to {svg_path}");
    if cfg.rebalance_rounds > 0 {
        println!();
        let r = rebalance::run(&mut admin, cfg).map_err(|e| format!("rebalancing: {e}"))?;
        report::print_rebalance(cfg, &r);
    }
    Ok(())
}
