//! The final exactly-once check of the processing log, printed as a verdict
//! with counts.

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
            &[&(cfg.workers as i32)],
        )
        .map_err(|e| format!("checking the log: {}", describe(&e)))?;
    let (items, logged, distinct, missing, not_done, wrong): (i64, i64, i64, i64, i64, i64) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
    let per = c
        .query(
            "SELECT slot, worker_pid, count(*), min(item_id), max(item_id)
               FROM processing_log GROUP BY slot, worker_pid ORDER BY slot, min(item_id)",
            &[],
        )
        .map_err(|e| format!("checking the log: {}", describe(&e)))?;
    println!();
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
    drop(s);
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
    let ok = logged == items && distinct == items && missing == 0 && not_done == 0 && wrong == 0;
    if ok {
        println!("VERDICT: PASS, every one of the {items} items was processed exactly once");
    } else {
        println!(
            "VERDICT: FAIL, {} duplicate log rows, {missing} items missing, {not_done} not done, {wrong} in the wrong slot",
            logged - distinct
        );
    }
    Ok(ok)
}
