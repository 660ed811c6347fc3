//! The demo's command-line options.

use pg_claim_support::{dsn_from_env, Opts};
use std::time::Duration;

/// The name the fleet claims its slots under.
pub const NAME: &str = "demo";

pub const USAGE: &str = "usage: scripts/demo [--items N] [--workers W] [--standbys S] [--slots N] [--batch B] \
     [--work-us U] [--kill-at F] [--kill-slot K] [--no-kill] [--timeout SECS]\n\
     [--resume-from-start: a deliberately wrong resume that ignores the log, to see the check fail]\n\
     defaults: --items 200000 --workers 4 --standbys 2 --slots (= workers) --batch 500 --work-us 250 \
     --kill-at 0.4 --kill-slot 1 --timeout 240\n\
     [--slots N above workers + standbys: a fleet that cannot serve every slot; the run shows the gap and fails]\n\
     lease mode, an elastic fleet with claim_leases (scripts/demo --pooler runs it through PgBouncer): \
     --leases [--worker-dsn DSN] [--slots N] [--workers W] [--ttl SECS] [--join-at F] [--no-join] \
     [--leave-at F] [--no-leave] [--pause-at F] [--pause-slot K] [--pause SECS] [--no-pause]\n\
     defaults: --slots 8 --workers 3 --ttl 2 --join-at 0.15 --leave-at 0.75 --pause-at 0.4 --pause-slot 1 \
     --pause (2 x ttl); --join-at and --leave-at are fractions of all items, --pause-at of the slot's share; \
     the workers connect to --worker-dsn (default: --dsn)";

#[derive(Clone, Debug)]
pub struct Config {
    pub dsn: String,
    pub items: i64,
    /// The workers at the start (session mode: one slot each; lease mode:
    /// they share the slots with claim_leases).
    pub workers: usize,
    /// Session mode only: standbys waiting for a slot.
    pub standbys: usize,
    /// The n of the name (`--slots`; default: the number of workers in
    /// session mode, 8 in lease mode).
    pub slots: usize,
    pub batch: i64,
    pub work_us: u64,
    /// When and whom to strike: the holder of `kill_slot` once that slot is
    /// `kill_at` done (0: never). Session mode terminates its backend; lease
    /// mode pauses it (`--pause-at`, `--pause-slot`).
    pub kill_at: f64,
    pub kill_slot: usize,
    pub timeout: Duration,
    /// Deliberately wrong: a slot's new holder restarts the share from its
    /// beginning instead of where the log says it stands (to see the check
    /// fail).
    pub resume_from_start: bool,
    /// Lease mode (`--leases`): an elastic fleet, every worker calling
    /// `claim_leases` for its share by remaining work and writing behind
    /// `fence` with its slot's weight (`report_backlog`); a worker
    /// is paused instead of killed, one joins and one leaves mid-run.
    pub leases: bool,
    /// Where the workers connect (a pooler); the coordinator (set-up,
    /// progress, check) uses `dsn`.
    pub worker_dsn: String,
    /// Lease mode: the leases' TTL; `claim_leases` is called every third of it.
    pub ttl: Duration,
    /// Lease mode: how long the paused worker sleeps (longer than `ttl`).
    pub pause: Duration,
    /// Lease mode: one more worker starts when this fraction of all items is
    /// done (0: none).
    pub join_at: f64,
    /// Lease mode: one worker leaves (`claim_leases(..., max => 0)`) when
    /// this fraction of all items is done (0: none).
    pub leave_at: f64,
}

/// The configuration from `args` (without the program name); `None` when
/// `--help` was asked for.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Config>, String> {
    let o = Opts::parse(
        args,
        &[
            "no-kill",
            "resume-from-start",
            "help",
            "leases",
            "no-pause",
            "no-join",
            "no-leave",
        ],
    )?;
    if o.flag("help") {
        return Ok(None);
    }
    // the options of both modes, of session mode only, of lease mode only
    const COMMON: [&str; 9] = [
        "items",
        "workers",
        "slots",
        "batch",
        "work-us",
        "resume-from-start",
        "timeout",
        "dsn",
        "help",
    ];
    let session_only = ["standbys", "kill-at", "kill-slot", "no-kill"];
    let lease_only = [
        "worker-dsn",
        "ttl",
        "pause-at",
        "pause-slot",
        "pause",
        "no-pause",
        "join-at",
        "no-join",
        "leave-at",
        "no-leave",
    ];
    o.check_known(
        &[
            &COMMON[..],
            &session_only[..],
            &lease_only[..],
            &["leases"][..],
        ]
        .concat(),
    )?;
    let leases = o.flag("leases");
    let given = |names: &[&'static str]| names.iter().find(|k| o.get_str(k).is_some()).copied();
    match (leases, given(&session_only)) {
        (true, Some("standbys")) => {
            return Err(
                "--standbys is for session mode; with --leases every worker calls claim_leases and holds its share of the slots"
                    .into(),
            )
        }
        (true, Some(k)) => {
            return Err(format!(
                "--{k} is for session mode; with --leases use --pause-at, --pause-slot, --no-pause"
            ))
        }
        _ => {}
    }
    if let (false, Some(k)) = (leases, given(&lease_only)) {
        return Err(format!("--{k} needs --leases"));
    }
    let dsn = dsn_from_env(o.get_str("dsn"));
    let ttl: f64 = o.get("ttl", 2.0f64)?;
    if !(0.3..=3600.0).contains(&ttl) {
        return Err("--ttl is in seconds, from 0.3 to 3600".into());
    }
    let pause: f64 = o.get("pause", 2.0 * ttl)?;
    if !(pause > ttl && pause <= 3600.0) {
        return Err(format!(
            "--pause must be longer than the TTL ({ttl} s), so that the leases expire"
        ));
    }
    let (at, slot, off) = if leases {
        ("pause-at", "pause-slot", "no-pause")
    } else {
        ("kill-at", "kill-slot", "no-kill")
    };
    let fraction = |name: &str, flag: &str, default: f64| -> Result<f64, String> {
        if o.flag(flag) {
            return Ok(0.0);
        }
        let f = o.get(name, default)?;
        if (0.0..1.0).contains(&f) {
            Ok(f)
        } else {
            Err(format!("--{name} is a fraction of all items, in [0, 1)"))
        }
    };
    let workers = o.get("workers", if leases { 3usize } else { 4 })?;
    let mut c = Config {
        worker_dsn: o
            .get_str("worker-dsn")
            .map_or_else(|| dsn.clone(), str::to_string),
        dsn,
        items: o.get("items", 200_000i64)?,
        workers,
        standbys: if leases {
            0
        } else {
            o.get("standbys", 2usize)?
        },
        slots: o.get("slots", if leases { 8 } else { workers })?,
        batch: o.get("batch", 500i64)?,
        work_us: o.get("work-us", 250u64)?,
        kill_at: if o.flag(off) { 0.0 } else { o.get(at, 0.4f64)? },
        kill_slot: o.get(slot, 1usize)?,
        timeout: Duration::from_secs(o.get("timeout", 240u64)?),
        resume_from_start: o.flag("resume-from-start"),
        leases,
        ttl: Duration::from_secs_f64(ttl),
        pause: Duration::from_secs_f64(pause),
        join_at: if leases {
            fraction("join-at", "no-join", 0.15)?
        } else {
            0.0
        },
        leave_at: if leases {
            fraction("leave-at", "no-leave", 0.75)?
        } else {
            0.0
        },
    };
    if c.slots == 0 {
        c.slots = c.workers;
    }
    if c.items < 1 || c.workers < 1 || c.batch < 1 {
        return Err("--items, --workers and --batch must be at least 1".into());
    }
    if c.workers > 256 || c.standbys > 256 || c.slots > 256 {
        return Err("--workers, --standbys and --slots are limited to 256 each".into());
    }
    if !leases && c.slots < c.workers {
        return Err(format!(
            "--slots {} is fewer than --workers {}: the extra workers would be standbys (use --standbys)",
            c.slots, c.workers
        ));
    }
    if !(0.0..1.0).contains(&c.kill_at) {
        return Err(format!(
            "--{at} is a fraction of the slot's share, in [0, 1)"
        ));
    }
    if leases {
        check_lease_fleet(&c)?;
    } else if c.kill_at > 0.0 && c.kill_slot >= c.workers {
        return Err(format!(
            "--{slot} {} is not a slot held by a worker, 0..{}",
            c.kill_slot,
            c.workers - 1
        ));
    } else if c.kill_at > 0.0 && c.standbys == 0 {
        return Err(
            "killing a worker needs at least one standby (--standbys 1, or --no-kill)".into(),
        );
    }
    Ok(Some(c))
}

/// Lease mode: the paused worker's slots and the leaving worker's need
/// another worker to take them.
fn check_lease_fleet(c: &Config) -> Result<(), String> {
    if c.kill_at > 0.0 && c.kill_slot >= c.slots {
        return Err(format!(
            "--pause-slot {} is not a slot, 0..{}",
            c.kill_slot,
            c.slots - 1
        ));
    }
    // the workers after the join, if any
    let most = c.workers + usize::from(c.join_at > 0.0);
    if c.kill_at > 0.0 && most < 2 {
        return Err(
            "pausing a worker needs another worker to take its slots over (--workers 2, or --no-pause)"
                .into(),
        );
    }
    if c.leave_at > 0.0 && most < 2 {
        return Err(
            "a worker leaving needs another worker to take its slots (--workers 2, or --no-leave)"
                .into(),
        );
    }
    Ok(())
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
        assert!(!c.leases);
    }

    #[test]
    fn lease_mode() {
        let c = parse_str(&["--dsn", "host=x", "--leases"])
            .unwrap()
            .unwrap();
        assert!(c.leases);
        assert_eq!(c.worker_dsn, "host=x");
        assert_eq!((c.workers, c.slots, c.standbys), (3, 8, 0));
        assert_eq!((c.kill_at, c.kill_slot), (0.4, 1));
        assert_eq!((c.join_at, c.leave_at), (0.15, 0.75));
        assert_eq!(c.ttl, Duration::from_secs(2));
        assert_eq!(c.pause, Duration::from_secs(4));
        let c = parse_str(&[
            "--dsn=host=x",
            "--leases",
            "--worker-dsn",
            "host=y port=6432",
            "--ttl",
            "1.5",
            "--pause-at",
            "0.5",
            "--pause-slot",
            "7",
            "--workers",
            "5",
            "--slots",
            "16",
            "--join-at",
            "0.3",
            "--no-leave",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.dsn.as_str(), c.worker_dsn.as_str()),
            ("host=x", "host=y port=6432")
        );
        assert_eq!((c.kill_at, c.kill_slot), (0.5, 7));
        assert_eq!((c.workers, c.slots), (5, 16));
        assert_eq!((c.join_at, c.leave_at), (0.3, 0.0));
        assert_eq!(c.ttl, Duration::from_millis(1500));
        assert_eq!(c.pause, Duration::from_secs(3));
        let c = parse_str(&[
            "--leases",
            "--no-pause",
            "--no-join",
            "--no-leave",
            "--workers",
            "1",
        ])
        .unwrap()
        .unwrap();
        assert_eq!((c.kill_at, c.join_at, c.leave_at), (0.0, 0.0, 0.0));
        // one worker and a joining one: someone takes the paused one's slots
        assert!(parse_str(&["--leases", "--workers", "1"]).is_ok());
        for args in [
            &["--leases", "--kill-at", "0.5"][..],
            &["--leases", "--no-kill"],
            &["--leases", "--standbys", "2"],
            &["--ttl", "2"],
            &["--pause-at", "0.5"],
            &["--join-at", "0.5"],
            &["--no-leave"],
            &["--worker-dsn", "host=y"],
            &["--leases", "--ttl", "2", "--pause", "2"],
            &["--leases", "--ttl", "0.1"],
            &["--leases", "--pause-slot", "8"],
            &["--leases", "--join-at", "1"],
            &["--leases", "--leave-at", "-0.1"],
            &["--leases", "--workers", "1", "--no-join"],
            &["--leases", "--workers", "1", "--no-join", "--no-pause"],
        ] {
            assert!(parse_str(args).is_err(), "{args:?}");
        }
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
