//! slot_counts stops soon after its client goes away: it turns on
//! client_connection_check_interval (pg_claim.client_connection_check_interval,
//! 1 s by default) for its own transaction and arms the check for the running
//! statement. The control shows that without it the orphaned backend counts
//! on to the end.

use pg_claim_sessions::{app_running, backend_of, connect, ms, psql, wait_for};
use std::thread;
use std::time::{Duration, Instant};

/// A view whose rows take 10 ms each: counting its 3,000 rows takes 30 s.
fn slow_view(c: &mut postgres::Client) {
    c.batch_execute(
        "CREATE OR REPLACE VIEW ic_slow AS
           SELECT g AS id FROM generate_series(1, 3000) g WHERE pg_sleep(0.01) IS NOT NULL",
    )
    .unwrap();
}

/// Start `SELECT * FROM slot_counts('ic_slow', 4, 'id')` in a psql client
/// named `app` (after `setup`), wait until its backend is counting, kill the
/// client, and return the backend's pid and the instant of the kill.
fn kill_client_while_counting(
    probe: &mut postgres::Client,
    app: &str,
    setup: &str,
) -> (i32, Instant) {
    let mut child = psql(
        app,
        &[
            "-c",
            setup,
            "-c",
            "SELECT * FROM slot_counts('ic_slow', 4, 'id')",
        ],
    );
    wait_for("the count to run", Duration::from_secs(10), || {
        app_running(probe, app, "%slot_counts%")
    });
    let pid = backend_of(probe, app).unwrap();
    let at = Instant::now();
    child.kill().unwrap();
    child.wait().unwrap();
    (pid, at)
}

#[test]
fn slot_counts_stops_when_its_client_dies() {
    let mut probe = connect("ic_probe");
    slow_view(&mut probe);
    let (_pid, killed) = kill_client_while_counting(&mut probe, "ic_victim", "SELECT 1");
    wait_for(
        "the orphaned count to stop",
        Duration::from_secs(20),
        || backend_of(&mut probe, "ic_victim").is_none(),
    );
    let took = killed.elapsed();
    println!(
        "slot_counts backend gone {} after its client was killed",
        ms(took)
    );
    assert!(
        took < Duration::from_millis(3000),
        "the orphaned count ran on for {took:?}; expected about 1 s"
    );
}

#[test]
fn without_the_check_the_orphaned_count_runs_on() {
    let mut probe = connect("ic_probe_control");
    slow_view(&mut probe);
    let (pid, _) = kill_client_while_counting(
        &mut probe,
        "ic_control",
        "SET pg_claim.client_connection_check_interval = 0",
    );
    thread::sleep(Duration::from_millis(3000)); // longer than the check takes
    assert_eq!(
        backend_of(&mut probe, "ic_control"),
        Some(pid),
        "without the check the orphaned backend is still counting"
    );
    probe
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    wait_for("orphan gone", Duration::from_secs(10), || {
        backend_of(&mut probe, "ic_control").is_none()
    });
}
