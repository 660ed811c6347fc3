//! The final exactly-once check of the processing log, printed as a verdict
//! with counts; in lease mode also whether the paused worker's late write
//! was rejected and whether every lease was given back at the end.

use crate::config::Config;
use crate::state::{lock, State};
use pg_claim_support::{describe, ms, thousands};
use postgres::Client;
use std::time::Duration;

pub fn check(
    c: &mut Client,
    cfg: &Config,
    elapsed: Duration,
    state: &State,
    leases_left: Option<i64>,
) -> Result<bool, String> {
    let r = c
        .query_one(
            "SELECT (SELECT count(*) FROM work_items),
                    (SELECT count(*) FROM processing_log),
                    (SELECT count(DISTINCT item_id) FROM processing_log),
                    (SELECT count(*) FROM work_items w
                      WHERE NOT EXISTS (SELECT 1 FROM processing_log l WHERE l.item_id = w.id)),
                    (SELECT count(*) FROM work_items WHERE NOT done),
                    (SELECT count(*) FROM processing_log WHERE slot <> slot_of(item_id, $1))",
            &[&(cfg.slots as i32)],
        )
        .map_err(|e| format!("checking the log: {}", describe(&e)))?;
    let (items, logged, distinct, missing, not_done, wrong): (i64, i64, i64, i64, i64, i64) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
    println!();
    if cfg.leases {
        print_lease_log(c, state)?;
    } else {
        let per = c
            .query(
                "SELECT slot, worker_pid, count(*), min(item_id), max(item_id)
                   FROM processing_log GROUP BY slot, worker_pid ORDER BY slot, min(item_id)",
                &[],
            )
            .map_err(|e| format!("checking the log: {}", describe(&e)))?;
        println!("processing log by slot and worker:");
        println!("  slot | worker pid |  items | first id .. last id");
        for r in per {
            let (slot, pid, cnt, lo, hi): (i32, i32, i64, i64, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
            println!("  {slot:4} | {pid:10} | {cnt:6} | {lo} .. {hi}");
        }
        let s = lock(state);
        if let Some(t) = s.takeover {
            println!(
                "takeover latency (pg_terminate_backend -> standby's claim_slot returned): {}",
                ms(t)
            );
        }
    }
    println!(
        "throughput: {} items in {:.1} s = {} items/s",
        thousands(items as u64),
        elapsed.as_secs_f64(),
        thousands((items as f64 / elapsed.as_secs_f64()) as u64)
    );
    println!();
    println!("exactly-once check:");
    println!("  items in the table                 {items}");
    println!("  log rows           count(*)        {logged}");
    println!("  distinct items     count(DISTINCT) {distinct}");
    println!("  items never processed              {missing}");
    println!("  items not marked done              {not_done}");
    println!("  log rows in the wrong slot         {wrong}");
    let once = logged == items && distinct == items && missing == 0 && not_done == 0 && wrong == 0;
    // Lease mode with a pause: the paused worker's late write must have
    // been tried and rejected by fence.
    let late = if cfg.leases && cfg.kill_at > 0.0 {
        let r = lock(state).late_write_rejected;
        let shown = match r {
            Some(true) => "rejected (PC001)",
            Some(false) => "NOT REJECTED",
            None => "never tried: no worker paused",
        };
        println!("  late write of the paused worker    {shown}");
        Some(r)
    } else {
        None
    };
    if let Some(left) = leases_left {
        println!("  live leases after max => 0        {left}");
    }
    let mut fenced = match late {
        None | Some(Some(true)) => String::new(),
        Some(Some(false)) => {
            ", and the paused worker's late write was not rejected by fence".to_string()
        }
        Some(None) => {
            ", and no worker paused (its slot was done before it fetched another batch: try a smaller --pause-at)".to_string()
        }
    };
    if let Some(left @ 1..) = leases_left {
        fenced.push_str(&format!(
            ", and {left} leases were still live after every worker gave its slots back"
        ));
    }
    let ok = once && fenced.is_empty();
    if ok {
        let rejected = if late.is_some() {
            ", and the paused worker's late write was rejected by fence"
        } else {
            ""
        };
        println!(
            "VERDICT: PASS, every one of the {items} items was processed exactly once{rejected}"
        );
    } else if once {
        println!(
            "VERDICT: FAIL, every item was processed exactly once{}",
            fenced.replacen(", and", ", but", 1)
        );
    } else {
        println!(
            "VERDICT: FAIL, {} duplicate log rows, {missing} items missing, {not_done} not done, {wrong} in the wrong slot{fenced}",
            logged - distinct
        );
    }
    Ok(ok)
}

/// Lease mode: the log by slot, holder and fencing token (with how many
/// server backends the pooler ran each holder's writes on), the takeovers
/// of the paused worker's leases, the writes fence rejected and the batches
/// dropped because their slot was given back.
fn print_lease_log(c: &mut Client, state: &State) -> Result<(), String> {
    let per = c
        .query(
            "SELECT slot, worker, token, count(*), count(DISTINCT worker_pid), min(item_id), max(item_id)
               FROM processing_log GROUP BY slot, worker, token ORDER BY slot, min(item_id)",
            &[],
        )
        .map_err(|e| format!("checking the log: {}", describe(&e)))?;
    println!("processing log by slot, lease holder and fencing token:");
    println!("  slot | holder     | token            |  items | backends | first id .. last id");
    for r in per {
        let (slot, worker, token, cnt, backends, lo, hi): (i32, String, i64, i64, i64, i64, i64) = (
            r.get(0),
            r.get(1),
            r.get(2),
            r.get(3),
            r.get(4),
            r.get(5),
            r.get(6),
        );
        println!("  {slot:4} | {worker:10} | {token:16} | {cnt:6} | {backends:8} | {lo} .. {hi}");
    }
    println!("(backends: the server connections the pooler ran that holder's batches on)");
    let s = lock(state);
    if !s.takeover_lines.is_empty() {
        println!("takeovers of the paused worker's leases:");
        for line in &s.takeover_lines {
            println!("  {line}");
        }
    }
    println!("writes rejected by fence (PC001): {}", s.rejected.len());
    for line in &s.rejected {
        println!("  {line}");
    }
    println!(
        "batches dropped unwritten, their slot given back by claim_leases during the work: {}",
        s.dropped_batches
    );
    println!(
        "slots given back after a batch, wanted by a holder with less work (report_backlog): {}",
        s.handovers
    );
    Ok(())
}
