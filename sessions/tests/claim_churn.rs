//! Churn: many sessions claim, hold, work, release or die abruptly for a
//! bounded time. Every unit of work a holder does is logged with the server's
//! clock, inside the statement, only while my_slot() confirms the slot. The
//! test asserts that no two logged intervals of one slot overlap and that every
//! slot kept being served (bounded gaps).

use pg_claim_sessions::{connect, connect_with};
use rand::Rng;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const NAME: &str = "cc_churn";
const SLOTS: i32 = 4;
const WORKERS: usize = 12;
const RUN: Duration = Duration::from_secs(10);

#[test]
fn churn_never_overlaps_and_keeps_every_slot_served() {
    let mut setup = connect_with(
        "cc_setup",
        "DROP TABLE IF EXISTS cc_churn_log;
             CREATE UNLOGGED TABLE cc_churn_log (
                 slot int NOT NULL, pid int NOT NULL, hold text NOT NULL,
                 t0 timestamptz NOT NULL, t1 timestamptz NOT NULL);
             CREATE OR REPLACE FUNCTION cc_churn_work(s int, hold text) RETURNS boolean
             LANGUAGE plpgsql AS $$
             DECLARE t0 timestamptz := clock_timestamp();
             BEGIN
                 IF my_slot('cc_churn') IS DISTINCT FROM s THEN
                     RETURN false;
                 END IF;
                 PERFORM pg_sleep(0.002 + random() * 0.004);
                 INSERT INTO cc_churn_log VALUES (s, pg_backend_pid(), hold, t0, clock_timestamp());
                 RETURN true;
             END $$;",
    );
    let start: std::time::SystemTime = setup
        .query_one("SELECT clock_timestamp()", &[])
        .unwrap()
        .get(0);

    let stop = Arc::new(AtomicBool::new(false));
    let holds = Arc::new(AtomicUsize::new(0));
    let kills = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for w in 0..WORKERS {
        let stop = stop.clone();
        let holds = holds.clone();
        handles.push(thread::spawn(move || worker(w, stop, holds)));
    }
    // A killer that terminates a random holder now and then (abrupt death).
    let killer = {
        let stop = stop.clone();
        let kills = kills.clone();
        thread::spawn(move || {
            let mut c = connect("cc_killer");
            let mut rng = rand::thread_rng();
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(rng.gen_range(50..250)));
                let n: i64 = c
                    .query_one(
                        "SELECT count(pg_terminate_backend(pid)) FROM
                           (SELECT pid FROM slot_holders($1) ORDER BY random() LIMIT 1) h",
                        &[&NAME],
                    )
                    .unwrap()
                    .get(0);
                kills.fetch_add(n as usize, Ordering::Relaxed);
            }
        })
    };
    thread::sleep(RUN);
    stop.store(true, Ordering::Relaxed);
    killer.join().unwrap();
    for h in handles {
        h.join().unwrap();
    }
    let end: std::time::SystemTime = setup
        .query_one("SELECT clock_timestamp()", &[])
        .unwrap()
        .get(0);

    let row = setup
        .query_one(
            "SELECT count(*), count(DISTINCT hold) FROM cc_churn_log",
            &[],
        )
        .unwrap();
    let (intervals, logged_holds): (i64, i64) = (row.get(0), row.get(1));
    let overlaps: i64 = setup
        .query_one(
            "SELECT count(*) FROM cc_churn_log a JOIN cc_churn_log b
               ON a.slot = b.slot AND a.ctid < b.ctid
              AND a.t0 < b.t1 AND b.t0 < a.t1",
            &[],
        )
        .unwrap()
        .get(0);
    // Longest time each slot went without logged work, including the edges.
    let gaps = setup
        .query(
            "WITH s AS (SELECT generate_series(0, $1 - 1) AS slot),
                  e AS (SELECT slot, t0, t1 FROM cc_churn_log
                        UNION ALL SELECT slot, $2::timestamptz, $2::timestamptz FROM s
                        UNION ALL SELECT slot, $3::timestamptz, $3::timestamptz FROM s),
                  g AS (SELECT slot, t0 - max(t1) OVER (PARTITION BY slot ORDER BY t0
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS gap
                        FROM e)
             SELECT slot, extract(epoch FROM max(gap))::float8, count(*) - 2
             FROM g GROUP BY slot ORDER BY slot",
            &[&SLOTS, &start, &end],
        )
        .unwrap();
    println!(
        "churn: {WORKERS} workers, {SLOTS} slots, {:?}: {} holds claimed, {logged_holds} holds with logged work, \
         {intervals} work intervals checked, {} holders terminated, {overlaps} overlaps",
        RUN,
        holds.load(Ordering::Relaxed),
        kills.load(Ordering::Relaxed)
    );
    for g in &gaps {
        let (slot, gap, n): (i32, f64, i64) = (g.get(0), g.get(1), g.get(2));
        println!(
            "  slot {slot}: {n} intervals, longest gap without a holder at work {:.0} ms",
            gap * 1000.0
        );
    }
    assert_eq!(
        overlaps, 0,
        "two sessions worked on one slot at the same time"
    );
    assert_eq!(gaps.len(), SLOTS as usize);
    assert!(
        logged_holds > 50,
        "too little churn to be meaningful: {logged_holds}"
    );
    assert!(kills.load(Ordering::Relaxed) > 5);
    for g in &gaps {
        let (slot, gap, n): (i32, f64, i64) = (g.get(0), g.get(1), g.get(2));
        assert!(n > 20, "slot {slot} served only {n} times");
        assert!(
            gap < 3.0,
            "slot {slot} went {gap:.2} s without a holder at work"
        );
    }
    setup
        .batch_execute("DROP TABLE cc_churn_log; DROP FUNCTION cc_churn_work(int, text);")
        .unwrap();
}

/// One worker: connect, claim (standby wait), work a few units, then release,
/// disconnect without releasing, or get terminated by the killer; repeat.
fn worker(w: usize, stop: Arc<AtomicBool>, holds: Arc<AtomicUsize>) {
    let mut rng = rand::thread_rng();
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut c = connect(&format!("cc_worker_{w}"));
        'session: while !stop.load(Ordering::Relaxed) {
            let slot: Option<i32> =
                match c.query_one("SELECT claim_slot($1, $2, '200 ms')", &[&NAME, &SLOTS]) {
                    Ok(r) => r.get(0),
                    Err(_) => break 'session, // terminated while waiting
                };
            let Some(slot) = slot else { continue };
            holds.fetch_add(1, Ordering::Relaxed);
            seq += 1;
            let hold = format!("{w}.{seq}");
            loop {
                for _ in 0..rng.gen_range(1..15) {
                    match c.query_one("SELECT cc_churn_work($1, $2)", &[&slot, &hold]) {
                        Ok(r) => assert!(r.get::<_, bool>(0), "my_slot lost the slot while held"),
                        Err(_) => break 'session, // terminated: the slot died with the session
                    }
                }
                if stop.load(Ordering::Relaxed) {
                    break 'session;
                }
                match rng.gen_range(0..3) {
                    0 => {
                        // orderly release, stay connected and claim again
                        match c.query_one("SELECT release_slot($1)", &[&NAME]) {
                            Ok(r) => assert!(r.get::<_, bool>(0)),
                            Err(_) => break 'session,
                        }
                        continue 'session;
                    }
                    1 => break 'session, // disconnect without releasing
                    _ => {
                        // keep holding: a re-claim is idempotent
                        match c.query_one("SELECT claim_slot($1, $2)", &[&NAME, &SLOTS]) {
                            Ok(r) => assert_eq!(r.get::<_, Option<i32>>(0), Some(slot)),
                            Err(_) => break 'session,
                        }
                    }
                }
            }
        }
        drop(c);
    }
}
