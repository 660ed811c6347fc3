//! Claiming an identity: claim_slot, release_slot, my_slot, slot_holders (reference: docs/claiming.md).
//!
//! A slot of a name is a session-level advisory lock in the two-`int4` key
//! space (`src/locks.rs` has the key layout): `(name_key(name), slot)`,
//! exclusive. While a session holds a slot it also holds the shared "n record"
//! lock `(name_key(name), 0x10000000 + n)`, so a claimer with another `n` can
//! see the live `n` in the lock table and is refused.
//!
//! Claim protocol (one statement, no client round trips, no lock-table scan
//! on the common path):
//! 1. *establish* under the name's claim mutex (an exclusive advisory lock held
//!    for a few microseconds): if another session holds the n record of `n`,
//!    live claimers use `n` (all live claimers agree, see below); else if no
//!    session holds the name's "claimers" lock, there are no live claimers;
//!    else live claimers use another `n`: read the lock table once to name it
//!    and raise an ERROR. Then take the shared n record and "claimers" locks and
//!    release the mutex. Since every claimer checks and joins under the mutex,
//!    the live claimers of a name always agree on `n`;
//! 2. try the slots lowest first with conditional lock acquisitions (the lock
//!    manager guarantees that no two sessions get the same slot); past the
//!    first 64 slots, read the lock table once and try its free slots, lowest
//!    first, then from a pid-derived offset (see `probe`);
//! 3. standby (`wait`): if none was free, sleep on the process latch a few
//!    milliseconds and go back to 2, until the deadline. While it waits, the
//!    standby holds the name's "waiters" lock (RowExclusive), which tells
//!    `claim_slots` holders to give an extra slot back.
//!
//! `claim_slots` adds *extra* slots to a session's own one: free slots up to
//! `max` while nobody wants one, and back one per call while a standby (or a
//! holder below its fair share) does; see `claim_many`.

mod probe;
mod registry;

pub(crate) use registry::{known_or_checked as name_registered, owns_key, register_name};

use crate::backend::error::{internal, invalid_parameter, n_below_one, raise};
use crate::backend::limits::MAX_N;
use crate::backend::settings::{self, STANDBY_POLL_MAX};
use crate::locks::{
    held_by_me, lock, locks_of, name_key, try_lock, unlock, CLAIMERS_KEY, CLAIM_MUTEX_KEY,
    EXCLUSIVE, N_RECORD_BASE, ROW_EXCLUSIVE, SHARE, WAITERS_KEY,
};
use pgrx::prelude::*;
use pgrx::PgTryBuilder;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

// slot_status is SQL (it reads the lock table through pg_locks and the
// leases through lease_holders, inside a PL/pgSQL body resolved when it runs).
pgrx::extension_sql_file!("../sql/status.sql", name = "slot_status");

// The name registry: the table pg_claim_names and the internal function
// pg_claim_register_name (sql/names.sql; see `registry`).
pgrx::extension_sql_file!("../sql/names.sql", name = "names");

// Who may claim: EXECUTE on the claiming functions granted to PUBLIC by the
// extension's owner, who can therefore revoke it (sql/grants.sql). Last in
// the install script: it grants on functions defined everywhere else.
pgrx::extension_sql_file!("../sql/grants.sql", name = "grants", finalize);

/// What this session holds, per name key.
#[derive(Debug, Clone)]
struct Held {
    name: String,
    /// The session's own slot (`my_slot`).
    slot: i32,
    n: i32,
    /// Further slots taken by `claim_slots`, ascending.
    extra: Vec<i32>,
}

thread_local! {
    static HELD: RefCell<HashMap<i32, Held>> = RefCell::new(HashMap::new());
}

/// This session's claim for `key1`, if its locks are still held. A claim
/// whose locks were released behind pg_claim's back (`pg_advisory_unlock_all()`)
/// is forgotten here, together with any remaining hold of its n record.
fn current_claim(key1: i32) -> Option<Held> {
    let h = HELD.with(|m| m.borrow().get(&key1).cloned())?;
    let rec = N_RECORD_BASE + h.n;
    if held_by_me(key1, h.slot, EXCLUSIVE) && held_by_me(key1, rec, SHARE) {
        if h.extra.iter().all(|&s| held_by_me(key1, s, EXCLUSIVE)) {
            return Some(h);
        }
        let kept = HELD.with(|m| {
            let mut m = m.borrow_mut();
            let h = m.get_mut(&key1).expect("checked above");
            h.extra.retain(|&s| held_by_me(key1, s, EXCLUSIVE));
            h.clone()
        });
        return Some(kept);
    }
    forget(key1, &h);
    None
}

/// Drop the bookkeeping of a claim and release whatever is left of its locks.
fn forget(key1: i32, h: &Held) {
    HELD.with(|m| m.borrow_mut().remove(&key1));
    stop_waiting(key1);
    for &slot in h.extra.iter().chain(std::iter::once(&h.slot)) {
        if held_by_me(key1, slot, EXCLUSIVE) {
            unlock(key1, slot, EXCLUSIVE);
        }
    }
    leave(key1, h.n);
}

/// Stop announcing that this session waits for a slot of the name.
fn stop_waiting(key1: i32) {
    while held_by_me(key1, WAITERS_KEY, ROW_EXCLUSIVE) {
        unlock(key1, WAITERS_KEY, ROW_EXCLUSIVE);
    }
}

/// Whether some other session waits for a slot of the name. The test lock
/// is Share, which conflicts with the waiters' RowExclusive holds only, so
/// holders testing at the same moment do not see each other.
fn others_waiting(key1: i32) -> bool {
    if try_lock(key1, WAITERS_KEY, SHARE) {
        unlock(key1, WAITERS_KEY, SHARE);
        false
    } else {
        true
    }
}

/// Release this session's n record and "claimers" holds of a name.
fn leave(key1: i32, n: i32) {
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
fn establish(name: &str, key1: i32, n: i32) {
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

fn require_name(name: Option<&str>) -> &str {
    match name {
        Some(s) => s,
        None => raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            "name must not be null".to_string(),
            "The name identifies the worker fleet, e.g. claim_slot('mailer', 8); a NULL name is usually an unset variable in the client.",
        ),
    }
}

/// The hint for a NULL or bad `n` of a claim.
const CLAIM_N_HINT: &str =
    "The argument n is the number of slots (workers) of the name: pass the same n from every worker.";

fn check_claim_n(n: Option<i32>) -> i32 {
    match n {
        None => raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            "n must not be null".to_string(),
            CLAIM_N_HINT,
        ),
        Some(n) if n < 1 => n_below_one(n, CLAIM_N_HINT),
        Some(n) if n > MAX_N => invalid_parameter(
            format!("n must be at most {MAX_N}, got {n}"),
            "Each held slot is one entry in PostgreSQL's shared lock table; split the work into at most 1048576 slots.",
        ),
        Some(n) => n,
    }
}

/// The wait of the standby form, in microseconds.
fn wait_micros(wait: Option<pgrx::datum::Interval>) -> i64 {
    let Some(w) = wait else {
        raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            "wait must not be null".to_string(),
            "Pass how long to wait for a free slot, e.g. interval '30 seconds', or use claim_slot(name, n) to not wait.",
        )
    };
    let us = w.as_micros();
    if us < 0 {
        invalid_parameter(
            format!("wait must not be negative, got {w}"),
            "Pass how long to wait for a free slot, e.g. interval '30 seconds', or interval '0' to not wait.",
        );
    }
    us.min(i64::MAX as i128) as i64
}

/// The claim itself; `wait_us` None means a single attempt.
fn claim(name: &str, n: i32, wait_us: Option<i64>) -> Option<i32> {
    let key1 = name_key(name);
    // A claiming session notices a dead client while busy, for the rest of
    // the session.
    settings::apply_client_check(true);
    if let Some(h) = current_claim(key1) {
        if h.name != name {
            raise(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "name \"{name}\" shares its lock key {} with \"{}\", whose slot {} this session holds",
                    key1 as u32, h.name, h.slot
                ),
                "Names are keyed by their crc32: rename one of the two so that crc32(a) <> crc32(b).",
            );
        }
        if h.n != n {
            raise(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "n = {n} does not match n = {} of slot {} of \"{name}\", which this session holds",
                    h.n, h.slot
                ),
                "All workers of one name must use the same n; call release_slot first to claim with another n.",
            );
        }
        if !registry::known_or_checked(name) {
            // registered in a transaction that rolled back
            registry::register_name(name);
        }
        return Some(h.slot);
    }

    crate::locks::ensure_room(CLAIM_LOCKS + usize::from(wait_us.is_some()), || {
        format!("claim_slot(\"{name}\", {n})")
    });
    // The name's lock key must be its own (42710 when another name has it).
    registry::register_name(name);
    establish(name, key1, n);
    // A wait too long to add to the clock (centuries) has no deadline: the
    // standby waits until a slot frees or the statement is cancelled.
    let deadline =
        wait_us.and_then(|us| Instant::now().checked_add(Duration::from_micros(us as u64)));
    let waits = wait_us.is_some();
    // SAFETY: MyProcPid is set for every backend.
    let seed = probe::seed_of(unsafe { pg_sys::MyProcPid });

    let got = PgTryBuilder::new(|| {
        let mut attempt = 0u32;
        loop {
            if let Some(slot) = attempt_once(key1, n, seed) {
                return Some(slot);
            }
            if !waits {
                return None;
            }
            // A standby: say so, for claim_slots holders (a holder's test
            // lock may be in the way for a moment: try again next round).
            if !held_by_me(key1, WAITERS_KEY, ROW_EXCLUSIVE) {
                try_lock(key1, WAITERS_KEY, ROW_EXCLUSIVE);
            }
            let remaining = match deadline {
                None => i64::MAX,
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return None;
                    }
                    (deadline - now).as_micros().min(i64::MAX as u128) as i64
                }
            };
            let ms = probe::next_sleep_ms(attempt, STANDBY_POLL_MAX.get() as u32, remaining);
            attempt = attempt.saturating_add(1);
            sleep_on_latch(ms);
        }
    })
    .catch_others(|cause| {
        // cancel, statement_timeout, termination: leave nothing behind.
        stop_waiting(key1);
        leave(key1, n);
        cause.rethrow()
    })
    .execute();
    stop_waiting(key1);
    if let Some(slot) = got {
        refuse_if_leased(name, key1, n, slot);
    }

    match got {
        Some(slot) => {
            HELD.with(|m| {
                m.borrow_mut().insert(
                    key1,
                    Held {
                        name: name.to_string(),
                        slot,
                        n,
                        extra: Vec::new(),
                    },
                )
            });
            Some(slot)
        }
        None => {
            leave(key1, n);
            None
        }
    }
}

/// One slot, one holder, whatever the mode: with the new slot lock held,
/// wait for any `claim_lease` of the name in progress, then give the slot
/// back and refuse (55000) when the name has a live lease. `claim_lease`
/// refuses in turn while a session holds a slot of the name, so of the two
/// racing, one always sees the other.
fn refuse_if_leased(name: &str, key1: i32, n: i32, slot: i32) {
    let give_back = || {
        if held_by_me(key1, slot, EXCLUSIVE) {
            unlock(key1, slot, EXCLUSIVE);
        }
        leave(key1, n);
    };
    let is_leased = PgTryBuilder::new(|| registry::leased(name))
        .catch_others(|cause| {
            give_back();
            cause.rethrow()
        })
        .execute();
    if is_leased {
        give_back();
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("name \"{name}\" is leased with claim_lease; it cannot also be claimed with claim_slot"),
            "Use one mode per name: claim_slot (and my_token), or claim_lease. Let the leases of the name expire or release them (SELECT * FROM lease_holders(name)), or use another name.",
        );
    }
}

/// Locks a claim holds: the slot, the n record, the claimers lock.
const CLAIM_LOCKS: usize = 3;

/// Slots tried one by one, lowest first, before reading the lock table.
const LINEAR_PROBES: i32 = 64;

/// One pass over the slots: the lowest `LINEAR_PROBES` one by one (a failed
/// conditional acquisition costs about 0.2 us), then, for larger `n`, one
/// snapshot of the lock table and its free slots.
fn attempt_once(key1: i32, n: i32, seed: u32) -> Option<i32> {
    let linear = n.min(LINEAR_PROBES);
    if let Some(slot) = (0..linear).find(|&s| try_slot(key1, s)) {
        return Some(slot);
    }
    if n <= LINEAR_PROBES {
        return None;
    }
    let mut held: Vec<i32> = locks_of(key1, 0, n)
        .iter()
        .filter(|l| l.granted)
        .map(|l| l.key2)
        .collect();
    held.sort_unstable();
    held.dedup();
    let found = probe::FreeSlots::new(n, &held)
        .probe_order(seed)
        .find(|&slot| try_slot(key1, slot));
    found
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
fn sleep_on_latch(ms: i64) {
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

/// Claim a slot of `name` in `0..n-1` for this session, or NULL when all `n`
/// are held by other sessions. Idempotent for a session that already holds one.
#[pg_extern(volatile, parallel_unsafe)]
fn claim_slot(name: Option<&str>, n: Option<i32>) -> Option<i32> {
    let name = require_name(name);
    let n = check_claim_n(n);
    claim(name, n, None)
}

/// As `claim_slot(name, n)`, but wait up to `wait` for a slot to free
/// (standby). NULL on timeout.
#[pg_extern(volatile, parallel_unsafe, name = "claim_slot")]
fn claim_slot_wait(
    name: Option<&str>,
    n: Option<i32>,
    wait: Option<pgrx::datum::Interval>,
) -> Option<i32> {
    let name = require_name(name);
    let n = check_claim_n(n);
    let us = wait_micros(wait);
    claim(name, n, Some(us))
}

/// The hint of a NULL or bad `max` of `claim_slots`.
const MAX_HINT: &str =
    "The argument max is how many slots this worker serves at most, from 1 to n; pass n to serve every slot nobody else serves.";

fn check_max(max: Option<i32>, n: i32) -> i32 {
    match max {
        None => raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            "max must not be null".to_string(),
            MAX_HINT,
        ),
        Some(m) if m < 1 || m > n => invalid_parameter(
            format!("max must be between 1 and n = {n}, got {m}"),
            MAX_HINT,
        ),
        Some(m) => m,
    }
}

/// Refuse up front (53400) a `claim_slots` whose `max` slots, with the
/// claim's two records (and a standby's waiters lock), could not all be held
/// within `pg_claim.max_locks_per_session`, whatever the session holds.
fn check_max_room(name: &str, n: i32, max: i32, waits: bool) {
    let limit = i64::from(settings::MAX_LOCKS_PER_SESSION.get());
    let needs = i64::from(max) + (CLAIM_LOCKS as i64 - 1) + i64::from(waits);
    if needs > limit {
        let records = needs - i64::from(max);
        raise(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "claim_slots(\"{name}\", {n}, {max}) could hold {needs} advisory locks ({max} slots and {records} records), more than pg_claim.max_locks_per_session ({limit}) allows"
            ),
            &format!(
                "Pass a max of at most {} (pg_claim.max_locks_per_session less the claim's {records} records), or have a superuser raise pg_claim.max_locks_per_session for this role (ALTER ROLE ... SET pg_claim.max_locks_per_session = ...).",
                limit - records
            ),
        );
    }
}

/// Up to `want` free slots of `0..n`, lowest first, now held by this session.
fn take_free(key1: i32, n: i32, want: usize) -> Vec<i32> {
    if want == 0 {
        return Vec::new();
    }
    if n <= LINEAR_PROBES {
        return (0..n).filter(|&s| try_slot(key1, s)).take(want).collect();
    }
    let mut held: Vec<i32> = locks_of(key1, 0, n)
        .iter()
        .filter(|l| l.granted)
        .map(|l| l.key2)
        .collect();
    held.sort_unstable();
    held.dedup();
    (0..n)
        .filter(|s| held.binary_search(s).is_err())
        .filter(|&s| try_slot(key1, s))
        .take(want)
        .collect()
}

thread_local! {
    /// The last count of live claimers per name key, and when it was read.
    static CLAIMERS: RefCell<HashMap<i32, (Instant, usize)>> = RefCell::new(HashMap::new());
}

/// How long `claim_slots` reuses its count of live claimers while nobody
/// wants a slot (the count only tells a worker below its fair share to say
/// so; a standby that waits makes the next call read it afresh).
const CLAIMERS_MAX_AGE: Duration = Duration::from_secs(1);

/// How many sessions are live claimers of the name (holders and waiting
/// standbys): read from the lock table when `fresh` or when the last count is
/// older than `CLAIMERS_MAX_AGE`.
fn claimers_cached(key1: i32, fresh: bool) -> usize {
    let now = Instant::now();
    if !fresh {
        if let Some(live) = CLAIMERS.with(|c| {
            c.borrow()
                .get(&key1)
                .filter(|(at, _)| now.duration_since(*at) < CLAIMERS_MAX_AGE)
                .map(|&(_, live)| live)
        }) {
            return live;
        }
    }
    let live = claimers(key1);
    CLAIMERS.with(|c| c.borrow_mut().insert(key1, (now, live)));
    live
}

/// How many sessions are live claimers of the name (holders and waiting
/// standbys): one read of the lock table.
fn claimers(key1: i32) -> usize {
    let mut pids: Vec<i32> = locks_of(key1, CLAIMERS_KEY, CLAIMERS_KEY + 1)
        .iter()
        .filter(|l| l.granted && l.mode == SHARE)
        .map(|l| l.pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids.len().max(1)
}

/// `claim_slots`: the own slot (as `claim`), then the extra slots, by these
/// rules (`fair` = ceil(n / live claimers), `floor` = n / live claimers):
/// 1. never more than `max`;
/// 2. while another session wants a slot (a waiting standby, or a holder
///    below `floor`), a session above `fair` gives one extra slot back per
///    call, one at or below `fair` takes free slots up to `fair`;
/// 3. while nobody wants one, take free slots up to `max`;
/// 4. a session below `floor` (and `max`) says it wants slots, so that
///    holders above their fair share give some back.
///
/// So no free slot stays free while some caller holds fewer than `max`, and
/// the slots even out over the fleet.
fn claim_many(name: &str, n: i32, max: i32, wait_us: Option<i64>) -> Vec<i32> {
    let key1 = name_key(name);
    if claim(name, n, wait_us).is_none() {
        return Vec::new();
    }
    let Some(mut h) = current_claim(key1) else {
        internal("find the slot it just claimed", name)
    };
    let max = max as usize;
    while 1 + h.extra.len() > max {
        let last = h.extra.pop().expect("more than one slot held");
        unlock(key1, last, EXCLUSIVE);
    }
    let waiting = others_waiting(key1);
    let live = claimers_cached(key1, waiting);
    let fair = (n as usize).div_ceil(live);
    let floor = n as usize / live;
    let held = 1 + h.extra.len();
    let target = if !waiting {
        max
    } else if held > fair {
        let last = h.extra.pop().expect("more than fair > 0 slots held");
        unlock(key1, last, EXCLUSIVE);
        0
    } else {
        fair.min(max)
    };
    if target > 1 + h.extra.len() {
        let want = (target - 1 - h.extra.len()).min(crate::locks::room());
        h.extra.extend(take_free(key1, n, want));
        h.extra.sort_unstable();
    }
    let held = 1 + h.extra.len();
    if held < floor.min(max) {
        if !held_by_me(key1, WAITERS_KEY, ROW_EXCLUSIVE) && crate::locks::room() > 0 {
            try_lock(key1, WAITERS_KEY, ROW_EXCLUSIVE);
        }
    } else {
        stop_waiting(key1);
    }
    let mut all = h.extra.clone();
    all.push(h.slot);
    all.sort_unstable();
    HELD.with(|m| m.borrow_mut().insert(key1, h));
    all
}

/// Serve up to `max` slots of `name` in `0..n-1`: this session's own slot
/// (claimed as by `claim_slot(name, n)` if it holds none) plus free ones, or
/// one fewer while a standby waits. The slots held after the call, ascending.
#[pg_extern(volatile, parallel_unsafe)]
fn claim_slots(name: Option<&str>, n: Option<i32>, max: Option<i32>) -> Vec<i32> {
    let name = require_name(name);
    let n = check_claim_n(n);
    let max = check_max(max, n);
    check_max_room(name, n, max, false);
    claim_many(name, n, max, None)
}

/// As `claim_slots(name, n, max)`, but a session holding no slot waits up
/// to `wait` for one (standby).
#[pg_extern(volatile, parallel_unsafe, name = "claim_slots")]
fn claim_slots_wait(
    name: Option<&str>,
    n: Option<i32>,
    max: Option<i32>,
    wait: Option<pgrx::datum::Interval>,
) -> Vec<i32> {
    let name = require_name(name);
    let n = check_claim_n(n);
    let max = check_max(max, n);
    let us = wait_micros(wait);
    check_max_room(name, n, max, true);
    claim_many(name, n, max, Some(us))
}

/// Every slot this session holds for `name`, ascending (empty when none).
#[pg_extern(stable, strict, parallel_restricted)]
fn my_slots(name: &str) -> Vec<i32> {
    let key1 = name_key(name);
    HELD.with(|m| {
        let m = m.borrow();
        let Some(h) = m.get(&key1) else {
            return Vec::new();
        };
        if h.name != name || !held_by_me(key1, h.slot, EXCLUSIVE) {
            return Vec::new();
        }
        let mut all: Vec<i32> = h
            .extra
            .iter()
            .copied()
            .filter(|&s| held_by_me(key1, s, EXCLUSIVE))
            .collect();
        all.push(h.slot);
        all.sort_unstable();
        all
    })
}

/// Release this session's slot of `name`; false when it held none.
#[pg_extern(volatile, strict, parallel_unsafe)]
fn release_slot(name: &str) -> bool {
    let key1 = name_key(name);
    match current_claim(key1) {
        Some(h) if h.name == name => {
            forget(key1, &h);
            true
        }
        _ => false,
    }
}

/// The slot this session holds for `name`, or NULL.
#[pg_extern(stable, strict, parallel_restricted)]
fn my_slot(name: &str) -> Option<i32> {
    let key1 = name_key(name);
    HELD.with(|m| {
        let m = m.borrow();
        let h = m.get(&key1)?;
        (h.name == name && held_by_me(key1, h.slot, EXCLUSIVE)).then_some(h.slot)
    })
}

/// Who holds which slot of `name` now.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, strict, parallel_unsafe)]
fn slot_holders(
    name: &str,
) -> TableIterator<
    'static,
    (
        name!(slot, Option<i32>),
        name!(pid, Option<i32>),
        name!(application_name, Option<String>),
        name!(client_addr, Option<pgrx::datum::Inet>),
        name!(backend_start, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(state, Option<String>),
    ),
> {
    let key1 = name_key(name);
    if !registry::owns_key(name) {
        // another name's key: its holders are not this name's
        return TableIterator::new(Vec::new());
    }
    let mut holders: Vec<(i32, i32)> = locks_of(key1, 0, MAX_N)
        .into_iter()
        .filter(|l| l.granted && l.mode == EXCLUSIVE)
        .map(|l| (l.key2, l.pid))
        .collect();
    holders.sort_unstable();
    holders.dedup();
    if holders.is_empty() {
        return TableIterator::new(Vec::new());
    }
    let list = |f: fn(&(i32, i32)) -> i32| {
        holders
            .iter()
            .map(|h| f(h).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    // Only integers are formatted into the query.
    let sql = format!(
        "SELECT h.slot, h.pid, a.application_name::pg_catalog.text, a.client_addr, a.backend_start,
                a.state::pg_catalog.text
         FROM ROWS FROM (pg_catalog.unnest('{{{}}}'::pg_catalog.int4[]),
                         pg_catalog.unnest('{{{}}}'::pg_catalog.int4[]))
              WITH ORDINALITY AS h(slot, pid, o)
         LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) h.pid
         ORDER BY h.o",
        list(|h| h.0),
        list(|h| h.1)
    );
    let rows = Spi::connect(|client| {
        let table = client.select(&sql, None, &[])?;
        let mut out = Vec::with_capacity(holders.len());
        for row in table {
            out.push((
                row.get::<i32>(1)?,
                row.get::<i32>(2)?,
                row.get::<String>(3)?,
                row.get::<pgrx::datum::Inet>(4)?,
                row.get::<pgrx::datum::TimestampWithTimeZone>(5)?,
                row.get::<String>(6)?,
            ));
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })
    .unwrap_or_else(|e| internal("read pg_stat_activity", e));
    TableIterator::new(rows)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn claim_is_idempotent_and_released() {
        let a = Spi::get_one::<i32>("SELECT claim_slot('pgt_claim', 4)").unwrap();
        assert_eq!(a, Some(0));
        let b = Spi::get_one::<i32>("SELECT claim_slot('pgt_claim', 4)").unwrap();
        assert_eq!(b, Some(0));
        let mine = Spi::get_one::<i32>("SELECT my_slot('pgt_claim')").unwrap();
        assert_eq!(mine, Some(0));
        let locks = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 2 AND classid = crc32('pgt_claim')::oid",
        )
        .unwrap();
        assert_eq!(locks, Some(3)); // the slot, the n record, the claimers lock
        assert_eq!(
            Spi::get_one::<bool>("SELECT release_slot('pgt_claim')").unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT release_slot('pgt_claim')").unwrap(),
            Some(false)
        );
        assert_eq!(
            Spi::get_one::<i32>("SELECT my_slot('pgt_claim')").unwrap(),
            None
        );
    }
}
