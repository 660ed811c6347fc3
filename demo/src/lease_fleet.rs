//! The coordinator of lease mode, an elastic fleet: starts fewer workers
//! than slots (each calls `claim_leases` for its share by remaining work,
//! reporting each slot's weight with `report_backlog`), shows the
//! shares as `lease_holders` has them whenever they change, starts one more
//! worker and lets another leave mid-run, has one worker pause past its TTL,
//! then stops the fleet (every worker gives its slots back) and has the
//! processing log checked.

use crate::check::check;
use crate::config::{Config, NAME};
use crate::display::Display;
use crate::lease_worker::{self, Handle, END, LEAVE, RUN};
use crate::state::{event, lock, State};
use crate::table::{print_leases, print_status};
use crate::watch::{timeout, GapWatch};
use pg_claim_support::{describe, ms};
use postgres::Client;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

pub fn run(
    cfg: &Config,
    admin: &mut Client,
    state: &State,
    start: Instant,
) -> Result<bool, String> {
    print_lease_mode(cfg);
    let mut workers: Vec<Handle> = (0..cfg.workers)
        .map(|i| lease_worker::spawn(format!("worker-{i}"), cfg, state, start))
        .collect();
    let watched = watch(admin, cfg, state, start, &mut workers);
    if watched.is_ok() {
        print_leases(admin, "leases at the end").ok();
        print_status(admin, cfg).ok();
    }
    // Every worker finishes its batch and gives its slots back.
    for w in &workers {
        w.stop.store(END, Ordering::SeqCst);
    }
    for w in workers {
        let _ = w.thread.join();
    }
    let (elapsed, timed_out) = watched?;
    // A given-back lease expires at once (lease_holders keeps showing its
    // last holder, expired): none may be live once every worker has left.
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM lease_holders($1) WHERE NOT expired AND slot < $2",
            &[&NAME, &(cfg.slots as i32)],
        )
        .map_err(|e| format!("lease_holders: {}", describe(&e)))?
        .get(0);
    println!(
        "live leases after every worker called claim_leases(..., max => 0): \
         SELECT count(*) FROM lease_holders('{NAME}') WHERE NOT expired -> {left}"
    );
    let failures = lock(state).failures.clone();
    let verdict = check(admin, cfg, elapsed, state, Some(left))?;
    for f in &failures {
        println!("worker error: {f}");
    }
    Ok(verdict && failures.is_empty() && !timed_out)
}

/// What the run does, before it starts.
fn print_lease_mode(cfg: &Config) {
    let ttl = cfg.ttl.as_secs_f64();
    println!(
        "lease mode: {} workers for {} slots; each calls claim_leases('{NAME}', {}, holder, ttl => {ttl} s) every {} \
         for its share by remaining work and writes each batch behind fence(), reporting the slot's rows left \
         with report_backlog() (a slot wanted elsewhere is given back after the batch)",
        cfg.workers,
        cfg.slots,
        cfg.slots,
        ms(cfg.ttl / 3)
    );
    println!("  workers connect to: {}", cfg.worker_dsn);
    if cfg.join_at > 0.0 {
        println!(
            "  at {:.0}% of all items one more worker starts",
            100.0 * cfg.join_at
        );
    }
    if cfg.kill_at > 0.0 {
        println!(
            "  at {:.0}% of slot {}'s share, the worker about to write its next batch pauses for {:.2} s, its lease thread too",
            100.0 * cfg.kill_at,
            cfg.kill_slot,
            cfg.pause.as_secs_f64()
        );
    }
    if cfg.leave_at > 0.0 {
        println!(
            "  at {:.0}% of all items one worker leaves: claim_leases('{NAME}', {}, holder, max => 0)",
            100.0 * cfg.leave_at,
            cfg.slots
        );
    }
    println!(
        "  SHARES lines: SELECT holder, expired, array_agg(slot) FROM lease_holders('{NAME}') GROUP BY holder, expired, at each change"
    );
}

/// Redraws the progress until every share is finished (or the timeout),
/// with the shares at each change, the join, the pause and the leave on
/// the way; the run's time and whether it timed out.
fn watch(
    admin: &mut Client,
    cfg: &Config,
    state: &State,
    start: Instant,
    workers: &mut Vec<Handle>,
) -> Result<(Duration, bool), String> {
    let mut display = Display::new();
    let mut gap = GapWatch::new(cfg);
    let mut joined = cfg.join_at == 0.0;
    let mut leave_asked = cfg.leave_at == 0.0;
    let mut pause_asked = cfg.kill_at == 0.0;
    let mut shares_at = start;
    let mut timed_out = false;
    loop {
        thread::sleep(Duration::from_millis(50));
        if shares_at.elapsed() >= Duration::from_millis(200) {
            shares_at = Instant::now();
            let line = shares(admin, cfg)?;
            let mut s = lock(state);
            if line != s.shares {
                s.shares = line.clone();
                drop(s);
                event(state, start, format!("SHARES {line}"));
            }
        }
        if let Some(unfinished) = gap.check(admin, cfg, state)? {
            event(
                state,
                start,
                format!(
                    "UNSERVED  slot_status('{NAME}', {}) shows slots {unfinished:?} unserved for {:.0} s: \
                     no worker's claim_leases took them; stopping",
                    cfg.slots,
                    gap.limit.as_secs_f64(),
                ),
            );
            timed_out = true;
            break;
        }
        let (frac, all_done) = {
            let mut s = lock(state);
            let (done, total) = s
                .slots
                .iter()
                .fold((0, 0), |(d, t), v| (d + v.done, t + v.total));
            let k = &s.slots[cfg.kill_slot.min(s.slots.len() - 1)];
            if !pause_asked && k.done as f64 >= cfg.kill_at * k.total as f64 {
                // the worker that fetches the slot's next batch pauses
                pause_asked = true;
                s.pause_request = true;
            }
            // The run ends once the paused worker's late write was tried
            // and the leaving worker has left.
            let broken = !s.failures.is_empty();
            let settled = (cfg.kill_at == 0.0
                || s.late_write_rejected.is_some()
                || s.pause.is_none()
                || broken)
                && (cfg.leave_at == 0.0 || s.left.is_some() || broken);
            let all = s.slots.iter().all(|v| v.finished);
            (done as f64 / total.max(1) as f64, all && settled)
        };
        if !joined && frac >= cfg.join_at {
            joined = true;
            let role = format!("worker-{}", workers.len());
            let live = workers
                .iter()
                .filter(|w| w.stop.load(Ordering::SeqCst) == RUN)
                .count()
                + 1;
            event(
                state,
                start,
                format!(
                    "JOIN {role} starts at {:.0}% of all items; with {live} live holder{} the {} slots go by remaining work (by count: {})",
                    100.0 * frac,
                    if live == 1 { "" } else { "s" },
                    cfg.slots,
                    fair(cfg.slots, live)
                ),
            );
            workers.push(lease_worker::spawn(role, cfg, state, start));
        }
        if !leave_asked && frac >= cfg.leave_at {
            // The first running worker that did not pause leaves, once
            // another one is running and not paused (it takes the slots).
            let (paused, pausing) = {
                let s = lock(state);
                let role = s.pause.as_ref().map(|p| p.role.clone());
                let pausing = role.clone().filter(|_| s.late_write_rejected.is_none());
                (role, pausing)
            };
            let running: Vec<&Handle> = workers
                .iter()
                .filter(|w| w.stop.load(Ordering::SeqCst) == RUN)
                .collect();
            let awake = running
                .iter()
                .filter(|w| Some(&w.role) != pausing.as_ref())
                .count();
            if let Some(w) = running
                .iter()
                .find(|w| Some(&w.role) != paused.as_ref())
                .filter(|_| awake >= 2)
            {
                leave_asked = true;
                let live = running.len() - 1;
                event(
                    state,
                    start,
                    format!(
                        "LEAVING {} at {:.0}% of all items: it finishes its batch and gives its slots back; \
                         with {live} live holder{} the slots go by remaining work (by count: {})",
                        w.role,
                        100.0 * frac,
                        if live == 1 { "" } else { "s" },
                        fair(cfg.slots, live)
                    ),
                );
                w.stop.store(LEAVE, Ordering::SeqCst);
            }
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

/// The fair share of `n` slots among `h` holders: "2", or "2 or 3".
fn fair(n: usize, h: usize) -> String {
    let h = h.max(1);
    let (lo, hi) = (n / h, n.div_ceil(h));
    if lo == hi {
        format!("{lo} each")
    } else {
        format!("{lo} or {hi} each")
    }
}

/// The shares as `lease_holders` has them, by holder, with each holder's
/// expired leases apart (expired, or given back: a given-back lease expires
/// at once and keeps its last holder), and the slots without a lease row:
/// one line.
fn shares(admin: &mut Client, cfg: &Config) -> Result<String, String> {
    let rows = admin
        .query(
            "SELECT holder, coalesce(expired, false), array_agg(slot ORDER BY slot)
               FROM lease_holders($1)
              WHERE slot < $2
              GROUP BY 1, 2
              ORDER BY length(holder), holder, 2",
            &[&NAME, &(cfg.slots as i32)],
        )
        .map_err(|e| format!("lease_holders: {}", describe(&e)))?;
    let mut held = vec![false; cfg.slots];
    let mut parts: Vec<String> = Vec::new();
    for r in &rows {
        let (holder, expired, slots): (Option<String>, bool, Vec<i32>) =
            (r.get(0), r.get(1), r.get(2));
        for &s in &slots {
            if let Some(h) = held.get_mut(s as usize) {
                *h = true;
            }
        }
        let who = holder.unwrap_or_else(|| "(hidden)".into());
        // expired, or given back (a given-back lease expires at once)
        parts.push(if expired {
            format!("{who} expired {slots:?}")
        } else {
            format!("{who} {} {slots:?}", slots.len())
        });
    }
    let free: Vec<usize> = (0..cfg.slots).filter(|&s| !held[s]).collect();
    if !free.is_empty() {
        parts.push(format!("free {free:?}"));
    }
    Ok(parts.join(" | "))
}
