//! Names never share slots, and a name is in one mode at a time, under races
//! of real sessions: two names with the same crc32 claimed at the same moment
//! (every mix of claim_slot, claim_slots, group_join and claim_partitions),
//! and claim_slot racing claim_lease on one name.

use pg_claim_sessions::{backend_pid, connect, sqlstate};
use postgres::Client;
use std::sync::{Arc, Barrier};
use std::thread;

/// Two names with the same crc32 (492309981).
const A: &str = "uablaijhsa";
const B: &str = "pfcxpytzcn";

/// The calls that take a new claim of a name.
const MODES: [&str; 4] = [
    "SELECT claim_slot($1, 4)::text",
    "SELECT claim_slots($1, 4, 2)::text",
    "SELECT group_join($1)::text",
    "SELECT claim_partitions($1, 8)::text",
];

/// Every advisory lock of the two names' key held by `pid`.
fn locks_of(c: &mut Client, pid: i32) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND classid = crc32($1::text)::oid AND pid = $2",
        &[&A, &pid],
    )
    .unwrap()
    .get(0)
}

fn forget_names(c: &mut Client) {
    c.execute(
        "DELETE FROM pg_claim_names WHERE name = ANY($1)",
        &[&vec![A, B]],
    )
    .unwrap();
}

#[test]
fn colliding_names_racing_one_wins_the_other_is_refused_in_every_mode() {
    let mut admin = connect("cn_admin");
    for (i, mode_a) in MODES.iter().enumerate() {
        for (j, mode_b) in MODES.iter().enumerate() {
            for round in 0..3 {
                forget_names(&mut admin);
                let barrier = Arc::new(Barrier::new(2));
                let run = |name: &'static str, stmt: &'static str, tag: String| {
                    let barrier = barrier.clone();
                    thread::spawn(move || {
                        let mut c = connect(&tag);
                        let pid = backend_pid(&mut c);
                        barrier.wait();
                        let r = c.query_one(stmt, &[&name]).map(|_| ()).map_err(|e| {
                            let msg = e.as_db_error().map(|d| d.message().to_string());
                            (sqlstate(&e), msg.unwrap_or_else(|| e.to_string()))
                        });
                        (c, pid, name, r)
                    })
                };
                let ha = run(A, mode_a, format!("cn_a_{i}{j}{round}"));
                let hb = run(B, mode_b, format!("cn_b_{i}{j}{round}"));
                let results = [ha.join().unwrap(), hb.join().unwrap()];
                let won: Vec<_> = results.iter().filter(|r| r.3.is_ok()).collect();
                let lost: Vec<_> = results.iter().filter(|r| r.3.is_err()).collect();
                assert_eq!(
                    (won.len(), lost.len()),
                    (1, 1),
                    "{mode_a} / {mode_b}: exactly one name gets the key: {:?}",
                    results.iter().map(|r| &r.3).collect::<Vec<_>>()
                );
                let (_, loser_pid, loser, Err((state, msg))) = lost[0] else {
                    unreachable!()
                };
                let winner = won[0].2;
                assert_eq!(state, "42710", "{msg}");
                assert!(
                    msg.contains(&format!("\"{loser}\"")) && msg.contains(&format!("\"{winner}\"")),
                    "the refusal names both names: {msg}"
                );
                assert!(
                    !msg.contains("pid"),
                    "the refusal names no session of the other fleet: {msg}"
                );
                assert_eq!(
                    locks_of(&mut admin, *loser_pid),
                    0,
                    "the refused took nothing"
                );
                let registered: String = admin
                    .query_one(
                        "SELECT name FROM pg_claim_names WHERE key = (crc32($1::text)::bit(32))::integer",
                        &[&A],
                    )
                    .unwrap()
                    .get(0);
                assert_eq!(registered, winner);
                // the loser's readers of the name show none of the winner's sessions
                let mut loser_client = connect("cn_reader");
                let shown: i64 = loser_client
                    .query_one(
                        "SELECT (SELECT count(*) FROM slot_holders($1))
                              + (SELECT count(*) FROM group_members($1))
                              + (SELECT count(*) FROM slot_status($1, 4) WHERE state <> 'unserved')",
                        &[&loser],
                    )
                    .unwrap()
                    .get(0);
                assert_eq!(shown, 0, "nothing of {winner} shown under {loser}");
            }
        }
    }
    forget_names(&mut admin);
}

#[test]
fn claim_slot_racing_claim_lease_never_both_hold_the_name() {
    let mut admin = connect("cm_admin");
    for round in 0..40 {
        let name = format!("cm_mode_{round}");
        let barrier = Arc::new(Barrier::new(2));
        let slot = {
            let barrier = barrier.clone();
            let name = name.clone();
            thread::spawn(move || {
                let mut c = connect("cm_slot");
                barrier.wait();
                let r = c
                    .query_one("SELECT claim_slot($1, 2)", &[&name])
                    .map(|row| row.get::<_, Option<i32>>(0))
                    .map_err(|e| sqlstate(&e));
                (c, r)
            })
        };
        let lease = {
            let barrier = barrier.clone();
            let name = name.clone();
            thread::spawn(move || {
                let mut c = connect("cm_lease");
                barrier.wait();
                let r = c
                    .query_one(
                        "SELECT slot FROM claim_lease($1, 2, 'cm-host:' || pg_backend_pid())",
                        &[&name],
                    )
                    .map(|row| row.get::<_, i32>(0))
                    .map_err(|e| sqlstate(&e));
                (c, r)
            })
        };
        let (mut sc, s) = slot.join().unwrap();
        let (_lc, l) = lease.join().unwrap();
        match (&s, &l) {
            (Ok(Some(0)), Err(state)) | (Err(state), Ok(0)) => assert_eq!(state, "55000"),
            other => panic!("round {round}: exactly one mode must win: {other:?}"),
        }
        if s.is_err() {
            // the refused claim_slot holds no lock of the name
            let pid = backend_pid(&mut sc);
            let held: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
                       AND classid = crc32($1::text)::oid AND pid = $2",
                    &[&name, &pid],
                )
                .unwrap()
                .get(0);
            assert_eq!(held, 0);
        }
        admin
            .execute("DELETE FROM pg_claim_leases WHERE name = $1", &[&name])
            .unwrap();
    }
}
