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

use pg_claim_demo::{connect, describe, dsn_from_env, parse_list, percentile, thousands, Opts};
use postgres::Client;
use std::fmt::Write as _;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const METHODS: [&str; 6] = [
    "pg_claim",
    "my_items",
    "pg_claim_tx",
    "skip_locked",
    "skip_locked_simple",
    "pgq",
];
const DEFAULT_METHODS: &str = "pg_claim,my_items,pg_claim_tx,skip_locked,skip_locked_simple,pgq";

fn label(m: &str) -> &'static str {
    match m {
        "pg_claim" => "pg_claim (claim_slot + slot_of index)",
        "my_items" => "pg_claim (claim_slot + my_items)",
        "pg_claim_tx" => "pg_claim (in a queue-style transaction)",
        "skip_locked" => "FOR UPDATE SKIP LOCKED queue",
        "skip_locked_simple" => "FOR UPDATE SKIP LOCKED queue (two round trips)",
        _ => "PgQ (one queue + consumer per worker)",
    }
}

fn color(m: &str) -> &'static str {
    match m {
        "pg_claim" => "#1f77b4",
        "my_items" => "#2ca02c",
        "pg_claim_tx" => "#9467bd",
        "skip_locked" => "#d62728",
        "skip_locked_simple" => "#8c564b",
        _ => "#ff7f0e",
    }
}

#[derive(Clone)]
struct Config {
    dsn: String,
    items: i64,
    workers: Vec<usize>,
    batch: i64,
    work_us: u64,
    methods: Vec<String>,
    rounds: usize,
    fillfactor: u32,
    out_dir: String,
}

/// One (method, W) run.
struct RunResult {
    method: String,
    w: usize,
    items_per_s: f64,
    /// Batch (transaction) latencies in ms, sorted.
    lat: Vec<f64>,
    duplicates: i64,
    missing: i64,
    seconds: f64,
    /// The share of the run's updates of the work table that were HOT
    /// (heap-only: no index entry written), from `pg_stat_user_tables`;
    /// None when the statistics did not arrive in time.
    hot: Option<f64>,
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("queue_bench: {e}");
            std::process::exit(2);
        }
    }
}

fn parse_config() -> Result<Config, String> {
    let o = Opts::parse(std::env::args().skip(1), &["help"])?;
    if o.flag("help") {
        println!(
            "usage: queue_bench [--items N] [--workers 1,2,4,8,16,32] [--batch 50] [--work-us 0] \
             [--methods {DEFAULT_METHODS}] [--rounds 5] [--fillfactor 100] [--out-dir docs] [--dsn DSN]"
        );
        std::process::exit(0);
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
    Ok(c)
}

fn run() -> Result<bool, String> {
    let mut cfg = parse_config()?;
    let mut admin = connect(&cfg.dsn, "bench-admin").map_err(|e| describe(&e))?;
    admin
        .batch_execute("SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS pg_claim")
        .map_err(|e| format!("CREATE EXTENSION pg_claim: {}", describe(&e)))?;
    if cfg.methods.iter().any(|m| m == "pgq") {
        if let Err(e) = admin.batch_execute("CREATE EXTENSION IF NOT EXISTS pgq") {
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
    let mut results: Vec<RunResult> = Vec::new();
    for round in 0..cfg.rounds {
        for &w in &cfg.workers {
            // Rotate the order of the methods from round to round, so none
            // always runs first (or right after another's checkpoint).
            let k = cfg.methods.len();
            for j in 0..k {
                let m = &cfg.methods[(j + round) % k];
                let r =
                    run_one(&mut admin, &cfg, m, w).map_err(|e| format!("{m} at W={w}: {e}"))?;
                println!(
                    "  round {} W={w:2} {:18} {:>9} items/s  p50 {:7.2} ms  p95 {:7.2} ms  p99 {:7.2} ms  {:.1} s  HOT {}  duplicates {} missing {}",
                    round + 1,
                    m,
                    thousands(r.items_per_s as u64),
                    percentile(&r.lat, 50.0).unwrap_or(0.0),
                    percentile(&r.lat, 95.0).unwrap_or(0.0),
                    percentile(&r.lat, 99.0).unwrap_or(0.0),
                    r.seconds,
                    hot_text(r.hot),
                    r.duplicates,
                    r.missing
                );
                results.push(r);
            }
        }
    }
    let table = summarize(&cfg, &results);
    let valid = results.iter().all(|r| r.duplicates == 0 && r.missing == 0);
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| format!("{}: {e}", cfg.out_dir))?;
    let md_path = format!("{}/queue-results.md", cfg.out_dir);
    let svg_path = format!("{}/queue-throughput.svg", cfg.out_dir);
    let md = markdown(&cfg, &table, cores);
    std::fs::write(&md_path, &md).map_err(|e| format!("{md_path}: {e}"))?;
    std::fs::write(&svg_path, svg(&cfg, &table, cores)).map_err(|e| format!("{svg_path}: {e}"))?;
    println!();
    print!("{md}");
    println!();
    println!("table written to {md_path}, plot to {svg_path}");
    let by_w: Vec<String> = cfg
        .workers
        .iter()
        .filter_map(|&w| {
            let get = |m| items_per_s(&table, m, w);
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
        let get = |m| items_per_s(&table, m, w);
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
    if !valid {
        println!("FAIL: some run processed an item twice or missed one (see the table)");
    }
    Ok(valid)
}

/// The summarized items/s of `method` at `w` workers, if it was run.
fn items_per_s(table: &[RunResult], method: &str, w: usize) -> Option<f64> {
    table
        .iter()
        .find(|r| r.method == method && r.w == w)
        .map(|r| r.items_per_s)
}

/// Creates a fresh table (and queue) for one run, so no method inherits
/// another's dead tuples or bloat.
fn prepare(
    admin: &mut Client,
    cfg: &Config,
    method: &str,
    w: usize,
) -> Result<(), postgres::Error> {
    let index = match method {
        m if claims_slot(m) => {
            format!("CREATE INDEX bench_items_slot ON bench_items ((slot_of(id, {w})), id);")
        }
        "skip_locked" | "skip_locked_simple" => {
            "CREATE INDEX bench_items_pending ON bench_items (id) WHERE NOT done;".into()
        }
        _ => String::new(),
    };
    admin.batch_execute(&format!(
        "SET client_min_messages = warning;
         DROP TABLE IF EXISTS bench_log, bench_items;
         CREATE TABLE bench_items (
             id      bigint PRIMARY KEY,
             payload text NOT NULL,
             done    boolean NOT NULL DEFAULT false
         ) WITH (fillfactor = {ff});
         INSERT INTO bench_items (id, payload)
             SELECT g, 'item ' || g FROM generate_series(1, {items}) g;
         {index}
         CREATE TABLE bench_log (
             item_id      bigint NOT NULL,
             slot         integer NOT NULL,
             worker_pid   integer NOT NULL,
             processed_at timestamptz NOT NULL
         );",
        items = cfg.items,
        ff = cfg.fillfactor
    ))?;
    admin.batch_execute("VACUUM ANALYZE bench_items")?;
    if method == "pgq" {
        // Drop the previous run's queues, then one queue per worker, each
        // ticked every `batch` events so a PgQ batch is `batch` events.
        admin.batch_execute(
            "SELECT pgq.drop_queue(queue_name, true) FROM pgq.queue WHERE queue_name LIKE 'bench_q%'",
        )?;
        for q in 0..w {
            admin.execute("SELECT pgq.create_queue($1)", &[&format!("bench_q{q}")])?;
            admin.execute(
                "SELECT pgq.set_queue_config($1, 'ticker_max_count', $2)",
                &[&format!("bench_q{q}"), &cfg.batch.to_string()],
            )?;
            admin.execute(
                "SELECT pgq.register_consumer($1, 'bench')",
                &[&format!("bench_q{q}")],
            )?;
        }
        // The producer: events carry item ids; a tick after each `batch`
        // events of a queue (each chunk committed before its tick).
        admin.batch_execute(&format!(
            "DO $$
             DECLARE q int; lo bigint;
             BEGIN
               FOR q IN 0..{w1} LOOP
                 lo := 0;
                 LOOP
                   PERFORM pgq.insert_event('bench_q' || q, 'item', id::text)
                      FROM (SELECT id FROM bench_items WHERE id % {w} = q AND id > lo
                             ORDER BY id LIMIT {b}) s;
                   EXIT WHEN NOT FOUND;
                   SELECT max(id) INTO lo FROM (SELECT id FROM bench_items
                     WHERE id % {w} = q AND id > lo ORDER BY id LIMIT {b}) s;
                   COMMIT;
                   PERFORM pgq.ticker('bench_q' || q);
                   COMMIT;
                 END LOOP;
                 -- a last, shorter chunk: tick it too
                 PERFORM pgq.set_queue_config('bench_q' || q, 'ticker_max_count', '1');
                 PERFORM pgq.ticker('bench_q' || q);
                 COMMIT;
               END LOOP;
             END $$;",
            w1 = w - 1,
            b = cfg.batch
        ))?;
    }
    admin.batch_execute("CHECKPOINT")?;
    Ok(())
}

fn run_one(admin: &mut Client, cfg: &Config, method: &str, w: usize) -> Result<RunResult, String> {
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
    let r = admin
        .query_one(
            "SELECT (SELECT count(*) FROM bench_log) - (SELECT count(DISTINCT item_id) FROM bench_log),
                    (SELECT count(*) FROM bench_items b
                      WHERE NOT b.done OR NOT EXISTS (SELECT 1 FROM bench_log l WHERE l.item_id = b.id))",
            &[],
        )
        .map_err(|e| format!("checking: {}", describe(&e)))?;
    lat.sort_by(|a, b| a.total_cmp(b));
    let hot =
        hot_share(admin, cfg.items).map_err(|e| format!("reading statistics: {}", describe(&e)))?;
    Ok(RunResult {
        method: method.to_string(),
        w,
        items_per_s: cfg.items as f64 / seconds,
        lat,
        duplicates: r.get::<_, i64>(0) + refetched,
        missing: r.get(1),
        seconds,
        hot,
    })
}

/// The share of HOT updates among the work table's updates in the run just
/// finished (the table is new, so its counters start at zero). Every item is
/// updated exactly once, so the counters are complete when they reach
/// `items`; a backend reports its counts within a second or when it exits,
/// so this polls for that with a deadline.
fn hot_share(admin: &mut Client, items: i64) -> Result<Option<f64>, postgres::Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = admin.query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
              WHERE relid = 'bench_items'::regclass",
            &[],
        )?;
        let (upd, hot): (i64, i64) = (r.get(0), r.get(1));
        if upd >= items {
            return Ok(Some(hot as f64 / upd as f64));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn hot_text(hot: Option<f64>) -> String {
    hot.map_or_else(|| "n/a".to_string(), |h| format!("{:.0}%", h * 100.0))
}

/// One worker: connect, take its identity, wait for the start, then drain
/// its share (or the queue) batch by batch (see `drain`).
fn worker(
    cfg: &Config,
    method: &str,
    w: usize,
    i: usize,
    barrier: &Barrier,
) -> Result<Drained, String> {
    let mut c = match connect(&cfg.dsn, &format!("bench-{method}-{i}")) {
        Ok(c) => c,
        Err(e) => {
            barrier.wait();
            return Err(format!("connect: {}", describe(&e)));
        }
    };
    let prepared = prepare_worker(&mut c, method, w, i, cfg.batch);
    barrier.wait();
    let (slot, stmts) = prepared?;
    let work = Duration::from_micros(cfg.work_us * cfg.batch as u64);
    drain(&mut c, method, slot, &stmts, work, cfg.batch).map_err(|e| describe(&e))
}

/// A worker's prepared statements: fetch a batch, mark it done, log it, and
/// for PgQ open and finish the batch.
struct Stmts {
    fetch: postgres::Statement,
    mark: postgres::Statement,
    pgq: Option<(postgres::Statement, postgres::Statement)>,
}

/// Whether the method's workers claim a slot and walk its share (the others
/// take from a queue).
fn claims_slot(method: &str) -> bool {
    matches!(method, "pg_claim" | "my_items" | "pg_claim_tx")
}

/// The queue's fetch, the same in both SKIP LOCKED forms.
fn queue_fetch_sql(batch: i64) -> String {
    format!("SELECT id FROM bench_items WHERE NOT done ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED")
}

/// Every method's marking statement: marks the batch done, skipping items
/// already done, and logs what it marked. `ids` and `slot` are SQL
/// expressions (parameters, or literals in the simple protocol).
fn mark_sql(ids: &str, slot: &str) -> String {
    format!(
        "WITH d AS (UPDATE bench_items SET done = true WHERE id = ANY({ids}) AND NOT done RETURNING id)
         INSERT INTO bench_log (item_id, slot, worker_pid, processed_at)
         SELECT id, {slot}, pg_backend_pid(), clock_timestamp() FROM d"
    )
}

/// Claims the worker's identity and prepares its statements.
fn prepare_worker(
    c: &mut Client,
    method: &str,
    w: usize,
    i: usize,
    batch: i64,
) -> Result<(i32, Stmts), String> {
    let err = |e: postgres::Error| describe(&e);
    let slot: i32 = match method {
        m if claims_slot(m) => c
            .query_one("SELECT claim_slot('bench', $1)", &[&(w as i32)])
            .map_err(err)?
            .get::<_, Option<i32>>(0)
            // W workers and W slots: every worker gets one.
            .ok_or_else(|| format!("claim_slot('bench', {w}) returned NULL"))?,
        _ => i as i32,
    };
    let fetch = match method {
        "pg_claim" | "pg_claim_tx" => format!(
            "SELECT id FROM bench_items WHERE slot_of(id, {w}) = $1 AND id > $2 AND NOT done ORDER BY id LIMIT {batch}"
        ),
        "my_items" => format!(
            "SELECT id FROM my_items(NULL::bench_items, $1, {w}, after => $2::bigint::text, batch => {batch})"
        ),
        "skip_locked" | "skip_locked_simple" => queue_fetch_sql(batch),
        _ => "SELECT ev_data::bigint FROM pgq.get_batch_events($1)".to_string(),
    };
    let pgq = if method == "pgq" {
        Some((
            c.prepare("SELECT pgq.next_batch($1, 'bench')")
                .map_err(err)?,
            c.prepare("SELECT pgq.finish_batch($1)").map_err(err)?,
        ))
    } else {
        None
    };
    Ok((
        slot,
        Stmts {
            fetch: c.prepare(&fetch).map_err(err)?,
            mark: c.prepare(&mark_sql("$1", "$2")).map_err(err)?,
            pgq,
        },
    ))
}

/// What one worker did: batch latencies in ms, and how many fetched items
/// were already done (fetched for work a second time).
struct Drained {
    lat: Vec<f64>,
    refetched: i64,
}

/// One worker's loop until its share (or the queue) is empty. Every batch is
/// fetched, worked on, then marked done and logged by one statement. The
/// queues fetch, work and mark inside one transaction, since their row locks
/// (or PgQ batch) are the claim; a pg_claim worker's claim is its slot, so it
/// fetches outside any transaction and the marking statement is its own
/// transaction (`pg_claim_tx` runs the pg_claim fetch in the queues' loop
/// instead).
fn drain(
    c: &mut Client,
    method: &str,
    slot: i32,
    s: &Stmts,
    work: Duration,
    batch: i64,
) -> Result<Drained, postgres::Error> {
    if method == "skip_locked_simple" {
        return drain_simple(c, slot, work, batch);
    }
    let share = claims_slot(method);
    let in_tx = !matches!(method, "pg_claim" | "my_items");
    let mut lat = Vec::new();
    let mut refetched = 0i64;
    let mut after: i64 = i64::MIN;
    let queue = format!("bench_q{slot}");
    loop {
        let t = Instant::now();
        if in_tx {
            c.batch_execute("BEGIN")?;
        }
        let mut batch_id: Option<i64> = None;
        let rows = if share {
            c.query(&s.fetch, &[&slot, &after])?
        } else if let Some((next, _)) = &s.pgq {
            batch_id = c.query_one(next, &[&queue])?.get(0);
            match batch_id {
                Some(b) => c.query(&s.fetch, &[&b])?,
                None => Vec::new(),
            }
        } else {
            c.query(&s.fetch, &[])?
        };
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        if ids.is_empty() && batch_id.is_none() {
            if in_tx {
                c.batch_execute("COMMIT")?;
            }
            return Ok(Drained { lat, refetched });
        }
        if !work.is_zero() {
            thread::sleep(work);
        }
        if !ids.is_empty() {
            // The statement skips items already done, so the log never
            // holds one twice; an item skipped so was fetched for work a
            // second time, and is counted as a duplicate.
            let marked = c.execute(&s.mark, &[&ids, &slot])?;
            refetched += ids.len() as i64 - marked as i64;
            after = ids.iter().copied().max().unwrap_or(after);
        }
        if let (Some(b), Some((_, finish))) = (batch_id, &s.pgq) {
            c.query_one(finish, &[&b])?;
        }
        if in_tx {
            c.batch_execute("COMMIT")?;
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
}

/// The queue in two round trips per batch: `BEGIN` goes with the fetch and
/// `COMMIT` with the marking statement, in the simple query protocol (which
/// allows several statements per message but no parameters, so nothing is
/// prepared and the ids travel as a literal).
fn drain_simple(
    c: &mut Client,
    slot: i32,
    work: Duration,
    batch: i64,
) -> Result<Drained, postgres::Error> {
    let mut lat = Vec::new();
    let mut refetched = 0i64;
    loop {
        let t = Instant::now();
        let mut ids: Vec<i64> = Vec::new();
        let mut marked = 0i64;
        for m in c.simple_query(&format!("BEGIN; {}", queue_fetch_sql(batch)))? {
            if let postgres::SimpleQueryMessage::Row(r) = m {
                ids.extend(r.get(0).and_then(|v| v.parse::<i64>().ok()));
            }
        }
        if ids.is_empty() {
            c.batch_execute("COMMIT")?;
            return Ok(Drained { lat, refetched });
        }
        if !work.is_zero() {
            thread::sleep(work);
        }
        let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let ids_literal = format!("'{{{}}}'::bigint[]", list.join(","));
        for m in c.simple_query(&format!(
            "{}; COMMIT",
            mark_sql(&ids_literal, &slot.to_string())
        ))? {
            if let postgres::SimpleQueryMessage::CommandComplete(n) = m {
                marked += n as i64;
            }
        }
        refetched += ids.len() as i64 - marked;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
}

/// One row per (method, W): the median run by items/s over the rounds.
fn summarize(cfg: &Config, results: &[RunResult]) -> Vec<RunResult> {
    let mut out = Vec::new();
    for &w in &cfg.workers {
        for m in &cfg.methods {
            let mut runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| &r.method == m && r.w == w)
                .collect();
            if runs.is_empty() {
                continue;
            }
            runs.sort_by(|a, b| a.items_per_s.total_cmp(&b.items_per_s));
            let r = runs[runs.len() / 2];
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

fn command_line(cfg: &Config) -> String {
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

fn markdown(cfg: &Config, table: &[RunResult], cores: usize) -> String {
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
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            r.w,
            label(&r.method),
            thousands(r.items_per_s as u64),
            percentile(&r.lat, 50.0).unwrap_or(0.0),
            percentile(&r.lat, 95.0).unwrap_or(0.0),
            percentile(&r.lat, 99.0).unwrap_or(0.0),
            hot_text(r.hot),
            r.duplicates,
            r.missing
        );
    }
    s
}

/// A line chart of items/s against W (log2 axis), one line per method.
fn svg(cfg: &Config, table: &[RunResult], cores: usize) -> String {
    let (w, h) = (760.0f64, 440.0f64);
    let (left, right, top, bottom) = (80.0, 250.0, 50.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let xs: Vec<f64> = cfg.workers.iter().map(|&v| (v as f64).log2()).collect();
    let (xmin, xmax) = (
        xs.iter().cloned().fold(f64::INFINITY, f64::min),
        xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    );
    let ymax_data = table
        .iter()
        .map(|r| r.items_per_s)
        .fold(0.0, f64::max)
        .max(1.0);
    let step = nice_step(ymax_data / 5.0);
    let ymax = (ymax_data / step).ceil() * step;
    let x_of = |v: usize| {
        let lx = (v as f64).log2();
        if xmax > xmin {
            left + (lx - xmin) / (xmax - xmin) * pw
        } else {
            left + pw / 2.0
        }
    };
    let y_of = |v: f64| top + ph - v / ymax * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" font-weight="bold">Items/s drained vs workers W ({} items, {} per batch, {cores} cores)</text>"#,
        left,
        thousands(cfg.items as u64),
        cfg.batch
    );
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="38" font-size="11" fill="#555">median of {} round(s); simulated work {} µs per item; client and server on the same machine</text>"##,
        cfg.rounds, cfg.work_us
    );
    let mut yv = 0.0;
    while yv <= ymax + step / 2.0 {
        let y = y_of(yv);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            thousands(yv as u64)
        );
        yv += step;
    }
    for &wv in &cfg.workers {
        let x = x_of(wv);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{wv}</text>"##,
            top + ph,
            top + ph + 18.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">workers W (log scale)</text>"#,
        left + pw / 2.0,
        h - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">items/s</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    for (k, m) in cfg.methods.iter().enumerate() {
        let pts: Vec<(f64, f64)> = table
            .iter()
            .filter(|r| &r.method == m)
            .map(|r| (x_of(r.w), y_of(r.items_per_s)))
            .collect();
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let col = color(m);
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{col}" stroke-width="2.5"/>"#,
            path.join(" ")
        );
        for (x, y) in &pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{col}"/>"#
            );
        }
        let ly = top + 10.0 + k as f64 * 40.0;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{col}" stroke-width="3"/>"#,
            lx + 22.0
        );
        let text = label(m);
        let (a, b) = text.split_once(" (").unwrap_or((text, ""));
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 28.0,
            ly + 4.0,
            a
        );
        if !b.is_empty() {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#555">({}</text>"##,
                lx + 28.0,
                ly + 18.0,
                b
            );
        }
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1.0).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(0.5), 1.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(1234.0), 2000.0);
        assert_eq!(nice_step(5000.0), 5000.0);
        assert_eq!(nice_step(5001.0), 10000.0);
    }
}
