//! my_items from several real sessions at once: four workers walk their
//! shares of one table in batches (keyset paging), mark what they processed,
//! and together they process every row exactly once, through the expression
//! index (its scan counter grows by at least one scan per batch).

use pg_claim_sessions::{connect, connect_with, wait_for};
use std::collections::HashSet;
use std::time::Duration;

const N: i32 = 4;
const ROWS: i64 = 20_000;
const BATCH: i32 = 100;

fn idx_scans(c: &mut postgres::Client) -> i64 {
    c.query_one(
        "SELECT coalesce(idx_scan, 0) FROM pg_stat_user_indexes WHERE indexrelname = 'items_ws_slot'",
        &[],
    )
    .unwrap()
    .get(0)
}

#[test]
fn workers_walk_disjoint_shares_through_the_index() {
    let mut admin = connect_with(
        "items_ws_admin",
        &format!(
            "DROP TABLE IF EXISTS items_ws;
             CREATE TABLE items_ws (id bigint PRIMARY KEY, payload text NOT NULL,
                                    done_by integer, done_count integer NOT NULL DEFAULT 0);
             INSERT INTO items_ws (id, payload)
               SELECT g - {half}, md5(g::text) FROM generate_series(1, {ROWS}) g
               ORDER BY md5(g::text); -- heap order unrelated to the key, as in real tables
             CREATE INDEX items_ws_slot ON items_ws ((slot_of(id, {N})), id);
             ANALYZE items_ws;",
            half = ROWS / 2
        ),
    );
    admin
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .unwrap();
    let scans_before = idx_scans(&mut admin);

    let workers: Vec<_> = (0..N)
        .map(|slot| {
            std::thread::spawn(move || {
                let mut c = connect(&format!("items_ws_worker_{slot}"));
                let mut seen = Vec::new();
                let mut after: Option<String> = None;
                let mut batches = 0;
                loop {
                    let rows = c
                        .query(
                            "SELECT id FROM my_items(NULL::items_ws, $1, $2, after => $3, batch => $4)",
                            &[&slot, &N, &after, &BATCH],
                        )
                        .unwrap();
                    batches += 1;
                    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                    if let Some(last) = ids.last() {
                        after = Some(last.to_string());
                    }
                    // the work: mark the batch done by this slot
                    c.execute(
                        "UPDATE items_ws SET done_by = $1, done_count = done_count + 1 WHERE id = ANY($2)",
                        &[&slot, &ids],
                    )
                    .unwrap();
                    seen.extend(ids.iter().copied());
                    if ids.len() < BATCH as usize {
                        break;
                    }
                }
                c.batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
                // flushed when the session goes idle; one more round trip
                c.batch_execute("SELECT 1").unwrap();
                (slot, seen, batches)
            })
        })
        .collect();

    let mut all = HashSet::new();
    let mut total_batches = 0;
    for w in workers {
        let (slot, seen, batches) = w.join().unwrap();
        total_batches += batches;
        // keyset paging: strictly increasing keys, each in this slot
        assert!(
            seen.windows(2).all(|p| p[0] < p[1]),
            "slot {slot}: keys not in increasing order"
        );
        for id in &seen {
            assert_eq!(
                id.rem_euclid(N as i64),
                slot as i64,
                "id {id} in slot {slot}"
            );
            assert!(all.insert(*id), "id {id} processed twice");
        }
        let expected = ROWS / N as i64;
        assert_eq!(seen.len() as i64, expected, "slot {slot} share size");
    }
    assert_eq!(all.len() as i64, ROWS);

    // the table agrees: every row done exactly once, by the slot it maps to
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE done_count = 1),
                    count(*) FILTER (WHERE done_by = slot_of(id, 4))
             FROM items_ws",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), ROWS);
    assert_eq!(row.get::<_, i64>(1), ROWS);

    // every batch was an index scan of the slot index (statistics are
    // flushed asynchronously: poll with a deadline)
    let mut scans = 0;
    let took = wait_for(
        "idx_scan of items_ws_slot to grow by one per batch",
        Duration::from_secs(10),
        || {
            scans = idx_scans(&mut admin) - scans_before;
            scans >= total_batches as i64
        },
    );
    println!(
        "{total_batches} batches, {scans} scans of the slot index (statistics seen after {took:?})"
    );
    admin.batch_execute("DROP TABLE items_ws").unwrap();
}

#[test]
fn shares_follow_the_table_as_it_changes() {
    // the query text is cached per session; DDL on the table must not leave
    // a stale query behind
    let mut c = connect_with(
        "items_ws_ddl",
        "DROP TABLE IF EXISTS items_ws_ddl;
         CREATE TABLE items_ws_ddl (id bigint PRIMARY KEY, a text);
         INSERT INTO items_ws_ddl SELECT g, 'x' FROM generate_series(1, 100) g;",
    );
    let q = "SELECT count(*) FROM my_items(NULL::items_ws_ddl, 1, 4, batch => 1000)";
    assert_eq!(c.query_one(q, &[]).unwrap().get::<_, i64>(0), 25);
    // a new column: the row type changes, and my_items returns it
    c.batch_execute("ALTER TABLE items_ws_ddl ADD COLUMN b integer DEFAULT 7")
        .unwrap();
    let b: i32 = c
        .query_one(
            "SELECT b FROM my_items(NULL::items_ws_ddl, 1, 4, batch => 1000) LIMIT 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(b, 7);
    // the table renamed: the next call reads it under its new name
    c.batch_execute("ALTER TABLE items_ws_ddl RENAME TO items_ws_ddl2")
        .unwrap();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM my_items(NULL::items_ws_ddl2, 1, 4, batch => 1000)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 25);
    // the primary key moves to another column: the default key follows
    c.batch_execute(
        "ALTER TABLE items_ws_ddl2 DROP CONSTRAINT items_ws_ddl_pkey;
         ALTER TABLE items_ws_ddl2 ADD COLUMN k bigint GENERATED ALWAYS AS (id * 2) STORED;
         ALTER TABLE items_ws_ddl2 ADD PRIMARY KEY (k);",
    )
    .unwrap();
    let rows = c
        .query(
            "SELECT k FROM my_items(NULL::items_ws_ddl2, 1, 4, batch => 1000)",
            &[],
        )
        .unwrap();
    // k = 2 * id is even, so slot 1 of 4 (odd remainders) is empty
    assert_eq!(rows.len(), 0);
    let zero: i64 = c
        .query_one(
            "SELECT count(*) FROM my_items(NULL::items_ws_ddl2, 2, 4, batch => 1000)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(zero, 50);
    c.batch_execute("DROP TABLE items_ws_ddl2").unwrap();
}
