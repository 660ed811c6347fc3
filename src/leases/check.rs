//! The check of `fence` and `lease_valid`, in Rust: on every fenced write's
//! path, so it reads the slot's row of `pg_claim_leases` through its primary
//! key index and locks it `FOR KEY SHARE` directly, as the statement
//!
//! ```sql
//! SELECT 1 FROM pg_claim_leases l
//! WHERE l.name = $name AND l.slot = $slot AND l.token = $token
//!   AND l.holder IS NOT NULL AND (l.session OR l.expires_at > clock_timestamp())
//!   AND (l.owner IS NULL OR l.owner = current_user OR pg_has_role(current_user, l.owner, 'USAGE'))
//! FOR KEY SHARE
//! ```
//!
//! of the internal function `pg_claim_lease_valid` does (`sql/leases.sql`),
//! with the same locking: in READ COMMITTED the newest version of the row is
//! locked and checked again (as PostgreSQL's `FOR KEY SHARE` does after a
//! concurrent update); under REPEATABLE READ and SERIALIZABLE a row changed
//! after the transaction's snapshot raises `40001`. The table and index are
//! the extension's own, found in its schema and checked to be members of the
//! extension; no SQL function or operator is called, so nothing a role
//! planted can run. The lock holds to the end of the caller's transaction.

use crate::backend::compat;
use crate::backend::error::raise;
use crate::backend::internal::extension;
use crate::backend::limits::MAX_KEY_INDEX;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::CString;

/// The columns of `pg_claim_leases` the check reads, by attribute number.
#[derive(Clone, Copy)]
struct Columns {
    token: i32,
    holder: i32,
    session: i32,
    expires_at: i32,
    owner: i32,
    last: i32,
}

/// The table, its primary key index and its columns, found once per backend.
#[derive(Clone, Copy)]
struct Leases {
    table: pg_sys::Oid,
    index: pg_sys::Oid,
    cols: Columns,
}

thread_local! {
    static LEASES: Cell<Option<Leases>> = const { Cell::new(None) };
}

const HINT: &str = "The installation of pg_claim in this database is incomplete or was altered: \
                    run ALTER EXTENSION pg_claim UPDATE, or reinstall the extension.";

/// The relation `name` of schema `nsp`, a member of extension `ext`; raises
/// 42P01 otherwise.
fn member_relation(name: &str, nsp: pg_sys::Oid, ext: pg_sys::Oid) -> pg_sys::Oid {
    let cname = CString::new(name).expect("relation names contain no NUL");
    // SAFETY: catalog look-ups by name and by object
    let oid = unsafe { pg_sys::get_relname_relid(cname.as_ptr(), nsp) };
    let member = oid != pg_sys::InvalidOid
        // SAFETY: a pg_depend look-up of an existing relation
        && unsafe { pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, oid) } == ext;
    if !member {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("pg_claim's relation {name} does not exist in the extension's schema"),
            HINT,
        );
    }
    oid
}

/// The primary key index of `table` (an index belongs to its table, not to
/// the extension).
fn primary_key(table: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: the relcache entry of an existing table, opened and closed
    // here; RelationGetIndexList fills rd_pkindex
    let index = unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::list_free(pg_sys::RelationGetIndexList(rel));
        let index = (*rel).rd_pkindex;
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        index
    };
    if index == pg_sys::InvalidOid {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            "pg_claim's table pg_claim_leases has no primary key".to_string(),
            HINT,
        );
    }
    index
}

fn attnum(table: pg_sys::Oid, column: &str) -> i32 {
    let cname = CString::new(column).expect("column names contain no NUL");
    // SAFETY: a syscache look-up
    let n = unsafe { pg_sys::get_attnum(table, cname.as_ptr()) };
    if n <= 0 {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            format!("pg_claim's table pg_claim_leases has no column {column}"),
            HINT,
        );
    }
    n as i32
}

fn leases() -> Leases {
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
    let (ext, nsp) = extension();
    let table = member_relation("pg_claim_leases", nsp, ext);
    let index = primary_key(table);
    let cols = Columns {
        token: attnum(table, "token"),
        holder: attnum(table, "holder"),
        session: attnum(table, "session"),
        expires_at: attnum(table, "expires_at"),
        owner: attnum(table, "owner"),
        last: 0,
    };
    let last = [
        cols.token,
        cols.holder,
        cols.session,
        cols.expires_at,
        cols.owner,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let l = Leases {
        table,
        index,
        cols: Columns { last, ..cols },
    };
    LEASES.set(Some(l));
    l
}

/// Whether the row in `slot` passes: `token`, a holder, live (a session
/// record, or not expired), and a lease of a role whose privileges the
/// calling role has.
///
/// # Safety
/// `slot` holds a tuple of `pg_claim_leases`; its attributes up to
/// `cols.last` are deformed.
unsafe fn passes(slot: *mut pg_sys::TupleTableSlot, cols: Columns, token: i64) -> bool {
    let value = |att: i32| -> Option<pg_sys::Datum> {
        let i = (att - 1) as usize;
        if *(*slot).tts_isnull.add(i) {
            None
        } else {
            Some(*(*slot).tts_values.add(i))
        }
    };
    let Some(t) = value(cols.token) else {
        return false;
    };
    if t.value() as i64 != token || value(cols.holder).is_none() {
        return false;
    }
    let session = value(cols.session).is_some_and(|d| d.value() != 0);
    if !session {
        let Some(until) = value(cols.expires_at) else {
            return false;
        };
        if (until.value() as i64) <= pg_sys::GetCurrentTimestamp() {
            return false;
        }
    }
    match value(cols.owner) {
        None => true,
        Some(owner) => {
            let owner = pg_sys::Oid::from(owner.value() as u32);
            let me = pg_sys::GetUserId();
            owner == me || pg_sys::has_privs_of_role(me, owner)
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
/// the calling role has; when true, the row is locked `FOR KEY SHARE` until
/// the transaction ends.
fn valid(name: &str, slot: i32, token: i64) -> bool {
    let l = leases();
    let cname = CString::new(name).unwrap_or_default();
    // SAFETY: the standard sequence of an index scan and a tuple lock, as
    // PostgreSQL's executor does for SELECT ... FOR KEY SHARE: the relations
    // opened with RowShareLock (kept to the end of the transaction, as a
    // statement keeps it) and AccessShareLock, a registered snapshot, a slot
    // of the table's kind; everything is closed before returning. An ERROR
    // (a lock wait cancelled) unwinds through PostgreSQL's resource owners,
    // which release the relations, the snapshot and the buffers.
    unsafe {
        let rel = pg_sys::table_open(l.table, pg_sys::RowShareLock as pg_sys::LOCKMODE);
        let idx = pg_sys::index_open(l.index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let xact_snapshot = pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32;
        let snapshot = pg_sys::RegisterSnapshot(if xact_snapshot {
            pg_sys::GetTransactionSnapshot()
        } else {
            pg_sys::GetLatestSnapshot()
        });
        let tslot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
        let mut keys: [pg_sys::ScanKeyData; 2] = std::mem::zeroed();
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
        pg_sys::ScanKeyEntryInitialize(
            &mut keys[1],
            0,
            2,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::RegProcedure::from(pg_sys::F_INT4EQ),
            pg_sys::Datum::from(slot),
        );
        let scan = compat::index_beginscan(rel, idx, snapshot, 2, 0);
        pg_sys::index_rescan(scan, keys.as_mut_ptr(), 2, std::ptr::null_mut(), 0);
        let found =
            pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, tslot);
        let mut ok = false;
        if found {
            pg_sys::slot_getsomeattrs_int(tslot, l.cols.last);
            if passes(tslot, l.cols, token) {
                let mut tid = (*tslot).tts_tid;
                let mut tmfd: pg_sys::TM_FailureData = Default::default();
                let lock = (*(*rel).rd_tableam)
                    .tuple_lock
                    .expect("a table access method locks tuples");
                // as PostgreSQL's executor locks rows: the versions an
                // update in progress makes are locked too (waiting for it),
                // and in READ COMMITTED the newest version is locked
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
                        // a newer version was locked: it must pass too
                        ok = !tmfd.traversed || {
                            pg_sys::slot_getsomeattrs_int(tslot, l.cols.last);
                            passes(tslot, l.cols, token)
                        };
                    }
                    // changed by this transaction itself since the scan
                    pg_sys::TM_Result::TM_SelfModified => ok = false,
                    pg_sys::TM_Result::TM_Updated | pg_sys::TM_Result::TM_Deleted
                        if xact_snapshot =>
                    {
                        raise(
                            PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                            "could not serialize access due to concurrent update".to_string(),
                            "The slot changed hands or was given back after this transaction's snapshot: treat the lease as lost, as PC001.",
                        );
                    }
                    _ => ok = false,
                }
            }
        }
        pg_sys::index_endscan(scan);
        pg_sys::ExecDropSingleTupleTableSlot(tslot);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::index_close(idx, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        ok
    }
}
