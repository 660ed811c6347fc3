//! What differs between the PostgreSQL major versions pg_claim builds for
//! (features `pg15`, `pg16`, `pg18`), in one place: each function here has
//! one definition per version, so a version without one does not compile.
//! (The id of the client connection check timeout differs too; `build.rs`
//! reads it from the headers.)

use pgrx::pg_sys;

/// The entry at 1-based position `i` (up to `pgstat_fetch_stat_numbackends()`)
/// of this backend's snapshot of the backend status array, or null.
///
/// # Safety
/// As the C function: in a backend, inside a transaction.
#[cfg(feature = "pg15")]
pub unsafe fn local_beentry(i: i32) -> *mut pg_sys::LocalPgBackendStatus {
    pg_sys::pgstat_fetch_stat_local_beentry(i)
}

/// As above; PostgreSQL 16 renamed the function.
///
/// # Safety
/// As the C function: in a backend, inside a transaction.
#[cfg(any(feature = "pg16", feature = "pg18"))]
pub unsafe fn local_beentry(i: i32) -> *mut pg_sys::LocalPgBackendStatus {
    pg_sys::pgstat_get_local_beentry_by_index(i)
}

/// Whether this backend holds the lock `tag` in exactly `mode`.
///
/// # Safety
/// As the C function: reads only this backend's local lock table.
#[cfg(any(feature = "pg15", feature = "pg16"))]
pub unsafe fn lock_held_by_me(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) -> bool {
    pg_sys::LockHeldByMe(tag, mode)
}

/// As above; PostgreSQL 17 added the argument `orstronger`, false for the
/// exact mode.
///
/// # Safety
/// As the C function: reads only this backend's local lock table.
#[cfg(feature = "pg18")]
pub unsafe fn lock_held_by_me(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) -> bool {
    pg_sys::LockHeldByMe(tag, mode, false)
}

/// Begin an index scan of `index` on `heap` (PostgreSQL 18 added the
/// instrumentation argument, NULL for none).
///
/// # Safety
/// As the C function: both relations open and locked, `snapshot` registered.
#[cfg(any(feature = "pg15", feature = "pg16"))]
pub unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
    norderbys: i32,
) -> pg_sys::IndexScanDesc {
    pg_sys::index_beginscan(heap, index, snapshot, nkeys, norderbys)
}

/// As above, for PostgreSQL 18.
///
/// # Safety
/// As the C function: both relations open and locked, `snapshot` registered.
#[cfg(feature = "pg18")]
pub unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
    norderbys: i32,
) -> pg_sys::IndexScanDesc {
    pg_sys::index_beginscan(
        heap,
        index,
        snapshot,
        std::ptr::null_mut(),
        nkeys,
        norderbys,
    )
}
