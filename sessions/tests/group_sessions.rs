//! Dynamic groups with real sessions: positions follow live membership, and
//! claim_partitions keeps partitions exclusive, covered, fair, and moves only
//! what the bounds allow.

use pg_claim_sessions::{backend_pid, connect, connect_with, sqlstate, wait_for};
use postgres::Client;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(10);

fn position(c: &mut Client, group: &str) -> (Option<i32>, i32) {
    let r = c
        .query_one("SELECT index, members FROM group_position($1)", &[&group])
        .unwrap();
    (r.get(0), r.get(1))
}

fn terminate(observer: &mut Client, pid: i32) {
    let ok: bool = observer
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(ok, "could not terminate {pid}");
}

/// Every member's view of the group: the positions are 0..n-1 in the
/// order the sessions connected, and every member counts n.
fn assert_positions(members: &mut [Client], group: &str) {
    let n = members.len() as i32;
    for (i, c) in members.iter_mut().enumerate() {
        assert_eq!(position(c, group), (Some(i as i32), n), "member {i}");
    }
}

#[test]
fn positions_follow_joins_and_kills() {
    let g = "gs_positions";
    let mut observer = connect("gs_observer");
    let mut members: Vec<Client> = (0..5).map(|i| connect(&format!("gs_m{i}"))).collect();
    for c in members.iter_mut() {
        c.execute("SELECT group_join($1)", &[&g]).unwrap();
        // Joining twice is harmless.
        c.execute("SELECT group_join($1)", &[&g]).unwrap();
    }
    assert_positions(&mut members, g);
    assert_eq!(position(&mut observer, g), (None, 5));

    // group_members lists them in rank order with their details.
    let pids: Vec<i32> = members.iter_mut().map(backend_pid).collect();
    let rows = observer
        .query(
            "SELECT index, pid, application_name, backend_start IS NOT NULL FROM group_members($1)",
            &[&g],
        )
        .unwrap();
    let listed: Vec<(i32, i32, String, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let expected: Vec<(i32, i32, String, bool)> = pids
        .iter()
        .enumerate()
        .map(|(i, &p)| (i as i32, p, format!("gs_m{i}"), true))
        .collect();
    assert_eq!(listed, expected);

    // A sixth joins: it is last, nobody else moves.
    let mut sixth = connect("gs_m5");
    sixth.execute("SELECT group_join($1)", &[&g]).unwrap();
    members.push(sixth);
    assert_positions(&mut members, g);

    // Terminate the member at index 2: the others see it gone at once.
    let victim = members.remove(2);
    let victim_pid = pids[2];
    terminate(&mut observer, victim_pid);
    drop(victim);
    let took = wait_for("positions after the kill", DEADLINE, || {
        members
            .iter_mut()
            .enumerate()
            .all(|(i, c)| position(c, g) == (Some(i as i32), 5))
    });
    eprintln!("positions updated {took:?} after pg_terminate_backend");
    assert_positions(&mut members, g);

    // group_leave: false the second time; the rest close up.
    let leaver: bool = members[0]
        .query_one("SELECT group_leave($1)", &[&g])
        .unwrap()
        .get(0);
    assert!(leaver);
    let again: bool = members[0]
        .query_one("SELECT group_leave($1)", &[&g])
        .unwrap()
        .get(0);
    assert!(!again);
    assert_eq!(position(&mut members[0], g), (None, 4));
    members.remove(0);
    assert_positions(&mut members, g);
}

/// Partition owners from pg_locks: partition -> pid.
fn owners_in_pg_locks(c: &mut Client, group: &str) -> BTreeMap<i32, Vec<i32>> {
    let rows = c
        .query(
            "SELECT (objid::bigint - 805306368)::int AS p, pid FROM pg_locks
             WHERE locktype = 'advisory' AND objsubid = 2 AND granted
               AND mode = 'ExclusiveLock' AND classid = crc32($1)::oid
               AND objid::bigint BETWEEN 805306368 AND 805306368 + 1048575",
            &[&group],
        )
        .unwrap();
    let mut m: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for r in rows {
        m.entry(r.get(0)).or_default().push(r.get(1));
    }
    m
}

/// One round: every member calls claim_partitions once, all at the same
/// time (one thread each), so the calls interleave freely.
fn round(members: &mut [Client], group: &str, p: i32) -> Vec<Vec<i32>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = members
            .iter_mut()
            .map(|c| {
                s.spawn(move || -> Vec<i32> {
                    c.query_one("SELECT claim_partitions($1, $2)", &[&group, &p])
                        .unwrap()
                        .get(0)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// After two rounds: coverage, exclusivity (also in pg_locks), fair shares
/// by rank, and my_partitions agrees. Returns partition -> owner pid.
fn assert_converged(
    members: &mut [Client],
    observer: &mut Client,
    group: &str,
    p: i32,
) -> BTreeMap<i32, i32> {
    round(members, group, p);
    let held = round(members, group, p);
    let m = members.len();
    let mut owner = BTreeMap::new();
    for (i, (c, parts)) in members.iter_mut().zip(&held).enumerate() {
        let pid = backend_pid(c);
        let (index, count) = position(c, group);
        assert_eq!(count as usize, m);
        let index = index.unwrap() as usize;
        let share = p as usize / m + usize::from(index < p as usize % m);
        assert_eq!(
            parts.len(),
            share,
            "member {i} (rank {index}) holds {parts:?}"
        );
        let mine: Vec<i32> = c
            .query_one("SELECT my_partitions($1)", &[&group])
            .unwrap()
            .get(0);
        assert_eq!(&mine, parts);
        for &x in parts {
            assert!((0..p).contains(&x));
            assert!(owner.insert(x, pid).is_none(), "partition {x} held twice");
        }
    }
    assert_eq!(owner.len(), p as usize, "not every partition is held");
    let locks = owners_in_pg_locks(observer, group);
    assert_eq!(locks.len(), p as usize);
    for (x, pids) in &locks {
        assert_eq!(pids, &vec![owner[x]], "pg_locks owner of partition {x}");
    }
    owner
}

fn moved(a: &BTreeMap<i32, i32>, b: &BTreeMap<i32, i32>) -> usize {
    a.iter().filter(|(k, v)| b.get(k) != Some(v)).count()
}

#[test]
fn claim_partitions_fair_exclusive_and_minimal_movement() {
    let g = "gs_parts";
    let p = 64;
    let mut observer = connect("gs_parts_observer");
    let mut members: Vec<Client> = (0..4).map(|i| connect(&format!("gs_p{i}"))).collect();
    // Join first: a first claim_partitions call would join too, but that is
    // a membership change, and convergence counts rounds after the last one.
    for c in members.iter_mut() {
        c.execute("SELECT group_join($1)", &[&g]).unwrap();
    }
    let before = assert_converged(&mut members, &mut observer, g, p);
    let counts: Vec<usize> = {
        let mut c: BTreeMap<i32, usize> = BTreeMap::new();
        for v in before.values() {
            *c.entry(*v).or_default() += 1;
        }
        c.into_values().collect()
    };
    assert_eq!(counts, vec![16; 4]);

    // A join moves at most ceil(64/5) = 13 partitions.
    members.push(connect("gs_p4"));
    members[4].execute("SELECT group_join($1)", &[&g]).unwrap();
    let after_join = assert_converged(&mut members, &mut observer, g, p);
    let mv = moved(&before, &after_join);
    eprintln!("join 4 -> 5 members moved {mv} of {p} partitions");
    assert!(mv <= 13, "join moved {mv}");
    assert!(mv >= 12, "the newcomer must have received its share");

    // A kill moves only the victim's partitions.
    let victim = members.remove(1);
    let mut v = victim;
    let victim_pid = backend_pid(&mut v);
    let victim_parts = after_join.values().filter(|&&o| o == victim_pid).count();
    terminate(&mut observer, victim_pid);
    drop(v);
    wait_for("the victim to leave", DEADLINE, || {
        position(&mut observer, g).1 == 4
    });
    let after_kill = assert_converged(&mut members, &mut observer, g, p);
    let mv = moved(&after_join, &after_kill);
    eprintln!("kill 5 -> 4 members moved {mv} of {p} partitions (victim held {victim_parts})");
    assert_eq!(mv, victim_parts);
    for (x, o) in &after_join {
        if *o != victim_pid {
            assert_eq!(after_kill[x], *o, "partition {x} moved without need");
        }
    }

    // A different P is refused (22023) and leaves nothing behind.
    let mut odd = connect("gs_p_odd");
    let e = odd
        .query_one("SELECT claim_partitions($1, 32)", &[&g])
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22023");
    let msg = e.as_db_error().unwrap().message().to_string();
    assert!(msg.contains("32") && msg.contains("64"), "{msg}");
    assert_eq!(position(&mut odd, g), (None, 4));
    // Bounds on P.
    for bad in [0, -1, 4097] {
        let e = odd
            .query_one("SELECT claim_partitions('gs_other', $1)", &[&bad])
            .unwrap_err();
        assert_eq!(sqlstate(&e), "22023");
    }

    // Leaving releases everything at once.
    for c in members.iter_mut() {
        let left: bool = c.query_one("SELECT group_leave($1)", &[&g]).unwrap().get(0);
        assert!(left);
    }
    assert!(owners_in_pg_locks(&mut observer, g).is_empty());
}

#[test]
fn churn_never_processes_a_partition_twice_at_once() {
    use rand::Rng;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    let g = "gs_churn";
    let p: i32 = 16;
    let mut ctl = connect_with("gs_churn_ctl", "DROP TABLE IF EXISTS gs_churn_log;
         CREATE TABLE gs_churn_log (partition int, member int, started timestamptz, ended timestamptz);");

    struct Worker {
        pid: i32,
        leave: Arc<AtomicBool>,
        handle: std::thread::JoinHandle<()>,
    }
    let spawn = |n: usize| -> Worker {
        let mut c = connect(&format!("gs_churn_w{n}"));
        let pid = backend_pid(&mut c);
        let leave = Arc::new(AtomicBool::new(false));
        let flag = leave.clone();
        let handle = std::thread::spawn(move || {
            // The safe worker loop: rebalance, then process only what
            // my_partitions says, until told to leave (or killed).
            loop {
                if flag.load(Ordering::Relaxed) {
                    let _ = c.execute("SELECT group_leave($1)", &[&g]);
                    return;
                }
                if c.execute("SELECT claim_partitions($1, $2)", &[&g, &p])
                    .is_err()
                {
                    return; // killed
                }
                let step = c.execute(
                    "INSERT INTO gs_churn_log
                     SELECT part, pg_backend_pid(), s, clock_timestamp()
                     FROM (SELECT part, clock_timestamp() AS s, pg_sleep(0.002)
                           FROM unnest(my_partitions($1)) AS part) AS x",
                    &[&g],
                );
                if step.is_err() {
                    return; // killed
                }
            }
        });
        Worker { pid, leave, handle }
    };

    let mut rng = rand::thread_rng();
    let mut workers: Vec<Worker> = (0..3).map(spawn).collect();
    let mut next = 3;
    let (mut joins, mut leaves, mut kills) = (0, 0, 0);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..250)));
        match rng.gen_range(0..4) {
            0 | 3 if workers.len() < 6 => {
                workers.push(spawn(next));
                next += 1;
                joins += 1;
            }
            1 if workers.len() > 1 => {
                let w = workers.swap_remove(rng.gen_range(0..workers.len()));
                w.leave.store(true, Ordering::Relaxed);
                w.handle.join().unwrap();
                leaves += 1;
            }
            2 if workers.len() > 1 => {
                let w = workers.swap_remove(rng.gen_range(0..workers.len()));
                terminate(&mut ctl, w.pid);
                w.handle.join().unwrap();
                kills += 1;
            }
            _ => {}
        }
    }
    // Quiet period: the survivors converge to a full, fair assignment.
    let m = workers.len();
    wait_for("convergence after churn", DEADLINE, || {
        let locks = owners_in_pg_locks(&mut ctl, g);
        let mut per: BTreeMap<i32, usize> = BTreeMap::new();
        for pids in locks.values() {
            *per.entry(pids[0]).or_default() += 1;
        }
        locks.len() == p as usize
            && per.len() == m
            && per
                .values()
                .all(|&k| k == p as usize / m || k == (p as usize).div_ceil(m))
    });
    std::thread::sleep(Duration::from_millis(300));
    for w in workers {
        w.leave.store(true, Ordering::Relaxed);
        w.handle.join().unwrap();
    }
    eprintln!("churn: {joins} joins, {leaves} leaves, {kills} kills, {m} survivors");
    assert!(
        joins + leaves + kills >= 5,
        "too little churn to mean anything"
    );

    // Never two members processing one partition at the same moment.
    let overlaps: i64 = ctl
        .query_one(
            "SELECT count(*) FROM gs_churn_log a JOIN gs_churn_log b
               ON a.partition = b.partition AND a.member <> b.member
              AND tstzrange(a.started, a.ended) && tstzrange(b.started, b.ended)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        overlaps, 0,
        "a partition was processed by two members at once"
    );

    // Every partition kept being served: processed often, no long gaps.
    let rows = ctl
        .query(
            "SELECT partition, count(*), max(gap) FROM (
               SELECT partition, started - lag(ended) OVER (PARTITION BY partition ORDER BY started) AS gap
               FROM gs_churn_log) x
             GROUP BY partition ORDER BY partition",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), p as usize, "some partition was never processed");
    let distinct: BTreeSet<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(distinct, (0..p).collect());
    let max_gap_ms: f64 = ctl
        .query_one(
            "SELECT (extract(epoch FROM max(gap)) * 1000)::float8 FROM (
               SELECT started - lag(ended) OVER (PARTITION BY partition ORDER BY started) AS gap
               FROM gs_churn_log) x",
            &[],
        )
        .unwrap()
        .get::<_, Option<f64>>(0)
        .unwrap_or(0.0);
    let min_count: i64 = rows.iter().map(|r| r.get::<_, i64>(1)).min().unwrap();
    eprintln!("churn: every partition processed at least {min_count} times, longest gap {max_gap_ms:.0} ms");
    assert!(min_count >= 20);
    assert!(
        max_gap_ms < 3000.0,
        "a partition went unserved for {max_gap_ms} ms"
    );
    ctl.batch_execute("DROP TABLE gs_churn_log").unwrap();
}
