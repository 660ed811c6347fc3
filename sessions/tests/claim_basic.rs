//! claim_slot across many real sessions: distinct slots, standbys get NULL,
//! idempotent re-claim, one n per name (also under races), error reporting.

use pg_claim_sessions::{backend_pid, connect, connect_with, sqlstate};
use postgres::Client;
use std::sync::{Arc, Barrier};
use std::thread;

/// Advisory locks of `name` in the two-int4 key space, as pg_locks shows them.
fn locks_of_name(c: &mut Client, name: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND classid = crc32($1::text)::oid",
        &[&name],
    )
    .unwrap()
    .get(0)
}

#[test]
fn two_n_sessions_get_n_distinct_slots_and_n_nulls() {
    const N: usize = 8;
    let name = "cb_fill";
    let barrier = Arc::new(Barrier::new(2 * N));
    let handles: Vec<_> = (0..2 * N)
        .map(|i| {
            let barrier = barrier.clone();
            thread::spawn(move || {
                let mut c = connect(&format!("cb_fill_{i}"));
                barrier.wait();
                let slot: Option<i32> = c
                    .query_one("SELECT claim_slot($1, $2)", &[&name, &(N as i32)])
                    .unwrap()
                    .get(0);
                (c, slot)
            })
        })
        .collect();
    let mut sessions: Vec<(Client, Option<i32>)> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();

    let mut slots: Vec<i32> = sessions.iter().filter_map(|(_, s)| *s).collect();
    slots.sort_unstable();
    let nulls = sessions.iter().filter(|(_, s)| s.is_none()).count();
    println!("claims: {slots:?}, {nulls} NULLs");
    assert_eq!(
        slots,
        (0..N as i32).collect::<Vec<_>>(),
        "N distinct slots 0..N-1"
    );
    assert_eq!(nulls, N, "N standbys got NULL");

    // Each holder: the slot lock, the shared n record and the shared "claimers"
    // lock; standbys that got NULL hold nothing.
    let mut probe = connect("cb_fill_probe");
    assert_eq!(locks_of_name(&mut probe, name), 3 * N as i64);

    // slot_holders agrees with what each session was told.
    for (c, s) in sessions.iter_mut() {
        let pid = backend_pid(c);
        let rows = probe
            .query(
                "SELECT slot FROM slot_holders($1) WHERE pid = $2",
                &[&name, &pid],
            )
            .unwrap();
        let held: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
        assert_eq!(held, s.iter().copied().collect::<Vec<_>>());
    }

    // Re-claim: the same slot back, no lock stacked (pg_locks granted count and
    // the lock manager's hold count: one release frees it).
    for (c, s) in sessions.iter_mut() {
        for _ in 0..3 {
            let again: Option<i32> = c
                .query_one("SELECT claim_slot($1, $2)", &[&name, &(N as i32)])
                .unwrap()
                .get(0);
            if s.is_some() {
                assert_eq!(again, *s, "re-claim returns the same slot");
            } else {
                assert_eq!(again, None, "a standby stays a standby while all are held");
            }
        }
        let mine: Option<i32> = c.query_one("SELECT my_slot($1)", &[&name]).unwrap().get(0);
        assert_eq!(mine, *s);
    }
    assert_eq!(locks_of_name(&mut probe, name), 3 * N as i64);

    // One release_slot frees the slot completely (nothing was stacked).
    let (holder, slot) = sessions.iter_mut().find(|(_, s)| s.is_some()).unwrap();
    let slot = slot.unwrap();
    let released: bool = holder
        .query_one("SELECT release_slot($1)", &[&name])
        .unwrap()
        .get(0);
    assert!(released);
    assert_eq!(locks_of_name(&mut probe, name), 3 * N as i64 - 3);
    let again: bool = holder
        .query_one("SELECT release_slot($1)", &[&name])
        .unwrap()
        .get(0);
    assert!(!again, "second release reports false");

    // A standby now gets exactly the freed slot.
    let (standby, _) = sessions.iter_mut().find(|(_, s)| s.is_none()).unwrap();
    let got: Option<i32> = standby
        .query_one("SELECT claim_slot($1, $2)", &[&name, &(N as i32)])
        .unwrap()
        .get(0);
    assert_eq!(got, Some(slot));
}

#[test]
fn lowest_free_slot_first() {
    let name = "cb_lowest";
    let mut a = connect("cb_lowest_a");
    let mut b = connect("cb_lowest_b");
    let mut c = connect("cb_lowest_c");
    let claim = |c: &mut Client| -> Option<i32> {
        c.query_one("SELECT claim_slot($1, 100)", &[&name])
            .unwrap()
            .get(0)
    };
    assert_eq!(claim(&mut a), Some(0));
    assert_eq!(claim(&mut b), Some(1));
    assert_eq!(claim(&mut c), Some(2));
    a.execute("SELECT release_slot($1)", &[&name]).unwrap();
    let mut d = connect("cb_lowest_d");
    assert_eq!(claim(&mut d), Some(0), "a freed low slot is refilled first");
}

#[test]
fn mismatched_n_is_refused_with_both_values() {
    let name = "cb_mismatch";
    let mut a = connect("cb_mismatch_a");
    let mut b = connect("cb_mismatch_b");
    let s: Option<i32> = a
        .query_one("SELECT claim_slot($1, 4)", &[&name])
        .unwrap()
        .get(0);
    assert_eq!(s, Some(0));
    let e = b
        .query_one("SELECT claim_slot($1, 8)", &[&name])
        .unwrap_err();
    assert_eq!(sqlstate(&e), "55000");
    let msg = e.as_db_error().unwrap().message().to_string();
    println!("mismatch: {msg}");
    assert!(msg.contains("n = 8") && msg.contains("n = 4"), "{msg}");
    assert!(e.as_db_error().unwrap().hint().is_some());
    // The refused session holds nothing afterwards.
    assert_eq!(backend_locks(&mut b), 0);
    // The standby form is refused the same way, without waiting.
    let e = b
        .query_one("SELECT claim_slot($1, 8, '10 s')", &[&name])
        .unwrap_err();
    assert_eq!(sqlstate(&e), "55000");
    assert_eq!(backend_locks(&mut b), 0);

    // The holder itself asking with another n.
    let e = a
        .query_one("SELECT claim_slot($1, 5)", &[&name])
        .unwrap_err();
    assert_eq!(sqlstate(&e), "55000");
    let msg = e.as_db_error().unwrap().message().to_string();
    assert!(msg.contains("n = 5") && msg.contains("n = 4"), "{msg}");

    // Once the n = 4 holder is gone, n = 8 is accepted.
    a.execute("SELECT release_slot($1)", &[&name]).unwrap();
    let s: Option<i32> = b
        .query_one("SELECT claim_slot($1, 8)", &[&name])
        .unwrap()
        .get(0);
    assert_eq!(s, Some(0));
}

fn backend_locks(c: &mut Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Sessions racing with two different n never both succeed.
#[test]
fn racing_claimers_with_different_n_never_coexist() {
    const PER_SIDE: usize = 6;
    const ROUNDS: usize = 40;
    let name = "cb_race";
    let mut sessions: Vec<(Client, i32)> = (0..2 * PER_SIDE)
        .map(|i| {
            (
                connect(&format!("cb_race_{i}")),
                if i % 2 == 0 { 3 } else { 5 },
            )
        })
        .collect();
    let mut mixed_rounds = 0;
    let mut refused_total = 0;
    for _ in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(sessions.len()));
        let handles: Vec<_> = sessions
            .drain(..)
            .map(|(mut c, n)| {
                let barrier = barrier.clone();
                thread::spawn(move || {
                    barrier.wait();
                    let r = c.query_one("SELECT claim_slot($1, $2)", &[&name, &n]);
                    let outcome = match r {
                        Ok(row) => Ok(row.get::<_, Option<i32>>(0)),
                        Err(e) => Err(sqlstate(&e)),
                    };
                    (c, n, outcome)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let mut winners_n: Vec<i32> = Vec::new();
        for (_, n, outcome) in &results {
            match outcome {
                Ok(Some(_)) => winners_n.push(*n),
                Ok(None) => {}
                Err(code) => {
                    assert_eq!(code, "55000");
                    refused_total += 1;
                }
            }
        }
        winners_n.sort_unstable();
        winners_n.dedup();
        assert!(
            winners_n.len() <= 1,
            "two different n hold slots of one name at once: {winners_n:?}"
        );
        if results.iter().any(|(_, _, o)| o.is_err()) {
            mixed_rounds += 1;
        }
        for (mut c, n, _) in results {
            c.execute("SELECT release_slot($1)", &[&name]).unwrap();
            sessions.push((c, n));
        }
    }
    println!("{ROUNDS} racing rounds, {mixed_rounds} with refusals, {refused_total} refusals");
}

#[test]
fn errors_have_sqlstate_message_and_hint() {
    let mut c = connect("cb_errors");
    let cases: &[(&str, &str, &str)] = &[
        (
            "SELECT claim_slot('cb_err', 0)",
            "22023",
            "n must be at least 1, got 0",
        ),
        (
            "SELECT claim_slot('cb_err', -5)",
            "22023",
            "n must be at least 1, got -5",
        ),
        (
            "SELECT claim_slot('cb_err', 1048577)",
            "22023",
            "n must be at most 1048576, got 1048577",
        ),
        (
            "SELECT claim_slot(NULL, 4)",
            "22004",
            "name must not be null",
        ),
        (
            "SELECT claim_slot(NULL, 4, '1 s')",
            "22004",
            "name must not be null",
        ),
        (
            "SELECT claim_slot('cb_err', NULL)",
            "22004",
            "n must not be null",
        ),
        (
            "SELECT claim_slot('cb_err', 4, NULL)",
            "22004",
            "wait must not be null",
        ),
        (
            "SELECT claim_slot('cb_err', 4, '-1 s')",
            "22023",
            "wait must not be negative, got -00:00:01",
        ),
        (
            "SELECT claim_slot('cb_err', 0, '1 s')",
            "22023",
            "n must be at least 1, got 0",
        ),
    ];
    for (sql, code, msg) in cases {
        let e = c.query_one(*sql, &[]).unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
        assert_eq!(sqlstate(&e), *code, "{sql}");
        assert_eq!(db.message(), *msg, "{sql}");
        assert!(db.hint().is_some_and(|h| !h.is_empty()), "{sql}: no hint");
    }
    assert_eq!(backend_locks(&mut c), 0, "failed claims leave no lock");
    // The largest n is accepted.
    let s: Option<i32> = c
        .query_one("SELECT claim_slot('cb_err_max', 1048576)", &[])
        .unwrap()
        .get(0);
    assert_eq!(s, Some(0));
    // STRICT readers: NULL in, NULL out.
    let row = c
        .query_one("SELECT my_slot(NULL), release_slot(NULL)", &[])
        .unwrap();
    assert_eq!(row.get::<_, Option<i32>>(0), None);
    assert_eq!(row.get::<_, Option<bool>>(1), None);
    let n: i64 = c
        .query_one("SELECT count(*) FROM slot_holders(NULL)", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[test]
fn rollback_keeps_session_claim_and_advisory_unlock_all_is_noticed() {
    let name = "cb_rollback";
    let mut c = connect_with(
        "cb_rollback",
        &format!("BEGIN; SELECT claim_slot('{name}', 2); ROLLBACK;"),
    );
    let s: Option<i32> = c.query_one("SELECT my_slot($1)", &[&name]).unwrap().get(0);
    assert_eq!(s, Some(0), "a rollback does not release a session claim");
    // Locks dropped behind pg_claim's back are noticed.
    c.batch_execute("SELECT pg_advisory_unlock_all()").unwrap();
    let s: Option<i32> = c.query_one("SELECT my_slot($1)", &[&name]).unwrap().get(0);
    assert_eq!(s, None);
    let s: Option<i32> = c
        .query_one("SELECT claim_slot($1, 2)", &[&name])
        .unwrap()
        .get(0);
    assert_eq!(s, Some(0));
    assert_eq!(backend_locks(&mut c), 3);
}

#[test]
fn claiming_sets_client_connection_check_interval() {
    let mut c = connect("cb_guc");
    let before: String = c
        .query_one("SHOW client_connection_check_interval", &[])
        .unwrap()
        .get(0);
    assert_eq!(before, "0");
    c.execute("SELECT claim_slot('cb_guc', 1)", &[]).unwrap();
    let after: String = c
        .query_one("SHOW client_connection_check_interval", &[])
        .unwrap()
        .get(0);
    assert_eq!(after, "1s");

    let mut d = connect_with(
        "cb_guc_off",
        "SET pg_claim.client_connection_check_interval = 0",
    );
    d.execute("SELECT claim_slot('cb_guc_off', 1)", &[])
        .unwrap();
    let after: String = d
        .query_one("SHOW client_connection_check_interval", &[])
        .unwrap()
        .get(0);
    assert_eq!(after, "0", "0 leaves the session alone");

    let mut e = connect_with(
        "cb_guc_lower",
        "SET client_connection_check_interval = '200ms'",
    );
    e.execute("SELECT claim_slot('cb_guc_lower', 1)", &[])
        .unwrap();
    let after: String = e
        .query_one("SHOW client_connection_check_interval", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        after, "200ms",
        "a shorter interval chosen by the session is kept"
    );
}

#[test]
fn standby_wait_times_out_with_null_and_is_cancellable() {
    let name = "cb_wait";
    let mut holder = connect("cb_wait_holder");
    holder
        .execute("SELECT claim_slot($1, 1)", &[&name])
        .unwrap();
    let mut standby = connect("cb_wait_standby");
    let t = std::time::Instant::now();
    let s: Option<i32> = standby
        .query_one("SELECT claim_slot($1, 1, '300 ms')", &[&name])
        .unwrap()
        .get(0);
    let waited = t.elapsed();
    assert_eq!(s, None);
    assert!(waited.as_millis() >= 300, "returned after {waited:?}");
    // No busy loop: the waiting backend sleeps on its latch (wait_event_type
    // Extension) most of the time, and its CPU time stays far below the wall time.
    let spid = backend_pid(&mut standby);
    let stat_before = cpu_ticks(spid);
    let sampler = thread::spawn(move || {
        let mut c = connect("cb_wait_sampler");
        let mut sleeping = 0;
        let mut samples = 0;
        let t = std::time::Instant::now();
        while t.elapsed().as_millis() < 800 {
            let w: Option<String> = c
                .query_one(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                    &[&spid],
                )
                .unwrap()
                .get(0);
            samples += 1;
            if w.as_deref() == Some("Extension") {
                sleeping += 1;
            }
            thread::sleep(std::time::Duration::from_millis(5));
        }
        (sleeping, samples)
    });
    let s: Option<i32> = standby
        .query_one("SELECT claim_slot($1, 1, '1 s')", &[&name])
        .unwrap()
        .get(0);
    assert_eq!(s, None);
    let (sleeping, samples) = sampler.join().unwrap();
    let cpu = cpu_ticks(spid) - stat_before;
    println!("standby wait: {sleeping}/{samples} samples asleep on the latch, {cpu} CPU ticks (1/100 s) in 1 s");
    assert!(sleeping * 2 > samples, "standby mostly sleeps on its latch");
    assert!(
        cpu < 50,
        "standby burnt {cpu} ticks of CPU in 1 s of waiting"
    );

    // statement_timeout interrupts a long wait, and leaves no lock behind.
    standby
        .batch_execute("SET statement_timeout = '200ms'")
        .unwrap();
    let t = std::time::Instant::now();
    let e = standby
        .query_one("SELECT claim_slot($1, 1, '60 s')", &[&name])
        .unwrap_err();
    assert_eq!(sqlstate(&e), "57014");
    assert!(t.elapsed().as_secs() < 5);
    standby.batch_execute("RESET statement_timeout").unwrap();
    assert_eq!(backend_locks(&mut standby), 0);

    // pg_cancel_backend interrupts it too.
    let canceller = thread::spawn(move || {
        let mut c = connect("cb_wait_cancel");
        pg_claim_sessions::wait_for(
            "standby waiting",
            std::time::Duration::from_secs(10),
            || pg_claim_sessions::running(&mut c, spid, "%claim_slot%"),
        );
        c.execute("SELECT pg_cancel_backend($1)", &[&spid]).unwrap();
    });
    let e = standby
        .query_one("SELECT claim_slot($1, 1, '60 s')", &[&name])
        .unwrap_err();
    canceller.join().unwrap();
    assert_eq!(sqlstate(&e), "57014");
    assert_eq!(backend_locks(&mut standby), 0);
}

/// utime + stime of a process, in clock ticks (the server runs on this machine).
fn cpu_ticks(pid: i32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<i64>().unwrap() + f[12].parse::<i64>().unwrap()
}

/// A foreign session holding pg_claim's n record key exclusively (misuse of
/// the documented key range) makes claims fail cleanly instead of half-claiming.
#[test]
fn foreign_exclusive_lock_on_the_n_record_is_reported() {
    let name = "cb_foreign";
    let mut foreign = connect("cb_foreign_raw");
    foreign
        .execute(
            "SELECT pg_advisory_lock(
                 (crc32($1::text) - CASE WHEN crc32($1::text) >= 2147483648
                                         THEN 4294967296 ELSE 0 END)::int4,
                 x'10000003'::int4)",
            &[&name],
        )
        .unwrap();
    let mut c = connect("cb_foreign_claimer");
    let e = c
        .query_one("SELECT claim_slot($1, 3)", &[&name])
        .unwrap_err();
    assert_eq!(sqlstate(&e), "55P03");
    let msg = e.as_db_error().unwrap().message().to_string();
    assert!(msg.contains("268435459"), "{msg}");
    assert_eq!(backend_locks(&mut c), 0);
    foreign
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    let s: Option<i32> = c
        .query_one("SELECT claim_slot($1, 3)", &[&name])
        .unwrap()
        .get(0);
    assert_eq!(s, Some(0));
}
