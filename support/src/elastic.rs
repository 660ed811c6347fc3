//! A member of an elastic lease fleet: the loop of the demo's lease mode
//! (`demo/src/lease_worker.rs`) and of the elastic benchmark's lease fleet
//! (`bench/src/bin/elastic_bench/fleet.rs`), written once. A member is two
//! threads, each with a connection of its own (through a transaction-mode
//! pooler, client connections):
//!
//! - the lease thread calls `claim_leases` every third of the TTL; its
//!   result, every slot the member holds with its token, replaces the
//!   member's [`Map`]. After a failed call the map is kept until a TTL has
//!   passed since the last success, then cleared (its leases may have
//!   expired). When the member leaves, it waits for the work loop to end
//!   (at most a TTL), then gives every slot back with `max => 0`; a killed
//!   member calls nothing more (its leases run out after their TTL).
//! - the work loop walks the map's slots round robin, one batch of a slot's
//!   share per turn: `my_items` after the slot's cursor (kept per slot and
//!   token: a slot held with a new token starts where [`Member::start`]
//!   says), the work outside any transaction, then the batch's fenced
//!   write. A write `fence` refused (`PC001`) drops the slot from the map
//!   until the next `claim_leases` result. After each write, the slots the
//!   member says another holder wants ([`Member::take_wanted`], from the
//!   batch's `report_backlog`) are given back ([`Member::release`]) and
//!   leave the map: a hand-over at the next batch, not at the next renew.
//!
//! The statements, the counting and the reporting are the program's: the
//! [`Member`] trait.

use postgres::Client;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// What a member is doing, as the program tells the loops.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    Run,
    /// The work loop ends after its batch; then the lease thread gives every
    /// slot back (`max => 0`).
    Leave,
    /// Both loops stop at once, as a killed process: no more calls, no
    /// give-back, an unwritten batch abandoned.
    Kill,
}

/// One row of a `claim_leases` result.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Lease {
    pub slot: i32,
    pub token: i64,
    /// `expires_at` in seconds since the epoch, where the program reads it.
    pub expires: Option<f64>,
}

/// How a batch's write ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Written {
    /// Written (or failed, counted by the program): the cursor moves past
    /// the batch.
    Done,
    /// `fence` refused it: the lease is gone, the slot leaves the map.
    Refused,
    /// Not written: the slot left the map meanwhile (its next holder does
    /// the batch); the cursor stays.
    Skipped,
}

/// The slots a member holds, slot -> token, and when the `claim_leases`
/// call that returned them was sent (they last at least a TTL from then).
#[derive(Default)]
pub struct Map {
    inner: Mutex<(BTreeMap<i32, i64>, Option<Instant>)>,
}

impl Map {
    fn lock(&self) -> MutexGuard<'_, (BTreeMap<i32, i64>, Option<Instant>)> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slots held, in slot order, with their tokens.
    pub fn held(&self) -> Vec<(i32, i64)> {
        self.lock().0.iter().map(|(s, t)| (*s, *t)).collect()
    }

    /// When the call that returned the map was sent.
    pub fn sent(&self) -> Option<Instant> {
        self.lock().1
    }

    /// Whether `slot` is held with `token`.
    pub fn holds(&self, slot: i32, token: i64) -> bool {
        self.lock().0.get(&slot) == Some(&token)
    }

    /// Replaces the map with a `claim_leases` result; `then` sees the map
    /// before, called while the map is locked (the work loop takes no slot
    /// of the new map before the program has seen it).
    fn replace(&self, leases: &[Lease], sent: Option<Instant>, then: impl FnOnce(&[(i32, i64)])) {
        let mut m = self.lock();
        let before: Vec<(i32, i64)> = m.0.iter().map(|(s, t)| (*s, *t)).collect();
        m.0 = leases.iter().map(|l| (l.slot, l.token)).collect();
        m.1 = sent.or(m.1);
        then(&before);
    }

    /// The token `slot` is held with, if it is.
    fn token_of(&self, slot: i32) -> Option<i64> {
        self.lock().0.get(&slot).copied()
    }

    /// Drops `slot` if it is still held with `token`.
    fn drop_lease(&self, slot: i32, token: i64) {
        let mut m = self.lock();
        if m.0.get(&slot) == Some(&token) {
            m.0.remove(&slot);
        }
    }

    /// The next slot after `last` (round robin) that `open` accepts; none
    /// while the map is older than `stale` (if given).
    fn next(
        &self,
        last: i32,
        stale: Option<Duration>,
        open: impl Fn(i32) -> bool,
    ) -> Option<(i32, i64)> {
        let m = self.lock();
        if let Some(stale) = stale {
            if m.1.is_none_or(|t| t.elapsed() >= stale) {
                return None;
            }
        }
        let ok = |(s, _): &(&i32, &i64)| open(**s);
        m.0.range(last + 1..)
            .find(ok)
            .or_else(|| m.0.iter().find(ok))
            .map(|(s, t)| (*s, *t))
    }
}

/// What a program supplies: its statements, its counting and reporting.
/// Errors returned as `Err` end the loop that got them (reported with
/// [`Member::failed`]).
pub trait Member: Sync {
    /// The TTL the member's leases are claimed with.
    fn ttl(&self) -> Duration;
    fn phase(&self) -> Phase;
    /// A connection for the lease thread (`"leases"`) or the work loop
    /// (`"work"`).
    fn connect(&self, what: &str) -> Result<Client, String>;
    /// `claim_leases(name, n, holder, ttl => ...)`, with `max => 0` when
    /// `leave`: every slot held after the call.
    fn claim(&self, c: &mut Client, leave: bool) -> Result<Vec<Lease>, postgres::Error>;
    /// A call's result is being installed as the map (`before`: the map
    /// before); called with the map locked.
    fn claimed(&self, _sent: Instant, _before: &[(i32, i64)], _after: &[Lease]) {}
    /// The map is being cleared: no call succeeded for a TTL (`before`: the
    /// map before); called with the map locked.
    fn lost(&self, _before: &[(i32, i64)]) {}
    /// A call failed; the connection is dropped and made again.
    fn claim_failed(&self, e: &postgres::Error);
    /// The give-back call returned (`had`: the map before it).
    fn gave_back(&self, had: &[(i32, i64)], result: Result<Vec<Lease>, postgres::Error>);
    /// How long the lease thread waits before its first call.
    fn first_call(&self) -> Duration {
        Duration::ZERO
    }
    /// While true, the lease thread calls nothing (a paused process).
    fn paused(&self) -> bool {
        false
    }
    /// Whether the work loop may start its batches.
    fn ready(&self) -> bool {
        true
    }
    /// The work loop takes no slot from a map older than this.
    fn stale_after(&self) -> Option<Duration> {
        None
    }
    /// How long the work loop waits when the map has no slot for it.
    fn idle(&self) -> Duration {
        Duration::from_millis(5)
    }
    /// Whether the work loop should work on `slot` (not finished).
    fn open(&self, _slot: i32) -> bool {
        true
    }
    /// Where the share of `slot`, held with a new `token`, stands: the
    /// cursor to start after.
    fn start(&self, _c: &mut Client, _slot: i32, _token: i64) -> Result<Option<i64>, String> {
        Ok(None)
    }
    /// The next batch of `slot`'s share after `after`; `Ok(None)` when the
    /// fetch failed and the loop should go on (the program counted it).
    fn fetch(
        &self,
        c: &mut Client,
        slot: i32,
        after: Option<i64>,
    ) -> Result<Option<Vec<i64>>, String>;
    /// The share of `slot` was walked to its end.
    fn finished(&self, _slot: i32) {}
    /// The work on a batch, outside any transaction.
    fn work(&self, ids: &[i64]);
    /// The batch's fenced write.
    fn write(
        &self,
        c: &mut Client,
        map: &Map,
        slot: i32,
        token: i64,
        ids: &[i64],
    ) -> Result<Written, String>;

    /// The slots of this member that another holder wants, as the last
    /// write's `report_backlog` answered (taken: the next call returns the
    /// next write's). None by default: a member that reports no weight.
    fn take_wanted(&self) -> Vec<i32> {
        Vec::new()
    }

    /// Gives `slot` back after its batch (`release_lease`); it leaves the
    /// map either way.
    fn release(&self, _c: &mut Client, _slot: i32, _token: i64) -> Result<(), String> {
        Ok(())
    }

    /// A loop ended on an error.
    fn failed(&self, msg: String);
}

/// Runs a member until it leaves or is killed: the lease thread beside, the
/// work loop on the calling thread.
pub fn run<M: Member>(m: &M, map: &Map) {
    let work_ended = AtomicBool::new(false);
    thread::scope(|sc| {
        let leases = sc.spawn(|| lease_loop(m, map, &work_ended));
        match m.connect("work") {
            Ok(mut c) => {
                if let Err(msg) = work_loop(m, map, &mut c) {
                    m.failed(msg);
                }
            }
            Err(msg) => m.failed(msg),
        }
        work_ended.store(true, Ordering::SeqCst);
        let _ = leases.join();
    });
}

/// Sleeps until `until`, waking early when the member stops running or
/// `also` is set; whether it is still running.
fn sleep_running<M: Member>(m: &M, until: Instant, also: &AtomicBool) -> bool {
    loop {
        if m.phase() != Phase::Run || also.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        thread::sleep((until - now).min(Duration::from_millis(5)));
    }
}

/// The lease thread (see the module's comment).
fn lease_loop<M: Member>(m: &M, map: &Map, work_ended: &AtomicBool) {
    let ttl = m.ttl();
    let mut conn: Option<Client> = None;
    sleep_running(m, Instant::now() + m.first_call(), work_ended);
    let mut last_ok = Instant::now();
    let mut next = Instant::now();
    loop {
        match m.phase() {
            Phase::Kill => return,
            Phase::Leave => {
                let deadline = Instant::now() + ttl;
                while !work_ended.load(Ordering::SeqCst) && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                return give_back(m, map, conn);
            }
            Phase::Run if work_ended.load(Ordering::SeqCst) => return give_back(m, map, conn),
            Phase::Run => {}
        }
        if m.paused() {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        let sent = Instant::now();
        let result = match conn.as_mut() {
            Some(c) => m.claim(c, false).map_err(Some),
            None => match m.connect("leases") {
                Ok(c) => m.claim(conn.insert(c), false).map_err(Some),
                Err(msg) => {
                    m.failed(msg);
                    Err(None)
                }
            },
        };
        match result {
            Ok(leases) => {
                map.replace(&leases, Some(sent), |before| {
                    m.claimed(sent, before, &leases)
                });
                last_ok = sent;
            }
            Err(e) => {
                if let Some(e) = e {
                    m.claim_failed(&e);
                }
                conn = None;
                if sent.duration_since(last_ok) >= ttl {
                    map.replace(&[], None, |before| m.lost(before));
                }
            }
        }
        next = (next + ttl / 3).max(Instant::now());
        sleep_running(m, next, work_ended); // leaving or killed: handled at the top
    }
}

/// Gives every slot back and leaves the live set: `max => 0`.
fn give_back<M: Member>(m: &M, map: &Map, conn: Option<Client>) {
    let had = map.held();
    let conn = match conn {
        Some(c) => Ok(c),
        None => m.connect("leases"),
    };
    match conn {
        Ok(mut c) => {
            let result = m.claim(&mut c, true);
            if result.is_ok() {
                map.replace(&[], None, |_| {});
            }
            m.gave_back(&had, result);
        }
        Err(msg) => m.failed(msg),
    }
}

/// The work loop (see the module's comment).
fn work_loop<M: Member>(m: &M, map: &Map, c: &mut Client) -> Result<(), String> {
    while !m.ready() {
        if m.phase() != Phase::Run {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(1));
    }
    // slot -> (token, cursor)
    let mut cursors: HashMap<i32, (i64, Option<i64>)> = HashMap::new();
    let mut last_slot = -1;
    let mut empty_in_a_row = 0usize;
    while m.phase() == Phase::Run {
        let Some((slot, token)) = map.next(last_slot, m.stale_after(), |s| m.open(s)) else {
            thread::sleep(m.idle());
            continue;
        };
        last_slot = slot;
        let after = match cursors.get(&slot) {
            Some(&(t, after)) if t == token => after,
            _ => {
                let after = m.start(c, slot, token)?;
                cursors.insert(slot, (token, after));
                after
            }
        };
        let Some(ids) = m.fetch(c, slot, after)? else {
            continue;
        };
        let Some(&last) = ids.last() else {
            // The share is walked to its end: from its beginning next time;
            // when every held slot came back empty, the table is drained.
            cursors.insert(slot, (token, None));
            m.finished(slot);
            empty_in_a_row += 1;
            if empty_in_a_row >= map.held().len() {
                thread::sleep(Duration::from_millis(5));
            }
            continue;
        };
        empty_in_a_row = 0;
        m.work(&ids);
        if m.phase() == Phase::Kill {
            return Ok(()); // the batch is abandoned, as by a killed process
        }
        match m.write(c, map, slot, token, &ids)? {
            Written::Done => {
                cursors.insert(slot, (token, Some(last)));
            }
            Written::Refused => map.drop_lease(slot, token),
            Written::Skipped => {}
        }
        for wanted in m.take_wanted() {
            if let Some(t) = map.token_of(wanted) {
                map.drop_lease(wanted, t);
                cursors.remove(&wanted);
                m.release(c, wanted, t)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(slot: i32, token: i64) -> Lease {
        Lease {
            slot,
            token,
            expires: None,
        }
    }

    #[test]
    fn round_robin_over_open_slots() {
        let map = Map::default();
        map.replace(
            &[lease(1, 10), lease(4, 40), lease(6, 60)],
            Some(Instant::now()),
            |before| assert!(before.is_empty()),
        );
        assert_eq!(map.next(-1, None, |_| true), Some((1, 10)));
        assert_eq!(map.next(1, None, |_| true), Some((4, 40)));
        assert_eq!(map.next(6, None, |_| true), Some((1, 10)));
        assert_eq!(map.next(1, None, |s| s != 4), Some((6, 60)));
        assert_eq!(map.next(1, None, |_| false), None);
    }

    #[test]
    fn a_stale_map_gives_no_slot() {
        let map = Map::default();
        assert_eq!(map.next(-1, Some(Duration::from_secs(9)), |_| true), None);
        let long_ago = Instant::now() - Duration::from_secs(10);
        map.replace(&[lease(2, 20)], Some(long_ago), |_| {});
        assert_eq!(map.next(-1, Some(Duration::from_secs(9)), |_| true), None);
        assert_eq!(
            map.next(-1, Some(Duration::from_secs(11)), |_| true),
            Some((2, 20))
        );
        assert_eq!(map.next(-1, None, |_| true), Some((2, 20)));
    }

    #[test]
    fn a_refused_lease_leaves_only_with_its_token() {
        let map = Map::default();
        map.replace(&[lease(3, 30)], Some(Instant::now()), |_| {});
        map.drop_lease(3, 29);
        assert!(map.holds(3, 30));
        map.drop_lease(3, 30);
        assert!(!map.holds(3, 30));
        assert_eq!(map.held(), vec![]);
    }
}
