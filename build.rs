//! Reads from the PostgreSQL headers this build compiles against what
//! pgrx's bindings leave out and what differs between major versions: the
//! id of the client connection check timeout (`TimeoutId` in
//! `utils/timeout.h`). The extension arms that timeout itself
//! (`backend::settings::apply_client_check`).

use pgrx_pg_config::{PgConfig, Pgrx};
use std::path::PathBuf;

/// The PostgreSQL major version this build is for, from the enabled
/// `pgNN` feature.
fn major() -> String {
    std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_PG").map(str::to_string))
        .find(|v| v.parse::<u16>().is_ok())
        .unwrap_or_else(|| panic!("enable one pgNN feature (pg15, pg16, pg18)"))
}

/// The server include directory of that version: the pg_config cargo-pgrx
/// passes in PGRX_PG_CONFIG_PATH, else the one `cargo pgrx init` recorded
/// for the version (as pgrx-pg-sys finds it).
fn includedir_server(major: &str) -> PathBuf {
    let config = match std::env::var("PGRX_PG_CONFIG_PATH") {
        Ok(path) => PgConfig::new_with_defaults(path.into()),
        Err(_) => {
            let label = format!("pg{major}");
            Pgrx::from_config()
                .and_then(|pgrx| pgrx.get(&label))
                .unwrap_or_else(|e| panic!("no pg_config for {label} ({e}): run cargo pgrx init"))
        }
    };
    config
        .includedir_server()
        .expect("pg_config --includedir-server")
}

/// The 0-based position of `name` in the `typedef enum TimeoutId { ... }`
/// of `header`: the enum has no explicit values before MAX_TIMEOUTS.
fn timeout_id(header: &str, name: &str) -> usize {
    let body = header
        .split("typedef enum TimeoutId")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .expect("utils/timeout.h declares enum TimeoutId");
    // strip comments, then the entries in order
    let mut text = String::new();
    let mut rest = body;
    while let Some(start) = rest.find("/*") {
        text.push_str(&rest[..start]);
        rest = rest[start..]
            .split_once("*/")
            .map_or("", |(_, after)| after);
    }
    text.push_str(rest);
    let entries: Vec<&str> = text
        .trim_start_matches(|c: char| c == '{' || c.is_whitespace())
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    for e in &entries {
        assert!(
            !e.contains('=') || e.starts_with("MAX_TIMEOUTS"),
            "TimeoutId entry with an explicit value: {e}"
        );
    }
    entries
        .iter()
        .position(|e| *e == name)
        .unwrap_or_else(|| panic!("{name} is not in enum TimeoutId"))
}

fn main() {
    println!("cargo:rerun-if-env-changed=PGRX_PG_CONFIG_PATH");
    let major = major();
    let header = includedir_server(&major).join("utils/timeout.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(&header)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", header.display()));
    let id = timeout_id(&text, "CLIENT_CONNECTION_CHECK_TIMEOUT");
    println!("cargo:rustc-env=PG_CLAIM_CLIENT_CONNECTION_CHECK_TIMEOUT={id}");
}
