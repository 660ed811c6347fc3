//! Helpers for pg_claim's multi-session tests.
//!
//! The tests run against a real, already running server with pg_claim
//! available; `scripts/test` starts a throwaway cluster and passes its address
//! in `PG_CLAIM_TEST_DSN`. Each test file creates its own database objects with
//! unique names, so test files do not interfere with each other. Connections,
//! errors and polling come from `pg_claim_support`, shared with the demo and
//! the benchmarks.

use pg_claim_support::describe;
pub use pg_claim_support::{ms, sqlstate, wait_for};
use postgres::Client;
use std::process::{Child, Command, Stdio};

/// The connection string of the server under test.
pub fn dsn() -> String {
    std::env::var("PG_CLAIM_TEST_DSN").unwrap_or_else(|_| {
        panic!("PG_CLAIM_TEST_DSN is not set: run these tests through scripts/test, which starts a server")
    })
}

/// A new session, with `application_name` set so it can be recognised in
/// `pg_stat_activity`, and the extension created if it is missing.
pub fn connect(application_name: &str) -> Client {
    pg_claim_support::session(&dsn(), application_name)
}

/// The backend pid of a session.
pub fn backend_pid(c: &mut Client) -> i32 {
    pg_claim_support::backend_pid(c).unwrap()
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

/// Whether the backend `pid` is running a statement that matches the `LIKE`
/// pattern `query_like` (a standby inside `claim_slot`, a long count).
pub fn running(c: &mut Client, pid: i32, query_like: &str) -> bool {
    pg_claim_support::is_active(c, pid, query_like).unwrap()
}

/// [`running`] for the backend of the client named `app`, if it is there.
pub fn app_running(c: &mut Client, app: &str, query_like: &str) -> bool {
    backend_of(c, app).is_some_and(|pid| running(c, pid, query_like))
}

/// [`connect`], then `setup` run in the new session: its settings, or the
/// tables a test starts from.
pub fn connect_with(application_name: &str, setup: &str) -> Client {
    let mut c = connect(application_name);
    c.batch_execute(setup)
        .unwrap_or_else(|e| panic!("{application_name}: {}: {setup}", describe(&e)));
    c
}
