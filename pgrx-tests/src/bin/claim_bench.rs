//! Benchmark of slot claiming, run by bench/30-claim.sh against a throwaway
//! cluster (PGHOST/PGPORT/PGUSER from the environment):
//! - claim latency next to a bare pg_try_advisory_lock round trip, one session;
//! - the cost of claiming the last free slot of n = 1024;
//! - takeover latency percentiles (standby blocked in claim_slot(name, n, wait)).

use postgres::{Client, NoTls, Statement};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

fn dsn() -> String {
    let host = std::env::var("PGHOST").unwrap_or_else(|_| "/tmp".into());
    let port = std::env::var("PGPORT").unwrap_or_else(|_| "5432".into());
    let user = std::env::var("PGUSER").unwrap_or_else(|_| "postgres".into());
    format!("host={host} port={port} user={user} dbname=postgres")
}

fn connect(app: &str) -> Client {
    let mut c = Client::connect(&format!("{} application_name={app}", dsn()), NoTls)
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", dsn()));
    c.batch_execute("SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS pg_claim")
        .unwrap();
    c
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Mean microseconds per iteration of `pair` (two statements) over `iters`.
fn time_pair(c: &mut Client, a: &Statement, b: &Statement, iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        c.query_one(a, &[]).unwrap();
        c.query_one(b, &[]).unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() {
    let iters = env_usize("BENCH_ITERS", 2000);
    let rounds = env_usize("BENCH_ROUNDS", 7);
    let takeovers = env_usize("BENCH_TAKEOVERS", 40);

    // 1. Claim + release vs pg_try_advisory_lock + pg_advisory_unlock, same
    //    session, prepared statements, interleaved rounds, median.
    let mut c = connect("bench_claim");
    let lock = c.prepare("SELECT pg_try_advisory_lock(424242, 7)").unwrap();
    let unlock = c.prepare("SELECT pg_advisory_unlock(424242, 7)").unwrap();
    let claim = c.prepare("SELECT claim_slot('bench', 8)").unwrap();
    let release = c.prepare("SELECT release_slot('bench')").unwrap();
    let reclaim = c.prepare("SELECT claim_slot('bench', 8)").unwrap();
    let my = c.prepare("SELECT my_slot('bench')").unwrap();
    let one = c.prepare("SELECT 1").unwrap();
    // warm-up
    time_pair(&mut c, &lock, &unlock, iters / 4);
    time_pair(&mut c, &claim, &release, iters / 4);
    // Interleaved pair by pair, so drift and neighbours' load hit all kinds
    // alike; per-pair medians are robust to the shared machine's outliers.
    let (mut t_lock, mut t_claim, mut t_one) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds * iters {
        let kinds: [(&Statement, &Statement, usize); 3] =
            [(&lock, &unlock, 0), (&claim, &release, 1), (&one, &one, 2)];
        for k in 0..3 {
            let (a, b, which) = kinds[(i + k) % 3];
            let t = Instant::now();
            c.query_one(a, &[]).unwrap();
            c.query_one(b, &[]).unwrap();
            let us = t.elapsed().as_secs_f64() * 1e6;
            [&mut t_lock, &mut t_claim, &mut t_one][which].push(us);
        }
    }
    c.query_one(&claim, &[]).unwrap();
    let mut t_reclaim = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        c.query_one(&reclaim, &[]).unwrap();
        c.query_one(&my, &[]).unwrap();
        t_reclaim.push(t.elapsed().as_secs_f64() * 1e6);
    }
    c.query_one(&release, &[]).unwrap();
    let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    let (ml, mc, mo) = (mean(&t_lock), mean(&t_claim), mean(&t_one));
    let (l, cl, o) = (median(t_lock), median(t_claim), median(t_one));
    let rc = median(t_reclaim);
    println!("claim latency, one session over a Unix socket, prepared statements, {} pairs of each kind interleaved", rounds * iters);
    println!("                                                          median       mean");
    println!(
        "  SELECT 1; SELECT 1                                      {o:7.1} us {mo:7.1} us per pair"
    );
    println!(
        "  pg_try_advisory_lock(k1,k2); pg_advisory_unlock(k1,k2)  {l:7.1} us {ml:7.1} us per pair"
    );
    println!("  claim_slot('bench', 8); release_slot('bench')           {cl:7.1} us {mc:7.1} us per pair");
    println!(
        "  claim_slot (re-claim, held); my_slot                    {rc:7.1} us per pair (median)"
    );
    println!("ratio: claim_slot+release_slot / pg_try_advisory_lock+pg_advisory_unlock = {:.2}x median, {:.2}x mean  (target <= 1.2x)", cl / l, mc / ml);
    println!(
        "  increment over the bare lock pair: {:.1} us per claim+release (median)",
        cl - l
    );

    // 1b. Server-side only: the same pairs in a DO loop (one round trip).
    let do_loop = |c: &mut Client, body: &str| -> f64 {
        let k = 20_000;
        let sql = format!("DO $$ BEGIN FOR i IN 1..{k} LOOP {body} END LOOP; END $$");
        let mut v = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            c.batch_execute(&sql).unwrap();
            v.push(t.elapsed().as_secs_f64() * 1e6 / k as f64);
        }
        median(v)
    };
    let s_lock = do_loop(
        &mut c,
        "PERFORM pg_try_advisory_lock(424242, 7); PERFORM pg_advisory_unlock(424242, 7);",
    );
    let s_claim = do_loop(
        &mut c,
        "PERFORM claim_slot('bench', 8); PERFORM release_slot('bench');",
    );
    let s_perform = do_loop(&mut c, "PERFORM 1; PERFORM 1;");
    println!("server side only, a DO loop of 20000 pairs, median of {rounds} loops");
    println!(
        "  PERFORM 1; PERFORM 1                                    {s_perform:7.2} us per pair"
    );
    println!("  pg_try_advisory_lock + pg_advisory_unlock               {s_lock:7.2} us per pair");
    println!("  claim_slot + release_slot                               {s_claim:7.2} us per pair");
    println!(
        "ratio: server side, claim_slot+release_slot / advisory lock+unlock = {:.2}x",
        s_claim / s_lock
    );

    // 2. The last free slot of n = 1024: another session holds slots 0..1022
    //    (taken directly through the documented key layout).
    let mut holder = connect("bench_holder");
    holder
        .batch_execute(
            "SELECT count(pg_advisory_lock(
                 (crc32('bench1024') - CASE WHEN crc32('bench1024') >= 2147483648
                                            THEN 4294967296 ELSE 0 END)::int4, s))
             FROM generate_series(0, 1022) s",
        )
        .unwrap();
    let claim_last = c.prepare("SELECT claim_slot('bench1024', 1024)").unwrap();
    let release_last = c.prepare("SELECT release_slot('bench1024')").unwrap();
    let got: Option<i32> = c.query_one(&claim_last, &[]).unwrap().get(0);
    assert_eq!(got, Some(1023), "the only free slot");
    c.query_one(&release_last, &[]).unwrap();
    let claim_free = c
        .prepare("SELECT claim_slot('bench1024free', 1024)")
        .unwrap();
    let release_free = c.prepare("SELECT release_slot('bench1024free')").unwrap();
    let (mut t_last, mut t_free) = (Vec::new(), Vec::new());
    for i in 0..rounds * iters / 2 {
        for k in 0..2 {
            let t = Instant::now();
            if (i + k) % 2 == 0 {
                c.query_one(&claim_last, &[]).unwrap();
                c.query_one(&release_last, &[]).unwrap();
                t_last.push(t.elapsed().as_secs_f64() * 1e6);
            } else {
                c.query_one(&claim_free, &[]).unwrap();
                c.query_one(&release_free, &[]).unwrap();
                t_free.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    let (last, free) = (median(t_last), median(t_free));
    println!();
    println!(
        "claiming with n = 1024, claim_slot + release_slot pair, {} pairs of each interleaved, median",
        rounds * iters / 2
    );
    println!("  all 1024 slots free                                      {free:8.1} us per pair");
    println!("  1023 held by another session, the last one free          {last:8.1} us per pair");
    println!(
        "ratio: last free slot of 1024 / all free = {:.2}x ({:.1} us more)",
        last / free,
        last - free
    );
    drop(holder);

    // 3. Takeover latency: a standby blocked in claim_slot(name, 1, wait); the
    //    holder is terminated (pg_terminate_backend) or releases its slot.
    println!();
    println!("takeover latency, {takeovers} takeovers each: holder ends -> standby's claim_slot(name, 1, '10 s') returns to its client");
    let mut admin = connect("bench_admin");
    let mut ratio_line = Vec::new();
    for mode in ["pg_terminate_backend", "release_slot"] {
        let mut lat = Vec::new();
        for i in 0..takeovers {
            let name = format!("bench_takeover_{mode}_{i}");
            let mut h = connect("bench_takeover_holder");
            let hpid: i32 = h.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
            let s: Option<i32> = h
                .query_one("SELECT claim_slot($1, 1)", &[&name])
                .unwrap()
                .get(0);
            assert_eq!(s, Some(0));
            let (tx, rx) = mpsc::channel();
            let (ptx, prx) = mpsc::channel();
            let sname = name.clone();
            let standby = thread::spawn(move || {
                let mut s = connect("bench_takeover_standby");
                ptx.send(
                    s.query_one("SELECT pg_backend_pid()", &[])
                        .unwrap()
                        .get::<_, i32>(0),
                )
                .unwrap();
                let got: Option<i32> = s
                    .query_one("SELECT claim_slot($1, 1, '10 s')", &[&sname])
                    .unwrap()
                    .get(0);
                tx.send((got, Instant::now())).unwrap();
            });
            let spid = prx.recv().unwrap();
            // wait until the standby is inside claim_slot, then a little more so
            // its poll interval has grown to its maximum (the steady state)
            let t = Instant::now();
            loop {
                let waiting: bool = admin
                    .query_one(
                        "SELECT count(*) = 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
                        &[&spid],
                    )
                    .unwrap()
                    .get(0);
                if waiting {
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(10));
                thread::sleep(Duration::from_millis(1));
            }
            thread::sleep(Duration::from_millis(30 + (i as u64 * 7) % 13));
            let t0 = Instant::now();
            if mode == "pg_terminate_backend" {
                admin
                    .execute("SELECT pg_terminate_backend($1)", &[&hpid])
                    .unwrap();
            } else {
                h.query_one("SELECT release_slot($1)", &[&name]).unwrap();
            }
            let (got, at) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(got, Some(0));
            lat.push(at.duration_since(t0).as_secs_f64() * 1000.0);
            standby.join().unwrap();
            drop(h);
        }
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "  after {mode:21} p50 {:6.2} ms  p90 {:6.2} ms  p99 {:6.2} ms  max {:6.2} ms",
            percentile(&lat, 0.5),
            percentile(&lat, 0.9),
            percentile(&lat, 0.99),
            lat[lat.len() - 1]
        );
        ratio_line.push(percentile(&lat, 0.5));
    }
    println!(
        "ratio: takeover p50 after pg_terminate_backend / after release_slot = {:.2}x",
        ratio_line[0] / ratio_line[1]
    );
}
