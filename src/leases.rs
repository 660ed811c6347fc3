//! Leases and fencing tokens: claim_lease, claim_leases, renew_lease, release_lease,
//! lease_holders, fence, lease_valid, my_token (reference: docs/leases.md).
//!
//! A lease belongs to the role that claimed it. The public functions here
//! are thin SECURITY INVOKER shells: each reads the calling role
//! (`GetUserId()`) and passes it, as the first argument, to an internal
//! SECURITY DEFINER function of `sql/leases.sql` (`pg_claim_lease_*`), called
//! directly through the function manager by OID
//! ([`crate::backend::internal`]). The internal functions' EXECUTE is revoked
//! from PUBLIC, so no role can pass another role's oid. The table, its row
//! locks and the fencing guarantee are explained in `sql/leases.sql`; the
//! tests are `tests/pg_regress/sql/leases*.sql` and `tests/isolation`.

mod check;

use crate::backend::internal::{call, field, internal_fn};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;

// The internal functions call crc32 and my_slot only inside PL/pgSQL bodies,
// which are resolved when they run: the file needs nothing created before it.
pgrx::extension_sql_file!("../sql/leases.sql", name = "leases");
// claim_leases' members table and internal functions, and indexes on the
// leases table of leases.sql.
pgrx::extension_sql_file!(
    "../sql/leases_fleet.sql",
    name = "leases_fleet",
    requires = ["leases"]
);

const OID: pg_sys::Oid = pg_sys::OIDOID;
const TEXT: pg_sys::Oid = pg_sys::TEXTOID;
const INT4: pg_sys::Oid = pg_sys::INT4OID;
const INT8: pg_sys::Oid = pg_sys::INT8OID;
const INTERVAL: pg_sys::Oid = pg_sys::INTERVALOID;

/// The calling role, as a Datum.
fn me() -> Option<pg_sys::Datum> {
    // SAFETY: GetUserId reads the backend's current user
    Some(pg_sys::Datum::from(unsafe { pg_sys::GetUserId() }))
}

fn d<T: IntoDatum>(v: Option<T>) -> Option<pg_sys::Datum> {
    v.and_then(IntoDatum::into_datum)
}

/// Call internal function `name(oid, argtypes...)` with the caller's role first.
fn invoke(
    name: &str,
    argtypes: &[pg_sys::Oid],
    args: &[Option<pg_sys::Datum>],
) -> Option<pg_sys::Datum> {
    let oid = internal_fn(name, argtypes);
    // on the stack: an ERROR of the call jumps over this frame
    let mut all: [Option<pg_sys::Datum>; 6] = [None; 6];
    all[0] = me();
    all[1..=args.len()].copy_from_slice(args);
    // SAFETY: the argument types are those of the signature looked up;
    // nothing here needs dropping
    unsafe { call(oid, &all[..=args.len()]) }
}

/// Claim the lowest free or expired slot of `name` in 0 .. n-1 for `holder`
/// until `ttl` from now: one row, or none when all are leased (a standby).
#[pg_extern(volatile, parallel_unsafe)]
fn claim_lease(
    name: Option<&str>,
    n: Option<i32>,
    holder: Option<&str>,
    ttl: default!(Option<Interval>, "'30 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(slot, i32),
        name!(token, i64),
        name!(expires_at, TimestampWithTimeZone),
    ),
> {
    let row = invoke(
        "pg_claim_lease_claim",
        &[OID, TEXT, INT4, TEXT, INTERVAL],
        &[d(name), d(n), d(holder), d(ttl)],
    );
    // SAFETY: the function's OUT parameters are (integer, bigint, timestamptz)
    let got = row.and_then(|row| unsafe {
        Some((
            field::<i32>(row, 1)?,
            field::<i64>(row, 2)?,
            field::<TimestampWithTimeZone>(row, 3)?,
        ))
    });
    TableIterator::new(got)
}

/// Renew, take and give back leases of `name` so that the live holders share
/// its `n` slots evenly (at most `max` for this holder; `max => 0`: leave):
/// every slot `holder` holds after the call, ordered by slot.
#[pg_extern(volatile, parallel_unsafe)]
fn claim_leases(
    name: Option<&str>,
    n: Option<i32>,
    holder: Option<&str>,
    max: default!(Option<i32>, "NULL"),
    ttl: default!(Option<Interval>, "'30 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(slot, i32),
        name!(token, i64),
        name!(expires_at, TimestampWithTimeZone),
    ),
> {
    let row = invoke(
        "pg_claim_leases_claim",
        &[OID, TEXT, INT4, TEXT, INT4, INTERVAL],
        &[d(name), d(n), d(holder), d(max), d(ttl)],
    );
    let mut rows = Vec::new();
    if let Some(row) = row {
        // SAFETY: the OUT parameters are arrays of these types, one element a lease
        unsafe {
            let slots = field::<Vec<Option<i32>>>(row, 1).unwrap_or_default();
            let tokens = field::<Vec<Option<i64>>>(row, 2).unwrap_or_default();
            let expires = field::<Vec<Option<TimestampWithTimeZone>>>(row, 3).unwrap_or_default();
            for ((slot, token), until) in slots.into_iter().zip(tokens).zip(expires) {
                if let (Some(slot), Some(token), Some(until)) = (slot, token, until) {
                    rows.push((slot, token, until));
                }
            }
        }
    }
    TableIterator::new(rows)
}

/// Extend a lease to `ttl` from now: the new expiry, or NULL when the lease
/// was lost (taken over, released, or not this role's).
#[pg_extern(volatile, parallel_unsafe)]
fn renew_lease(
    name: Option<&str>,
    slot: Option<i32>,
    token: Option<i64>,
    ttl: default!(Option<Interval>, "'30 seconds'"),
) -> Option<TimestampWithTimeZone> {
    let r = invoke(
        "pg_claim_lease_renew",
        &[OID, TEXT, INT4, INT8, INTERVAL],
        &[d(name), d(slot), d(token), d(ttl)],
    );
    // SAFETY: a timestamptz
    r.and_then(|r| unsafe { TimestampWithTimeZone::from_datum(r, false) })
}

/// Give a lease back; false when this token does not hold it (or the lease
/// is not this role's).
#[pg_extern(volatile, parallel_unsafe)]
fn release_lease(name: Option<&str>, slot: Option<i32>, token: Option<i64>) -> Option<bool> {
    let r = invoke(
        "pg_claim_lease_release",
        &[OID, TEXT, INT4, INT8],
        &[d(name), d(slot), d(token)],
    );
    // SAFETY: a boolean
    r.and_then(|r| unsafe { bool::from_datum(r, false) })
}

/// The leases and live session claims of `name`; holder and token only of
/// those whose owner role the caller has the privileges of.
#[pg_extern(stable, parallel_safe)]
#[allow(clippy::type_complexity)]
fn lease_holders(
    name: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(slot, i32),
        name!(holder, Option<String>),
        name!(token, Option<i64>),
        name!(acquired_at, Option<TimestampWithTimeZone>),
        name!(expires_at, Option<TimestampWithTimeZone>),
        name!(expired, Option<bool>),
    ),
> {
    let row = invoke("pg_claim_lease_holders", &[OID, TEXT], &[d(name)]);
    let mut rows = Vec::new();
    if let Some(row) = row {
        // SAFETY: the OUT parameters are arrays of these types, one element a row
        unsafe {
            let slots = field::<Vec<Option<i32>>>(row, 1).unwrap_or_default();
            let holders = field::<Vec<Option<String>>>(row, 2).unwrap_or_default();
            let tokens = field::<Vec<Option<i64>>>(row, 3).unwrap_or_default();
            let acquired = field::<Vec<Option<TimestampWithTimeZone>>>(row, 4).unwrap_or_default();
            let expires = field::<Vec<Option<TimestampWithTimeZone>>>(row, 5).unwrap_or_default();
            let expired = field::<Vec<Option<bool>>>(row, 6).unwrap_or_default();
            for (i, slot) in slots.into_iter().enumerate() {
                let Some(slot) = slot else { continue };
                rows.push((
                    slot,
                    holders.get(i).cloned().flatten(),
                    tokens.get(i).copied().flatten(),
                    acquired.get(i).copied().flatten(),
                    expires.get(i).copied().flatten(),
                    expired.get(i).copied().flatten(),
                ));
            }
        }
    }
    TableIterator::new(rows)
}

/// Whether `token` is the current token of `slot` of `name` (and the lease
/// is this role's); when true, the slot cannot change hands before the
/// calling transaction ends.
///
/// STABLE, so that with constant arguments (or parameters) it is evaluated
/// once per statement, before the first row (a one-time filter of the plan),
/// whatever the number of rows the statement reads.
#[pg_extern(stable, parallel_unsafe)]
fn lease_valid(name: Option<&str>, slot: Option<i32>, token: Option<i64>) -> Option<bool> {
    if let Some(valid) = check::valid_args(name, slot, token) {
        return Some(valid);
    }
    // the argument checks and their errors
    let r = invoke(
        "pg_claim_lease_valid",
        &[OID, TEXT, INT4, INT8],
        &[d(name), d(slot), d(token)],
    );
    // SAFETY: a boolean
    r.and_then(|r| unsafe { bool::from_datum(r, false) })
}

/// Raise PC001 unless `token` is the current token of `slot` of `name` (and
/// the lease is this role's); when it passes, the slot cannot change hands
/// before the calling transaction ends.
#[pg_extern(volatile, parallel_unsafe)]
fn fence(name: Option<&str>, slot: Option<i32>, token: Option<i64>) {
    if check::valid_args(name, slot, token) == Some(true) {
        return;
    }
    // the argument checks, and PC001 with what the slot's row says
    invoke(
        "pg_claim_lease_fence",
        &[OID, TEXT, INT4, INT8],
        &[d(name), d(slot), d(token)],
    );
}

/// The writer's half of the fence lock, called by the trigger of
/// `sql/leases_guard.sql` on every change that can end a holder's right to
/// write: waits for the READ COMMITTED transactions that passed `fence` /
/// `lease_valid` on the slot, holds its fence lock exclusive to the end of
/// this transaction, and has every session forget the leases it knew when
/// this transaction commits. Internal: EXECUTE is revoked from PUBLIC.
#[pg_extern(volatile, parallel_unsafe)]
fn pg_claim_lease_handover(name: &str, slot: i32) {
    check::handover(name, slot);
}

pgrx::extension_sql_file!(
    "../sql/leases_guard.sql",
    name = "leases_guard",
    requires = ["leases", pg_claim_lease_handover]
);

/// The fencing token of this session's claim_slot claim of `name` (NULL
/// when it holds none), for fence and lease_valid.
#[pg_extern(volatile, parallel_unsafe)]
fn my_token(name: Option<&str>) -> Option<i64> {
    name?;
    let r = invoke("pg_claim_lease_my_token", &[OID, TEXT], &[d(name)]);
    // SAFETY: a bigint
    r.and_then(|r| unsafe { i64::from_datum(r, false) })
}

// The comments of the functions above, once they exist.
pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION @extschema@.claim_lease(text, integer, text, interval) IS
    'claim the lowest free or expired slot of name in 0 .. n-1 for holder until ttl from now: one row (slot, token, expires_at), or none when all are leased';
COMMENT ON FUNCTION @extschema@.claim_leases(text, integer, text, integer, interval) IS
    'renew, take and give back leases of name so that the live holders share its n slots evenly (at most max for this holder; max => 0: leave): every slot holder holds after the call';
COMMENT ON FUNCTION @extschema@.renew_lease(text, integer, bigint, interval) IS
    'extend a lease to ttl from now: the new expiry, or NULL when the lease was lost (taken over or released)';
COMMENT ON FUNCTION @extschema@.release_lease(text, integer, bigint) IS
    'give a lease back; false when this token does not hold it';
COMMENT ON FUNCTION @extschema@.lease_holders(text) IS
    'the leases and live session claims of name: slot, holder, token (NULL for leases of roles whose privileges the caller lacks), since when, until when, and whether the lease expired';
COMMENT ON FUNCTION @extschema@.lease_valid(text, integer, bigint) IS
    'whether token is the current token of slot of name; when true, the slot cannot change hands before the calling transaction ends';
COMMENT ON FUNCTION @extschema@.fence(text, integer, bigint) IS
    'raise PC001 unless token is the current token of slot of name; when it passes, the slot cannot change hands before the calling transaction ends';
COMMENT ON FUNCTION @extschema@.my_token(text) IS
    'the fencing token of this session''s claim_slot claim of name (NULL when it holds none), for fence and lease_valid';
"#,
    name = "lease_comments",
    requires = [
        claim_lease,
        claim_leases,
        renew_lease,
        release_lease,
        lease_holders,
        lease_valid,
        fence,
        my_token
    ],
);
