//! The check of `fence` and `lease_valid`, in Rust: on every fenced write's
//! path, so it reads the slot's row of `pg_claim_leases` through its primary
//! key index directly, as the statement
//!
//! ```sql
//! SELECT 1 FROM pg_claim_leases l
//! WHERE l.name = $name AND l.slot = $slot AND l.token = $token
//!   AND l.holder IS NOT NULL AND (l.session OR l.expires_at > clock_timestamp())
//!   AND (l.owner IS NULL OR l.owner = current_user OR pg_has_role(current_user, l.owner, 'USAGE'))
//! ```
//!
//! of the internal function `pg_claim_lease_valid` does (`sql/leases.sql`).
//! What holds the slot for the caller's transaction once the check passed
//! (`sql/leases.sql`, "Locks carry the fencing guarantee"):
//!
//! - In READ COMMITTED, the slot's fence lock, an advisory lock taken shared
//!   before the row is read, to the end of the transaction. Every change of
//!   the slot's holder, token or expiry takes it exclusive first (the trigger
//!   of `sql/leases_guard.sql`), and makes every session forget the leases it
//!   knew when it commits (a relcache invalidation of `pg_claim_leases`). So
//!   a row that passed stays true for the session until such a change
//!   commits, and the next check of the same token reads nothing: it takes
//!   the lock, takes in the invalidations that committed before it, and finds
//!   the row it remembered (its expiry still checked against the clock).
//!   A check of a slot the session does not know reads the rows of the
//!   slots around it too, and remembers them (`read_around` says why that
//!   is safe): a pooled connection serves many workers' slots in turn.
//! - In REPEATABLE READ and SERIALIZABLE, the row read through the
//!   transaction's snapshot and locked `FOR KEY SHARE`, as PostgreSQL's
//!   executor locks it; a row changed after the snapshot raises `40001`.
//! - Where the trigger is missing or not enabled ALWAYS (an installation
//!   from before the fence lock whose library is newer), the row lock in
//!   every isolation level, the newest version of the row locked and checked
//!   again in READ COMMITTED.
//!
//! The table and index are the extension's own, found in its schema and
//! checked to be members of the extension (`check/table.rs`); no SQL function or operator is
//! called, so nothing a role planted can run.

mod table;

use crate::backend::compat;
use crate::backend::error::raise;
use crate::backend::limits::MAX_KEY_INDEX;
use crate::locks::{self, FENCE_BASE};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CString;
use table::{Columns, Leases};

/// What a lease row that passed said, remembered by the session.
#[derive(Clone, Copy)]
struct Row {
    token: i64,
    session: bool,
    expires_at: Option<i64>,
    owner: Option<pg_sys::Oid>,
}

/// The most rows a session remembers. A worker checks a few slots, but
/// behind a transaction pooler each server connection serves every client
/// in turn: with 128 slots over 64 connections, each connection checks all
/// 128, and a smaller memory would forget a row before its next check.
const MAX_KNOWN: usize = 4096;

/// The rows a session remembers: name, then slot.
type Known = HashMap<String, HashMap<i32, Row>>;

thread_local! {
    static LEASES: Cell<Option<Leases>> = const { Cell::new(None) };
    /// the rows read in READ COMMITTED since the last invalidation of the
    /// table: the row of a slot that passed, and the rows of the slots
    /// around it (`read_around`)
    static KNOWN: RefCell<Known> = RefCell::new(HashMap::new());
    static CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Forget the table and the known rows when the table is invalidated (a
/// committed change of a lease's holder, token or expiry; DDL; a reset of
/// the invalidation queue). No allocation, no ERROR.
extern "C-unwind" fn leases_changed(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let mine = relid == pg_sys::InvalidOid
        || LEASES
            .try_with(|l| l.get().is_none_or(|l| l.table == relid))
            .unwrap_or(true);
    if mine {
        let _ = LEASES.try_with(|l| l.set(None));
        let _ = KNOWN.try_with(|k| {
            if let Ok(mut k) = k.try_borrow_mut() {
                k.clear();
            }
        });
    }
}

fn register_callback() {
    if !CALLBACK.replace(true) {
        // SAFETY: registered once per backend; the callback touches only
        // thread-locals
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(leases_changed), pg_sys::Datum::from(0))
        };
    }
}

/// The table, its index and its columns: those this backend found, while
/// the table is still there, else found anew ([`table::find`]).
fn leases() -> Leases {
    register_callback();
    if let Some(l) = LEASES.get() {
        // still the same table (the extension may have been dropped and
        // created again since): one syscache probe
        // SAFETY: a syscache look-up; NULL when the relation is gone
        let name = unsafe { pg_sys::get_rel_name(l.table) };
        let same = !name.is_null() && {
            // SAFETY: a palloc'd NUL-terminated C string
            unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes() == b"pg_claim_leases"
        };
        if same {
            return l;
        }
    }
    let l = table::find();
    LEASES.set(Some(l));
    l
}

/// The row in `slot`, when it passes: `token`, a holder, live (a session
/// record, or not expired), and a lease of a role whose privileges the
/// calling role has.
///
/// # Safety
/// As [`row_of`].
unsafe fn passing(slot: *mut pg_sys::TupleTableSlot, cols: Columns, token: i64) -> Option<Row> {
    row_of(slot, cols)
        .map(|(_, row)| row)
        .filter(|row| row.passes(token))
}

/// The slot number and what [`Row::passes`] reads of the row in `slot`;
/// None for a slot no one holds (holder NULL).
///
/// # Safety
/// `slot` holds a tuple of `pg_claim_leases`; its attributes up to
/// `cols.last` are deformed.
unsafe fn row_of(slot: *mut pg_sys::TupleTableSlot, cols: Columns) -> Option<(i32, Row)> {
    let value = |att: i32| -> Option<pg_sys::Datum> {
        let i = (att - 1) as usize;
        if *(*slot).tts_isnull.add(i) {
            None
        } else {
            Some(*(*slot).tts_values.add(i))
        }
    };
    value(cols.holder)?;
    let row = Row {
        token: value(cols.token)?.value() as i64,
        session: value(cols.session).is_some_and(|d| d.value() != 0),
        expires_at: value(cols.expires_at).map(|d| d.value() as i64),
        owner: value(cols.owner).map(|d| pg_sys::Oid::from(d.value() as u32)),
    };
    Some((value(cols.slot)?.value() as i32, row))
}

impl Row {
    fn passes(&self, token: i64) -> bool {
        if self.token != token {
            return false;
        }
        if !self.session {
            match self.expires_at {
                // SAFETY: reads the clock
                Some(until) if until > unsafe { pg_sys::GetCurrentTimestamp() } => {}
                _ => return false,
            }
        }
        match self.owner {
            None => true,
            Some(owner) => {
                // SAFETY: reads the current user
                let me = unsafe { pg_sys::GetUserId() };
                // SAFETY: PostgreSQL's cached role membership, of two role oids
                owner == me || unsafe { pg_sys::has_privs_of_role(me, owner) }
            }
        }
    }
}

/// [`valid`] for arguments it can take as they are; None when one is NULL,
/// the name is longer than a lease's name may be, or the slot is out of
/// range: the internal function `pg_claim_lease_valid` / `_fence` then
/// answers, with its argument errors.
pub fn valid_args(name: Option<&str>, slot: Option<i32>, token: Option<i64>) -> Option<bool> {
    let (name, slot, token) = (name?, slot?, token?);
    (name.len() <= 1024 && (0..MAX_KEY_INDEX).contains(&slot)).then(|| valid(name, slot, token))
}

/// `fence` / `lease_valid`: whether `token` is the current token of a live
/// lease (or session record) of `slot` of `name` of a role whose privileges
/// the calling role has; when true, the slot cannot change hands until the
/// transaction ends (the module's comment says by which lock).
fn valid(name: &str, slot: i32, token: i64) -> bool {
    // SAFETY: reads the transaction's isolation level
    let read_committed = unsafe { pg_sys::XactIsoLevel } < pg_sys::XACT_REPEATABLE_READ as i32;
    if !(read_committed && leases().guarded) {
        return read(leases(), name, slot, token, true).is_some();
    }
    let (key1, key2) = (locks::name_key(name), FENCE_BASE + slot);
    // SAFETY: the table's lock as a statement reading it takes it (to the
    // end of the transaction); the fence lock; then the invalidations that
    // committed before the lock was granted
    unsafe {
        pg_sys::LockRelationOid(leases().table, pg_sys::RowShareLock as pg_sys::LOCKMODE);
        locks::xact_lock(key1, key2, locks::SHARE);
        pg_sys::AcceptInvalidationMessages();
    }
    let known = KNOWN.with_borrow(|k| k.get(name).and_then(|slots| slots.get(&slot)).copied());
    if known.is_some_and(|row| row.passes(token)) {
        return true;
    }
    let l = leases();
    let row = if !l.guarded {
        // the guard went away meanwhile: the row lock
        read(l, name, slot, token, true)
    } else if known.is_some() {
        // the row this session knew no longer passes for this token (a
        // stale token, or a lease that expired): the row alone
        read(l, name, slot, token, false).inspect(|&row| remember(name, [(slot, row)]))
    } else {
        // a slot this session does not know: the rows of the slots around
        // it too, so that a pooled connection that serves many workers in
        // turn reads the table once, not once per slot
        let rows = read_around(l, name, slot);
        let row = rows
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|&(_, row)| row)
            .filter(|row| row.passes(token));
        if row.is_some() {
            remember(name, rows);
        }
        row
    };
    match row {
        Some(_) => true,
        None => {
            // a refused check holds nothing: this hold of the fence lock
            // goes (an earlier one of this transaction stays)
            let tag = locks::advisory_tag(key1, key2);
            // SAFETY: the lock was taken above in this transaction
            unsafe { pg_sys::LockRelease(&tag, locks::SHARE, false) };
            false
        }
    }
}

/// Remember rows of `name` read in READ COMMITTED through the fence lock's
/// protocol: each stays true for the session until a change of its slot
/// commits, whose invalidation the next check of the slot takes in after
/// taking the slot's fence lock (the module's comment).
fn remember(name: &str, rows: impl IntoIterator<Item = (i32, Row)>) {
    KNOWN.with_borrow_mut(|k| {
        // a miss: counting over the names (a worker uses one or two) costs
        // nothing next to the read that missed
        if k.values().map(HashMap::len).sum::<usize>() >= MAX_KNOWN {
            k.clear();
        }
        k.entry(name.to_string()).or_default().extend(rows);
    });
}

/// The most slots on either side of the missed one that a miss reads.
const AROUND: i32 = 256;

/// The held slots of `name` from `slot - AROUND` to `slot + AROUND`, read
/// through the primary key with the latest snapshot, in READ COMMITTED,
/// without row locks.
///
/// Why a row of another slot, read without that slot's fence lock, can be
/// remembered: the snapshot is taken after this check took the invalidations
/// that committed before it. A change of that slot that this read does not
/// see commits after the snapshot was taken, and sends its invalidation
/// when it commits, before it gives the slot's fence lock up; the next check
/// of that slot takes the fence lock first, then the invalidations, and so
/// forgets the row before it would use it. A change this read does see was
/// committed already: the row is the new one.
fn read_around(l: Leases, name: &str, slot: i32) -> Vec<(i32, Row)> {
    let (lo, hi) = (
        slot.saturating_sub(AROUND).max(0),
        slot.saturating_add(AROUND).min(MAX_KEY_INDEX - 1),
    );
    let keys = [
        (pg_sys::BTGreaterEqualStrategyNumber, pg_sys::F_INT4GE, lo),
        (pg_sys::BTLessEqualStrategyNumber, pg_sys::F_INT4LE, hi),
    ];
    // SAFETY: as in `read`, without the tuple lock; the scan's tuples are
    // deformed before they are read
    with_scan(l, name, &keys, false, |_, _, scan, tslot| unsafe {
        let mut rows = Vec::new();
        while pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, tslot) {
            pg_sys::slot_getsomeattrs_int(tslot, l.cols.last);
            rows.extend(row_of(tslot, l.cols));
        }
        rows
    })
}

/// Runs `body` over an index scan of `pg_claim_leases`'s primary key for
/// the rows of `name` whose slot meets every `(strategy, int4 comparison,
/// value)` of `slot_keys`, with a slot of the table's kind; the snapshot is
/// the transaction's with `xact_snapshot`, else the latest one. `body` gets
/// the table, the snapshot, the scan and the slot.
///
/// The standard sequence of an index scan, as PostgreSQL's executor does
/// for a SELECT: the relations opened with RowShareLock (kept to the end of
/// the transaction, as a statement that locks rows keeps it) and
/// AccessShareLock, a registered snapshot; everything is closed before
/// returning. An ERROR unwinds through PostgreSQL's resource owners, which
/// release the relations, the snapshot and the buffers.
fn with_scan<R>(
    l: Leases,
    name: &str,
    slot_keys: &[(u32, u32, i32)],
    xact_snapshot: bool,
    body: impl FnOnce(
        pg_sys::Relation,
        pg_sys::Snapshot,
        pg_sys::IndexScanDesc,
        *mut pg_sys::TupleTableSlot,
    ) -> R,
) -> R {
    let cname = CString::new(name).unwrap_or_default();
    // SAFETY: as the comment above says
    unsafe {
        let rel = pg_sys::table_open(l.table, pg_sys::RowShareLock as pg_sys::LOCKMODE);
        let idx = pg_sys::index_open(l.index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let snapshot = pg_sys::RegisterSnapshot(if xact_snapshot {
            pg_sys::GetTransactionSnapshot()
        } else {
            pg_sys::GetLatestSnapshot()
        });
        let tslot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
        let mut keys: Vec<pg_sys::ScanKeyData> = vec![std::mem::zeroed(); 1 + slot_keys.len()];
        let name_text = pg_sys::cstring_to_text(cname.as_ptr());
        pg_sys::ScanKeyEntryInitialize(
            &mut keys[0],
            0,
            1,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::InvalidOid,
            *(*idx).rd_indcollation,
            pg_sys::RegProcedure::from(pg_sys::F_TEXTEQ),
            pg_sys::Datum::from(name_text),
        );
        for (key, &(strategy, proc_, value)) in keys[1..].iter_mut().zip(slot_keys) {
            pg_sys::ScanKeyEntryInitialize(
                key,
                0,
                2,
                strategy as pg_sys::StrategyNumber,
                pg_sys::InvalidOid,
                pg_sys::InvalidOid,
                pg_sys::RegProcedure::from(proc_),
                pg_sys::Datum::from(value),
            );
        }
        let nkeys = keys.len() as i32;
        let scan = compat::index_beginscan(rel, idx, snapshot, nkeys, 0);
        pg_sys::index_rescan(scan, keys.as_mut_ptr(), nkeys, std::ptr::null_mut(), 0);
        let r = body(rel, snapshot, scan, tslot);
        pg_sys::index_endscan(scan);
        pg_sys::ExecDropSingleTupleTableSlot(tslot);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::index_close(idx, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        r
    }
}

/// The row of `slot` of `name` when it passes for `token`, read through the
/// primary key: through the transaction's snapshot under REPEATABLE READ and
/// SERIALIZABLE, else the latest one; with `lock`, locked `FOR KEY SHARE`
/// (to the end of the transaction) as PostgreSQL's executor locks it.
fn read(l: Leases, name: &str, slot: i32, token: i64, lock: bool) -> Option<Row> {
    // SAFETY: reads the transaction's isolation level
    let xact_snapshot = unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32;
    let keys = [(pg_sys::BTEqualStrategyNumber, pg_sys::F_INT4EQ, slot)];
    // SAFETY: `with_scan`'s scan and slot, the tuple deformed before it is
    // read
    with_scan(
        l,
        name,
        &keys,
        xact_snapshot,
        |rel, snapshot, scan, tslot| unsafe {
            if !pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, tslot)
            {
                return None;
            }
            pg_sys::slot_getsomeattrs_int(tslot, l.cols.last);
            let row = passing(tslot, l.cols, token)?;
            if lock {
                lock_row(l, rel, snapshot, tslot, xact_snapshot, token)
            } else {
                Some(row)
            }
        },
    )
}

/// Locks the row in `tslot` `FOR KEY SHARE` as PostgreSQL's executor locks
/// rows: the versions an update in progress makes are locked too (waiting
/// for it), and in READ COMMITTED the newest version is locked, which must
/// pass for `token` too. Under REPEATABLE READ and SERIALIZABLE a row
/// changed since the snapshot raises 40001.
///
/// # Safety
/// `tslot` holds a row of `rel` (`pg_claim_leases`, opened with
/// RowShareLock) read through `snapshot`; an ERROR (a lock wait cancelled)
/// unwinds through PostgreSQL's resource owners.
unsafe fn lock_row(
    l: Leases,
    rel: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    tslot: *mut pg_sys::TupleTableSlot,
    xact_snapshot: bool,
    token: i64,
) -> Option<Row> {
    let mut tid = (*tslot).tts_tid;
    let mut tmfd: pg_sys::TM_FailureData = Default::default();
    let lock = (*(*rel).rd_tableam)
        .tuple_lock
        .expect("a table access method locks tuples");
    let mut flags = pg_sys::TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS as u8;
    if !xact_snapshot {
        flags |= pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION as u8;
    }
    let r = lock(
        rel,
        &mut tid,
        snapshot,
        tslot,
        pg_sys::GetCurrentCommandId(true),
        pg_sys::LockTupleMode::LockTupleKeyShare,
        pg_sys::LockWaitPolicy::LockWaitBlock,
        flags,
        &mut tmfd,
    );
    match r {
        pg_sys::TM_Result::TM_Ok => {
            // a newer version was locked: it must pass too (the slot holds
            // whichever version was locked)
            pg_sys::slot_getsomeattrs_int(tslot, l.cols.last);
            passing(tslot, l.cols, token)
        }
        // changed by this transaction itself since the scan
        pg_sys::TM_Result::TM_SelfModified => None,
        pg_sys::TM_Result::TM_Updated | pg_sys::TM_Result::TM_Deleted if xact_snapshot => {
            raise(
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                "could not serialize access due to concurrent update".to_string(),
                "The slot changed hands or was given back after this transaction's snapshot: treat the lease as lost, as PC001.",
            );
        }
        _ => None,
    }
}

/// The trigger's half of the fence lock (`sql/leases_guard.sql`): the slot's
/// fence lock exclusive to the end of this transaction (waiting for the
/// READ COMMITTED transactions that passed the check on it), and an
/// invalidation of the table, sent when this transaction commits, so that
/// every session forgets the rows it knew.
pub fn handover(name: &str, slot: i32) {
    if !(0..MAX_KEY_INDEX).contains(&slot) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("slot must be between 0 and {}, got {slot}", MAX_KEY_INDEX - 1),
            "pg_claim_lease_handover is the trigger's internal function: it takes a slot of pg_claim_leases.",
        );
    }
    locks::xact_lock(locks::name_key(name), FENCE_BASE + slot, locks::EXCLUSIVE);
    // SAFETY: registers an invalidation of an existing relation with the
    // current transaction
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(leases().table) };
}
