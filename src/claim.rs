//! Claiming an identity: claim_slot, claim_slots, release_slot, my_slot, my_slots,
//! slot_holders (reference: docs/claiming.md).
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
//! holder below its fair share) does; see `many::claim_many`.
//!
//! Here: the session's bookkeeping of what it holds, the input checks, the
//! claim itself, `claim_slot`, `release_slot`, `my_slot`. In submodules:
//! `establish` (step 1), `take` (step 2 and the standby's sleep), `probe`
//! (the pure probe order), `many` (`claim_slots`, `my_slots`), `holders`
//! (`slot_holders`) and `registry` (the name registry and the mode check).

mod establish;
mod holders;
mod many;
mod probe;
mod registry;
mod take;

pub(crate) use registry::{known_or_checked as name_registered, owns_key, register_name};

use crate::backend::error::{invalid_parameter, n_below_one, raise};
use crate::backend::limits::MAX_N;
use crate::backend::settings::{self, STANDBY_POLL_MAX};
use crate::locks::{
    held_by_me, name_key, try_lock, unlock, EXCLUSIVE, N_RECORD_BASE, ROW_EXCLUSIVE, SHARE,
    WAITERS_KEY,
};
use establish::{establish, leave};
use pgrx::prelude::*;
use pgrx::PgTryBuilder;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use take::{attempt_once, sleep_on_latch};

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
            // the name registry's error (42710), whichever session asks
            raise(
                PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
                format!(
                    "name \"{name}\" has the same lock key (crc32 {}) as name \"{}\", which is already in use in this database (this session holds its slot {})",
                    key1 as u32, h.name, h.slot
                ),
                "Names are keyed by their crc32, and two names with one key would share slots. Choose another name (for example append a suffix), such that crc32(new name) differs.",
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
