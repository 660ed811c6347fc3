//! Errors of the `postgres` crate, as the programs report and classify them.

/// A readable description of an error: the server's message, SQLSTATE and
/// hint when there is one (`postgres::Error`'s `Display` says only "db error").
pub fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => {
            let mut s = format!("{} (SQLSTATE {})", d.message(), d.code().code());
            if let Some(h) = d.hint() {
                s.push_str(&format!(", hint: {h}"));
            }
            s
        }
        None => e.to_string(),
    }
}

/// SQLSTATE of a failed statement, or "" when it has none.
pub fn sqlstate(e: &postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

/// Whether a statement failed because the session was terminated or its
/// connection is gone (what a worker sees after `pg_terminate_backend`).
pub fn is_connection_loss(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(c) => {
            let c = c.code();
            // 57P01 admin_shutdown, 57P02 crash_shutdown, 08xxx connection exceptions
            c == "57P01" || c == "57P02" || c.starts_with("08")
        }
        // An I/O error without SQLSTATE: the server closed the socket.
        None => e.as_db_error().is_none(),
    }
}
