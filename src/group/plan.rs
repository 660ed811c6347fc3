//! The pure decision logic of `claim_partitions`: given the live members in rank
//! order, the current owner of every partition and the calling member, what to
//! release and what to try to claim. No PostgreSQL dependency, so it is tested
//! here with plain `#[test]`s and a round-by-round simulation of many members
//! calling concurrently.
//!
//! # Fair shares
//!
//! With `P = q*M + r` (`0 <= r < M`), the member at rank `i` (0-based, the
//! `index` of `group_position`) has the target `q + 1` when `i < r`, else `q`.
//! Every member computes the same ranking from the same lock table, so the
//! targets agree and add up to exactly `P`.
//!
//! # One step (`plan_step`)
//!
//! 1. If the member holds more than its target, it releases the excess, first
//!    the partitions whose preferred owner is someone else, then those it likes
//!    least.
//! 2. If it holds fewer, it claims free partitions (owned by nobody) until it
//!    reaches the target, first those whose preferred owner it is, then those it
//!    likes most. A member never releases a partition it is within its target
//!    for, and never claims above its target.
//!
//! The preferred owner of a partition is the member with the highest
//! rendezvous weight `weight(seed, pid, partition)`: every member computes it
//! the same way, so when the excess of several members is released, the new
//! member tends to receive the partitions that hash to it.
//!
//! # Convergence in two rounds (proof)
//!
//! Suppose membership does not change. Round 1: every member makes one call
//! (in any interleaving, concurrently or not). Round 2: every member makes one
//! call that starts after all round-1 calls have ended.
//!
//! * A member's holdings change only inside its own calls (locks are taken and
//!   released by the session itself; only its death releases them otherwise).
//! * Every call ends with `held <= target` (step 1 releases down to the target,
//!   step 2 never goes above it). So after round 1, and at every moment of
//!   round 2, every member `o` holds at most `t_o`.
//! * Round 2, member `m` holding `h_m < t_m`: at any moment the free partitions
//!   number at least `P - sum_{o != m} t_o - h_m = t_m - h_m` (the targets add
//!   up to `P`). A claim attempt fails only when another member took that
//!   partition after our snapshot; the caller then takes a fresh snapshot and
//!   tries again, and a fresh snapshot always shows at least `t_m - h_m` free
//!   partitions. So `m` ends its round-2 call holding exactly `t_m`.
//! * After round 2 every member holds exactly its target; the targets add up to
//!   `P`, so every partition is held, and each share is `q` or `q + 1`, i.e.
//!   within `floor(P/M) ..= ceil(P/M)`.
//!
//! Two calls per member without the round boundary are not enough in general:
//! if `A` calls twice while `B` still holds everything, `A` cannot gain
//! anything until `B` has released, and only `A`'s own later call can claim.
//!
//! # Movement bounds (proof)
//!
//! From a converged state with `M` members, `P = q*M + r`, the members at ranks
//! `< r` hold `q + 1` and the others `q`. Partitions change owner only when
//! released, and a member releases only what is above its new target.
//!
//! * Leave (or kill) of one member: the targets of the others never decrease
//!   (if `q` stays the same, `r` grows by at least the number of extras the
//!   leaver had, and ranks behind the leaver move up by one), so nobody
//!   releases: only the leaver's partitions change owner.
//! * Join of one member at rank `k`, new `P = q'*(M+1) + r'`. If `q' < q`,
//!   every old member's new target `<= q' + 1 <= q <=` its holding, so the
//!   released partitions number exactly the new member's target
//!   `<= ceil(P/(M+1))`. If `q' = q`, then `r' = r - q`, and an old member
//!   releases one partition exactly when it had `q + 1` and now has target
//!   `q`: that is `q` members when `k >= r'`, and `q + 1` members when
//!   `k < r'` (then `r' > 0`, so `ceil(P/(M+1)) = q + 1`). Either way at most
//!   `ceil(P/(M+1))` partitions move. Ranks follow backend start time, so a new
//!   session usually joins at the end (`k = M`) and exactly its own target
//!   moves.

/// The fair share of the member at `index` (0-based rank) among `members`.
pub fn fair_share(partitions: i32, members: usize, index: usize) -> usize {
    debug_assert!(members >= 1 && partitions >= 0);
    let p = partitions as usize;
    p / members + usize::from(index < p % members)
}

/// splitmix64's finaliser: a fast 64-bit mix with full avalanche.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The rendezvous (highest random weight) weight of member `pid` for
/// `partition` in the group whose key is `seed`.
#[inline]
pub fn weight(seed: i32, pid: i32, partition: i32) -> u64 {
    let who = ((seed as u32 as u64) << 32) | pid as u32 as u64;
    mix(mix(who) ^ (partition as u32 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The preferred owner of `partition` among `members` (pids): the highest
/// weight, ties (practically impossible) broken by the larger pid.
pub fn preferred_owner(seed: i32, members: &[i32], partition: i32) -> Option<i32> {
    members
        .iter()
        .map(|&m| (weight(seed, m, partition), m))
        .max()
        .map(|(_, m)| m)
}

/// What one `claim_partitions` call should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// This member's fair share.
    pub target: usize,
    /// Partitions to release now (all currently held by this member).
    pub release: Vec<i32>,
    /// Free partitions to try, best first; claim until holding `target`.
    pub claim: Vec<i32>,
}

/// One rebalancing step for member `me`.
///
/// `members` are the live members' pids in rank order and must contain `me`;
/// `owners[p]` is the pid holding partition `p` (`owners.len()` is `P`).
pub fn plan_step(seed: i32, members: &[i32], me: i32, owners: &[Option<i32>]) -> Step {
    let index = members
        .iter()
        .position(|&m| m == me)
        .unwrap_or(members.len());
    let target = fair_share(owners.len() as i32, members.len().max(1), index);
    let mine: Vec<i32> = (0..owners.len() as i32)
        .filter(|&p| owners[p as usize] == Some(me))
        .collect();
    let mut release = Vec::new();
    let mut claim = Vec::new();
    if mine.len() > target {
        // Least wanted first: preferred by someone else, then lowest weight.
        let mut keyed: Vec<(bool, u64, i32)> = mine
            .iter()
            .map(|&p| {
                (
                    preferred_owner(seed, members, p) == Some(me),
                    weight(seed, me, p),
                    p,
                )
            })
            .collect();
        keyed.sort_unstable();
        release = keyed[..mine.len() - target].iter().map(|k| k.2).collect();
        release.sort_unstable();
    } else if mine.len() < target {
        // Most wanted first: preferred by me, then highest weight.
        let mut keyed: Vec<(bool, u64, i32)> = (0..owners.len() as i32)
            .filter(|&p| owners[p as usize].is_none())
            .map(|p| {
                (
                    preferred_owner(seed, members, p) == Some(me),
                    weight(seed, me, p),
                    p,
                )
            })
            .collect();
        keyed.sort_unstable_by(|a, b| b.cmp(a));
        claim = keyed.into_iter().map(|k| k.2).collect();
    }
    Step {
        target,
        release,
        claim,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn fair_shares_add_up_and_are_balanced() {
        for p in 1..=70 {
            for m in 1..=20usize {
                let shares: Vec<usize> = (0..m).map(|i| fair_share(p, m, i)).collect();
                assert_eq!(shares.iter().sum::<usize>(), p as usize);
                let lo = p as usize / m;
                let hi = (p as usize).div_ceil(m);
                assert!(shares.iter().all(|&s| s == lo || s == hi));
                // Extras go to the lowest ranks.
                assert!(shares.windows(2).all(|w| w[0] >= w[1]));
            }
        }
    }

    #[test]
    fn rendezvous_spreads_preferences_evenly() {
        let members: Vec<i32> = (1000..1010).collect();
        let mut count: BTreeMap<i32, usize> = BTreeMap::new();
        for p in 0..10_000 {
            *count
                .entry(preferred_owner(7, &members, p).unwrap())
                .or_default() += 1;
        }
        for &m in &members {
            let c = count.get(&m).copied().unwrap_or(0);
            assert!(
                (800..1200).contains(&c),
                "member {m} preferred for {c} of 10000"
            );
        }
        // A join moves the preferences only to the new member.
        let mut grown = members.clone();
        grown.push(4242);
        for p in 0..2000 {
            let before = preferred_owner(7, &members, p).unwrap();
            let after = preferred_owner(7, &grown, p).unwrap();
            assert!(after == before || after == 4242);
        }
    }

    #[test]
    fn plan_releases_excess_and_claims_free() {
        // Member 1 alone held all 8; member 2 joins at rank 1.
        let owners = vec![Some(1); 8];
        let s1 = plan_step(0, &[1, 2], 1, &owners);
        assert_eq!(s1.target, 4);
        assert_eq!(s1.release.len(), 4);
        assert!(s1.claim.is_empty());
        let s2 = plan_step(0, &[1, 2], 2, &owners);
        assert_eq!(s2.target, 4);
        assert!(s2.release.is_empty() && s2.claim.is_empty());
        let mut after = owners.clone();
        for &p in &s1.release {
            after[p as usize] = None;
        }
        let s2 = plan_step(0, &[1, 2], 2, &after);
        let mut c = s2.claim.clone();
        c.sort_unstable();
        assert_eq!(c, s1.release);
        // Released are those preferred by 2 first.
        let pref2 = (0..8)
            .filter(|&p| preferred_owner(0, &[1, 2], p) == Some(2))
            .count();
        let released_pref2 = s1
            .release
            .iter()
            .filter(|&&p| preferred_owner(0, &[1, 2], p) == Some(2))
            .count();
        assert_eq!(released_pref2, pref2.min(4));
    }

    // ------------------------------------------------------------ simulation

    /// A tiny deterministic PRNG (xorshift64*), seeded by proptest.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A model of the lock table and the live members.
    struct World {
        seed: i32,
        owners: Vec<Option<i32>>,
        /// (backend start, pid): the ranking key.
        members: Vec<(u64, i32)>,
        next_pid: i32,
        clock: u64,
    }

    /// One `claim_partitions` call in progress, advanced one lock operation
    /// at a time so that calls of different members interleave.
    struct Call {
        me: i32,
        started: bool,
        target: usize,
        todo: Vec<i32>,
        passes: usize,
        done: bool,
    }

    impl World {
        fn new(seed: i32, partitions: usize) -> World {
            World {
                seed,
                owners: vec![None; partitions],
                members: Vec::new(),
                next_pid: 100,
                clock: 0,
            }
        }
        fn ranked(&self) -> Vec<i32> {
            let mut m = self.members.clone();
            m.sort_unstable();
            m.into_iter().map(|x| x.1).collect()
        }
        fn held(&self, pid: i32) -> usize {
            self.owners.iter().filter(|&&o| o == Some(pid)).count()
        }
        /// A new session joins; `early` gives it a backend start before
        /// some existing members (a long-lived session joining late).
        fn join(&mut self, rng: &mut Rng, early: bool) -> i32 {
            self.clock += 10;
            let start = if early && !self.members.is_empty() {
                self.members[rng.below(self.members.len())].0 - 1
            } else {
                self.clock
            };
            let pid = self.next_pid;
            self.next_pid += 1 + rng.below(5) as i32;
            self.members.push((start, pid));
            pid
        }
        /// A member leaves or dies: its locks vanish.
        fn remove(&mut self, pid: i32) {
            self.members.retain(|m| m.1 != pid);
            for o in self.owners.iter_mut() {
                if *o == Some(pid) {
                    *o = None;
                }
            }
        }
        fn is_member(&self, pid: i32) -> bool {
            self.members.iter().any(|m| m.1 == pid)
        }
        /// Advance a call by one operation. Returns false when it is done.
        fn advance(&mut self, c: &mut Call) -> bool {
            if c.done || !self.is_member(c.me) {
                c.done = true;
                return false;
            }
            if !c.started || c.todo.is_empty() {
                // Snapshot and plan; releases happen at once.
                if c.started && (self.held(c.me) >= c.target || c.passes >= 64) {
                    c.done = true;
                    return false;
                }
                let step = plan_step(self.seed, &self.ranked(), c.me, &self.owners);
                for &p in &step.release {
                    assert_eq!(self.owners[p as usize], Some(c.me));
                    self.owners[p as usize] = None;
                }
                c.started = true;
                c.target = step.target;
                c.todo = step.claim;
                c.todo.reverse();
                c.passes += 1;
                if self.held(c.me) >= c.target || c.todo.is_empty() {
                    c.done = true;
                    return false;
                }
                return true;
            }
            let p = c.todo.pop().unwrap();
            // try_lock: succeeds only when nobody holds it.
            if self.owners[p as usize].is_none() {
                self.owners[p as usize] = Some(c.me);
            }
            if self.held(c.me) >= c.target {
                c.done = true;
                return false;
            }
            true
        }
        /// Every member in `who` makes one call; the calls interleave at
        /// random, one lock operation at a time.
        fn round(&mut self, rng: &mut Rng, who: &[i32]) {
            let mut calls: Vec<Call> = who
                .iter()
                .map(|&me| Call {
                    me,
                    started: false,
                    target: 0,
                    todo: Vec::new(),
                    passes: 0,
                    done: false,
                })
                .collect();
            while !calls.is_empty() {
                let i = rng.below(calls.len());
                let mut c = calls.swap_remove(i);
                if self.advance(&mut c) {
                    calls.push(c);
                }
            }
        }
        fn full_round(&mut self, rng: &mut Rng) {
            let who = self.ranked();
            self.round(rng, &who);
        }
        fn assert_converged(&self) {
            let ranked = self.ranked();
            let m = ranked.len();
            let p = self.owners.len();
            assert!(
                self.owners.iter().all(|o| o.is_some()),
                "not every partition is held: {:?}",
                self.owners
            );
            for (i, &pid) in ranked.iter().enumerate() {
                let h = self.held(pid);
                assert_eq!(h, fair_share(p as i32, m, i), "member {pid} at rank {i}");
                assert!(h >= p / m && h <= p.div_ceil(m));
            }
            // Only members own partitions.
            assert!(self.owners.iter().all(|o| ranked.contains(&o.unwrap())));
        }
    }

    fn moved(before: &[Option<i32>], after: &[Option<i32>]) -> usize {
        before.iter().zip(after).filter(|(a, b)| a != b).count()
    }

    /// Random churn with partial rounds (some members call, some do not),
    /// then a quiet period of two rounds: always converged.
    fn churn_then_converge(seed: u64, partitions: usize, steps: usize) {
        let mut rng = Rng(seed | 1);
        let mut w = World::new(seed as i32, partitions);
        for _ in 0..1 + rng.below(4) {
            w.join(&mut rng, false);
        }
        for _ in 0..steps {
            match rng.below(6) {
                0 if w.members.len() < 12 => {
                    let early = rng.below(3) == 0;
                    w.join(&mut rng, early);
                }
                1 if w.members.len() > 1 => {
                    let pid = w.members[rng.below(w.members.len())].1;
                    w.remove(pid);
                }
                _ => {
                    let ranked = w.ranked();
                    let some: Vec<i32> = ranked.into_iter().filter(|_| rng.below(2) == 0).collect();
                    w.round(&mut rng, &some);
                }
            }
        }
        w.full_round(&mut rng);
        w.full_round(&mut rng);
        w.assert_converged();
        // A third round changes nothing.
        let before = w.owners.clone();
        w.full_round(&mut rng);
        assert_eq!(moved(&before, &w.owners), 0);
    }

    /// From a converged state: one join moves at most ceil(P/(M+1))
    /// partitions; one leave moves only the leaver's.
    fn movement_bounds(seed: u64, partitions: usize, members: usize) {
        let mut rng = Rng(seed | 1);
        let mut w = World::new(seed as i32, partitions);
        for _ in 0..members {
            w.join(&mut rng, false);
        }
        for _ in 0..2 {
            w.full_round(&mut rng);
        }
        w.assert_converged();
        for _ in 0..6 {
            let m = w.members.len();
            if rng.below(2) == 0 || m == 1 {
                let before = w.owners.clone();
                let early = rng.below(2) == 0;
                let pid = w.join(&mut rng, early);
                w.full_round(&mut rng);
                w.full_round(&mut rng);
                w.assert_converged();
                let mv = moved(&before, &w.owners);
                assert!(
                    mv <= partitions.div_ceil(m + 1),
                    "join of {pid} moved {mv} > ceil({partitions}/{})",
                    m + 1
                );
                // Everything that moved went to... someone; the newcomer got its share.
                assert!(w.held(pid) <= mv);
            } else {
                let before = w.owners.clone();
                let pid = w.members[rng.below(m)].1;
                let had = w.held(pid);
                w.remove(pid);
                w.full_round(&mut rng);
                w.full_round(&mut rng);
                w.assert_converged();
                assert_eq!(
                    moved(&before, &w.owners),
                    had,
                    "leave moved others' partitions"
                );
                for (a, b) in before.iter().zip(&w.owners) {
                    if *a != Some(pid) {
                        assert_eq!(a, b);
                    }
                }
            }
        }
    }

    #[test]
    fn simulation_examples() {
        churn_then_converge(1, 64, 30);
        movement_bounds(2, 64, 4);
        movement_bounds(3, 5, 3);
        movement_bounds(4, 1, 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn two_rounds_converge_after_any_churn(seed in any::<u64>(), partitions in 1usize..80, steps in 0usize..40) {
            churn_then_converge(seed, partitions, steps);
        }

        #[test]
        fn join_and_leave_move_within_bounds(seed in any::<u64>(), partitions in 1usize..100, members in 1usize..10) {
            movement_bounds(seed, partitions, members);
        }

        #[test]
        fn plan_never_releases_within_target_nor_claims_held(seed in any::<i32>(), owners in proptest::collection::vec(proptest::option::of(0i32..5), 1..60), me in 0i32..5) {
            let members = [0, 1, 2, 3, 4];
            let s = plan_step(seed, &members, me, &owners);
            let held = owners.iter().filter(|&&o| o == Some(me)).count();
            prop_assert_eq!(s.release.len(), held.saturating_sub(s.target));
            prop_assert!(s.release.iter().all(|&p| owners[p as usize] == Some(me)));
            prop_assert!(s.claim.iter().all(|&p| owners[p as usize].is_none()));
            if held >= s.target { prop_assert!(s.claim.is_empty()); }
        }
    }
}
