//! Pure logic of slot claiming: which free slot to try first, and in which
//! order to try the others. No PostgreSQL dependency, unit- and property-tested.
//!
//! The claimer reads one snapshot of the lock table, so it knows which slots
//! were held at that moment (`held`, sorted, no duplicates, all `< n`). The
//! free slots are the gaps. Policy:
//!
//! 1. first try the **lowest** free slot, so a fleet smaller than `n` fills
//!    slots `0, 1, 2, ...` and a restarted worker gets a low slot back;
//! 2. if another session took it between the snapshot and our attempt (a race
//!    between concurrent claimers, who all see the same lowest slot), continue at
//!    a free slot chosen by a per-session `seed` (derived from the backend pid),
//!    walking the free slots from there and wrapping around. Concurrent
//!    claimers then spread over the free slots instead of queueing on the same
//!    ones, so the expected number of attempts stays O(1) when many are free.
//!
//! Every free slot of the snapshot is tried at most once.

/// The free slots of `0..n` given the sorted, deduplicated held slots.
#[derive(Debug, Clone, Copy)]
pub struct FreeSlots<'a> {
    n: i32,
    held: &'a [i32],
}

impl<'a> FreeSlots<'a> {
    /// `held` must be sorted ascending, without duplicates, every value in `0..n`.
    pub fn new(n: i32, held: &'a [i32]) -> Self {
        debug_assert!(held.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(held.iter().all(|&s| (0..n).contains(&s)));
        FreeSlots { n, held }
    }

    /// How many slots are free.
    pub fn count(&self) -> u32 {
        (self.n as u32).saturating_sub(self.held.len() as u32)
    }

    /// The `k`-th free slot (0-based, ascending), `k < count()`. O(log held).
    ///
    /// The k-th free slot is `k + i`, where `i` is the number of held slots
    /// below it: the first `i` with `held[i] - i > k`.
    pub fn nth(&self, k: u32) -> i32 {
        debug_assert!(k < self.count());
        let k = k as i64;
        let (mut lo, mut hi) = (0usize, self.held.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if (self.held[mid] as i64) - (mid as i64) <= k {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (k + lo as i64) as i32
    }

    /// The order in which to try the free slots: the lowest first, then from
    /// the `seed`-th free slot onwards (wrapping), skipping the lowest.
    pub fn probe_order(self, seed: u32) -> impl Iterator<Item = i32> + 'a {
        let count = self.count();
        let start = if count > 1 { 1 + seed % (count - 1) } else { 0 };
        let first = (count > 0).then_some(0u32);
        let rest = (0..count.saturating_sub(1)).map(move |j| {
            // ranks 1..count, starting at `start`
            let r = start - 1 + j;
            1 + r % (count - 1)
        });
        first
            .into_iter()
            .chain(rest)
            .map(move |rank| self.nth(rank))
    }
}

/// A per-session seed for `probe_order`: a mix of the backend pid, so
/// concurrent claimers start at different free slots.
pub fn seed_of(pid: i32) -> u32 {
    // splitmix32-style finaliser: neighbouring pids land far apart.
    let mut x = pid as u32;
    x = (x ^ (x >> 16)).wrapping_mul(0x7feb_352d);
    x = (x ^ (x >> 15)).wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Among the `n` values recorded by live claimers of a name (one entry per
/// granted n-record lock: `(n, pid)`), the first that differs from `mine`.
pub fn conflicting_n(records: &[(i32, i32)], mine: i32) -> Option<(i32, i32)> {
    records.iter().copied().find(|&(n, _)| n != mine)
}

/// The sleep between two attempts of a waiting claimer, in milliseconds:
/// 1 ms after the first attempt, growing by 1 ms per attempt up to `max_ms`,
/// and never past the deadline (`remaining_us`).
pub fn next_sleep_ms(attempt: u32, max_ms: u32, remaining_us: i64) -> i64 {
    let grow = (attempt as i64 + 1).min(max_ms.max(1) as i64);
    let remaining_ms = remaining_us.saturating_add(999) / 1000;
    grow.min(remaining_ms).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn free_naive(n: i32, held: &[i32]) -> Vec<i32> {
        (0..n).filter(|s| !held.contains(s)).collect()
    }

    #[test]
    fn sleep_with_no_deadline_does_not_overflow() {
        assert_eq!(next_sleep_ms(0, 5, i64::MAX), 1);
        assert_eq!(next_sleep_ms(u32::MAX, 5, i64::MAX), 5);
        assert_eq!(next_sleep_ms(3, 5, 1), 1);
        assert_eq!(next_sleep_ms(3, 5, 0), 0);
    }

    #[test]
    fn nth_matches_naive() {
        let held = [0, 1, 3, 7, 8, 9];
        let f = FreeSlots::new(12, &held);
        let want = free_naive(12, &held);
        assert_eq!(f.count() as usize, want.len());
        for (k, s) in want.iter().enumerate() {
            assert_eq!(f.nth(k as u32), *s);
        }
    }

    #[test]
    fn lowest_first_then_seeded() {
        let held = [0, 2];
        let f = FreeSlots::new(8, &held);
        let order: Vec<i32> = f.probe_order(0).collect();
        assert_eq!(order, vec![1, 3, 4, 5, 6, 7]);
        let order: Vec<i32> = f.probe_order(2).collect();
        assert_eq!(order, vec![1, 5, 6, 7, 3, 4]);
    }

    #[test]
    fn none_free_and_one_free() {
        let held = [0, 1, 2];
        assert_eq!(FreeSlots::new(3, &held).probe_order(9).count(), 0);
        let held = [0, 2];
        let order: Vec<i32> = FreeSlots::new(3, &held).probe_order(9).collect();
        assert_eq!(order, vec![1]);
    }

    #[test]
    fn last_free_of_many() {
        let held: Vec<i32> = (0..1023).collect();
        let f = FreeSlots::new(1024, &held);
        assert_eq!(f.probe_order(5).collect::<Vec<_>>(), vec![1023]);
        let held: Vec<i32> = (1..1024).collect();
        let f = FreeSlots::new(1024, &held);
        assert_eq!(f.probe_order(5).collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn conflicting_n_finds_other_value() {
        assert_eq!(conflicting_n(&[(8, 1), (8, 2)], 8), None);
        assert_eq!(conflicting_n(&[(8, 1), (4, 2)], 8), Some((4, 2)));
        assert_eq!(conflicting_n(&[], 8), None);
    }

    #[test]
    fn sleep_grows_and_respects_deadline() {
        assert_eq!(next_sleep_ms(0, 5, 1_000_000), 1);
        assert_eq!(next_sleep_ms(3, 5, 1_000_000), 4);
        assert_eq!(next_sleep_ms(100, 5, 1_000_000), 5);
        assert_eq!(next_sleep_ms(100, 5, 2_500), 3);
        assert_eq!(next_sleep_ms(100, 5, 0), 0);
    }

    #[test]
    fn seeds_differ_for_neighbouring_pids() {
        let seeds: std::collections::HashSet<u32> = (1000..1100).map(seed_of).collect();
        assert_eq!(seeds.len(), 100);
    }

    proptest! {
        /// The standby's sleep for any wait (a NULL-free interval from a
        /// microsecond to the largest, or already past) and any setting:
        /// never negative, never past the deadline, never above the
        /// setting's maximum.
        #[test]
        fn next_sleep_ms_is_bounded(attempt in any::<u32>(), max_ms in any::<u32>(), remaining_us in any::<i64>()) {
            let ms = next_sleep_ms(attempt, max_ms, remaining_us);
            prop_assert!(ms >= 0);
            prop_assert!(ms <= max_ms.max(1) as i64);
            if remaining_us <= 0 {
                prop_assert_eq!(ms, 0);
            } else {
                prop_assert!(ms <= remaining_us / 1000 + 1);
            }
        }

        /// probe_order visits every free slot exactly once, lowest first,
        /// and never a held one.
        #[test]
        fn probe_order_is_a_permutation_of_the_free_slots(
            n in 1i32..300,
            mask in proptest::collection::vec(any::<bool>(), 300),
            seed in any::<u32>(),
        ) {
            let held: Vec<i32> = (0..n).filter(|&s| mask[s as usize]).collect();
            let want = free_naive(n, &held);
            let got: Vec<i32> = FreeSlots::new(n, &held).probe_order(seed).collect();
            prop_assert_eq!(got.len(), want.len());
            if let Some(&lowest) = want.first() {
                prop_assert_eq!(got[0], lowest);
            }
            let mut sorted = got.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, want);
        }
    }
}
