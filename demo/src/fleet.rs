//! The coordinator of session mode: sets up the table, starts the workers
//! and then the standbys, watches the progress, kills one worker mid-run,
//! stops the fleet and has the processing log checked. Lease mode's
//! coordinator is `lease_fleet`.

use crate::check::check;
use crate::config::{Config, NAME};
use crate::display::Display;
use crate::lease_fleet;
use crate::state::{event, lock, SlotView, State};
use crate::table::{print_holders, print_status, setup, slot_totals};
use crate::watch::{timeout, GapWatch};
use crate::worker::worker;
use pg_claim_support::{connect, describe, poll, thousands, wait_until};
use postgres::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The whole demo; `Ok(false)` when the exactly-once check failed, a worker
/// failed or the run timed out.
pub fn run(cfg: &Config) -> Result<bool, String> {
    let mut admin =
        connect(&cfg.dsn, "demo-coordinator").map_err(|e| format!("connect: {}", describe(&e)))?;
    setup(&mut admin, cfg).map_err(|e| format!("setting up the work table: {}", describe(&e)))?;

    let start = Instant::now();
    let state: State = State::default();
    {
        let totals =
            slot_totals(&mut admin, cfg).map_err(|e| format!("slot_counts: {}", describe(&e)))?;
        let mut s = lock(&state);
        s.slots = totals
            .into_iter()
            .map(|t| SlotView {
                total: t,
                ..Default::default()
            })
            .collect();
    }
    if cfg.leases {
        return lease_fleet::run(cfg, &mut admin, &state, start);
    }
    // `finished` stops the workers, `stop_standbys` the standbys (first, so a
    // standby does not pick up the slot of a worker that is leaving).
    let finished = Arc::new(AtomicBool::new(false));
    let stop_standbys = Arc::new(AtomicBool::new(false));

    // Workers first: each claims a slot (all n are free, so each gets one).
    let workers = spawn(
        cfg,
        &state,
        &finished,
        &stop_standbys,
        false,
        start,
        "worker",
        cfg.workers,
    );
    // Then the standbys, once every slot is held, so they wait instead of
    // racing the workers for the first slots.
    let all_held = poll(Duration::from_secs(30), Duration::from_millis(5), || {
        let s = lock(&state);
        if s.slots.iter().filter(|v| v.holder.is_some()).count() == cfg.workers {
            Ok(Some(()))
        } else if !s.failures.is_empty() {
            Err(())
        } else {
            Ok(None)
        }
    });
    if all_held != Ok(Some(())) {
        finished.store(true, Ordering::SeqCst);
        let f = lock(&state).failures.join("; ");
        return Err(format!(
            "the workers did not claim all {} slots: {f}",
            cfg.workers
        ));
    }
    print_holders(&mut admin, "slot holders at the start")?;
    print_status(&mut admin, cfg)?;
    let standbys = spawn(
        cfg,
        &state,
        &finished,
        &stop_standbys,
        true,
        start,
        "standby",
        cfg.standbys,
    );

    let (elapsed, timed_out) = watch(&mut admin, cfg, &state, start)?;
    print_holders(&mut admin, "slot holders at the end").ok();
    print_status(&mut admin, cfg).ok();
    // Waiting standbys leave first (within one claim round), then the holders.
    stop_standbys.store(true, Ordering::SeqCst);
    wait_until(Duration::from_secs(5), Duration::from_millis(10), || {
        !lock(&state).standbys.iter().any(|s| s.2 == "waiting")
    });
    finished.store(true, Ordering::SeqCst);
    for h in workers.into_iter().chain(standbys) {
        let _ = h.join();
    }
    let failures = lock(&state).failures.clone();
    let verdict = check(&mut admin, cfg, elapsed, &state, None)?;
    for f in &failures {
        println!("worker error: {f}");
    }
    Ok(verdict && failures.is_empty() && !timed_out)
}

/// Starts `count` threads running the worker loop as `{kind}-{i}`;
/// standbys when `standby`, which stop at `stop_standbys`.
#[allow(clippy::too_many_arguments)]
fn spawn(
    cfg: &Config,
    state: &State,
    finished: &Arc<AtomicBool>,
    stop_standbys: &Arc<AtomicBool>,
    standby: bool,
    start: Instant,
    kind: &str,
    count: usize,
) -> Vec<JoinHandle<()>> {
    (0..count)
        .map(|i| {
            let (cfg, state, finished) = (cfg.clone(), state.clone(), finished.clone());
            let stop = stop_standbys.clone();
            let role = format!("{kind}-{i}");
            thread::spawn(move || {
                let stop = standby.then_some(&*stop);
                worker(role, &cfg, &state, &finished, stop, start)
            })
        })
        .collect()
}

/// Redraws the progress until every share is finished (or the timeout),
/// killing the victim on the way; the run's time and whether it timed out.
fn watch(
    admin: &mut Client,
    cfg: &Config,
    state: &State,
    start: Instant,
) -> Result<(Duration, bool), String> {
    let mut display = Display::new();
    let mut killed = cfg.kill_at == 0.0;
    let mut timed_out = false;
    let mut gap = GapWatch::new(cfg);
    loop {
        thread::sleep(Duration::from_millis(100));
        if let Some(unfinished) = gap.check(admin, cfg, state)? {
            event(
                state,
                start,
                format!(
                    "UNSERVED  slot_status('{NAME}', {}) shows slots {unfinished:?} unserved for {:.0} s and no standby took them: \
                     {} workers + {} standbys cannot serve {} slots; stopping",
                    cfg.slots,
                    gap.limit.as_secs_f64(),
                    cfg.workers,
                    cfg.standbys,
                    cfg.slots
                ),
            );
            timed_out = true;
            break;
        }
        let (all_done, victim) = {
            let s = lock(state);
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
            kill(admin, state, cfg, &role, pid, start)?;
        }
        display.draw(state, start, false);
        if all_done {
            break;
        }
        if timeout(cfg, state, start) {
            timed_out = true;
            break;
        }
    }
    let elapsed = start.elapsed();
    display.draw(state, start, true);
    Ok((elapsed, timed_out))
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
