//! The mapping functions are PARALLEL SAFE: parallel workers (separate
//! backends) compute the same slots as the leader alone. pg_hash_slot and
//! range_slot: each parallel worker builds
//! its own per-call-site cache, and computes the same slots as a serial plan;
//! rows of a hash-partitioned table scanned in parallel still match the
//! partition they are stored in.

use pg_claim_sessions::connect_with;
use postgres::Client;

fn rows(c: &mut Client, q: &str) -> Vec<(i32, i64, i64)> {
    c.query(q, &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get::<_, i64>(2)))
        .collect()
}

fn force_parallel(c: &mut Client) {
    c.batch_execute(
        "SET max_parallel_workers_per_gather = 2; SET parallel_setup_cost = 0;
         SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;",
    )
    .unwrap();
}

fn assert_parallel_plan(c: &mut Client, q: &str) {
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
}

#[test]
fn parallel_workers_agree_with_serial_plan() {
    let mut c = connect_with(
        "mappings_parallel",
        "DROP TABLE IF EXISTS mpar_keys;
         CREATE TABLE mpar_keys AS
           SELECT g::bigint * 7919 - 1000000 AS id, md5(g::text) || 'é' AS name,
                  timestamptz '2024-01-01 00:00+00' + g * interval '1 minute' AS at
           FROM generate_series(1, 200000) g;
         ANALYZE mpar_keys;",
    );
    let q = "SELECT pg_hash_slot(id, 7) AS s, count(*),
                    sum(pg_hash_slot(name, 11) + range_slot(at, ARRAY['2024-02-01', '2024-03-01', '2024-04-01']::timestamptz[])
                        + range_slot(name, ARRAY['4', '8', 'c']) + jump_slot(id, 13)
                        + slot_of(id, 5) + slot_of(name, 11))
             FROM mpar_keys GROUP BY 1 ORDER BY 1";
    force_parallel(&mut c);
    assert_parallel_plan(&mut c, q);
    let parallel = rows(&mut c, q);

    let mut other = connect_with("mappings_serial", "SET max_parallel_workers_per_gather = 0");
    let serial = rows(&mut other, q);

    assert_eq!(parallel.len(), 7);
    assert_eq!(parallel, serial);
    assert_eq!(parallel.iter().map(|r| r.1).sum::<i64>(), 200000);
    c.batch_execute("DROP TABLE mpar_keys").unwrap();
}

#[test]
fn parallel_scan_of_hash_partitions_matches_storage() {
    let mut c = connect_with(
        "mappings_parallel_parts",
        "DROP TABLE IF EXISTS mpar_parts;
         CREATE TABLE mpar_parts (k text) PARTITION BY HASH (k);
         CREATE TABLE mpar_parts_0 PARTITION OF mpar_parts FOR VALUES WITH (MODULUS 3, REMAINDER 0);
         CREATE TABLE mpar_parts_1 PARTITION OF mpar_parts FOR VALUES WITH (MODULUS 3, REMAINDER 1);
         CREATE TABLE mpar_parts_2 PARTITION OF mpar_parts FOR VALUES WITH (MODULUS 3, REMAINDER 2);
         INSERT INTO mpar_parts SELECT 'key-' || g FROM generate_series(1, 150000) g;
         ANALYZE mpar_parts;",
    );
    force_parallel(&mut c);
    let q = "SELECT pg_hash_slot(k, 3) AS s, count(*),
                    count(*) FILTER (WHERE tableoid::regclass::text <> 'mpar_parts_' || pg_hash_slot(k, 3))
             FROM mpar_parts GROUP BY 1 ORDER BY 1";
    assert_parallel_plan(&mut c, q);
    let got = rows(&mut c, q);
    assert_eq!(got.len(), 3);
    assert!(
        got.iter().all(|r| r.2 == 0),
        "rows outside their slot's partition: {got:?}"
    );
    assert_eq!(got.iter().map(|r| r.1).sum::<i64>(), 150000);
    c.batch_execute("DROP TABLE mpar_parts").unwrap();
}
