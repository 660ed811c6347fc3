//! Step 1 of the claim protocol: *establish* `n` for a name under its claim
//! mutex, or name the live claimers that use another `n`; and `leave`, which
//! gives back what it takes.

use super::probe;
use crate::backend::error::raise;
use crate::backend::limits::MAX_N;
use crate::locks::{
    held_by_me, lock, locks_of, try_lock, unlock, CLAIMERS_KEY, CLAIM_MUTEX_KEY, EXCLUSIVE,
    N_RECORD_BASE, SHARE,
};
use pgrx::prelude::*;
use pgrx::PgTryBuilder;

/// Whether another session holds `key2` in a mode that conflicts with
/// ExclusiveLock (for the keys tested here: shared holds of live claimers).
/// Only called under the claim mutex, so the momentary test lock disturbs no one.
fn held_by_others(key1: i32, key2: i32) -> bool {
    if try_lock(key1, key2, EXCLUSIVE) {
        unlock(key1, key2, EXCLUSIVE);
        false
    } else {
        true
    }
}

/// Step 1 of the protocol: become a live claimer of `name` with `n`, or raise
/// the mismatch ERROR.
pub(super) fn establish(name: &str, key1: i32, n: i32) {
    let rec = N_RECORD_BASE + n;
    lock(key1, CLAIM_MUTEX_KEY, EXCLUSIVE);
    let outcome = PgTryBuilder::new(|| {
        for _ in 0..100 {
            if !held_by_others(key1, CLAIMERS_KEY) || held_by_others(key1, rec) {
                if !try_lock(key1, rec, SHARE) {
                    key_in_use(name, key1, rec);
                }
                if !try_lock(key1, CLAIMERS_KEY, SHARE) {
                    unlock(key1, rec, SHARE);
                    key_in_use(name, key1, CLAIMERS_KEY);
                }
                return None;
            }
            // Live claimers with another n: find one to name it. If they all
            // left between the two tests, test again.
            // SAFETY: MyProcPid is set for every backend.
            let me = unsafe { pg_sys::MyProcPid };
            let records: Vec<(i32, i32)> =
                locks_of(key1, N_RECORD_BASE + 1, N_RECORD_BASE + MAX_N + 1)
                    .iter()
                    .filter(|l| l.granted && l.mode == SHARE && l.pid != me)
                    .map(|l| (l.key2 - N_RECORD_BASE, l.pid))
                    .collect();
            if let Some(other) = probe::conflicting_n(&records, n) {
                return Some(other);
            }
        }
        Some((0, 0))
    })
    .catch_others(|cause| {
        // out of shared memory (53200) on the second lock, cancel: leave
        // neither the n record nor the claimers lock behind
        leave(key1, n);
        unlock(key1, CLAIM_MUTEX_KEY, EXCLUSIVE);
        cause.rethrow()
    })
    .execute();
    unlock(key1, CLAIM_MUTEX_KEY, EXCLUSIVE);
    match outcome {
        None => {}
        Some((0, _)) => raise(
            PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
            format!("cannot establish n = {n} for \"{name}\": its claimers keep changing"),
            "Retry the claim.",
        ),
        Some((other, pid)) => raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "n = {n} does not match n = {other} used by the live claimers of \"{name}\" (for example pid {pid})"
            ),
            "All workers of one name must use the same n. Use the same n, or stop the workers with the other n first (SELECT * FROM slot_holders(name)).",
        ),
    }
}

/// Another application holds one of pg_claim's keys in a conflicting mode.
fn key_in_use(name: &str, key1: i32, key2: i32) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        format!(
            "advisory lock ({key1}, {key2}) of \"{name}\" is held exclusively by a session that is not a pg_claim claimer"
        ),
        "Another application uses pg_claim's two-int4 advisory key range; see the key layout in docs/claiming.md.",
    )
}

/// Release this session's n record and "claimers" holds of a name.
pub(super) fn leave(key1: i32, n: i32) {
    for key2 in [N_RECORD_BASE + n, CLAIMERS_KEY] {
        // bounded: each call releases one hold
        for _ in 0..64 {
            if !held_by_me(key1, key2, SHARE) {
                break;
            }
            unlock(key1, key2, SHARE);
        }
    }
}
