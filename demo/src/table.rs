//! The work table and the processing log: created before the run, and read
//! for the items per slot and the slot holders.

use crate::config::{Config, NAME};
use pg_claim_support::{create_work_tables, describe, ensure_extension};
use postgres::Client;

/// The extension, the work table `work_items` and the empty
/// `processing_log`, with the indexes the workers read through.
pub fn setup(c: &mut Client, cfg: &Config) -> Result<(), postgres::Error> {
    ensure_extension(c, "pg_claim")?;
    let mut extra = format!(
        "-- the index my_items uses to read one slot's share in key order
             CREATE INDEX work_items_slot ON work_items ((slot_of(id, {n})), id);
             -- where a slot's share stands: max(item_id) of the slot
             CREATE INDEX processing_log_slot ON processing_log (slot, item_id);",
        n = cfg.slots
    );
    if cfg.leases {
        // Through a pooler, worker_pid is whichever server backend the pooler
        // lent for the transaction: the log records the lease holder and its
        // fencing token as well. Leases of an earlier run on this server go.
        extra.push_str(&format!(
            "
             ALTER TABLE processing_log ADD COLUMN worker text, ADD COLUMN token bigint;
             SELECT release_lease(name => '{NAME}', slot => slot, token => token)
               FROM lease_holders('{NAME}');"
        ));
    }
    create_work_tables(c, "work_items", "processing_log", cfg.items, 80, &extra)
}

/// Items per slot, from `slot_counts`.
pub fn slot_totals(c: &mut Client, cfg: &Config) -> Result<Vec<u64>, postgres::Error> {
    let rows = c.query(
        "SELECT slot, items FROM slot_counts('work_items'::regclass, $1) ORDER BY slot",
        &[&(cfg.slots as i32)],
    )?;
    let mut t = vec![0u64; cfg.slots];
    for r in rows {
        let slot: i32 = r.get(0);
        let items: i64 = r.get(1);
        if let Some(v) = t.get_mut(slot as usize) {
            *v = items as u64;
        }
    }
    Ok(t)
}

/// The slots `slot_status` shows unserved.
pub fn unserved(c: &mut Client, cfg: &Config) -> Result<Vec<i32>, String> {
    let rows = c
        .query(
            "SELECT slot FROM slot_status($1, $2) WHERE state = 'unserved' ORDER BY slot",
            &[&NAME, &(cfg.slots as i32)],
        )
        .map_err(|e| format!("slot_status: {}", describe(&e)))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// One line from `slot_status`: how many slots are served, and which are not.
pub fn print_status(c: &mut Client, cfg: &Config) -> Result<(), String> {
    let gap = unserved(c, cfg)?;
    println!(
        "SELECT state FROM slot_status('{NAME}', {}): {} of {} slots served{}",
        cfg.slots,
        cfg.slots - gap.len(),
        cfg.slots,
        if gap.is_empty() {
            String::new()
        } else {
            format!(", UNSERVED: {gap:?} (nobody works on their items)")
        }
    );
    Ok(())
}

pub fn print_holders(c: &mut Client, title: &str) -> Result<(), String> {
    let rows = c
        .query(
            "SELECT slot, pid, application_name FROM slot_holders($1) ORDER BY slot",
            &[&NAME],
        )
        .map_err(|e| format!("slot_holders: {}", describe(&e)))?;
    let list: Vec<String> = rows
        .iter()
        .map(|r| {
            let slot: i32 = r.get(0);
            let pid: i32 = r.get(1);
            let app: Option<String> = r.get(2);
            format!("{slot}={} (pid {pid})", app.unwrap_or_default())
        })
        .collect();
    println!("{title}: SELECT slot, pid, application_name FROM slot_holders('{NAME}');");
    println!("  {}", list.join(", "));
    Ok(())
}

/// Lease mode: the leases of the fleet, from `lease_holders`.
pub fn print_leases(c: &mut Client, title: &str) -> Result<(), String> {
    let rows = c
        .query(
            "SELECT slot, holder, token, expired FROM lease_holders($1) ORDER BY slot",
            &[&NAME],
        )
        .map_err(|e| format!("lease_holders: {}", describe(&e)))?;
    let list: Vec<String> = rows
        .iter()
        .map(|r| {
            let (slot, holder, token, expired): (i32, String, i64, Option<bool>) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let expired = if expired == Some(true) {
                ", expired"
            } else {
                ""
            };
            format!("{slot}={holder} (token {token}{expired})")
        })
        .collect();
    println!("{title}: SELECT slot, holder, token, expired FROM lease_holders('{NAME}');");
    println!("  {}", list.join(", "));
    Ok(())
}
