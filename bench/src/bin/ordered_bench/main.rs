//! Ordered per key: a table of items in groups, processed FIFO per group
//! (each group's items in id order, one at a time) and in parallel across
//! groups, by W workers with pg_claim and with a `FOR UPDATE SKIP LOCKED`
//! queue of group heads (see `worker`), side by side for each W and number
//! of groups G:
//!
//! 1. drain: `--items` items, group `i mod G`, loaded before the workers
//!    start; items/s until every item is processed (or `--seconds`);
//! 2. delay: an empty table and one producer inserting `--rate` items/s
//!    into random groups for `--seconds`, committed every 10 ms; the delay
//!    from insert (`created_at`) to processing, p50 and p99.
//!
//! After each phase the processing log is checked: every item once, and
//! each group's items in strictly increasing id order of the log's
//! sequence. Run through `scripts/bench ordered` (bench/80-ordered.sh).

mod worker;

use pg_claim_support::{connect, describe, ensure_extension, parse_list, percentile, Opts};
use postgres::Client;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};
use worker::{index_sql, label, Shared, METHODS};

#[derive(Clone)]
struct Config {
    dsn: String,
    items: i64,
    workers: Vec<usize>,
    groups: Vec<usize>,
    batch: i64,
    rate: i64,
    seconds: f64,
}

fn parse_config() -> Result<Config, String> {
    let o = Opts::parse(std::env::args().skip(1), &[])?;
    o.check_known(&[
        "dsn", "items", "workers", "groups", "batch", "rate", "seconds",
    ])?;
    Ok(Config {
        dsn: pg_claim_support::dsn_from_env(o.get_str("dsn")),
        items: o.get("items", 200_000)?,
        workers: parse_list(o.get_str("workers").unwrap_or("8,32"))?,
        groups: parse_list(o.get_str("groups").unwrap_or("100,10000"))?,
        batch: o.get("batch", 50)?,
        rate: o.get("rate", 2000)?,
        seconds: o.get("seconds", 5.0)?,
    })
}

/// A fresh work table and log for one run, with the method's index.
fn fresh(admin: &mut Client, method: &str, w: usize) -> Result<(), postgres::Error> {
    admin.batch_execute(&format!(
        "SET client_min_messages = warning;
         DROP TABLE IF EXISTS ord_items, ord_log;
         CREATE TABLE ord_items (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, grp bigint NOT NULL,
                                 created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                                 done boolean NOT NULL DEFAULT false);
         CREATE TABLE ord_log (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item bigint NOT NULL,
                               grp bigint NOT NULL, created_at timestamptz NOT NULL,
                               processed_at timestamptz NOT NULL);
         {};
         RESET client_min_messages;",
        index_sql(method, w)
    ))
}

/// What the processing log says about a phase.
#[derive(Clone, Copy, Default)]
struct Verdict {
    /// items logged more than once
    duplicates: i64,
    /// items never logged
    missing: i64,
    /// items logged before an earlier item of their group
    order: i64,
}

impl std::ops::Add for Verdict {
    type Output = Verdict;
    fn add(self, o: Verdict) -> Verdict {
        Verdict {
            duplicates: self.duplicates + o.duplicates,
            missing: self.missing + o.missing,
            order: self.order + o.order,
        }
    }
}

fn verdict(admin: &mut Client) -> Result<Verdict, postgres::Error> {
    let r = admin.query_one(
        "SELECT (SELECT count(*) - count(DISTINCT item) FROM ord_log),
                (SELECT count(*) FROM ord_items i WHERE NOT EXISTS (SELECT FROM ord_log l WHERE l.item = i.id)),
                (SELECT count(*) FROM (SELECT item, lag(item) OVER (PARTITION BY grp ORDER BY seq) AS prev
                                       FROM ord_log) x WHERE prev >= item)",
        &[],
    )?;
    Ok(Verdict {
        duplicates: r.get(0),
        missing: r.get(1),
        order: r.get(2),
    })
}

/// Starts W workers, runs `during` once they are connected (and hold their
/// slots), then stops them; the seconds from the start until `during`
/// returned.
fn with_workers(
    cfg: &Config,
    method: &str,
    name: &str,
    w: usize,
    during: impl FnOnce(&Shared) -> Result<(), String>,
) -> Result<f64, String> {
    let shared = Arc::new(Shared {
        processed: AtomicI64::new(0),
        stop: AtomicBool::new(false),
    });
    let barrier = Arc::new(Barrier::new(w + 1));
    let handles: Vec<_> = (0..w)
        .map(|_| {
            let (cfg, shared, barrier) = (cfg.clone(), shared.clone(), barrier.clone());
            let (method, name) = (method.to_string(), name.to_string());
            thread::spawn(move || {
                worker::worker(&cfg.dsn, &method, &name, w, cfg.batch, &shared, &barrier)
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let outcome = during(&shared);
    let seconds = start.elapsed().as_secs_f64();
    shared.stop.store(true, Ordering::Relaxed);
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a worker panicked".to_string()),
        }
    }
    outcome?;
    if let Some(e) = errors.first() {
        return Err(e.clone());
    }
    Ok(seconds)
}

/// Waits until `target` items are processed or `limit` passed.
fn until_processed(shared: &Shared, target: i64, limit: Duration) {
    let end = Instant::now() + limit;
    while shared.processed.load(Ordering::Relaxed) < target && Instant::now() < end {
        thread::sleep(Duration::from_millis(2));
    }
}

/// Phase 1: the drain of a loaded table. Items/s, and the verdict (items
/// never logged count only when every item should have been).
fn drain(
    admin: &mut Client,
    cfg: &Config,
    method: &str,
    w: usize,
    g: usize,
) -> Result<(f64, Verdict), String> {
    let err = |e: postgres::Error| describe(&e);
    fresh(admin, method, w).map_err(err)?;
    admin
        .execute(
            "INSERT INTO ord_items (grp) SELECT i % $2::bigint FROM generate_series(1, $1::bigint) i ORDER BY i",
            &[&cfg.items, &(g as i64)],
        )
        .map_err(err)?;
    admin
        .batch_execute("VACUUM ANALYZE ord_items")
        .map_err(err)?;
    admin.batch_execute("CHECKPOINT").map_err(err)?;
    let name = format!("ordbench-drain-{method}-{w}-{g}");
    let mut done = 0;
    let seconds = with_workers(cfg, method, &name, w, |shared| {
        until_processed(
            shared,
            cfg.items,
            Duration::from_secs_f64(cfg.seconds * 4.0),
        );
        done = shared.processed.load(Ordering::Relaxed);
        Ok(())
    })?;
    let v = verdict(admin).map_err(err)?;
    let v = if done < cfg.items {
        Verdict { missing: 0, ..v }
    } else {
        v
    };
    Ok((done as f64 / seconds, v))
}

/// Phase 2: a producer at `rate` items/s for `seconds`, then until every
/// item is processed. Delay percentiles (ms) and the verdict.
fn delay(
    admin: &mut Client,
    cfg: &Config,
    method: &str,
    w: usize,
    g: usize,
) -> Result<(f64, f64, Verdict), String> {
    let err = |e: postgres::Error| describe(&e);
    fresh(admin, method, w).map_err(err)?;
    admin.batch_execute("CHECKPOINT").map_err(err)?;
    let name = format!("ordbench-delay-{method}-{w}-{g}");
    let mut producer = connect(&cfg.dsn, "ordbench-producer").map_err(err)?;
    let insert = producer
        .prepare("INSERT INTO ord_items (grp) SELECT floor(random() * $2::bigint)::bigint FROM generate_series(1, $1::bigint)")
        .map_err(err)?;
    let mut produced = 0i64;
    with_workers(cfg, method, &name, w, |shared| {
        let start = Instant::now();
        let run = Duration::from_secs_f64(cfg.seconds);
        while start.elapsed() < run {
            let due = (start.elapsed().as_secs_f64() * cfg.rate as f64) as i64;
            if due > produced {
                producer
                    .execute(&insert, &[&(due - produced), &(g as i64)])
                    .map_err(err)?;
                produced = due;
            }
            thread::sleep(Duration::from_millis(10));
        }
        until_processed(shared, produced, Duration::from_secs_f64(cfg.seconds * 4.0));
        Ok(())
    })?;
    let mut delays: Vec<f64> = admin
        .query(
            "SELECT (extract(epoch FROM processed_at - created_at) * 1000)::float8 FROM ord_log",
            &[],
        )
        .map_err(err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    delays.sort_by(f64::total_cmp);
    Ok((
        percentile(&delays, 50.0).unwrap_or(f64::NAN),
        percentile(&delays, 99.0).unwrap_or(f64::NAN),
        verdict(admin).map_err(err)?,
    ))
}

fn run(cfg: &Config) -> Result<bool, String> {
    let mut admin = connect(&cfg.dsn, "ordbench-admin").map_err(|e| describe(&e))?;
    ensure_extension(&mut admin, "pg_claim").map_err(|e| describe(&e))?;
    let cores = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "ordered per key: FIFO per group, drain of {} items and a producer at {} items/s for {} s, batches of {}, {} cores",
        cfg.items, cfg.rate, cfg.seconds, cfg.batch, cores
    );
    println!(
        "{:>6} {:>3}  {:<40} {:>10} {:>10} {:>10} {:>6} {:>6}",
        "groups", "W", "method", "items/s", "delay p50", "delay p99", "dup", "order"
    );
    let mut ok = true;
    let mut ratios = Vec::new();
    for &g in &cfg.groups {
        for &w in &cfg.workers {
            let mut rates = Vec::new();
            for m in METHODS {
                let (rate, dv) = drain(&mut admin, cfg, m, w, g)
                    .map_err(|e| format!("{m} W={w} G={g} drain: {e}"))?;
                let (p50, p99, lv) = delay(&mut admin, cfg, m, w, g)
                    .map_err(|e| format!("{m} W={w} G={g} delay: {e}"))?;
                let Verdict {
                    duplicates: dup,
                    missing,
                    order,
                } = dv + lv;
                ok &= dup == 0 && missing == 0 && order == 0;
                let note = if missing != 0 {
                    format!("  ({missing} items never processed)")
                } else {
                    String::new()
                };
                println!(
                    "{g:>6} {w:>3}  {:<40} {rate:>10.0} {p50:>8.1}ms {p99:>8.1}ms {dup:>6} {order:>6}{note}",
                    label(m)
                );
                rates.push(rate);
            }
            ratios.push((g, w, rates[0] / rates[1]));
        }
    }
    for (g, w, r) in ratios {
        let target = if w == 32 { "  (target >= 5x)" } else { "" };
        println!(
            "ratio: pg_claim / queue items/s, FIFO per group, G = {g}, W = {w} = {r:.2}x{target}"
        );
    }
    println!(
        "order: {}",
        if ok {
            "every item once, every group in strictly increasing id order, in every run"
        } else {
            "VIOLATED (see dup/order columns)"
        }
    );
    Ok(ok)
}

fn main() {
    let cfg = match parse_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ordered_bench: {e}\nusage: ordered_bench [--items 200000] [--workers 8,32] [--groups 100,10000] [--batch 50] [--rate 2000] [--seconds 5] [--dsn DSN]");
            std::process::exit(2);
        }
    };
    match run(&cfg) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("ordered_bench: {e}");
            std::process::exit(2);
        }
    }
}
