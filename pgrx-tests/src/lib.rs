//! Helpers for pg_claim's multi-session tests.
//!
//! The tests run against a real, already running server with pg_claim
//! available; `scripts/test` starts a throwaway cluster and passes its address
//! in `PG_CLAIM_TEST_DSN`. Each test file creates its own database objects with
//! unique names, so test files do not interfere with each other.

use postgres::{Client, NoTls};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The connection string of the server under test.
pub fn dsn() -> String {
    std::env::var("PG_CLAIM_TEST_DSN").unwrap_or_else(|_| {
        panic!("PG_CLAIM_TEST_DSN is not set: run these tests through scripts/test, which starts a server")
    })
}

/// A new session, with `application_name` set so it can be recognised in
/// `pg_stat_activity`, and the extension created if it is missing.
pub fn connect(application_name: &str) -> Client {
    let mut c = Client::connect(
        &format!("{} application_name={application_name}", dsn()),
        NoTls,
    )
    .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", dsn()));
    c.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_claim")
        .or_else(|e| {
            // Two sessions racing to create the extension: the loser sees a
            // unique violation; the extension exists either way.
            if e.code().map(|c| c.code()) == Some("23505") {
                Ok(())
            } else {
                Err(e)
            }
        })
        .expect("create extension");
    c
}

/// The backend pid of a session.
pub fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// Poll `cond` every few milliseconds until it is true or `timeout` passes.
/// Returns the time it took, or panics with `what` on timeout.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SQLSTATE of a failed statement, or "" when it has none.
pub fn sqlstate(e: &postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

/// A `psql` client process on the server under test, running `args` (for
/// example `-c` statements) with `application_name` set; killing it kills a
/// real client whose backend may still be busy.
pub fn psql(application_name: &str, args: &[&str]) -> Child {
    Command::new("psql")
        .arg("-X")
        .arg("-q")
        .arg(format!("{} application_name={application_name}", dsn()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("psql must be installed (postgresql-client)")
}

/// The pid of the backend whose `application_name` is `app`, if it is there.
pub fn backend_of(c: &mut Client, app: &str) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .unwrap()
    .map(|r| r.get(0))
}
