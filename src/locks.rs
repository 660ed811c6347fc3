//! Advisory lock keys and primitives shared by slot claiming and groups.
//!
//! pg_claim uses only the **two-`int4` advisory key space** (the one of
//! `pg_advisory_lock(int4, int4)`; `pg_locks.objsubid = 2`), which never overlaps
//! the single-`bigint` key space (`objsubid = 1`). Within it:
//!
//! | `key1` (`pg_locks.classid`) | `key2` (`pg_locks.objid`) | meaning |
//! |---|---|---|
//! | `name_key(name)` | `0 ..= 1048575` | slot `key2` of `claim_slot(name, n)`, exclusive |
//! | `name_key(name)` | `0x10000000 + n` | "this session claims `name` with `n` slots", shared |
//! | `name_key(name)` | `0x10000000` | "this session is a live claimer of `name`" (any `n`), shared |
//! | `name_key(name)` | `0x10100001` | claim mutex of `name`, exclusive, held for microseconds |
//! | `name_key(name)` | `0x10100002` | lease mutex of `name`: transaction-level, exclusive, held by `claim_lease` to the end of its transaction (`resize_fleet`: to the end of its transaction) |
//! | `name_key(name)` | `0x10100003` | "this session waits for a slot of `name`" (a standby in a wait form), RowExclusive; `claim_slots` holders probe it with a momentary Share lock |
//! | `name_key(name)` | `0x10100004` | resize lock of `name`: transaction-level, exclusive, taken with a try by `resize_fleet` (another resize of the name in progress: 55P03; `sql/leases_resize.sql`) |
//! | `name_key(name)` | `0x10200000 + s` | reservation of slot `s`'s first lease row, transaction-level, exclusive (`sql/leases.sql`) |
//! | `name_key(name)` | `0x10300000 + s` | the fence of slot `s` of leases: transaction-level, shared by `fence`/`lease_valid` in READ COMMITTED, exclusive by every change of the slot's holder, token or expiry (`sql/leases_guard.sql`) |
//! | `name_key(name)` | `0x20000000` | membership of group `name`, shared |
//! | `name_key(name)` | `0x28000000 + P` | "this member uses `P` partitions", shared |
//! | `name_key(name)` | `0x30000000 + p` | partition `p` of group `name`, exclusive |
//!
//! `name_key(name)` is `crc32(name)` (of its UTF-8 bytes) reinterpreted as a signed
//! `int4`, i.e. `crc32(name) - 4294967296` when `crc32(name) >= 2147483648`.
//! `pg_locks` shows `classid`/`objid` as unsigned `oid`s, i.e. `crc32(name)` itself.
//! Applications that also use two-`int4` advisory locks should avoid `key2` values
//! in `0 ..= 1048575` and `0x10000000 ..= 0x3FFFFFFF`, or use the bigint key space.
//!
//! Two names with the same crc32 would share their locks (about one pair in 4
//! billion, or on purpose). They never do: the name registry
//! (`pg_claim_names`, `crate::claim::registry`) gives each key to the first
//! name claimed with it, and a claim of another name with that key is refused
//! with 42710.

use crate::backend::error::raise;
use crate::backend::settings::MAX_LOCKS_PER_SESSION;
use crate::mapping::hashing::crc32;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::cell::RefCell;
use std::collections::HashSet;

thread_local! {
    /// The session-level advisory locks pg_claim took in this session and
    /// has not released, for `pg_claim.max_locks_per_session`.
    static TAKEN: RefCell<HashSet<(i32, i32, pg_sys::LOCKMODE)>> = RefCell::new(HashSet::new());
}

/// Raise SQLSTATE 53400 unless this session may take `adding` more locks
/// through pg_claim without going over `pg_claim.max_locks_per_session`.
/// `what` names the call for the message. Locks released behind pg_claim's
/// back (`pg_advisory_unlock_all()`) stop counting here.
pub fn ensure_room(adding: usize, what: impl FnOnce() -> String) {
    let max = MAX_LOCKS_PER_SESSION.get().max(0) as usize;
    let held = TAKEN.with(|t| t.borrow().len());
    if held + adding <= max {
        return;
    }
    let held = TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        t.retain(|&(k1, k2, mode)| held_by_me(k1, k2, mode));
        t.len()
    });
    if held + adding > max {
        raise(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "{} would hold {} advisory locks in this session, more than pg_claim.max_locks_per_session ({max}) allows",
                what(),
                held + adding
            ),
            "Each held slot, group membership and partition is an entry in the server's shared lock table, \
             which all sessions share. Release what this session no longer needs, use fewer partitions, \
             or have a superuser raise pg_claim.max_locks_per_session for this role (ALTER ROLE ... SET).",
        );
    }
}

/// How many more locks this session may take through pg_claim without going
/// over `pg_claim.max_locks_per_session` (never raises).
pub fn room() -> usize {
    let max = MAX_LOCKS_PER_SESSION.get().max(0) as usize;
    let held = TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        t.retain(|&(k1, k2, mode)| held_by_me(k1, k2, mode));
        t.len()
    });
    max.saturating_sub(held)
}

fn taken(key1: i32, key2: i32, mode: pg_sys::LOCKMODE) {
    TAKEN.with(|t| t.borrow_mut().insert((key1, key2, mode)));
}

/// The largest `n` (slots) and `P` (partitions) the key layout allows.
pub use crate::backend::limits::MAX_KEY_INDEX;
/// `key2` of the shared lock recording a claimer's `n`: `N_RECORD_BASE + n`.
pub const N_RECORD_BASE: i32 = 0x1000_0000;
/// `key2` held shared by every live claimer of a name, whatever its `n`
/// (the n record of the invalid `n = 0`).
pub const CLAIMERS_KEY: i32 = N_RECORD_BASE;
/// `key2` of the short-lived exclusive lock that serialises the n check of
/// claimers of one name (just above the n records).
pub const CLAIM_MUTEX_KEY: i32 = N_RECORD_BASE + MAX_KEY_INDEX + 1;
/// `key2` of the transaction-level lock that serialises `claim_lease` calls
/// of one name (just above the claim mutex). `sql/leases.sql` writes it as a
/// number; a test checks the two agree.
#[cfg(test)]
pub const LEASE_MUTEX_KEY: i32 = CLAIM_MUTEX_KEY + 1;
/// `key2` held in RowExclusive mode by every standby waiting for a slot of a
/// name; holders of several slots (`claim_slots`) test it with a conditional
/// Share lock, which conflicts with RowExclusive but not with other Share
/// tests, and give an extra slot back when it is held.
pub const WAITERS_KEY: i32 = CLAIM_MUTEX_KEY + 2;
/// `key2` of the transaction-level lock that `resize_fleet` takes with a
/// try, so that a second resize of the name is refused at once (just above
/// the waiters' key). `sql/leases_resize.sql` writes it as a number; a test
/// checks the two agree.
#[cfg(test)]
pub const RESIZE_KEY: i32 = CLAIM_MUTEX_KEY + 3;
/// `key2` of slot `s`'s fence lock: `FENCE_BASE + s`, taken shared (to the
/// end of the transaction) by `fence` and `lease_valid` in READ COMMITTED
/// and exclusive by the trigger on every change of a lease's holder, token
/// or expiry. `sql/leases.sql` and `sql/leases_guard.sql` write it as a
/// number; a test checks they agree.
pub const FENCE_BASE: i32 = 0x1030_0000;
/// `key2` of a group's shared membership lock.
pub const GROUP_MEMBER_KEY: i32 = 0x2000_0000;
/// `key2` of the shared lock recording the partition count `P` a group
/// member uses with `claim_partitions`: `PARTITION_COUNT_BASE + P`.
pub const PARTITION_COUNT_BASE: i32 = 0x2800_0000;
/// `key2` of group partition `p`: `PARTITION_BASE + p`.
pub const PARTITION_BASE: i32 = 0x3000_0000;
/// The largest number of partitions `claim_partitions` accepts. Each held
/// partition is one entry in PostgreSQL's shared lock table, whose default
/// size (`max_locks_per_transaction * (max_connections + ...)`) is about 7800
/// entries; 4096 leaves room for everything else.
pub const MAX_PARTITIONS: i32 = 4096;

// The key ranges of the table above do not overlap.
const _: () = assert!(MAX_KEY_INDEX < N_RECORD_BASE);
const _: () = assert!(N_RECORD_BASE + MAX_KEY_INDEX < CLAIM_MUTEX_KEY);
const _: () = assert!(WAITERS_KEY < 0x1020_0000);
const _: () = assert!(0x1020_0000 + MAX_KEY_INDEX <= FENCE_BASE);
const _: () = assert!(FENCE_BASE + MAX_KEY_INDEX < GROUP_MEMBER_KEY);
const _: () = assert!(GROUP_MEMBER_KEY < PARTITION_COUNT_BASE);
const _: () = assert!(PARTITION_COUNT_BASE + MAX_PARTITIONS < PARTITION_BASE);

/// PostgreSQL's lock modes, as used for advisory locks.
pub const SHARE: pg_sys::LOCKMODE = pg_sys::ShareLock as pg_sys::LOCKMODE;
pub const EXCLUSIVE: pg_sys::LOCKMODE = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
pub const ROW_EXCLUSIVE: pg_sys::LOCKMODE = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;

/// `key1` for a name: its crc32 as a signed int4.
#[inline]
pub fn name_key(name: &str) -> i32 {
    crc32(name.as_bytes()) as i32
}

/// The lock tag `pg_advisory_lock(key1, key2)` uses in the current database.
pub fn advisory_tag(key1: i32, key2: i32) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set for every backend connected to a database.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: key1 as u32,
        locktag_field3: key2 as u32,
        locktag_field4: 2,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// Try to take a session-level advisory lock without waiting.
/// Returns true when this session now holds it (also when it already did:
/// PostgreSQL then counts the lock twice, see `held_by_me`).
pub fn try_lock(key1: i32, key2: i32, mode: pg_sys::LOCKMODE) -> bool {
    let tag = advisory_tag(key1, key2);
    // SAFETY: a valid tag; session locks survive transaction end.
    let r = unsafe { pg_sys::LockAcquire(&tag, mode, true, true) };
    let got = r != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL;
    if got {
        taken(key1, key2, mode);
    }
    got
}

/// Take a session-level advisory lock, waiting for it like `pg_advisory_lock`
/// (interruptible by cancel and statement_timeout, deadlock-checked).
pub fn lock(key1: i32, key2: i32, mode: pg_sys::LOCKMODE) {
    let tag = advisory_tag(key1, key2);
    // SAFETY: a valid tag; session locks survive transaction end.
    unsafe { pg_sys::LockAcquire(&tag, mode, true, false) };
    taken(key1, key2, mode);
}

/// Take a transaction-level advisory lock, waiting for it like
/// `pg_advisory_xact_lock(_shared)`; it is released when the transaction
/// ends.
pub fn xact_lock(key1: i32, key2: i32, mode: pg_sys::LOCKMODE) {
    let tag = advisory_tag(key1, key2);
    // SAFETY: a valid tag; the lock belongs to the current transaction
    unsafe { pg_sys::LockAcquire(&tag, mode, false, false) };
}

/// Release one hold of a session-level advisory lock; false when not held.
pub fn unlock(key1: i32, key2: i32, mode: pg_sys::LOCKMODE) -> bool {
    let tag = advisory_tag(key1, key2);
    // SAFETY: a valid tag. LockRelease only WARNs when the lock is not held;
    // callers check `held_by_me` first.
    let released = unsafe { pg_sys::LockRelease(&tag, mode, true) };
    if !held_by_me(key1, key2, mode) {
        TAKEN.with(|t| t.borrow_mut().remove(&(key1, key2, mode)));
    }
    released
}

/// Whether this session holds the lock in exactly `mode`.
pub fn held_by_me(key1: i32, key2: i32, mode: pg_sys::LOCKMODE) -> bool {
    let tag = advisory_tag(key1, key2);
    // SAFETY: a valid tag; only reads this backend's local lock table.
    unsafe { crate::backend::compat::lock_held_by_me(&tag, mode) }
}

/// One granted or awaited advisory lock of a name, from the shared lock table.
#[derive(Debug, Clone, Copy)]
pub struct LockHolder {
    pub key2: i32,
    pub pid: i32,
    pub mode: pg_sys::LOCKMODE,
    pub granted: bool,
}

/// Every two-int4 advisory lock on `key1` in the current database whose `key2`
/// is in `lo..hi`, granted or waiting (like `pg_locks`, one consistent snapshot).
pub fn locks_of(key1: i32, lo: i32, hi: i32) -> Vec<LockHolder> {
    let mut out = Vec::new();
    // SAFETY: GetLockStatusData returns a palloc'd snapshot of the lock table,
    // valid until the current memory context is reset; we copy out what we need.
    unsafe {
        let db = pg_sys::MyDatabaseId.to_u32();
        let data = pg_sys::GetLockStatusData();
        let n = (*data).nelements as usize;
        let locks = std::slice::from_raw_parts((*data).locks, n);
        for l in locks {
            let t = &l.locktag;
            if t.locktag_type != pg_sys::LockTagType::LOCKTAG_ADVISORY as u8
                || t.locktag_field4 != 2
                || t.locktag_field1 != db
                || t.locktag_field2 != key1 as u32
            {
                continue;
            }
            let key2 = t.locktag_field3 as i32;
            if key2 < lo || key2 >= hi {
                continue;
            }
            for mode in [SHARE, EXCLUSIVE] {
                if l.holdMask & (1 << mode) != 0 {
                    out.push(LockHolder {
                        key2,
                        pid: l.pid,
                        mode,
                        granted: true,
                    });
                }
                if l.waitLockMode == mode {
                    out.push(LockHolder {
                        key2,
                        pid: l.pid,
                        mode,
                        granted: false,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_uses_the_lease_mutex_key() {
        let sql = include_str!("../sql/leases.sql");
        assert!(sql.contains(&format!("pg_advisory_lock(key_, {LEASE_MUTEX_KEY})")));
        assert_eq!(LEASE_MUTEX_KEY, 0x1010_0002);
    }

    #[test]
    fn sql_uses_the_resize_and_mutex_keys() {
        let sql = include_str!("../sql/leases_resize.sql");
        assert!(sql.contains(&format!("pg_try_advisory_xact_lock(key_, {RESIZE_KEY})")));
        assert!(sql.contains(&format!("pg_advisory_xact_lock(key_, {LEASE_MUTEX_KEY})")));
        assert_eq!(RESIZE_KEY, 0x1010_0004);
        const { assert!(RESIZE_KEY < 0x1020_0000) };
    }

    #[test]
    fn sql_uses_the_fence_key() {
        let key = format!("{FENCE_BASE} + ");
        for sql in [
            include_str!("../sql/leases.sql"),
            include_str!("../sql/leases_fleet.sql"),
            include_str!("../sql/leases_guard.sql"),
            include_str!("../sql/leases_resize.sql"),
        ] {
            assert!(sql.contains(&key), "the fence key {key}...");
        }
    }
}
