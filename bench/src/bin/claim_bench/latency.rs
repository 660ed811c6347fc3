//! Claim latency, one session: claim_slot + release_slot against a bare
//! pg_try_advisory_lock + pg_advisory_unlock and `SELECT 1` twice, over the
//! wire with prepared statements (pairs interleaved) and server side only (a
//! DO loop).

use crate::us_since;
use pg_claim_support::median;
use postgres::{Client, Statement};
use std::time::Instant;

/// Microseconds of one round trip of each statement of a pair.
pub fn pair_us(c: &mut Client, a: &Statement, b: &Statement) -> f64 {
    let t = Instant::now();
    c.query_one(a, &[]).unwrap();
    c.query_one(b, &[]).unwrap();
    us_since(t)
}

pub fn run(c: &mut Client, iters: usize, rounds: usize) {
    over_the_wire(c, iters, rounds);
    server_side(c, rounds);
}

/// Claim + release vs pg_try_advisory_lock + pg_advisory_unlock, same
/// session, prepared statements, interleaved rounds, median.
fn over_the_wire(c: &mut Client, iters: usize, rounds: usize) {
    let lock = c.prepare("SELECT pg_try_advisory_lock(424242, 7)").unwrap();
    let unlock = c.prepare("SELECT pg_advisory_unlock(424242, 7)").unwrap();
    let claim = c.prepare("SELECT claim_slot('bench', 8)").unwrap();
    let release = c.prepare("SELECT release_slot('bench')").unwrap();
    let reclaim = c.prepare("SELECT claim_slot('bench', 8)").unwrap();
    let my = c.prepare("SELECT my_slot('bench')").unwrap();
    let one = c.prepare("SELECT 1").unwrap();
    // warm-up
    for _ in 0..iters / 4 {
        pair_us(c, &lock, &unlock);
    }
    for _ in 0..iters / 4 {
        pair_us(c, &claim, &release);
    }
    // Interleaved pair by pair, so drift and neighbours' load hit all kinds
    // alike; per-pair medians are robust to the shared machine's outliers.
    let (mut t_lock, mut t_claim, mut t_one) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds * iters {
        let kinds: [(&Statement, &Statement, usize); 3] =
            [(&lock, &unlock, 0), (&claim, &release, 1), (&one, &one, 2)];
        for k in 0..3 {
            let (a, b, which) = kinds[(i + k) % 3];
            let us = pair_us(c, a, b);
            [&mut t_lock, &mut t_claim, &mut t_one][which].push(us);
        }
    }
    c.query_one(&claim, &[]).unwrap();
    let t_reclaim: Vec<f64> = (0..iters).map(|_| pair_us(c, &reclaim, &my)).collect();
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
}

/// Server-side only: the same pairs in a DO loop (one round trip).
fn server_side(c: &mut Client, rounds: usize) {
    let do_loop = |c: &mut Client, body: &str| -> f64 {
        let k = 20_000;
        let sql = format!("DO $$ BEGIN FOR i IN 1..{k} LOOP {body} END LOOP; END $$");
        let mut v = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            c.batch_execute(&sql).unwrap();
            v.push(us_since(t) / k as f64);
        }
        median(v)
    };
    let s_lock = do_loop(
        c,
        "PERFORM pg_try_advisory_lock(424242, 7); PERFORM pg_advisory_unlock(424242, 7);",
    );
    let s_claim = do_loop(
        c,
        "PERFORM claim_slot('bench', 8); PERFORM release_slot('bench');",
    );
    let s_perform = do_loop(c, "PERFORM 1; PERFORM 1;");
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
}
