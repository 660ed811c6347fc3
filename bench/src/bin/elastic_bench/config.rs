//! The benchmark's command-line options, and the command line that
//! reproduces a run (printed with its figures).

use crate::fleet::FenceForm;
use pg_claim_support::{dsn_from_env, parse_list, Opts};
use std::time::Duration;

/// What is compared: an elastic lease fleet, and two forms of the
/// `FOR UPDATE SKIP LOCKED` queue with the same handler and pool.
pub const METHODS: [&str; 3] = ["leases", "queue", "queue_tx"];
/// `--methods` when not given.
pub const DEFAULT_METHODS: &str = "leases,queue";

/// The benchmark's parameters.
#[derive(Clone)]
pub struct Config {
    /// Direct connection: set-up, checks, `pg_stat_activity`.
    pub dsn: String,
    /// Through the pooler: every worker's connections.
    pub pooler_dsn: String,
    /// PgBouncer's pid file, for its CPU time (optional).
    pub pooler_pidfile: Option<String>,
    /// The pooler's server connections (for the report only).
    pub pool: usize,
    pub workers: Vec<usize>,
    pub n: i32,
    pub batch: usize,
    /// The handler's time per row.
    pub work: Duration,
    pub ttl: Duration,
    /// How the lease fleet's batch writes are fenced.
    pub fence: FenceForm,
    pub seconds: f64,
    pub warmup: f64,
    pub rounds: usize,
    pub methods: Vec<String>,
    /// Repetitions of the rebalancing sequence (0: none).
    pub rebalance_rounds: usize,
    /// Workers of the rebalancing fleet before a ninth joins.
    pub rebalance_workers: usize,
    pub out_dir: String,
    /// Whether pg_stat_statements is there to read (found at the start).
    pub statements: bool,
}

/// `--help`'s text.
pub fn usage() -> String {
    format!(
        "usage: elastic_bench --pooler-dsn DSN [--pooler-pidfile FILE] [--pool 8] \
         [--workers 4,8,16,32] [--n 64] [--batch 10] [--work-us 1000] [--ttl-ms 3000] [--fence implicit] \
         [--seconds 4] [--warmup 0.5] [--rounds 3] [--methods {DEFAULT_METHODS}] \
         [--rebalance-rounds 3] [--rebalance-workers 8] [--out-dir target/bench] [--dsn DSN]\n\
         methods: {}; fence forms: {}",
        METHODS.join(", "),
        FenceForm::NAMES.join(", ")
    )
}

/// The configuration from the command line; `None` when `--help` was asked for.
pub fn parse_config() -> Result<Option<Config>, String> {
    let o = Opts::parse(std::env::args().skip(1), &["help"])?;
    if o.flag("help") {
        return Ok(None);
    }
    o.check_known(&[
        "dsn",
        "pooler-dsn",
        "pooler-pidfile",
        "pool",
        "workers",
        "n",
        "batch",
        "work-us",
        "ttl-ms",
        "fence",
        "seconds",
        "warmup",
        "rounds",
        "methods",
        "rebalance-rounds",
        "rebalance-workers",
        "out-dir",
        "help",
    ])?;
    let methods: Vec<String> = o
        .get_str("methods")
        .unwrap_or(DEFAULT_METHODS)
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
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
        pooler_dsn: o
            .get_str("pooler-dsn")
            .ok_or("--pooler-dsn is required (a PgBouncer in pool_mode = transaction)")?
            .to_string(),
        pooler_pidfile: o.get_str("pooler-pidfile").map(str::to_string),
        pool: o.get("pool", 8usize)?,
        workers: parse_list(o.get_str("workers").unwrap_or("4,8,16,32"))?,
        n: o.get("n", 64i32)?,
        batch: o.get("batch", 10usize)?,
        work: Duration::from_micros(o.get("work-us", 1000u64)?),
        ttl: Duration::from_millis(o.get("ttl-ms", 3000u64)?),
        fence: FenceForm::parse(o.get_str("fence").unwrap_or("implicit"))?,
        seconds: o.get("seconds", 4.0f64)?,
        warmup: o.get("warmup", 0.5f64)?,
        rounds: o.get("rounds", 3usize)?,
        methods,
        rebalance_rounds: o.get("rebalance-rounds", 3usize)?,
        rebalance_workers: o.get("rebalance-workers", 8usize)?,
        out_dir: o.get_str("out-dir").unwrap_or("target/bench").to_string(),
        statements: false,
    };
    if c.n < 1 || c.batch < 1 || c.rounds < 1 || c.seconds <= 0.0 || c.warmup < 0.0 {
        return Err("--n, --batch, --rounds and --seconds must be positive".into());
    }
    if c.ttl < Duration::from_millis(300) {
        return Err("--ttl-ms must be at least 300".into());
    }
    if c.rebalance_rounds > 0 && (c.rebalance_workers < 1 || c.rebalance_workers >= c.n as usize) {
        return Err("--rebalance-workers must be between 1 and n - 1".into());
    }
    Ok(Some(c))
}

/// The `scripts/bench elastic` command that runs this configuration: the
/// defaults of bench/75-elastic.sh are left out.
pub fn command_line(cfg: &Config) -> String {
    let list = |v: &[usize]| {
        v.iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut env = Vec::new();
    let mut knob = |name: &str, value: String, default: &str| {
        if value != default {
            env.push(format!("BENCH_ELASTIC_{name}={value}"));
        }
    };
    knob("WORKERS", list(&cfg.workers), "4,8,16,32");
    knob("POOL", cfg.pool.to_string(), "8");
    knob("N", cfg.n.to_string(), "64");
    knob("BATCH", cfg.batch.to_string(), "10");
    knob("WORK_US", cfg.work.as_micros().to_string(), "1000");
    knob("TTL_MS", cfg.ttl.as_millis().to_string(), "3000");
    knob("FENCE", cfg.fence.name().to_string(), "implicit");
    knob("SECONDS", cfg.seconds.to_string(), "4");
    knob("ROUNDS", cfg.rounds.to_string(), "3");
    knob("METHODS", cfg.methods.join(","), DEFAULT_METHODS);
    knob("REBALANCE_ROUNDS", cfg.rebalance_rounds.to_string(), "3");
    let mut s = env.join(" ");
    if !s.is_empty() {
        s.push(' ');
    }
    s.push_str("scripts/bench elastic");
    s
}
