//! pg_claim's demo: a fleet of workers and standbys drains a table of work
//! items, one worker is killed mid-run, its standby takes over the slot, and
//! the processing log is checked for exactly-once processing at the end.
//!
//! It is also the worked example of a real pg_claim worker loop (in
//! `worker.rs`):
//!
//! ```sql
//! SELECT claim_slot('demo', 4, interval '30 seconds');           -- once: my slot
//! SELECT max(item_id) FROM processing_log WHERE slot = 2;         -- where my share stands
//! BEGIN;                                                          -- per batch:
//! SELECT id FROM my_items(NULL::work_items, 2, 4, after => '81234', batch => 500);
//! INSERT INTO processing_log ... ; UPDATE work_items SET done = true ... ;
//! COMMIT;
//! ```
//!
//! Run it through `scripts/demo`, which starts a throwaway cluster; options:
//! `--items N --workers W --standbys S --batch B --work-us U --kill-at F
//! --kill-slot K --no-kill --timeout SECS --dsn DSN`.
//!
//! Lease mode (`--leases`, run by `scripts/demo --pooler` through PgBouncer
//! in transaction mode, `--worker-dsn DSN`): an elastic fleet of fewer
//! workers than slots, each calling `claim_leases` every third of the TTL
//! for its share by remaining work and writing each batch behind `fence`,
//! with the slot's rows left (`report_backlog`); one worker
//! joins and one leaves (`claim_leases(..., max => 0)`) mid-run, one pauses
//! past its TTL instead of being killed, the others take its slots, and its
//! late write must be rejected (`PC001`). Options `--slots N --workers W
//! --ttl SECS --join-at F --no-join --leave-at F --no-leave --pause-at F
//! --pause-slot K --pause SECS --no-pause`.
//!
//! The modules, one job each: `config` (the options), `table` (the work
//! table and the queries about it), `fleet` (the coordinator: starts the
//! workers and standbys, kills one, stops them), `lease_fleet` (lease
//! mode's coordinator: the join, the leave, the pause, the shares),
//! `worker` (the worker loop), `lease_worker` (the lease-mode worker: the
//! statements and reports of `pg_claim_support::elastic`'s loop), `watch`
//! (the timeout and the unserved slots both coordinators watch), `state`
//! (what the threads share), `display` (live progress) and `check` (the
//! exactly-once verdict).

mod check;
mod config;
mod display;
mod fleet;
mod lease_fleet;
mod lease_worker;
mod state;
mod table;
mod watch;
mod worker;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cfg = match config::parse(std::env::args().skip(1)) {
        Ok(Some(cfg)) => cfg,
        Ok(None) => {
            println!("{}", config::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("pg_claim_demo: {e}");
            return ExitCode::from(2);
        }
    };
    match fleet::run(&cfg) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("pg_claim_demo: {e}");
            ExitCode::from(2)
        }
    }
}
