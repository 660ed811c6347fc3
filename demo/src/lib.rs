//! Shared helpers for pg_claim's demo worker fleet (`pg_claim_demo`) and its
//! queue benchmark (`queue_bench`): option parsing, connections, number
//! formatting and percentiles.

use postgres::{Client, NoTls};
use std::collections::HashMap;
use std::time::Duration;

/// Command-line options of the form `--name value` or `--name=value`, plus
/// boolean flags (`--name` alone).
#[derive(Debug, Default)]
pub struct Opts {
    values: HashMap<String, String>,
}

impl Opts {
    /// Parses `args` (without the program name). `flags` are the options that
    /// take no value; every other option needs one.
    pub fn parse(args: impl IntoIterator<Item = String>, flags: &[&str]) -> Result<Opts, String> {
        let mut values = HashMap::new();
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            let Some(body) = a.strip_prefix("--") else {
                return Err(format!("unexpected argument {a:?}"));
            };
            if let Some((k, v)) = body.split_once('=') {
                values.insert(k.to_string(), v.to_string());
            } else if flags.contains(&body) {
                values.insert(body.to_string(), "true".to_string());
            } else {
                let v = it
                    .next()
                    .ok_or_else(|| format!("option --{body} needs a value"))?;
                values.insert(body.to_string(), v);
            }
        }
        Ok(Opts { values })
    }

    /// Fails when an option outside `known` was given.
    pub fn check_known(&self, known: &[&str]) -> Result<(), String> {
        for k in self.values.keys() {
            if !known.contains(&k.as_str()) {
                return Err(format!("unknown option --{k}"));
            }
        }
        Ok(())
    }

    /// The option's value parsed as `T`, or `default` when absent.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.values.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("invalid value for --{name}: {v:?}")),
        }
    }

    /// The option's raw value, if given.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether the flag was given.
    pub fn flag(&self, name: &str) -> bool {
        self.values.get(name).is_some_and(|v| v == "true")
    }
}

/// Parses a comma-separated list of positive integers, e.g. `1,2,4,8`.
pub fn parse_list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("invalid list element {x:?} in {s:?}"))
        })
        .collect()
}

/// The connection string: `--dsn` if given, else built from the standard
/// `PGHOST`, `PGPORT`, `PGUSER` and `PGDATABASE` variables (database
/// `postgres` by default), as `scripts/lib.sh` exports them.
pub fn dsn_from_env(explicit: Option<&str>) -> String {
    if let Some(d) = explicit {
        return d.to_string();
    }
    let mut parts = Vec::new();
    for (var, key) in [("PGHOST", "host"), ("PGPORT", "port"), ("PGUSER", "user")] {
        if let Ok(v) = std::env::var(var) {
            parts.push(format!(
                "{key}='{}'",
                v.replace('\\', "\\\\").replace('\'', "\\'")
            ));
        }
    }
    let db = std::env::var("PGDATABASE").unwrap_or_else(|_| "postgres".to_string());
    parts.push(format!("dbname='{}'", db.replace('\'', "\\'")));
    parts.join(" ")
}

/// A new connection with `application_name` set, so it shows in
/// `pg_stat_activity` and `slot_holders()`.
pub fn connect(dsn: &str, application_name: &str) -> Result<Client, postgres::Error> {
    Client::connect(
        &format!("{dsn} application_name='{application_name}'"),
        NoTls,
    )
}

/// `12345678` → `12,345,678`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Milliseconds with three significant-ish digits.
pub fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else if v >= 10.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.2} ms")
    }
}

/// The `p`-th percentile (0..=100) of `sorted` by the nearest-rank method;
/// `None` for an empty slice.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opts_parse_values_and_flags() {
        let o = Opts::parse(
            ["--items", "10", "--workers=3", "--no-kill"].map(String::from),
            &["no-kill"],
        )
        .unwrap();
        assert_eq!(o.get("items", 0usize).unwrap(), 10);
        assert_eq!(o.get("workers", 0usize).unwrap(), 3);
        assert_eq!(o.get("standbys", 7usize).unwrap(), 7);
        assert!(o.flag("no-kill"));
        assert!(o.check_known(&["items", "workers", "no-kill"]).is_ok());
        assert!(o.check_known(&["items"]).is_err());
        assert!(o.get("items", 0u8).is_ok());
        assert!(Opts::parse(["--items".to_string()], &[]).is_err());
        assert!(Opts::parse(["items".to_string()], &[]).is_err());
        let bad = Opts::parse(["--items=x".to_string()], &[]).unwrap();
        assert!(bad.get("items", 0usize).is_err());
    }

    #[test]
    fn lists_and_numbers() {
        assert_eq!(parse_list("1, 2,4").unwrap(), vec![1, 2, 4]);
        assert!(parse_list("1,0").is_err());
        assert!(parse_list("a").is_err());
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(12345678), "12,345,678");
    }

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 95.0), Some(95.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
    }
}
