//! Standby takeover: a standby blocked in claim_slot(name, n, wait) gets the
//! slot when the holder's session ends, whatever the way it ends. Each test
//! prints the measured latency from the holder's end to the standby's return.

use pg_claim_sessions::{
    app_running, backend_of, backend_pid, connect, ms, psql, running, wait_for,
};
use postgres::Client;
use std::io::Write;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Start a standby in its own session and thread; returns its pid and a
/// receiver for (slot, instant it returned).
fn start_standby(name: &'static str, n: i32) -> (i32, mpsc::Receiver<(Option<i32>, Instant)>) {
    let (tx, rx) = mpsc::channel();
    let (pid_tx, pid_rx) = mpsc::channel();
    thread::spawn(move || {
        let mut c = connect(&format!("{name}_standby"));
        pid_tx.send(backend_pid(&mut c)).unwrap();
        let slot: Option<i32> = c
            .query_one("SELECT claim_slot($1, $2, '60 s')", &[&name, &n])
            .unwrap()
            .get(0);
        let at = Instant::now();
        tx.send((slot, at)).unwrap();
        // keep the session (and the slot) until the test is done with it
        thread::sleep(Duration::from_millis(300));
    });
    let pid = pid_rx.recv().unwrap();
    let mut probe = connect(&format!("{name}_probe"));
    wait_for(
        "standby blocked in claim_slot",
        Duration::from_secs(10),
        || running(&mut probe, pid, "%claim_slot%"),
    );
    (pid, rx)
}

fn holder_pid(c: &mut Client, name: &str, app: &str) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM slot_holders($1) WHERE application_name = $2",
        &[&name, &app],
    )
    .unwrap()
    .map(|r| r.get(0))
}

#[test]
fn takeover_after_pg_terminate_backend() {
    let name = "ct_term";
    let mut holder = connect("ct_term_holder");
    let s: Option<i32> = holder
        .query_one("SELECT claim_slot($1, 1)", &[&name])
        .unwrap()
        .get(0);
    assert_eq!(s, Some(0));
    let hpid = backend_pid(&mut holder);
    let (_spid, rx) = start_standby(name, 1);
    assert!(
        rx.try_recv().is_err(),
        "standby must wait while the slot is held"
    );

    let mut admin = connect("ct_term_admin");
    let t0 = Instant::now();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&hpid])
        .unwrap();
    let (slot, at) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(slot, Some(0));
    let latency = at.duration_since(t0);
    println!("takeover after pg_terminate_backend: {}", ms(latency));
    assert!(latency < Duration::from_secs(5));
}

/// Wait until the slot holder of `name` with `application_name` `app` is
/// running its pg_sleep.
fn wait_until_holder_sleeps(probe: &mut Client, name: &str, app: &str) {
    wait_for("holder inside pg_sleep", Duration::from_secs(10), || {
        probe
            .query_one(
                "SELECT count(*) = 1 FROM slot_holders($1) h JOIN pg_stat_activity a USING (pid)
                 WHERE h.application_name = $2 AND a.query LIKE '%pg_sleep%' AND a.state = 'active'",
                &[&name, &app],
            )
            .unwrap()
            .get(0)
    });
}

#[test]
fn takeover_after_kill_9_of_idle_client() {
    let name = "ct_idle";
    let app = "ct_idle_victim";
    let mut child = psql(app, &[]);
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"SELECT claim_slot('ct_idle', 1);\n")
        .unwrap();
    let mut probe = connect("ct_idle_probe");
    wait_for(
        "client process holds the slot",
        Duration::from_secs(10),
        || holder_pid(&mut probe, name, app).is_some(),
    );
    let hpid = holder_pid(&mut probe, name, app).unwrap();
    wait_for("holder idle", Duration::from_secs(10), || {
        probe
            .query_one(
                "SELECT state = 'idle' FROM pg_stat_activity WHERE pid = $1",
                &[&hpid],
            )
            .unwrap()
            .get(0)
    });
    let (_spid, rx) = start_standby(name, 1);

    let t0 = Instant::now();
    child.kill().unwrap(); // SIGKILL: the client dies without a word
    child.wait().unwrap();
    let (slot, at) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(slot, Some(0));
    let latency = at.duration_since(t0);
    println!("takeover after kill -9 of an idle client: {}", ms(latency));
    assert!(latency < Duration::from_secs(5));
}

/// Holder's client killed while its backend is inside a long query: without
/// a connection check PostgreSQL would notice only when pg_sleep(600) ends;
/// with claim_slot's default (pg_claim.client_connection_check_interval = 1s)
/// the backend notices within about a second.
#[test]
fn takeover_after_kill_9_of_client_during_long_query() {
    let name = "ct_busy";
    let app = "ct_busy_victim";
    let mut child = psql(
        app,
        &[
            "-c",
            "SELECT claim_slot('ct_busy', 1)",
            "-c",
            "SELECT pg_sleep(600)",
        ],
    );
    let mut probe = connect("ct_busy_probe");
    wait_until_holder_sleeps(&mut probe, name, app);
    let (_spid, rx) = start_standby(name, 1);

    let t0 = Instant::now();
    child.kill().unwrap();
    child.wait().unwrap();
    let (slot, at) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(slot, Some(0));
    let latency = at.duration_since(t0);
    println!(
        "takeover after kill -9 of a client whose backend runs pg_sleep(600): {}",
        ms(latency)
    );
    assert!(
        latency < Duration::from_millis(2500),
        "dead client noticed after {latency:?}; expected about 1 s"
    );
}

/// The control: with the check disabled the orphaned backend keeps the slot
/// for as long as its query runs. This is why claim_slot enables it.
#[test]
fn without_connection_check_a_busy_orphan_keeps_its_slot() {
    let name = "ct_nocheck";
    let app = "ct_nocheck_victim";
    let mut child = psql(
        app,
        &[
            "-c",
            "SET pg_claim.client_connection_check_interval = 0",
            "-c",
            "SELECT claim_slot('ct_nocheck', 1)",
            "-c",
            "SELECT pg_sleep(600)",
        ],
    );
    let mut probe = connect("ct_nocheck_probe");
    wait_until_holder_sleeps(&mut probe, name, app);
    let hpid = holder_pid(&mut probe, name, app).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    thread::sleep(Duration::from_millis(2500)); // deliberately longer than the 1 s the check takes
    assert_eq!(
        holder_pid(&mut probe, name, app),
        Some(hpid),
        "without the check the orphaned backend still holds the slot"
    );
    probe
        .execute("SELECT pg_terminate_backend($1)", &[&hpid])
        .unwrap();
    wait_for("orphan gone", Duration::from_secs(10), || {
        holder_pid(&mut probe, name, app).is_none()
    });
}

/// A standby whose client dies while it waits inside claim_slot(name, n, wait)
/// goes away within about a second too: claim_slot arms the connection check
/// for its own statement, not only for later ones.
#[test]
fn waiting_standby_with_dead_client_goes_away() {
    let name = "ct_deadstandby";
    let app = "ct_deadstandby_victim";
    let mut holder = connect("ct_deadstandby_holder");
    holder
        .execute("SELECT claim_slot($1, 1)", &[&name])
        .unwrap();
    let mut child = psql(
        app,
        &["-c", "SELECT claim_slot('ct_deadstandby', 1, '10 min')"],
    );
    let mut probe = connect("ct_deadstandby_probe");
    wait_for("standby waiting", Duration::from_secs(10), || {
        app_running(&mut probe, app, "%claim_slot%")
    });
    let spid = backend_of(&mut probe, app).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = wait_for("standby backend exits", Duration::from_secs(5), || {
        probe
            .query_one(
                "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1",
                &[&spid],
            )
            .unwrap()
            .get(0)
    });
    println!("standby with a dead client left after {}", ms(gone));
    assert!(gone < Duration::from_millis(2500));
}
