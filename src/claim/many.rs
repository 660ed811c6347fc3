//! `claim_slots` and `my_slots`: a session's own slot plus extra slots,
//! given back while a standby (or a holder below its fair share) wants one.

use super::take::take_free;
use super::{
    check_claim_n, claim, current_claim, others_waiting, require_name, stop_waiting, wait_micros,
    CLAIM_LOCKS, HELD,
};
use crate::backend::error::{internal, invalid_parameter, raise};
use crate::backend::settings;
use crate::locks::{
    held_by_me, locks_of, name_key, try_lock, unlock, CLAIMERS_KEY, EXCLUSIVE, ROW_EXCLUSIVE,
    SHARE, WAITERS_KEY,
};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

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
