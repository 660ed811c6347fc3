//! After a run: what the database says about it, items logged twice or
//! never done, and the share of its updates that were HOT.

use pg_claim_support::poll;
use postgres::Client;
use std::time::Duration;

/// `(log rows beyond one per item, items not done or not logged)`.
pub fn lost_and_repeated(admin: &mut Client) -> Result<(i64, i64), postgres::Error> {
    let r = admin.query_one(
        "SELECT (SELECT count(*) FROM bench_log) - (SELECT count(DISTINCT item_id) FROM bench_log),
                (SELECT count(*) FROM bench_items b
                  WHERE NOT b.done OR NOT EXISTS (SELECT 1 FROM bench_log l WHERE l.item_id = b.id))",
        &[],
    )?;
    Ok((r.get(0), r.get(1)))
}

/// The share of HOT updates among the work table's updates in the run just
/// finished (the table is new, so its counters start at zero). Every item is
/// updated exactly once, so the counters are complete when they reach
/// `items`; a backend reports its counts within a second or when it exits,
/// so this polls for that with a deadline.
pub fn hot_share(admin: &mut Client, items: i64) -> Result<Option<f64>, postgres::Error> {
    poll(Duration::from_secs(10), Duration::from_millis(50), || {
        let r = admin.query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
              WHERE relid = 'bench_items'::regclass",
            &[],
        )?;
        let (upd, hot): (i64, i64) = (r.get(0), r.get(1));
        Ok((upd >= items).then(|| hot as f64 / upd as f64))
    })
}
