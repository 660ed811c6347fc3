//! Takeover latency: a standby blocked in claim_slot(name, 1, wait); the
//! holder is terminated (pg_terminate_backend) or releases its slot, and the
//! time until the standby's claim returns to its client is measured.

use crate::connect;
use pg_claim_support::{backend_pid, is_active, percentile, wait_for};
use postgres::Client;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

pub fn run(takeovers: usize) {
    println!();
    println!("takeover latency, {takeovers} takeovers each: holder ends -> standby's claim_slot(name, 1, '10 s') returns to its client");
    let mut admin = connect("bench_admin");
    let mut p50 = Vec::new();
    for mode in ["pg_terminate_backend", "release_slot"] {
        let mut lat: Vec<f64> = (0..takeovers)
            .map(|i| takeover_ms(&mut admin, mode, i))
            .collect();
        lat.sort_by(f64::total_cmp);
        let [p_50, p_90, p_99, max] =
            [50.0, 90.0, 99.0, 100.0].map(|p| percentile(&lat, p).unwrap_or(f64::NAN));
        println!(
            "  after {mode:21} p50 {p_50:6.2} ms  p90 {p_90:6.2} ms  p99 {p_99:6.2} ms  max {max:6.2} ms"
        );
        p50.push(p_50);
    }
    println!(
        "ratio: takeover p50 after pg_terminate_backend / after release_slot = {:.2}x",
        p50[0] / p50[1]
    );
}

/// One takeover, the `i`-th after the holder's end by `mode`: milliseconds
/// from the holder's end to the standby's claim returning.
fn takeover_ms(admin: &mut Client, mode: &str, i: usize) -> f64 {
    let name = format!("bench_takeover_{mode}_{i}");
    let mut h = connect("bench_takeover_holder");
    let hpid = backend_pid(&mut h).unwrap();
    let s: Option<i32> = h
        .query_one("SELECT claim_slot($1, 1)", &[&name])
        .unwrap()
        .get(0);
    assert_eq!(s, Some(0));
    let (tx, rx) = mpsc::channel();
    let (ptx, prx) = mpsc::channel();
    let sname = name.clone();
    let standby = thread::spawn(move || {
        let mut s = connect("bench_takeover_standby");
        ptx.send(backend_pid(&mut s).unwrap()).unwrap();
        let got: Option<i32> = s
            .query_one("SELECT claim_slot($1, 1, '10 s')", &[&sname])
            .unwrap()
            .get(0);
        tx.send((got, Instant::now())).unwrap();
    });
    let spid = prx.recv().unwrap();
    // wait until the standby is inside claim_slot, then a little more so
    // its poll interval has grown to its maximum (the steady state)
    wait_for(
        "the standby inside claim_slot",
        Duration::from_secs(10),
        || is_active(admin, spid, "%claim_slot%").unwrap(),
    );
    thread::sleep(Duration::from_millis(30 + (i as u64 * 7) % 13));
    let t0 = Instant::now();
    if mode == "pg_terminate_backend" {
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&hpid])
            .unwrap();
    } else {
        h.query_one("SELECT release_slot($1)", &[&name]).unwrap();
    }
    let (got, at) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(got, Some(0));
    standby.join().unwrap();
    at.duration_since(t0).as_secs_f64() * 1000.0
}
