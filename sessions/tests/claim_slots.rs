//! claim_slots across real sessions: a fleet smaller than n serves every
//! slot (every item processed once), a waiting standby gets an extra slot
//! back, a leaving worker's slots are taken over, and slot_status shows the
//! gap of a claim_slot fleet smaller than n.

use pg_claim_sessions::{app_running, connect, connect_with, wait_for};
use postgres::Client;
use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

const N: i32 = 8;

fn claim_slots(c: &mut Client, name: &str, max: i32) -> Vec<i32> {
    c.query_one("SELECT claim_slots($1, $2, $3)", &[&name, &N, &max])
        .unwrap()
        .get(0)
}

fn unserved(c: &mut Client, name: &str) -> Vec<i32> {
    c.query(
        "SELECT slot FROM slot_status($1, $2) WHERE state = 'unserved' ORDER BY slot",
        &[&name, &N],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[test]
fn four_workers_with_eight_slots_process_every_item_once() {
    const ITEMS: i64 = 4000;
    let mut setup = connect_with(
        "cs_setup",
        &format!(
            "DROP TABLE IF EXISTS cs_items, cs_done;
             CREATE TABLE cs_items (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
             CREATE INDEX ON cs_items ((slot_of(id, 8)), id) WHERE NOT done;
             CREATE TABLE cs_done (id bigint NOT NULL, pid integer NOT NULL, slot integer NOT NULL);
             INSERT INTO cs_items (id) SELECT g FROM generate_series(1, {ITEMS}) g;"
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let workers: Vec<_> = (0..4)
        .map(|w| {
            thread::spawn(move || {
                let mut c = connect(&format!("cs_worker_{w}"));
                let mut served = BTreeSet::new();
                loop {
                    assert!(Instant::now() < deadline, "worker {w}: items left at the deadline");
                    // between batches: take free slots, give extras back to a standby
                    let slots: Vec<i32> = c
                        .query_one("SELECT claim_slots('cs_cover', 8, 8, '10 s')", &[])
                        .unwrap()
                        .get(0);
                    served.extend(slots.iter().copied());
                    let done = c
                        .execute(
                            "WITH batch AS (
                               SELECT id FROM cs_items
                               WHERE slot_of(id, 8) = ANY (my_slots('cs_cover')) AND NOT done
                               ORDER BY id LIMIT 25 FOR UPDATE),
                             marked AS (
                               UPDATE cs_items i SET done = true FROM batch
                               WHERE i.id = batch.id RETURNING i.id)
                             INSERT INTO cs_done SELECT id, pg_backend_pid(), slot_of(id, 8) FROM marked",
                            &[],
                        )
                        .unwrap();
                    if done == 0 {
                        let left: i64 = c
                            .query_one("SELECT count(*) FROM cs_items WHERE NOT done", &[])
                            .unwrap()
                            .get(0);
                        if left == 0 {
                            return served;
                        }
                    }
                }
            })
        })
        .collect();
    let served: Vec<BTreeSet<i32>> = workers.into_iter().map(|h| h.join().unwrap()).collect();
    println!("slots served per worker: {served:?}");

    let row = setup
        .query_one(
            "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM cs_done",
            &[],
        )
        .unwrap();
    let (rows, distinct, lo, hi): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(rows, ITEMS, "every item processed once (rows)");
    assert_eq!(distinct, ITEMS, "no item processed twice");
    assert_eq!((lo, hi), (1, ITEMS));
    // each item was processed by a session that held its slot: the slots
    // every worker saw cover 0..7
    let all: BTreeSet<i32> = served.iter().flatten().copied().collect();
    assert_eq!(all, (0..N).collect::<BTreeSet<_>>());
}

#[test]
fn a_waiting_standby_gets_an_extra_slot_back_and_a_leaver_is_covered() {
    let name = "cs_handover";
    let mut a = connect("cs_a");
    let mut probe = connect("cs_probe");
    assert_eq!(claim_slots(&mut a, name, N), (0..N).collect::<Vec<_>>());
    assert_eq!(unserved(&mut probe, name), Vec::<i32>::new());
    // repeated calls change nothing while nobody waits
    assert_eq!(claim_slots(&mut a, name, N), (0..N).collect::<Vec<_>>());

    // a standby waits in the wait form; the holder's next call gives one back
    let standby = thread::spawn(move || {
        let mut b = connect("cs_b");
        let got: Vec<i32> = b
            .query_one("SELECT claim_slots('cs_handover', 8, 8, '30 s')", &[])
            .unwrap()
            .get(0);
        (b, got)
    });
    wait_for("the standby waits", Duration::from_secs(10), || {
        app_running(&mut probe, "cs_b", "%claim_slots%")
    });
    wait_for(
        "the standby announces that it waits",
        Duration::from_secs(10),
        || {
            probe
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
                   AND classid = crc32('cs_handover')::oid AND objid = 269484035
                   AND mode = 'RowExclusiveLock' AND granted",
                    &[],
                )
                .unwrap()
                .get::<_, i64>(0)
                == 1
        },
    );
    let after = claim_slots(&mut a, name, N);
    assert_eq!(
        after,
        (0..N - 1).collect::<Vec<_>>(),
        "one extra slot given back, the highest"
    );
    let (mut b, got) = standby.join().unwrap();
    assert_eq!(got, vec![N - 1], "the standby got the slot given back");
    // the newcomer wants its fair share (8 / 2): the holder gives back one
    // slot per call until both hold 4
    let mut rounds = 0;
    let (sa, sb) = loop {
        let sa = claim_slots(&mut a, name, N);
        let sb = claim_slots(&mut b, name, N);
        rounds += 1;
        if sa.len() == 4 && sb.len() == 4 {
            break (sa, sb);
        }
        assert!(
            rounds < 20,
            "no fair split after {rounds} rounds: {sa:?} {sb:?}"
        );
    };
    assert_eq!((sa, sb), (vec![0, 1, 2, 3], vec![4, 5, 6, 7]));
    // stable once fair
    assert_eq!(claim_slots(&mut a, name, N), vec![0, 1, 2, 3]);
    assert_eq!(claim_slots(&mut b, name, N), vec![4, 5, 6, 7]);

    // max below the slots held: the call gives the extras back
    assert_eq!(claim_slots(&mut a, name, 3), vec![0, 1, 2]);
    assert_eq!(unserved(&mut probe, name), vec![3]);
    // the other worker covers it on its next call
    assert_eq!(claim_slots(&mut b, name, N), vec![3, 4, 5, 6, 7]);
    assert_eq!(unserved(&mut probe, name), Vec::<i32>::new());

    // a worker leaves: the slots are unserved until the other's next call
    drop(a);
    wait_for(
        "the leaver's slots are free",
        Duration::from_secs(10),
        || unserved(&mut probe, name) == vec![0, 1, 2],
    );
    assert_eq!(claim_slots(&mut b, name, N), (0..N).collect::<Vec<_>>());
    // release_slot gives back all of them
    let released: bool = b
        .query_one("SELECT release_slot($1)", &[&name])
        .unwrap()
        .get(0);
    assert!(released);
    assert_eq!(unserved(&mut probe, name), (0..N).collect::<Vec<_>>());
}

#[test]
fn slot_status_shows_the_gap_of_a_small_claim_slot_fleet() {
    let name = "cs_gap";
    let mut workers: Vec<Client> = (0..4).map(|i| connect(&format!("cs_gap_{i}"))).collect();
    let mut pids = Vec::new();
    for w in workers.iter_mut() {
        let s: Option<i32> = w
            .query_one("SELECT claim_slot($1, 8)", &[&name])
            .unwrap()
            .get(0);
        assert!(s.is_some());
        pids.push(pg_claim_sessions::backend_pid(w));
    }
    let mut probe = connect("cs_gap_probe");
    let rows = probe
        .query(
            "SELECT slot, state, holder FROM slot_status($1, 8)",
            &[&name],
        )
        .unwrap();
    let status: Vec<(i32, String, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(status.len(), 8, "one row per slot: {status:?}");
    for (slot, state, holder) in &status {
        if *slot < 4 {
            assert_eq!(state, "session");
            let holder = holder.as_deref().unwrap();
            assert!(
                pids.iter().any(|p| holder == format!("pid {p}")),
                "slot {slot} held by one of the workers, not {holder}"
            );
        } else {
            assert_eq!((state.as_str(), holder), ("unserved", &None));
        }
    }
}
