//! slot_of is PARALLEL SAFE: parallel workers (separate backends) compute the
//! same slots as the leader alone, and concurrent sessions agree.

use pg_claim_sessions::connect;

#[test]
fn parallel_workers_agree_with_serial_plan() {
    let mut c = connect("mapping_parallel");
    c.batch_execute(
        "DROP TABLE IF EXISTS par_keys;
         CREATE TABLE par_keys AS
           SELECT g::bigint - 100000 AS id, md5(g::text) || 'é' AS name
           FROM generate_series(1, 200000) g;
         ANALYZE par_keys;",
    )
    .unwrap();
    let q = "SELECT slot_of(id, 7) AS s, count(*), sum(slot_of(name, 11)) FROM par_keys GROUP BY 1 ORDER BY 1";

    c.batch_execute(
        "SET max_parallel_workers_per_gather = 2; SET parallel_setup_cost = 0;
         SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;",
    )
    .unwrap();
    let plan: Vec<String> = c
        .query(&format!("EXPLAIN {q}"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    assert!(
        plan.iter().any(|l| l.contains("Gather")),
        "expected a parallel plan, got:\n{}",
        plan.join("\n")
    );
    let parallel: Vec<(i32, i64, i64)> = c
        .query(q, &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get::<_, i64>(2)))
        .collect();

    let mut other = connect("mapping_serial");
    other
        .batch_execute("SET max_parallel_workers_per_gather = 0")
        .unwrap();
    let serial: Vec<(i32, i64, i64)> = other
        .query(q, &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get::<_, i64>(2)))
        .collect();

    assert_eq!(parallel.len(), 7);
    assert_eq!(parallel, serial);
    assert_eq!(parallel.iter().map(|r| r.1).sum::<i64>(), 200000);
    c.batch_execute("DROP TABLE par_keys").unwrap();
}
