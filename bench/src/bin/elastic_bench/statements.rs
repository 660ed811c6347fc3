//! Server time per statement during a timed window, where the server
//! loads `pg_stat_statements` (`shared_preload_libraries`); elsewhere the
//! benchmark goes without.

use postgres::Client;

/// Whether `pg_stat_statements` can be used in the connected database
/// (created if missing).
pub fn available(admin: &mut Client) -> bool {
    admin
        .batch_execute(
            "SET client_min_messages = warning;
             CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
             RESET client_min_messages",
        )
        .and_then(|_| admin.batch_execute("SELECT pg_stat_statements_reset()"))
        .is_ok()
}

/// Forgets every statement counted so far.
pub fn reset(admin: &mut Client) -> Result<(), postgres::Error> {
    admin.batch_execute("SELECT pg_stat_statements_reset()")
}

/// A statement's kind as the report names it.
fn kind(query: &str) -> String {
    let q = query.trim_start();
    let named = [
        ("claim_leases", "claim_leases"),
        ("my_items", "my_items"),
        ("lease_valid", "UPDATE behind lease_valid"),
        ("fence(", "fence"),
        ("SET vt", "queue claim (UPDATE vt)"),
        ("FOR UPDATE SKIP LOCKED", "SELECT FOR UPDATE SKIP LOCKED"),
        ("SET done", "UPDATE done"),
    ];
    for (needle, name) in named {
        if q.contains(needle) {
            return name.to_string();
        }
    }
    q.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// "kind mean ms x calls/s" of the statements of the connected database
/// counted since the last reset, by total time, largest first; with the
/// server time summed per second of the window.
pub fn summary(admin: &mut Client, seconds: f64) -> Result<String, postgres::Error> {
    let rows = admin.query(
        "SELECT query, calls, total_exec_time FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND query NOT LIKE '%pg_stat%' AND query NOT LIKE 'SET application_name%' AND calls > 0
          ORDER BY total_exec_time DESC LIMIT 8",
        &[],
    )?;
    let mut total = 0.0;
    let parts: Vec<String> = rows
        .iter()
        .map(|r| {
            let (q, calls, ms): (String, i64, f64) = (r.get(0), r.get(1), r.get(2));
            total += ms;
            format!(
                "{} {:.3} ms x {:.0}/s",
                kind(&q),
                ms / calls as f64,
                calls as f64 / seconds
            )
        })
        .collect();
    Ok(format!(
        "server time per statement (pg_stat_statements, mean x calls per second): {}; in all {:.0}% of one core",
        parts.join(", "),
        total / seconds / 10.0
    ))
}

#[cfg(test)]
mod tests {
    use super::kind;

    #[test]
    fn kinds() {
        assert_eq!(kind("SELECT fence($1, $2, $3)"), "fence");
        assert_eq!(
            kind("SELECT slot, token FROM claim_leases($1, $2, $3, ttl => $4)"),
            "claim_leases"
        );
        assert_eq!(
            kind("UPDATE t SET done = true WHERE id = ANY($1::bigint[]) AND NOT done"),
            "UPDATE done"
        );
        assert_eq!(kind("BEGIN"), "BEGIN");
    }
}
