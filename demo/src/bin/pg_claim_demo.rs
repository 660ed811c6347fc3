//! pg_claim's demo: a fleet of workers and standbys drains a table of work
//! items, one worker is killed mid-run, its standby takes over the slot, and
//! the processing log is checked for exactly-once processing at the end.
//!
//! It is also the worked example of a real pg_claim worker loop:
//!
//! ```sql
//! SELECT claim_slot('demo', 4, interval '30 seconds');           -- once: my slot
//! SELECT max(item_id) FROM processing_log WHERE slot = 2;         -- where my share stands
//! BEGIN;                                                          -- per batch:
//! SELECT id FROM my_items(NULL::work_items, 2, 4, after => '81234', batch => 500);
//! INSERT INTO processing_log ... ; UPDATE work_items SET done = true ... ;
//! COMMIT;
//! ```
//!
//! Run it through `scripts/demo`, which starts a throwaway cluster; options:
//! `--items N --workers W --standbys S --batch B --work-us U --kill-at F
//! --kill-slot K --no-kill --timeout SECS --dsn DSN`.

use pg_claim_demo::{connect, describe, dsn_from_env, is_connection_loss, ms, thousands, Opts};
use postgres::Client;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const NAME: &str = "demo";

#[derive(Clone)]
struct Config {
    dsn: String,
    items: i64,
    workers: usize,
    standbys: usize,
    batch: i64,
    work_us: u64,
    kill_at: f64,
    kill_slot: usize,
    timeout: Duration,
    /// Deliberately wrong: a standby restarts the share from its beginning
    /// instead of where the log says it stands (to see the check fail).
    resume_from_start: bool,
}

/// What the display knows about one slot.
#[derive(Default)]
struct SlotView {
    total: u64,
    done: u64,
    /// `(role, backend pid)` of the current holder.
    holder: Option<(String, i32)>,
    /// Rows written by the holder's open transaction, not yet committed.
    uncommitted: u64,
    finished: bool,
    /// `(time, done)` samples for the items/s figure.
    samples: Vec<(Instant, u64)>,
}

#[derive(Default)]
struct Shared {
    slots: Vec<SlotView>,
    /// Messages to print once, in order (kill, takeover, errors).
    events: Vec<String>,
    /// Standbys and what they do: `(role, pid, state)`.
    standbys: Vec<(String, i32, String)>,
    kill_time: Option<Instant>,
    takeover: Option<Duration>,
    /// Errors that are not the expected termination of the victim.
    failures: Vec<String>,
}

type State = Arc<Mutex<Shared>>;

fn lock(s: &State) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

fn event(s: &State, start: Instant, msg: String) {
    let t = start.elapsed().as_secs_f64();
    lock(s).events.push(format!("[{t:6.2}s] {msg}"));
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("pg_claim_demo: {e}");
            ExitCode::from(2)
        }
    }
}

fn parse_config() -> Result<Config, String> {
    let o = Opts::parse(
        std::env::args().skip(1),
        &["no-kill", "resume-from-start", "help"],
    )?;
    if o.flag("help") {
        println!(
            "usage: scripts/demo [--items N] [--workers W] [--standbys S] [--batch B] \
             [--work-us U] [--kill-at F] [--kill-slot K] [--no-kill] [--timeout SECS]\n\
             [--resume-from-start: a deliberately wrong standby that ignores the log, to see the check fail]\n\
             defaults: --items 200000 --workers 4 --standbys 2 --batch 500 --work-us 250 \
             --kill-at 0.4 --kill-slot 1 --timeout 240"
        );
        std::process::exit(0);
    }
    o.check_known(&[
        "items",
        "workers",
        "standbys",
        "batch",
        "work-us",
        "kill-at",
        "kill-slot",
        "no-kill",
        "resume-from-start",
        "timeout",
        "dsn",
        "help",
    ])?;
    let c = Config {
        dsn: dsn_from_env(o.get_str("dsn")),
        items: o.get("items", 200_000i64)?,
        workers: o.get("workers", 4usize)?,
        standbys: o.get("standbys", 2usize)?,
        batch: o.get("batch", 500i64)?,
        work_us: o.get("work-us", 250u64)?,
        kill_at: if o.flag("no-kill") {
            0.0
        } else {
            o.get("kill-at", 0.4f64)?
        },
        kill_slot: o.get("kill-slot", 1usize)?,
        timeout: Duration::from_secs(o.get("timeout", 240u64)?),
        resume_from_start: o.flag("resume-from-start"),
    };
    if c.items < 1 || c.workers < 1 || c.batch < 1 {
        return Err("--items, --workers and --batch must be at least 1".into());
    }
    if c.workers > 256 || c.standbys > 256 {
        return Err("--workers and --standbys are limited to 256 each".into());
    }
    if !(0.0..1.0).contains(&c.kill_at) {
        return Err("--kill-at is a fraction of the slot's share, in [0, 1)".into());
    }
    if c.kill_at > 0.0 && c.kill_slot >= c.workers {
        return Err(format!(
            "--kill-slot {} is not a slot of 0..{}",
            c.kill_slot,
            c.workers - 1
        ));
    }
    if c.kill_at > 0.0 && c.standbys == 0 {
        return Err(
            "killing a worker needs at least one standby (--standbys 1, or --no-kill)".into(),
        );
    }
    Ok(c)
}

fn run() -> Result<bool, String> {
    let cfg = parse_config()?;
    let mut admin =
        connect(&cfg.dsn, "demo-coordinator").map_err(|e| format!("connect: {}", describe(&e)))?;
    setup(&mut admin, &cfg).map_err(|e| format!("setting up the work table: {}", describe(&e)))?;

    let start = Instant::now();
    let state: State = Arc::new(Mutex::new(Shared::default()));
    {
        let totals =
            slot_totals(&mut admin, &cfg).map_err(|e| format!("slot_counts: {}", describe(&e)))?;
        let mut s = lock(&state);
        s.slots = totals
            .into_iter()
            .map(|t| SlotView {
                total: t,
                ..Default::default()
            })
            .collect();
    }
    // `finished` stops the workers, `stop_standbys` the standbys (first, so a
    // standby does not pick up the slot of a worker that is leaving).
    let finished = Arc::new(AtomicBool::new(false));
    let stop_standbys = Arc::new(AtomicBool::new(false));

    // Workers first: each claims a slot (all n are free, so each gets one).
    let mut handles = Vec::new();
    for i in 0..cfg.workers {
        let (cfg, state, finished) = (cfg.clone(), state.clone(), finished.clone());
        handles.push(thread::spawn(move || {
            worker(format!("worker-{i}"), &cfg, &state, &finished, None, start)
        }));
    }
    // Then the standbys, once every slot is held, so they wait instead of
    // racing the workers for the first slots.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = lock(&state)
            .slots
            .iter()
            .filter(|s| s.holder.is_some())
            .count();
        if held == cfg.workers {
            break;
        }
        if Instant::now() > deadline || !lock(&state).failures.is_empty() {
            finished.store(true, Ordering::SeqCst);
            let f = lock(&state).failures.join("; ");
            return Err(format!(
                "the workers did not claim all {} slots: {f}",
                cfg.workers
            ));
        }
        thread::sleep(Duration::from_millis(5));
    }
    print_holders(&mut admin, "slot holders at the start")?;
    let mut standby_handles = Vec::new();
    for i in 0..cfg.standbys {
        let (cfg, state, finished) = (cfg.clone(), state.clone(), finished.clone());
        let stop = stop_standbys.clone();
        standby_handles.push(thread::spawn(move || {
            worker(
                format!("standby-{i}"),
                &cfg,
                &state,
                &finished,
                Some(&stop),
                start,
            )
        }));
    }

    let mut display = Display::new();
    let mut killed = cfg.kill_at == 0.0;
    let mut timed_out = false;
    loop {
        thread::sleep(Duration::from_millis(100));
        let (all_done, victim) = {
            let s = lock(&state);
            let all = s.slots.iter().all(|v| v.finished);
            let k = &s.slots[cfg.kill_slot.min(s.slots.len() - 1)];
            // Strike while the victim is inside a batch transaction, to show
            // that its uncommitted work is rolled back, not half-applied.
            let due = !killed
                && k.done as f64 >= cfg.kill_at * k.total as f64
                && (k.uncommitted > 0 || k.done as f64 >= (cfg.kill_at + 0.1) * k.total as f64);
            (all, if due { k.holder.clone() } else { None })
        };
        if let Some((role, pid)) = victim {
            killed = true;
            kill(&mut admin, &state, &cfg, &role, pid, start)?;
        }
        display.draw(&state, start, false);
        if all_done {
            break;
        }
        if start.elapsed() > cfg.timeout {
            timed_out = true;
            event(
                &state,
                start,
                format!(
                    "TIMEOUT after {:?}: not every share was finished",
                    cfg.timeout
                ),
            );
            break;
        }
    }
    let elapsed = start.elapsed();
    display.draw(&state, start, true);
    print_holders(&mut admin, "slot holders at the end").ok();
    // Waiting standbys leave first (within one claim round), then the holders.
    stop_standbys.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    while lock(&state).standbys.iter().any(|s| s.2 == "waiting") && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    finished.store(true, Ordering::SeqCst);
    for h in handles.into_iter().chain(standby_handles) {
        let _ = h.join();
    }
    let failures = lock(&state).failures.clone();
    let verdict = check(&mut admin, &cfg, elapsed, &state)?;
    for f in &failures {
        println!("worker error: {f}");
    }
    Ok(verdict && failures.is_empty() && !timed_out)
}

fn setup(c: &mut Client, cfg: &Config) -> Result<(), postgres::Error> {
    c.batch_execute(&format!(
        "SET client_min_messages = warning;
         CREATE EXTENSION IF NOT EXISTS pg_claim;
         DROP TABLE IF EXISTS processing_log, work_items;
         CREATE TABLE work_items (
             id      bigint PRIMARY KEY,
             payload text NOT NULL,
             done    boolean NOT NULL DEFAULT false
         ) WITH (fillfactor = 80);
         INSERT INTO work_items (id, payload)
             SELECT g, 'item ' || g FROM generate_series(1, {items}) g;
         -- the index my_items uses to read one slot's share in key order
         CREATE INDEX work_items_slot ON work_items ((slot_of(id, {n})), id);
         CREATE TABLE processing_log (
             item_id      bigint NOT NULL,
             slot         integer NOT NULL,
             worker_pid   integer NOT NULL,
             processed_at timestamptz NOT NULL
         );
         -- where a slot's share stands: max(item_id) of the slot
         CREATE INDEX processing_log_slot ON processing_log (slot, item_id);
         RESET client_min_messages;",
        items = cfg.items,
        n = cfg.workers
    ))?;
    c.batch_execute("VACUUM ANALYZE work_items")
}

/// Items per slot, from `slot_counts`.
fn slot_totals(c: &mut Client, cfg: &Config) -> Result<Vec<u64>, postgres::Error> {
    let rows = c.query(
        "SELECT slot, items FROM slot_counts('work_items'::regclass, $1) ORDER BY slot",
        &[&(cfg.workers as i32)],
    )?;
    let mut t = vec![0u64; cfg.workers];
    for r in rows {
        let slot: i32 = r.get(0);
        let items: i64 = r.get(1);
        if let Some(v) = t.get_mut(slot as usize) {
            *v = items as u64;
        }
    }
    Ok(t)
}

fn print_holders(c: &mut Client, title: &str) -> Result<(), String> {
    let rows = c
        .query(
            "SELECT slot, pid, application_name FROM slot_holders($1) ORDER BY slot",
            &[&NAME],
        )
        .map_err(|e| format!("slot_holders: {}", describe(&e)))?;
    let list: Vec<String> = rows
        .iter()
        .map(|r| {
            let slot: i32 = r.get(0);
            let pid: i32 = r.get(1);
            let app: Option<String> = r.get(2);
            format!("{slot}={} (pid {pid})", app.unwrap_or_default())
        })
        .collect();
    println!("{title}: SELECT slot, pid, application_name FROM slot_holders('{NAME}');");
    println!("  {}", list.join(", "));
    Ok(())
}

/// Terminates the victim's backend, as an operator or the OOM killer would.
fn kill(
    admin: &mut Client,
    state: &State,
    cfg: &Config,
    role: &str,
    pid: i32,
    start: Instant,
) -> Result<(), String> {
    let (done, total, open) = {
        let s = lock(state);
        let v = &s.slots[cfg.kill_slot];
        (v.done, v.total, v.uncommitted)
    };
    // Recorded before the call, so a standby that wins the slot before the
    // call returns still finds the kill time.
    lock(state).kill_time = Some(Instant::now());
    let ok: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .map_err(|e| format!("pg_terminate_backend: {}", describe(&e)))?
        .get(0);
    let inside = if open > 0 {
        format!("while it had {open} uncommitted log rows")
    } else {
        "between transactions".to_string()
    };
    event(
        state,
        start,
        format!(
            "KILL  SELECT pg_terminate_backend({pid}) -> {ok}: {role} holding slot {} at {}/{} items ({:.0}%), {inside}",
            cfg.kill_slot,
            thousands(done),
            thousands(total),
            100.0 * done as f64 / total.max(1) as f64
        ),
    );
    Ok(())
}

/// A worker (or standby): claim a slot, walk its share, hold the slot until
/// the whole table is done. A standby waits for a slot in short rounds so it
/// notices the end of the run.
fn worker(
    role: String,
    cfg: &Config,
    state: &State,
    finished: &AtomicBool,
    stop_standby: Option<&AtomicBool>,
    start: Instant,
) {
    let standby = stop_standby.is_some();
    let fail = |msg: String| {
        let mut s = lock(state);
        s.events.push(format!("ERROR {role}: {msg}"));
        s.failures.push(format!("{role}: {msg}"));
    };
    let mut c = match connect(&cfg.dsn, &format!("demo-{role}")) {
        Ok(c) => c,
        Err(e) => return fail(format!("connect: {}", describe(&e))),
    };
    let pid: i32 = match c.query_one("SELECT pg_backend_pid()", &[]) {
        Ok(r) => r.get(0),
        Err(e) => return fail(describe(&e)),
    };
    let n = cfg.workers as i32;
    let slot: i32 = if standby {
        lock(state)
            .standbys
            .push((role.clone(), pid, "waiting".into()));
        loop {
            if stop_standby.is_some_and(|s| s.load(Ordering::SeqCst)) {
                set_standby(state, &role, "stopped (never needed)".into());
                return;
            }
            // claim_slot(name, n, wait): NULL after `wait` when all n are held.
            match c.query_one(
                "SELECT claim_slot($1, $2, interval '500 milliseconds')",
                &[&NAME, &n],
            ) {
                Ok(r) => {
                    if let Some(s) = r.get::<_, Option<i32>>(0) {
                        break s;
                    }
                }
                Err(e) => return fail(format!("claim_slot: {}", describe(&e))),
            }
        }
    } else {
        match c.query_one(
            "SELECT claim_slot($1, $2, interval '30 seconds')",
            &[&NAME, &n],
        ) {
            Ok(r) => match r.get::<_, Option<i32>>(0) {
                Some(s) => s,
                None => return fail("no slot free after 30 s".into()),
            },
            Err(e) => return fail(format!("claim_slot: {}", describe(&e))),
        }
    };
    let claimed_at = Instant::now();
    let su = slot as usize;

    // Where this share stands: the log is written in the same transaction as
    // the done flags, in key order, so its max id per slot is the frontier.
    let (mut after, already): (Option<i64>, i64) = match c.query_one(
        "SELECT max(item_id), count(*) FROM processing_log WHERE slot = $1",
        &[&slot],
    ) {
        Ok(r) => (r.get(0), r.get(1)),
        Err(e) => return fail(format!("reading the log: {}", describe(&e))),
    };
    if standby && cfg.resume_from_start {
        after = None;
    }
    {
        let mut s = lock(state);
        let kill_time = s.kill_time;
        let v = &mut s.slots[su];
        v.holder = Some((role.clone(), pid));
        v.done = already as u64;
        v.samples.clear();
        if standby {
            let lat = kill_time.map(|k| claimed_at.saturating_duration_since(k));
            if s.takeover.is_none() {
                s.takeover = lat;
            }
            let resume = match after {
                Some(a) => format!(
                    "resuming after item {} ({} of its items already processed)",
                    a,
                    thousands(already as u64)
                ),
                None => "starting at the beginning of the share".to_string(),
            };
            let lat_s = lat
                .map(|d| format!("{} after the kill", ms(d)))
                .unwrap_or_default();
            s.events.push(format!(
                "[{:6.2}s] TAKEOVER {role} (pid {pid}) claimed slot {slot} {lat_s}; {resume}",
                start.elapsed().as_secs_f64()
            ));
            if let Some(e) = s.standbys.iter_mut().find(|e| e.0 == role) {
                e.2 = format!("took over slot {slot}");
            }
        }
    }

    let work = Duration::from_micros(cfg.work_us * cfg.batch as u64);
    loop {
        if finished.load(Ordering::SeqCst) {
            return; // the run was stopped (timeout)
        }
        match process_batch(&mut c, cfg, slot, after, work, state) {
            Ok(Some(last)) => after = Some(last),
            Ok(None) => break,
            Err(e) if is_connection_loss(&e) => {
                let mut s = lock(state);
                let v = &mut s.slots[su];
                // A standby may already hold the slot again.
                if v.holder.as_ref().is_some_and(|h| h.1 == pid) {
                    v.holder = None;
                }
                let lost = match std::mem::take(&mut v.uncommitted) {
                    0 => "no transaction was open".to_string(),
                    k => format!("its open transaction with {k} log rows was rolled back"),
                };
                s.events.push(format!(
                    "[{:6.2}s] DEAD  {role} (pid {pid}) lost its connection ({lost}): {}",
                    start.elapsed().as_secs_f64(),
                    describe(&e)
                ));
                return;
            }
            Err(e) => return fail(format!("slot {slot}: {}", describe(&e))),
        }
    }
    lock(state).slots[su].finished = true;
    // Keep the slot until the whole table is done, as a long-running worker
    // would keep polling its share for new items.
    while !finished.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(20));
    }
}

fn set_standby(state: &State, role: &str, what: String) {
    if let Some(e) = lock(state).standbys.iter_mut().find(|e| e.0 == role) {
        e.2 = what;
    }
}

/// One transaction: the next batch of the share after `after`, logged and
/// marked done, plus the simulated work. Returns the batch's last id, or
/// `None` when the share is exhausted.
fn process_batch(
    c: &mut Client,
    cfg: &Config,
    slot: i32,
    after: Option<i64>,
    work: Duration,
    state: &State,
) -> Result<Option<i64>, postgres::Error> {
    let n = cfg.workers as i32;
    let mut tx = c.transaction()?;
    let ids: Vec<i64> = tx
        .query(
            "SELECT id FROM my_items(NULL::work_items, $1, $2, after => $3, batch => $4)",
            &[
                &slot,
                &n,
                &after.map(|a| a.to_string()),
                &(cfg.batch as i32),
            ],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let Some(&last) = ids.last() else {
        tx.commit()?;
        return Ok(None);
    };
    let logged = tx.execute(
        "INSERT INTO processing_log (item_id, slot, worker_pid, processed_at)
         SELECT id, $2, pg_backend_pid(), clock_timestamp() FROM unnest($1::bigint[]) AS id",
        &[&ids, &slot],
    )?;
    tx.execute(
        "UPDATE work_items SET done = true WHERE id = ANY($1)",
        &[&ids],
    )?;
    lock(state).slots[slot as usize].uncommitted = logged;
    // The rest of the batch's work happens inside the same transaction.
    thread::sleep(work);
    tx.commit()?;
    let mut s = lock(state);
    let v = &mut s.slots[slot as usize];
    v.uncommitted = 0;
    v.done += logged;
    Ok(Some(last))
}

/// The final exactly-once check, printed as a verdict with counts.
fn check(c: &mut Client, cfg: &Config, elapsed: Duration, state: &State) -> Result<bool, String> {
    let r = c
        .query_one(
            "SELECT (SELECT count(*) FROM work_items),
                    (SELECT count(*) FROM processing_log),
                    (SELECT count(DISTINCT item_id) FROM processing_log),
                    (SELECT count(*) FROM work_items w
                      WHERE NOT EXISTS (SELECT 1 FROM processing_log l WHERE l.item_id = w.id)),
                    (SELECT count(*) FROM work_items WHERE NOT done),
                    (SELECT count(*) FROM processing_log WHERE slot <> slot_of(item_id, $1))",
            &[&(cfg.workers as i32)],
        )
        .map_err(|e| format!("checking the log: {}", describe(&e)))?;
    let (items, logged, distinct, missing, not_done, wrong): (i64, i64, i64, i64, i64, i64) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
    let per = c
        .query(
            "SELECT slot, worker_pid, count(*), min(item_id), max(item_id)
               FROM processing_log GROUP BY slot, worker_pid ORDER BY slot, min(item_id)",
            &[],
        )
        .map_err(|e| format!("checking the log: {}", describe(&e)))?;
    println!();
    println!("processing log by slot and worker:");
    println!("  slot | worker pid |  items | first id .. last id");
    for r in per {
        let (slot, pid, cnt, lo, hi): (i32, i32, i64, i64, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        println!("  {slot:4} | {pid:10} | {cnt:6} | {lo} .. {hi}");
    }
    let s = lock(state);
    if let Some(t) = s.takeover {
        println!(
            "takeover latency (pg_terminate_backend -> standby's claim_slot returned): {}",
            ms(t)
        );
    }
    drop(s);
    println!(
        "throughput: {} items in {:.1} s = {} items/s",
        thousands(items as u64),
        elapsed.as_secs_f64(),
        thousands((items as f64 / elapsed.as_secs_f64()) as u64)
    );
    println!();
    println!("exactly-once check:");
    println!("  items in the table                 {items}");
    println!("  log rows           count(*)        {logged}");
    println!("  distinct items     count(DISTINCT) {distinct}");
    println!("  items never processed              {missing}");
    println!("  items not marked done              {not_done}");
    println!("  log rows in the wrong slot         {wrong}");
    let ok = logged == items && distinct == items && missing == 0 && not_done == 0 && wrong == 0;
    if ok {
        println!("VERDICT: PASS, every one of the {items} items was processed exactly once");
    } else {
        println!(
            "VERDICT: FAIL, {} duplicate log rows, {missing} items missing, {not_done} not done, {wrong} in the wrong slot",
            logged - distinct
        );
    }
    Ok(ok)
}

/// Live progress: bars redrawn in place on a terminal, plain periodic lines
/// otherwise (CI logs, pipes).
struct Display {
    tty: bool,
    drawn_lines: usize,
    printed_events: usize,
    last_plain: Option<Instant>,
    last_plain_done: Option<u64>,
    width: usize,
}

impl Display {
    fn new() -> Display {
        Display {
            tty: std::io::stdout().is_terminal(),
            drawn_lines: 0,
            printed_events: 0,
            last_plain: None,
            last_plain_done: None,
            width: 30,
        }
    }

    fn draw(&mut self, state: &State, start: Instant, last: bool) {
        let now = Instant::now();
        let mut s = lock(state);
        for v in s.slots.iter_mut() {
            v.samples.push((now, v.done));
            v.samples
                .retain(|(t, _)| now.duration_since(*t) <= Duration::from_millis(1500));
        }
        let rate = |v: &SlotView| -> f64 {
            match (v.samples.first(), v.samples.last()) {
                (Some(a), Some(b)) if b.0 > a.0 => {
                    (b.1.saturating_sub(a.1)) as f64 / b.0.duration_since(a.0).as_secs_f64()
                }
                _ => 0.0,
            }
        };
        let mut out = String::new();
        let new_events: Vec<String> = s.events[self.printed_events..].to_vec();
        self.printed_events = s.events.len();
        let elapsed = start.elapsed().as_secs_f64();
        let (done, total): (u64, u64) = s
            .slots
            .iter()
            .fold((0, 0), |(d, t), v| (d + v.done, t + v.total));
        let total_rate: f64 = s.slots.iter().map(rate).sum();
        if self.tty {
            if self.drawn_lines > 0 {
                out.push_str(&format!("\x1b[{}A\x1b[J", self.drawn_lines));
            }
            for e in &new_events {
                out.push_str(e);
                out.push('\n');
            }
            let mut lines = 0;
            for (i, v) in s.slots.iter().enumerate() {
                let frac = v.done as f64 / v.total.max(1) as f64;
                let filled = ((frac * self.width as f64).round() as usize).min(self.width);
                let who = match &v.holder {
                    Some((r, p)) => format!("{r} pid {p}"),
                    None if v.finished => "done".to_string(),
                    None => "NO HOLDER".to_string(),
                };
                out.push_str(&format!(
                    "slot {i:2} [{}{}] {:5.1}% {:>9}/{:<9} {:>8} items/s  {who}\n",
                    "#".repeat(filled),
                    ".".repeat(self.width - filled),
                    frac * 100.0,
                    thousands(v.done),
                    thousands(v.total),
                    thousands(rate(v) as u64),
                ));
                lines += 1;
            }
            out.push_str(&format!(
                "total   {:>9}/{:<9} {:>8} items/s  elapsed {elapsed:.1}s\n",
                thousands(done),
                thousands(total),
                thousands(total_rate as u64)
            ));
            lines += 1;
            let sb: Vec<String> = s
                .standbys
                .iter()
                .map(|(r, p, st)| format!("{r} pid {p}: {st}"))
                .collect();
            if !sb.is_empty() {
                out.push_str(&format!("standbys: {}\n", sb.join("; ")));
                lines += 1;
            }
            self.drawn_lines = lines;
        } else {
            for e in &new_events {
                out.push_str(e);
                out.push('\n');
            }
            let due = self
                .last_plain
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(2));
            if (due || last) && self.last_plain_done != Some(done) {
                self.last_plain = Some(now);
                self.last_plain_done = Some(done);
                let per: Vec<String> = s
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        format!(
                            "s{i} {:3.0}%",
                            100.0 * v.done as f64 / v.total.max(1) as f64
                        )
                    })
                    .collect();
                out.push_str(&format!(
                    "[{elapsed:6.2}s] progress {}/{} ({:.0}%)  {} items/s  | {}\n",
                    thousands(done),
                    thousands(total),
                    100.0 * done as f64 / total.max(1) as f64,
                    thousands(total_rate as u64),
                    per.join(" ")
                ));
            }
        }
        drop(s);
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(out.as_bytes());
        let _ = o.flush();
    }
}
