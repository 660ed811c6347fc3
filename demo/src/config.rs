//! The demo's command-line options.

use pg_claim_support::{dsn_from_env, Opts};
use std::time::Duration;

/// The name the fleet claims its slots under.
pub const NAME: &str = "demo";

pub const USAGE: &str = "usage: scripts/demo [--items N] [--workers W] [--standbys S] [--batch B] \
     [--work-us U] [--kill-at F] [--kill-slot K] [--no-kill] [--timeout SECS]\n\
     [--resume-from-start: a deliberately wrong standby that ignores the log, to see the check fail]\n\
     defaults: --items 200000 --workers 4 --standbys 2 --batch 500 --work-us 250 \
     --kill-at 0.4 --kill-slot 1 --timeout 240";

#[derive(Clone, Debug)]
pub struct Config {
    pub dsn: String,
    pub items: i64,
    pub workers: usize,
    pub standbys: usize,
    pub batch: i64,
    pub work_us: u64,
    pub kill_at: f64,
    pub kill_slot: usize,
    pub timeout: Duration,
    /// Deliberately wrong: a standby restarts the share from its beginning
    /// instead of where the log says it stands (to see the check fail).
    pub resume_from_start: bool,
}

/// The configuration from `args` (without the program name); `None` when
/// `--help` was asked for.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Config>, String> {
    let o = Opts::parse(args, &["no-kill", "resume-from-start", "help"])?;
    if o.flag("help") {
        return Ok(None);
    }
    o.check_known(&[
        "items",
        "workers",
        "standbys",
        "batch",
        "work-us",
        "kill-at",
        "kill-slot",
        "no-kill",
        "resume-from-start",
        "timeout",
        "dsn",
        "help",
    ])?;
    let c = Config {
        dsn: dsn_from_env(o.get_str("dsn")),
        items: o.get("items", 200_000i64)?,
        workers: o.get("workers", 4usize)?,
        standbys: o.get("standbys", 2usize)?,
        batch: o.get("batch", 500i64)?,
        work_us: o.get("work-us", 250u64)?,
        kill_at: if o.flag("no-kill") {
            0.0
        } else {
            o.get("kill-at", 0.4f64)?
        },
        kill_slot: o.get("kill-slot", 1usize)?,
        timeout: Duration::from_secs(o.get("timeout", 240u64)?),
        resume_from_start: o.flag("resume-from-start"),
    };
    if c.items < 1 || c.workers < 1 || c.batch < 1 {
        return Err("--items, --workers and --batch must be at least 1".into());
    }
    if c.workers > 256 || c.standbys > 256 {
        return Err("--workers and --standbys are limited to 256 each".into());
    }
    if !(0.0..1.0).contains(&c.kill_at) {
        return Err("--kill-at is a fraction of the slot's share, in [0, 1)".into());
    }
    if c.kill_at > 0.0 && c.kill_slot >= c.workers {
        return Err(format!(
            "--kill-slot {} is not a slot of 0..{}",
            c.kill_slot,
            c.workers - 1
        ));
    }
    if c.kill_at > 0.0 && c.standbys == 0 {
        return Err(
            "killing a worker needs at least one standby (--standbys 1, or --no-kill)".into(),
        );
    }
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &[&str]) -> Result<Option<Config>, String> {
        parse(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn defaults_and_options() {
        let c = parse_str(&["--dsn", "host=x"]).unwrap().unwrap();
        assert_eq!(c.dsn, "host=x");
        assert_eq!(
            (c.items, c.workers, c.standbys, c.batch),
            (200_000, 4, 2, 500)
        );
        assert_eq!((c.work_us, c.kill_at, c.kill_slot), (250, 0.4, 1));
        assert_eq!(c.timeout, Duration::from_secs(240));
        assert!(!c.resume_from_start);
        let c = parse_str(&["--items=40000", "--no-kill", "--standbys", "0"])
            .unwrap()
            .unwrap();
        assert_eq!((c.items, c.kill_at, c.standbys), (40_000, 0.0, 0));
        assert!(parse_str(&["--help"]).unwrap().is_none());
    }

    #[test]
    fn refuses_what_cannot_run() {
        for args in [
            &["--items", "0"][..],
            &["--workers", "300"],
            &["--kill-at", "1"],
            &["--kill-slot", "4"],
            &["--standbys", "0"],
            &["--frobnicate", "1"],
        ] {
            assert!(parse_str(args).is_err(), "{args:?}");
        }
    }
}
