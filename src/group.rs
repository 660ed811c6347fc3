//! Dynamic groups: membership, positions and fair partition ownership (reference: docs/groups.md).
//!
//! A member of group `name` is a session holding the shared advisory lock
//! (`name_key(name)`, `GROUP_MEMBER_KEY`): membership is liveness, so a member
//! whose session ends for any reason leaves at once. Members are ranked by
//! `(backend_start, pid)`, which every session reads the same way from the
//! server's backend status array; the rank is `group_position`'s `index`.
//!
//! Partition `p` of a group is the exclusive advisory lock
//! (`name_key(name)`, `PARTITION_BASE + p`), so two sessions can never hold the
//! same partition. A member that calls `claim_partitions(name, P)` also holds
//! the shared lock (`name_key(name)`, `PARTITION_COUNT_BASE + P`), which lets
//! other members detect a different `P`. The decision logic is in `plan`.

mod plan;

use crate::backend::error::{invalid_parameter, raise};
use crate::locks::{
    held_by_me, locks_of, name_key, try_lock, unlock, LockHolder, EXCLUSIVE, GROUP_MEMBER_KEY,
    MAX_PARTITIONS, PARTITION_BASE, PARTITION_COUNT_BASE, SHARE,
};
use pgrx::prelude::*;
use pgrx::{Inet, PgTryBuilder};
use plan::plan_step;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;

/// A claim pass re-reads the lock table when a partition it wanted was taken
/// by another member meanwhile; this bounds the passes of one call.
const MAX_PASSES: usize = 64;

/// Linux address families (`sys/socket.h`).
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;

thread_local! {
    /// Partitions this backend took per group key, so `my_partitions` need
    /// not read the shared lock table (it still checks each one is held).
    static HELD: RefCell<HashMap<i32, BTreeSet<i32>>> = RefCell::new(HashMap::new());
}

/// A live member as seen in the backend status array.
struct Member {
    pid: i32,
    backend_start: pg_sys::TimestampTz,
    userid: pg_sys::Oid,
    application_name: Option<String>,
    client_addr: Option<String>,
}

fn my_pid() -> i32 {
    // SAFETY: set once at backend start.
    unsafe { pg_sys::MyProcPid }
}

/// The client address of a backend as `inet` text, None for Unix sockets
/// and background processes (as `pg_stat_activity.client_addr`).
fn client_addr(sa: &pg_sys::SockAddr) -> Option<String> {
    let len = sa.salen as usize;
    // SAFETY: sockaddr_storage is plain bytes of its own size.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&sa.addr as *const pg_sys::sockaddr_storage).cast::<u8>(),
            std::mem::size_of::<pg_sys::sockaddr_storage>(),
        )
    };
    let family = u16::from_ne_bytes([bytes[0], bytes[1]]) as u32;
    if family == AF_INET && len >= 8 {
        let a: [u8; 4] = bytes[4..8].try_into().ok()?;
        Some(std::net::Ipv4Addr::from(a).to_string())
    } else if family == AF_INET6 && len >= 24 {
        let a: [u8; 16] = bytes[8..24].try_into().ok()?;
        Some(std::net::Ipv6Addr::from(a).to_string())
    } else {
        None
    }
}

/// The pids holding the membership lock in a lock-table snapshot.
fn member_pids(locks: &[LockHolder]) -> BTreeSet<i32> {
    locks
        .iter()
        .filter(|l| l.key2 == GROUP_MEMBER_KEY && l.granted && l.mode == SHARE && l.pid != 0)
        .map(|l| l.pid)
        .collect()
}

/// The live members of the group with key `key`, ranked by
/// `(backend_start, pid)`.
fn ranked_members(key: i32) -> Vec<Member> {
    rank(member_pids(&locks_of(
        key,
        GROUP_MEMBER_KEY,
        GROUP_MEMBER_KEY + 1,
    )))
}

/// Rank membership-lock holders by `(backend_start, pid)`, as read from the
/// backend status array; a holder that has meanwhile exited is left out.
fn rank(pids: BTreeSet<i32>) -> Vec<Member> {
    let mut out = Vec::with_capacity(pids.len());
    if pids.is_empty() {
        return out;
    }
    // SAFETY: the backend status snapshot is read fresh (cleared first) and
    // copied out before anything else can clear it.
    unsafe {
        pg_sys::pgstat_clear_snapshot();
        let n = pg_sys::pgstat_fetch_stat_numbackends();
        for i in 1..=n {
            let local = crate::backend::compat::local_beentry(i);
            if local.is_null() {
                continue;
            }
            let be = &(*local).backendStatus;
            if !pids.contains(&be.st_procpid) {
                continue;
            }
            let application_name = if be.st_appname.is_null() {
                None
            } else {
                Some(
                    std::ffi::CStr::from_ptr(be.st_appname)
                        .to_string_lossy()
                        .into_owned(),
                )
            };
            out.push(Member {
                pid: be.st_procpid,
                backend_start: be.st_proc_start_timestamp,
                userid: be.st_userid,
                application_name,
                client_addr: client_addr(&be.st_clientaddr),
            });
        }
    }
    out.sort_unstable_by_key(|m| (m.backend_start, m.pid));
    out
}

/// The live members of group `name` in rank order; none when the name's
/// lock key is registered to another name (whose members they are).
fn members_of(name: &str) -> Vec<Member> {
    if !crate::claim::owns_key(name) {
        return Vec::new();
    }
    ranked_members(name_key(name))
}

/// Make this session a member of `name` (idempotent). True when it joined now.
fn ensure_member(key: i32, name: &str) -> bool {
    // Members notice a dead client while busy, like claiming sessions
    // (pg_claim.client_connection_check_interval).
    crate::backend::settings::apply_client_check(true);
    if held_by_me(key, GROUP_MEMBER_KEY, SHARE) {
        if !crate::claim::name_registered(name) {
            // registered in a transaction that rolled back
            crate::claim::register_name(name);
        }
        return false;
    }
    crate::locks::ensure_room(1, || format!("joining group \"{name}\""));
    // The name's lock key must be its own (42710 when another name has it).
    crate::claim::register_name(name);
    if !try_lock(key, GROUP_MEMBER_KEY, SHARE) {
        raise(
            PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
            format!("cannot join group \"{name}\": its membership lock is held exclusively"),
            "Another session holds pg_advisory_lock(key1, 536870912) exclusively on this group's key; \
             release it (see the key layout in docs/groups.md).",
        );
    }
    true
}

fn check_partitions(partitions: i32) {
    if !(1..=MAX_PARTITIONS).contains(&partitions) {
        invalid_parameter(
            format!("partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}"),
            "The argument partitions is the fixed number of partitions the group's work is split \
             into (e.g. 256); every held partition takes one entry in the shared lock table.",
        );
    }
}

/// Release every partition and partition-count record this session holds
/// for `key` (from the lock table, so it is complete).
fn release_all(key: i32) {
    let me = my_pid();
    for l in locks_of(key, PARTITION_COUNT_BASE, PARTITION_BASE + MAX_PARTITIONS) {
        if l.pid != me || !l.granted {
            continue;
        }
        if held_by_me(key, l.key2, l.mode) {
            unlock(key, l.key2, l.mode);
        }
    }
    HELD.with(|h| h.borrow_mut().remove(&key));
}

/// `group_join(name)`: this session becomes a live member of group `name`.
/// Idempotent. The membership ends with `group_leave` or the session.
#[pg_extern(volatile, strict, parallel_unsafe)]
fn group_join(name: &str) {
    ensure_member(name_key(name), name);
}

/// `group_leave(name)`: this session stops being a member of `name` and
/// releases every partition it holds in it. False when it was not a member.
#[pg_extern(volatile, strict, parallel_unsafe)]
fn group_leave(name: &str) -> bool {
    let key = name_key(name);
    release_all(key);
    if held_by_me(key, GROUP_MEMBER_KEY, SHARE) {
        unlock(key, GROUP_MEMBER_KEY, SHARE);
        true
    } else {
        false
    }
}

/// `group_position(name)`: this member's 0-based rank among the live
/// members (by backend start, then pid) and their count, at the call.
/// A session that is not a member gets a NULL index and the count.
#[pg_extern(volatile, strict, parallel_unsafe)]
fn group_position(
    name: &str,
) -> TableIterator<'static, (name!(index, Option<i32>), name!(members, i32))> {
    let members = members_of(name);
    let me = my_pid();
    let index = members.iter().position(|m| m.pid == me).map(|i| i as i32);
    TableIterator::once((index, members.len() as i32))
}

/// `group_members(name)`: the live members in rank order. `client_addr` and
/// `backend_start` are NULL for sessions of other roles unless the caller
/// may see them in `pg_stat_activity` (same role, or `pg_read_all_stats`).
#[pg_extern(volatile, strict, parallel_unsafe)]
#[allow(clippy::type_complexity)]
fn group_members(
    name: &str,
) -> TableIterator<
    'static,
    (
        name!(index, i32),
        name!(pid, i32),
        name!(application_name, Option<String>),
        name!(client_addr, Option<Inet>),
        name!(backend_start, Option<TimestampWithTimeZone>),
    ),
> {
    let members = members_of(name);
    // SAFETY: plain catalog lookups on role membership.
    let user = unsafe { pg_sys::GetUserId() };
    // SAFETY: a role membership look-up for the current user.
    let stats_reader = unsafe {
        pg_sys::has_privs_of_role(user, pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_STATS))
    };
    let rows: Vec<_> = members
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            // SAFETY: a role membership look-up; a role dropped meanwhile has
            // no members and gives false.
            let visible = stats_reader || unsafe { pg_sys::has_privs_of_role(user, m.userid) };
            (
                i as i32,
                m.pid,
                m.application_name,
                m.client_addr.filter(|_| visible).map(Inet),
                if visible {
                    TimestampWithTimeZone::try_from(m.backend_start).ok()
                } else {
                    None
                },
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// One consistent view of a group's locks, for one `claim_partitions` pass.
struct GroupSnapshot {
    /// Pids holding the membership lock.
    members: BTreeSet<i32>,
    /// Owner pid of each partition `0..P`.
    owners: Vec<Option<i32>>,
    /// `(pid, P)` of every partition-count record.
    counts: Vec<(i32, i32)>,
    /// This session's locks that do not belong to the current `P`:
    /// other count records, partitions `>= P`.
    my_stale: Vec<LockHolder>,
}

/// Read the whole group (membership, count records, partitions) from the
/// shared lock table in one snapshot.
fn snapshot(key: i32, partitions: i32) -> GroupSnapshot {
    let me = my_pid();
    let locks = locks_of(key, GROUP_MEMBER_KEY, PARTITION_BASE + MAX_PARTITIONS);
    let mut snap = GroupSnapshot {
        members: member_pids(&locks),
        owners: vec![None; partitions as usize],
        counts: Vec::new(),
        my_stale: Vec::new(),
    };
    for l in locks {
        if !l.granted || l.pid == 0 || l.key2 < PARTITION_COUNT_BASE {
            continue;
        }
        if l.key2 >= PARTITION_BASE {
            let p = l.key2 - PARTITION_BASE;
            if p < partitions && l.mode == EXCLUSIVE {
                snap.owners[p as usize] = Some(l.pid);
            } else if l.pid == me {
                snap.my_stale.push(l);
            }
        } else if l.mode == SHARE {
            let count = l.key2 - PARTITION_COUNT_BASE;
            snap.counts.push((l.pid, count));
            if l.pid == me && count != partitions {
                snap.my_stale.push(l);
            }
        }
    }
    snap
}

/// `claim_partitions(name, partitions)`: one rebalancing step. Joins the
/// group if this session is not a member, releases the partitions above this
/// member's fair share and claims free ones up to it; returns the partitions
/// it holds now, sorted.
#[pg_extern(volatile, strict, parallel_unsafe)]
fn claim_partitions(name: &str, partitions: i32) -> Vec<i32> {
    check_partitions(partitions);
    let key = name_key(name);
    // What this call took, so that an ERROR half-way (out of shared memory,
    // 53200; the lock bound, 53400; a cancel) gives it all back.
    let took_cell = RefCell::new(Took::default());
    let took = AssertUnwindSafe(&took_cell);
    let result = PgTryBuilder::new(|| rebalance(name, key, partitions, &took))
        .catch_others(|cause| {
            let took = took.borrow();
            for &p in &took.partitions {
                if held_by_me(key, PARTITION_BASE + p, EXCLUSIVE) {
                    unlock(key, PARTITION_BASE + p, EXCLUSIVE);
                }
            }
            if let Some(record) = took.record {
                if held_by_me(key, record, SHARE) {
                    unlock(key, record, SHARE);
                }
            }
            if took.membership && held_by_me(key, GROUP_MEMBER_KEY, SHARE) {
                unlock(key, GROUP_MEMBER_KEY, SHARE);
            }
            // what is still held: the partitions held before the call, less the
            // ones the call released before the ERROR
            let held: BTreeSet<i32> = (0..MAX_PARTITIONS)
                .filter(|&p| held_by_me(key, PARTITION_BASE + p, EXCLUSIVE))
                .collect();
            HELD.with(|h| h.borrow_mut().insert(key, held));
            cause.rethrow()
        })
        .execute();
    HELD.with(|h| h.borrow_mut().insert(key, result.iter().copied().collect()));
    result
}

/// The locks one `claim_partitions` call took so far.
#[derive(Default)]
struct Took {
    membership: bool,
    record: Option<i32>,
    partitions: Vec<i32>,
}

/// The body of `claim_partitions`; records in `took` every lock it takes.
fn rebalance(name: &str, key: i32, partitions: i32, took: &RefCell<Took>) -> Vec<i32> {
    let me = my_pid();
    let joined_now = ensure_member(key, name);
    took.borrow_mut().membership = joined_now;

    // Record our P first, then check the others' records: of two members
    // racing with different counts, the later reader sees the other.
    let record = PARTITION_COUNT_BASE + partitions;
    let newly_recorded = !held_by_me(key, record, SHARE);
    if newly_recorded {
        crate::locks::ensure_room(1, || format!("claim_partitions(\"{name}\", {partitions})"));
        if !try_lock(key, record, SHARE) {
            raise(
                PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
                format!("cannot record partitions = {partitions} for group \"{name}\""),
                "Another session holds this group's partition-count lock exclusively.",
            );
        }
        took.borrow_mut().record = Some(record);
    }
    let mut snap = snapshot(key, partitions);
    if let Some(&(pid, other)) = snap
        .counts
        .iter()
        .find(|&&(pid, p)| pid != me && p != partitions)
    {
        invalid_parameter(
            format!(
                "partitions = {partitions} does not match the {other} partitions used by member pid {pid} of group \"{name}\""
            ),
            "Every member of a group must call claim_partitions with the same number of partitions; \
             to change it, call group_leave in every member first.",
        );
    }
    // Drop our own records of another count, and partitions beyond P.
    for l in &snap.my_stale {
        if held_by_me(key, l.key2, l.mode) {
            unlock(key, l.key2, l.mode);
        }
    }

    let mut held: BTreeSet<i32> = BTreeSet::new();
    for pass in 0..MAX_PASSES {
        if pass > 0 {
            check_for_interrupts!();
            snap = snapshot(key, partitions);
        }
        held = (0..partitions)
            .filter(|&p| snap.owners[p as usize] == Some(me))
            .collect();
        let members: Vec<i32> = rank(std::mem::take(&mut snap.members))
            .into_iter()
            .map(|m| m.pid)
            .collect();
        if !members.contains(&me) {
            // Our own entry is always there while we run; be safe anyway.
            break;
        }
        let step = plan_step(key, &members, me, &snap.owners);
        for p in step.release {
            if held_by_me(key, PARTITION_BASE + p, EXCLUSIVE) {
                unlock(key, PARTITION_BASE + p, EXCLUSIVE);
            }
            held.remove(&p);
        }
        let wanted = step.target.saturating_sub(held.len());
        crate::locks::ensure_room(wanted, || {
            format!("claim_partitions(\"{name}\", {partitions})")
        });
        let mut missed = false;
        for p in step.claim {
            if held.len() >= step.target {
                break;
            }
            if try_lock(key, PARTITION_BASE + p, EXCLUSIVE) {
                took.borrow_mut().partitions.push(p);
                held.insert(p);
            } else {
                missed = true;
            }
        }
        if held.len() >= step.target || !missed {
            break;
        }
    }
    held.into_iter().collect()
}

/// `my_partitions(name)`: the partitions of `name` this session holds now,
/// sorted, without rebalancing (empty when none). STABLE, so
/// `slot_of(id, P) = ANY(my_partitions(name))` can be an index condition.
/// PARALLEL RESTRICTED: locks belong to the leader, not to parallel workers.
#[pg_extern(stable, strict, parallel_restricted)]
fn my_partitions(name: &str) -> Vec<i32> {
    let key = name_key(name);
    HELD.with(|h| {
        h.borrow()
            .get(&key)
            .map(|set| {
                set.iter()
                    .copied()
                    .filter(|&p| held_by_me(key, PARTITION_BASE + p, EXCLUSIVE))
                    .collect()
            })
            .unwrap_or_default()
    })
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn join_position_leave_in_one_session() {
        Spi::run("SELECT group_join('pgtest_g')").unwrap();
        let idx = Spi::get_one::<i32>("SELECT index FROM group_position('pgtest_g')").unwrap();
        assert_eq!(idx, Some(0));
        let parts = Spi::get_one::<Vec<i32>>("SELECT claim_partitions('pgtest_g', 5)")
            .unwrap()
            .unwrap();
        assert_eq!(parts, vec![0, 1, 2, 3, 4]);
        let mine = Spi::get_one::<Vec<i32>>("SELECT my_partitions('pgtest_g')")
            .unwrap()
            .unwrap();
        assert_eq!(mine, parts);
        assert_eq!(
            Spi::get_one::<bool>("SELECT group_leave('pgtest_g')").unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT group_leave('pgtest_g')").unwrap(),
            Some(false)
        );
        let mine = Spi::get_one::<Vec<i32>>("SELECT my_partitions('pgtest_g')")
            .unwrap()
            .unwrap();
        assert!(mine.is_empty());
    }
}
