//! The SVG plot of items/s against W (drawn by `pg_claim_bench::plot`).

use crate::config::Config;
use crate::methods::{color, label};
use crate::run::RunResult;
use pg_claim_bench::plot::{Chart, Series};
use pg_claim_support::thousands;

/// A line chart of items/s against W (log2 axis), one line per method.
pub fn svg(cfg: &Config, table: &[RunResult], cores: usize) -> String {
    let series = cfg
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
    pg_claim_bench::plot::svg(&Chart {
        title: format!(
            "Items/s drained vs workers W ({} items, {} per batch, {cores} cores)",
            thousands(cfg.items as u64),
            cfg.batch
        ),
        subtitle: format!(
            "median of {} round(s); simulated work {} µs per item; client and server on the same machine",
            cfg.rounds, cfg.work_us
        ),
        workers: cfg.workers.clone(),
        y_label: "items/s".to_string(),
        series,
    })
}
