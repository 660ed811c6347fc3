//! The benchmark's command-line options, and the command line that
//! reproduces a run (printed under its table).

use crate::methods::{DEFAULT_METHODS, METHODS};
use pg_claim_support::{dsn_from_env, parse_list, Opts};

/// The benchmark's parameters.
#[derive(Clone)]
pub struct Config {
    pub dsn: String,
    pub items: i64,
    pub workers: Vec<usize>,
    pub batch: i64,
    pub work_us: u64,
    pub methods: Vec<String>,
    pub rounds: usize,
    pub fillfactor: u32,
    pub out_dir: String,
}

/// `--help`'s text.
pub fn usage() -> String {
    format!(
        "usage: queue_bench [--items N] [--workers 1,2,4,8,16,32] [--batch 50] [--work-us 0] \
         [--methods {DEFAULT_METHODS}] [--rounds 5] [--fillfactor 100] [--out-dir docs] [--dsn DSN]"
    )
}

/// The configuration from the command line; `None` when `--help` was asked for.
pub fn parse_config() -> Result<Option<Config>, String> {
    let o = Opts::parse(std::env::args().skip(1), &["help"])?;
    if o.flag("help") {
        return Ok(None);
    }
    o.check_known(&[
        "items",
        "workers",
        "batch",
        "work-us",
        "methods",
        "rounds",
        "fillfactor",
        "out-dir",
        "dsn",
        "help",
    ])?;
    let methods: Vec<String> = o
        .get_str("methods")
        .unwrap_or(DEFAULT_METHODS)
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    for m in &methods {
        if !METHODS.contains(&m.as_str()) {
            return Err(format!(
                "unknown method {m:?}; known: {}",
                METHODS.join(", ")
            ));
        }
    }
    let c = Config {
        dsn: dsn_from_env(o.get_str("dsn")),
        items: o.get("items", 200_000i64)?,
        workers: parse_list(o.get_str("workers").unwrap_or("1,2,4,8,16,32"))?,
        batch: o.get("batch", 50i64)?,
        work_us: o.get("work-us", 0u64)?,
        methods,
        rounds: o.get("rounds", 5usize)?,
        fillfactor: o.get("fillfactor", 100u32)?,
        out_dir: o.get_str("out-dir").unwrap_or("target/bench").to_string(),
    };
    if !(10..=100).contains(&c.fillfactor) {
        return Err("--fillfactor must be between 10 and 100".into());
    }
    if c.items < 1 || c.batch < 1 || c.rounds < 1 {
        return Err("--items, --batch and --rounds must be at least 1".into());
    }
    Ok(Some(c))
}

/// The `scripts/bench queue` command that runs this configuration.
pub fn command_line(cfg: &Config) -> String {
    let mut s = format!(
        "BENCH_QUEUE_ITEMS={} BENCH_QUEUE_WORKERS={} scripts/bench queue",
        cfg.items,
        cfg.workers
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    if cfg.work_us > 0 {
        s = format!("BENCH_QUEUE_WORK_US={} {s}", cfg.work_us);
    }
    if cfg.fillfactor != 100 {
        s = format!("BENCH_QUEUE_FILLFACTOR={} {s}", cfg.fillfactor);
    }
    if cfg.rounds != 5 {
        s = format!("BENCH_QUEUE_ROUNDS={} {s}", cfg.rounds);
    }
    if cfg.batch != 50 {
        s = format!("BENCH_QUEUE_BATCH={} {s}", cfg.batch);
    }
    if cfg.methods.join(",") != DEFAULT_METHODS {
        s = format!("BENCH_QUEUE_METHODS={} {s}", cfg.methods.join(","));
    }
    s
}
