//! The last free slot of n = 1024: another session holds slots 0..1022
//! (taken directly through the documented key layout), and claiming the one
//! left is timed against claiming with all 1024 free.

use crate::connect;
use crate::latency::pair_us;
use pg_claim_support::median;
use postgres::Client;

pub fn run(c: &mut Client, iters: usize, rounds: usize) {
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
            if (i + k) % 2 == 0 {
                t_last.push(pair_us(c, &claim_last, &release_last));
            } else {
                t_free.push(pair_us(c, &claim_free, &release_free));
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
}
