//! Step 2 of the claim protocol and the standby's sleep: taking free slot
//! locks with conditional acquisitions, lowest first, then in `probe` order.

use super::probe;
use crate::locks::{held_by_me, locks_of, try_lock, EXCLUSIVE, SHARE};
use pgrx::pg_sys;

/// Slots tried one by one, lowest first, before reading the lock table.
const LINEAR_PROBES: i32 = 64;

/// One pass over the slots: the lowest `LINEAR_PROBES` one by one (a failed
/// conditional acquisition costs about 0.2 us), then, for larger `n`, one
/// snapshot of the lock table and its free slots.
pub(super) fn attempt_once(key1: i32, n: i32, seed: u32) -> Option<i32> {
    let linear = n.min(LINEAR_PROBES);
    if let Some(slot) = (0..linear).find(|&s| try_slot(key1, s)) {
        return Some(slot);
    }
    if n <= LINEAR_PROBES {
        return None;
    }
    let held = held_slots(key1, n);
    let found = probe::FreeSlots::new(n, &held)
        .probe_order(seed)
        .find(|&slot| try_slot(key1, slot));
    found
}

/// The slots of `0..n` whose lock someone holds now, sorted, each once.
fn held_slots(key1: i32, n: i32) -> Vec<i32> {
    let mut held: Vec<i32> = locks_of(key1, 0, n)
        .iter()
        .filter(|l| l.granted)
        .map(|l| l.key2)
        .collect();
    held.sort_unstable();
    held.dedup();
    held
}

/// Take a slot unless someone holds it. The lock manager never lets a
/// session conflict with itself, so a slot key this session already holds
/// (e.g. through a plain pg_advisory_lock) is skipped explicitly.
fn try_slot(key1: i32, slot: i32) -> bool {
    !held_by_me(key1, slot, EXCLUSIVE)
        && !held_by_me(key1, slot, SHARE)
        && try_lock(key1, slot, EXCLUSIVE)
}

/// Sleep up to `ms` milliseconds on the process latch, then honour cancel,
/// statement_timeout and termination.
pub(super) fn sleep_on_latch(ms: i64) {
    if ms > 0 {
        // SAFETY: MyLatch is this backend's latch; WaitLatch/ResetLatch are the
        // standard way for a backend to sleep interruptibly.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                ms as _,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
    }
    pg_sys::check_for_interrupts!();
}

/// Up to `want` free slots of `0..n`, lowest first, now held by this session.
pub(super) fn take_free(key1: i32, n: i32, want: usize) -> Vec<i32> {
    if want == 0 {
        return Vec::new();
    }
    if n <= LINEAR_PROBES {
        return (0..n).filter(|&s| try_slot(key1, s)).take(want).collect();
    }
    let held = held_slots(key1, n);
    (0..n)
        .filter(|s| held.binary_search(s).is_err())
        .filter(|&s| try_slot(key1, s))
        .take(want)
        .collect()
}
