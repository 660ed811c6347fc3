//! Connections: every session of the demo, the benchmarks and the tests is
//! opened by [`connect`] (or [`session`], its form that stops at a failure),
//! with an `application_name` so it can be recognised in `pg_stat_activity`
//! and `slot_holders()`.

use crate::error::{describe, sqlstate};
use postgres::{Client, NoTls};

/// The connection string: `explicit` (a `--dsn` option, a test's variable) if
/// given, else built from the standard `PGHOST`, `PGPORT`, `PGUSER` and
/// `PGDATABASE` variables (database `postgres` by default), as
/// `scripts/lib.sh` exports them.
pub fn dsn_from_env(explicit: Option<&str>) -> String {
    if let Some(d) = explicit {
        return d.to_string();
    }
    let mut parts = Vec::new();
    for (var, key) in [("PGHOST", "host"), ("PGPORT", "port"), ("PGUSER", "user")] {
        if let Ok(v) = std::env::var(var) {
            parts.push(format!("{key}='{}'", quote(&v)));
        }
    }
    let db = std::env::var("PGDATABASE").unwrap_or_else(|_| "postgres".to_string());
    parts.push(format!("dbname='{}'", quote(&db)));
    parts.join(" ")
}

/// A value inside single quotes of a connection string.
fn quote(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\'', "\\'")
}

/// A new connection to `dsn` with `application_name` set.
pub fn connect(dsn: &str, application_name: &str) -> Result<Client, postgres::Error> {
    Client::connect(
        &format!("{dsn} application_name='{}'", quote(application_name)),
        NoTls,
    )
}

/// Creates the extension `name` in the connected database if it is missing,
/// without a notice when it exists. Two sessions racing to create it: the
/// loser sees a unique violation (23505); the extension exists either way.
pub fn ensure_extension(c: &mut Client, name: &str) -> Result<(), postgres::Error> {
    c.batch_execute("SET client_min_messages = warning")?;
    let created = c.batch_execute(&format!("CREATE EXTENSION IF NOT EXISTS {name}"));
    c.batch_execute("RESET client_min_messages")?;
    match created {
        Err(e) if sqlstate(&e) == "23505" => Ok(()),
        r => r,
    }
}

/// For the tests and the benchmarks, which stop at the first failure: a
/// connection with pg_claim created, or a panic that names the server and
/// the error.
pub fn session(dsn: &str, application_name: &str) -> Client {
    let mut c = connect(dsn, application_name)
        .unwrap_or_else(|e| panic!("cannot connect to {dsn}: {}", describe(&e)));
    ensure_extension(&mut c, "pg_claim")
        .unwrap_or_else(|e| panic!("CREATE EXTENSION pg_claim: {}", describe(&e)));
    c
}

/// The backend pid of a session.
pub fn backend_pid(c: &mut Client) -> Result<i32, postgres::Error> {
    Ok(c.query_one("SELECT pg_backend_pid()", &[])?.get(0))
}

/// Whether the backend `pid` is running a statement whose text matches the
/// `LIKE` pattern `query_like` (`'%'` for any), as another session sees it.
pub fn is_active(c: &mut Client, pid: i32, query_like: &str) -> Result<bool, postgres::Error> {
    Ok(c.query_one(
        "SELECT count(*) = 1 FROM pg_stat_activity
          WHERE pid = $1 AND state = 'active' AND query LIKE $2",
        &[&pid, &query_like],
    )?
    .get(0))
}
