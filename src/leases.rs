//! Leases and fencing tokens: claim_lease, claim_leases, report_backlog, renew_lease,
//! release_lease, lease_holders, fence, lease_valid, my_token, resize_fleet, fleet_n,
//! cap_fleet, fleet_cap
//! (reference: docs/leases.md).
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

use crate::backend::internal::field;
use crate::role_shells;
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
// Balancing by remaining work: the leases table's weight columns,
// report_backlog's internal function and the weighted planner.
pgrx::extension_sql_file!(
    "../sql/leases_balance.sql",
    name = "leases_balance",
    requires = ["leases_fleet"]
);

type Row = (i32, i64, TimestampWithTimeZone);

/// claim_lease's row: the lease taken, if any.
///
/// # Safety
/// `result` is NULL or a composite of `(integer, bigint, timestamptz)` (the
/// OUT parameters of `pg_claim_lease_claim`).
unsafe fn one_lease(result: Option<pg_sys::Datum>) -> TableIterator<'static, Row> {
    // SAFETY: the caller's promise
    let got = result.and_then(|row| unsafe {
        Some((
            field::<i32>(row, 1)?,
            field::<i64>(row, 2)?,
            field::<TimestampWithTimeZone>(row, 3)?,
        ))
    });
    TableIterator::new(got)
}

/// claim_leases' rows: one a lease, from arrays of the same length.
///
/// # Safety
/// `result` is NULL or a composite of `(integer[], bigint[],
/// timestamptz[])` (the OUT parameters of `pg_claim_leases_claim`).
unsafe fn leases(result: Option<pg_sys::Datum>) -> TableIterator<'static, Row> {
    let mut rows = Vec::new();
    if let Some(row) = result {
        // SAFETY: the caller's promise
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

type HolderRow = (
    i32,
    Option<String>,
    Option<i64>,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
    Option<bool>,
);

/// lease_holders' rows, from arrays of the same length.
///
/// # Safety
/// `result` is NULL or a composite of `(integer[], text[], bigint[],
/// timestamptz[], timestamptz[], boolean[])` (the OUT parameters of
/// `pg_claim_lease_holders`).
unsafe fn holders(result: Option<pg_sys::Datum>) -> TableIterator<'static, HolderRow> {
    let mut rows = Vec::new();
    if let Some(row) = result {
        // SAFETY: the caller's promise
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

/// A scalar result as `T`.
///
/// # Safety
/// `result` is NULL or a datum of `T`'s SQL type.
unsafe fn scalar<T: FromDatum>(result: Option<pg_sys::Datum>) -> Option<T> {
    // SAFETY: the caller's promise
    result.and_then(|r| unsafe { T::from_datum(r, false) })
}

/// fence's: the internal function returns void (PC001 is its ERROR).
///
/// # Safety
/// Nothing is read.
unsafe fn void(_result: Option<pg_sys::Datum>) {}

role_shells! {
    /// Claim the lowest free or expired slot of `name` in 0 .. n-1 for `holder`
    /// until `ttl` from now: one row, or none when all are leased (a standby).
    #[pg_extern(volatile, parallel_unsafe)]
    fn claim_lease(
        name: Option<&str>,
        n: Option<i32>,
        holder: Option<&str>,
        ttl: Option<Interval> = "'30 seconds'",
    ) -> TableIterator<
        'static,
        (
            name!(slot, i32),
            name!(token, i64),
            name!(expires_at, TimestampWithTimeZone),
        ),
    > = pg_claim_lease_claim via one_lease;

    /// Renew, take and give back leases of `name` so that the live holders share
    /// its `n` slots evenly (at most `max` for this holder; `max => 0`: leave):
    /// every slot `holder` holds after the call, ordered by slot.
    #[pg_extern(volatile, parallel_unsafe)]
    fn claim_leases(
        name: Option<&str>,
        n: Option<i32>,
        holder: Option<&str>,
        max: Option<i32> = "NULL",
        ttl: Option<Interval> = "'30 seconds'",
    ) -> TableIterator<
        'static,
        (
            name!(slot, i32),
            name!(token, i64),
            name!(expires_at, TimestampWithTimeZone),
        ),
    > = pg_claim_leases_claim via leases;

    /// Report the work left in a slot this holder leases (its weight for
    /// claim_leases' balance; NULL `remaining`: only ask): the slots of its
    /// holder that another holder wants (give them back after this batch;
    /// empty when none), NULL when `token` does not hold the lease.
    /// `fenced_batches`: every batch of the slot runs in one transaction
    /// that passed `fence` before it read its rows, so a lighter holder may
    /// take the slot at once while no fenced transaction holds it.
    #[pg_extern(volatile, parallel_unsafe)]
    fn report_backlog(
        name: Option<&str>,
        slot: Option<i32>,
        token: Option<i64>,
        remaining: Option<i64>,
        fenced_batches: Option<bool> = "false",
    ) -> Option<Vec<i32>> = pg_claim_lease_report via scalar;

    /// Extend a lease to `ttl` from now: the new expiry, or NULL when the lease
    /// was lost (taken over, released, or not this role's).
    #[pg_extern(volatile, parallel_unsafe)]
    fn renew_lease(
        name: Option<&str>,
        slot: Option<i32>,
        token: Option<i64>,
        ttl: Option<Interval> = "'30 seconds'",
    ) -> Option<TimestampWithTimeZone> = pg_claim_lease_renew via scalar;

    /// Give a lease back; false when this token does not hold it (or the lease
    /// is not this role's).
    #[pg_extern(volatile, parallel_unsafe)]
    fn release_lease(name: Option<&str>, slot: Option<i32>, token: Option<i64>) -> Option<bool>
        = pg_claim_lease_release via scalar;

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
    > = pg_claim_lease_holders via holders;

    /// Whether `token` is the current token of `slot` of `name` (and the lease
    /// is this role's); when true, the slot cannot change hands before the
    /// calling transaction ends.
    ///
    /// STABLE, so that with constant arguments (or parameters) it is evaluated
    /// once per statement, before the first row (a one-time filter of the plan),
    /// whatever the number of rows the statement reads. The internal function
    /// answers only for the arguments the check in Rust does not take (with
    /// their errors).
    #[pg_extern(stable, parallel_unsafe)]
    fn lease_valid(name: Option<&str>, slot: Option<i32>, token: Option<i64>) -> Option<bool>
    where {
        if let Some(valid) = check::valid_args(name, slot, token) {
            return Some(valid);
        }
    } = pg_claim_lease_valid via scalar;

    /// Raise PC001 unless `token` is the current token of `slot` of `name` (and
    /// the lease is this role's); when it passes, the slot cannot change hands
    /// before the calling transaction ends. The internal function answers
    /// for the arguments the check in Rust does not take (their errors) and
    /// raises PC001 with what the slot's row says.
    #[pg_extern(volatile, parallel_unsafe)]
    fn fence(name: Option<&str>, slot: Option<i32>, token: Option<i64>)
    where {
        if check::valid_args(name, slot, token) == Some(true) {
            return;
        }
    } = pg_claim_lease_fence via void;

    /// The fencing token of this session's claim_slot claim of `name` (NULL
    /// when it holds none), for fence and lease_valid.
    #[pg_extern(volatile, parallel_unsafe)]
    fn my_token(name: Option<&str>) -> Option<i64>
    where {
        name?;
    } = pg_claim_lease_my_token via scalar;

    /// Set the number of slots of the claim_leases fleet `name` to `n`, in
    /// this transaction: it waits for every fenced transaction of the old n,
    /// gives back every lease, and sets the members' and the definition's n
    /// (`sql/leases_resize.sql`). The old n.
    #[pg_extern(volatile, parallel_unsafe)]
    fn resize_fleet(name: Option<&str>, n: Option<i32>) -> Option<i32>
        = pg_claim_leases_resize via scalar;

    /// The n of the lease fleet `name`: its live members', else its
    /// define_fleet definition's, else NULL.
    #[pg_extern(stable, parallel_safe)]
    fn fleet_n(name: Option<&str>) -> Option<i32> = pg_claim_fleet_n via scalar;

    /// Let at most `g` holders of the claim_leases fleet `name` hold slots at
    /// once; the other members wait as standbys (`sql/leases_cap.sql`).
    /// NULL `g` removes the cap. The cap before.
    #[pg_extern(volatile, parallel_unsafe)]
    fn cap_fleet(name: Option<&str>, g: Option<i32>) -> Option<i32>
        = pg_claim_leases_cap via scalar;

    /// The cap of the lease fleet `name`, NULL when it has none.
    #[pg_extern(stable, parallel_safe)]
    fn fleet_cap(name: Option<&str>) -> Option<i32> = pg_claim_fleet_cap via scalar;
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

// Online resize of a lease fleet: claim_leases' PC002 and the internal
// functions of resize_fleet and fleet_n (the definitions' table of
// sql/fleets.sql is read only when they run).
pgrx::extension_sql_file!(
    "../sql/leases_resize.sql",
    name = "leases_resize",
    requires = ["leases_balance"]
);

// A fleet-wide cap: the internal functions of cap_fleet and fleet_cap, and
// claim_leases' reading of the cap.
pgrx::extension_sql_file!(
    "../sql/leases_cap.sql",
    name = "leases_cap",
    requires = ["leases_resize"]
);

pgrx::extension_sql_file!(
    "../sql/leases_guard.sql",
    name = "leases_guard",
    requires = ["leases", pg_claim_lease_handover]
);

// The comments of the functions above, once they exist.
pgrx::extension_sql_file!(
    "../sql/lease_comments.sql",
    name = "lease_comments",
    requires = [
        claim_lease,
        claim_leases,
        report_backlog,
        renew_lease,
        release_lease,
        lease_holders,
        lease_valid,
        fence,
        my_token,
        resize_fleet,
        fleet_n,
        cap_fleet,
        fleet_cap
    ],
);
