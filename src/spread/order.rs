//! The feeder algorithm (docs/spreading.md), in plain Rust with no PostgreSQL
//! dependency.
//!
//! Jobs belong to groups. Groups are taken in a fixed order (by default the
//! order of their first appearance in the input); each group's jobs keep their
//! input order. There are `feeders` feeders, visited in turn (0, 1, …, 0, 1,
//! …). At its turn, a feeder whose current group is empty first takes the next
//! group not yet taken, then hands out its next job; a feeder with nothing left
//! (its group empty and no group left to take) is skipped from then on. The
//! output is the sequence of jobs handed out.
//!
//! Consequence (the spacing guarantee): a group is served by one feeder only,
//! and a feeder's turns come exactly `live` positions apart, where `live` is the
//! number of feeders not yet exhausted. Until the first feeder runs out, `live`
//! is `min(feeders, number of groups)`, so two jobs of one group are at least
//! that far apart; only in the tail, after every group has been taken and a
//! feeder has found nothing left, can they come closer.
//!
//! Complexity: O(jobs + groups) time and memory. Feeders that will never get
//! a group (when `feeders` exceeds the number of groups) are not materialised,
//! so a huge `feeders` costs nothing.

use std::collections::VecDeque;

/// In which order the feeders take the groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupOrder {
    /// By first appearance in the input (the algorithm as docs/spreading.md defines it).
    FirstAppearance,
    /// Largest group first; groups of equal size by first appearance.
    LargestFirst,
}

/// Output order of the jobs: `groups[i]` is the group id of job `i` (jobs in
/// input order); the result lists job indices in spread order, each exactly
/// once. Group ids are arbitrary `u32`s; memory is proportional to the
/// largest id, so callers pass dense ids (`0..number of groups`).
///
/// `feeders` must be at least 1 (0 is treated as 1). (The tests' shorthand;
/// spread_agg calls [`spread_order_by`].)
#[cfg(test)]
pub fn spread_order(groups: &[u32], feeders: usize) -> Vec<usize> {
    spread_order_by(groups, feeders, GroupOrder::FirstAppearance).order
}

/// The result of [`spread_order_by`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spread {
    /// Job indices in output order.
    pub order: Vec<usize>,
    /// Number of distinct groups.
    pub groups: usize,
    /// Feeders that served at least one group: `min(feeders, groups)`.
    pub live_feeders: usize,
    /// Output position at which the tail starts: the number of jobs handed out
    /// before the first feeder found nothing left. Before it, every two jobs of
    /// one group are exactly `live_feeders` positions apart.
    pub tail_start: usize,
}

/// [`spread_order`] with a choice of group order, also reporting where the
/// tail starts.
pub fn spread_order_by(groups: &[u32], feeders: usize, group_order: GroupOrder) -> Spread {
    let n = groups.len();
    if n == 0 {
        return Spread {
            order: Vec::new(),
            groups: 0,
            live_feeders: 0,
            tail_start: 0,
        };
    }

    // Rank the groups by first appearance and count their jobs.
    let max_id = groups.iter().copied().max().unwrap_or(0) as usize;
    let mut rank_of_id = vec![u32::MAX; max_id + 1];
    let mut sizes: Vec<usize> = Vec::new();
    for &g in groups {
        let r = &mut rank_of_id[g as usize];
        if *r == u32::MAX {
            *r = sizes.len() as u32;
            sizes.push(0);
        }
        sizes[*r as usize] += 1;
    }
    let group_count = sizes.len();

    // Counting sort: the jobs of each group, contiguous and in input order.
    let mut start = Vec::with_capacity(group_count + 1);
    let mut acc = 0;
    for &s in &sizes {
        start.push(acc);
        acc += s;
    }
    start.push(acc);
    let mut fill = start.clone();
    let mut members = vec![0usize; n];
    for (job, &g) in groups.iter().enumerate() {
        let r = rank_of_id[g as usize] as usize;
        members[fill[r]] = job;
        fill[r] += 1;
    }
    drop(fill);
    drop(rank_of_id);

    // The order in which feeders take groups (ranks).
    let take: Vec<usize> = match group_order {
        GroupOrder::FirstAppearance => (0..group_count).collect(),
        GroupOrder::LargestFirst => {
            let mut t: Vec<usize> = (0..group_count).collect();
            // stable: equal sizes keep first-appearance order
            t.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]));
            t
        }
    };

    // Feeders beyond the number of groups never get one: the first round
    // hands every group to feeders 0..groups-1 and the rest find nothing.
    let live = feeders.max(1).min(group_count);
    // Per feeder: the range of `members` it still has to hand out.
    let mut cursor = vec![(0usize, 0usize); live];
    let mut turns: VecDeque<usize> = (0..live).collect();
    let mut next_group = 0;
    let mut order = Vec::with_capacity(n);
    let mut tail_start = None;
    while let Some(f) = turns.pop_front() {
        let (pos, end) = &mut cursor[f];
        if *pos == *end {
            if next_group == group_count {
                // nothing left for this feeder: skipped from now on
                tail_start.get_or_insert(order.len());
                continue;
            }
            let r = take[next_group];
            next_group += 1;
            *pos = start[r];
            *end = start[r + 1];
        }
        order.push(members[*pos]);
        *pos += 1;
        turns.push_back(f);
    }
    Spread {
        order,
        groups: group_count,
        live_feeders: live,
        tail_start: tail_start.unwrap_or(n),
    }
}

/// Spacing figures of a spread: for consecutive jobs of one group (in output
/// order), how many are closer than `min_gap` positions apart (what the
/// tests measure).
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spacing {
    /// Pairs of consecutive jobs of one group in the output.
    pub pairs: usize,
    /// Of those, pairs fewer than `min_gap` positions apart.
    pub close: usize,
}

/// Measure [`Spacing`] of `order` (job indices in output order) for the
/// group ids `groups` (per job in input order).
#[cfg(test)]
pub fn spacing(groups: &[u32], order: &[usize], min_gap: usize) -> Spacing {
    let max_id = groups.iter().copied().max().unwrap_or(0) as usize;
    let mut last = vec![usize::MAX; max_id + 1];
    let mut s = Spacing::default();
    for (pos, &job) in order.iter().enumerate() {
        let g = groups[job] as usize;
        if last[g] != usize::MAX {
            s.pairs += 1;
            if pos - last[g] < min_gap {
                s.close += 1;
            }
        }
        last[g] = pos;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// The algorithm exactly as the spread_agg reference (docs/spreading.md) words it: `feeders` feeders
    /// (all of them, even those that will never get a group), visited in
    /// turn, each taking the next group when its own is empty.
    fn reference(groups: &[u32], feeders: usize, group_order: GroupOrder) -> Vec<usize> {
        // groups in order of first appearance, each with its jobs in input order
        let mut ids: Vec<u32> = Vec::new();
        let mut jobs: Vec<VecDeque<usize>> = Vec::new();
        for (i, &g) in groups.iter().enumerate() {
            match ids.iter().position(|&x| x == g) {
                Some(k) => jobs[k].push_back(i),
                None => {
                    ids.push(g);
                    jobs.push(VecDeque::from([i]));
                }
            }
        }
        if group_order == GroupOrder::LargestFirst {
            // stable sort: equal sizes stay in first-appearance order
            jobs.sort_by_key(|j| std::cmp::Reverse(j.len()));
        }
        let mut untaken = jobs.into_iter();
        let mut feeder: Vec<VecDeque<usize>> = vec![VecDeque::new(); feeders];
        let mut out = Vec::new();
        while out.len() < groups.len() {
            for current in feeder.iter_mut() {
                if current.is_empty() {
                    match untaken.next() {
                        Some(g) => *current = g,
                        None => continue,
                    }
                }
                out.push(current.pop_front().expect("a taken group is never empty"));
            }
        }
        out
    }

    /// Jobs named by their group letter and 1-based position in the group.
    fn names(groups: &[u32], order: &[usize]) -> Vec<String> {
        let mut seen = [0; 26];
        let mut label = vec![String::new(); groups.len()];
        for (i, &g) in groups.iter().enumerate() {
            seen[g as usize] += 1;
            label[i] = format!("{}{}", (b'a' + g as u8) as char, seen[g as usize]);
        }
        order.iter().map(|&i| label[i].clone()).collect()
    }

    // x = 23, y = 24, z = 25, w = 22 (letters of the worked example)
    const X: u32 = 23;
    const Y: u32 = 24;
    const Z: u32 = 25;
    const W: u32 = 22;

    #[test]
    fn worked_example_of_the_design() {
        // x=[x1..x4], y=[y1,y2], z=[z1], w=[w1..w3], groups contiguous
        let groups = [X, X, X, X, Y, Y, Z, W, W, W];
        let order = spread_order(&groups, 2);
        assert_eq!(
            names(&groups, &order).join(" "),
            "x1 y1 x2 y2 x3 z1 x4 w1 w2 w3"
        );
        assert_eq!(order, reference(&groups, 2, GroupOrder::FirstAppearance));
    }

    #[test]
    fn worked_example_interleaved_input() {
        // Same groups, jobs arriving interleaved: groups still come in order
        // of first appearance and each keeps its own input order.
        let groups = [X, Y, X, Z, W, Y, X, W, X, W];
        let order = spread_order(&groups, 2);
        assert_eq!(
            names(&groups, &order).join(" "),
            "x1 y1 x2 y2 x3 z1 x4 w1 w2 w3"
        );
    }

    #[test]
    fn largest_first_example() {
        // sizes x=4, w=3, y=2, z=1 → x w y z
        let groups = [X, X, X, X, Y, Y, Z, W, W, W];
        let s = spread_order_by(&groups, 2, GroupOrder::LargestFirst);
        assert_eq!(
            names(&groups, &s.order).join(" "),
            "x1 w1 x2 w2 x3 w3 x4 y1 z1 y2"
        );
        assert_eq!(s.order, reference(&groups, 2, GroupOrder::LargestFirst));
    }

    #[test]
    fn empty_input() {
        assert!(spread_order(&[], 3).is_empty());
        let s = spread_order_by(&[], 3, GroupOrder::LargestFirst);
        assert_eq!((s.groups, s.live_feeders, s.tail_start), (0, 0, 0));
    }

    #[test]
    fn one_group_keeps_input_order() {
        let groups = [7u32; 9];
        for f in [1, 2, 5, 1000] {
            assert_eq!(spread_order(&groups, f), (0..9).collect::<Vec<_>>());
        }
    }

    #[test]
    fn one_job_per_group_keeps_input_order() {
        // every feeder hands out one job and is done: input order survives
        let groups: Vec<u32> = (0..20).rev().collect();
        for f in [1, 2, 3, 7, 20, 21, 1 << 30] {
            assert_eq!(spread_order(&groups, f), (0..20).collect::<Vec<_>>());
        }
    }

    #[test]
    fn feeders_beyond_groups_is_one_round_robin() {
        // 3 groups, 10 feeders: only 3 feeders ever get a group, and the
        // output is a plain round robin over the groups.
        let groups = [0, 0, 0, 1, 1, 2, 2, 2, 2];
        let order = spread_order(&groups, 10);
        assert_eq!(
            names(&groups, &order).join(" "),
            "a1 b1 c1 a2 b2 c2 a3 c3 c4"
        );
        assert_eq!(order, spread_order(&groups, 3));
        let s = spread_order_by(&groups, usize::MAX, GroupOrder::FirstAppearance);
        assert_eq!(s.order, order);
        assert_eq!(s.live_feeders, 3);
    }

    #[test]
    fn one_feeder_drains_group_after_group() {
        // One feeder: groups one after the other in first-appearance order,
        // each in input order. That is the input order exactly when each
        // group's jobs are contiguous in the input ...
        let contiguous = [3, 3, 1, 1, 1, 0, 2, 2];
        assert_eq!(spread_order(&contiguous, 1), (0..8).collect::<Vec<_>>());
        // ... and a stable sort by first appearance otherwise.
        let interleaved = [3, 1, 3, 0, 1, 3];
        assert_eq!(spread_order(&interleaved, 1), vec![0, 2, 5, 1, 4, 3]);
    }

    #[test]
    fn large_input_is_linear() {
        // a million jobs in 100k groups, and one huge group with many
        // feeders: each finishes quickly (a quadratic algorithm would not).
        let n = 1_000_000usize;
        let groups: Vec<u32> = (0..n)
            .map(|i| ((i as u64 * 2_654_435_761) % 100_000) as u32)
            .collect();
        let s = spread_order_by(&groups, 64, GroupOrder::FirstAppearance);
        assert_eq!(s.order.len(), n);
        assert_eq!(s.groups, 100_000);
        let mut seen = vec![false; n];
        for &j in &s.order {
            assert!(!seen[j]);
            seen[j] = true;
        }
        let one = vec![0u32; n];
        assert_eq!(spread_order(&one, 1 << 40), (0..n).collect::<Vec<_>>());
    }

    /// The spacing guarantee, checked on one spread.
    fn check_spacing(groups: &[u32], s: &Spread) {
        let mut last = std::collections::HashMap::new();
        for (pos, &job) in s.order.iter().enumerate() {
            if let Some(prev) = last.insert(groups[job], pos) {
                let gap = pos - prev;
                assert!(gap <= s.live_feeders, "gap {gap} > {}", s.live_feeders);
                if pos < s.tail_start {
                    assert_eq!(gap, s.live_feeders, "gap before the tail at {pos}");
                }
            }
        }
    }

    fn layout() -> impl Strategy<Value = (Vec<u32>, usize)> {
        // up to 12 group ids, up to 60 jobs, feeders 1..=14 (so both more and
        // fewer feeders than groups occur)
        (prop::collection::vec(0u32..12, 0..60), 1usize..=14)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5000))]

        #[test]
        fn matches_the_reference((groups, feeders) in layout()) {
            let s = spread_order_by(&groups, feeders, GroupOrder::FirstAppearance);
            prop_assert_eq!(&s.order, &reference(&groups, feeders, GroupOrder::FirstAppearance));
            check_spacing(&groups, &s);
        }

        #[test]
        fn largest_first_matches_the_reference((groups, feeders) in layout()) {
            let s = spread_order_by(&groups, feeders, GroupOrder::LargestFirst);
            prop_assert_eq!(&s.order, &reference(&groups, feeders, GroupOrder::LargestFirst));
            check_spacing(&groups, &s);
        }

        #[test]
        fn is_a_permutation_keeping_each_group_in_input_order(
            groups in prop::collection::vec(0u32..50, 0..400),
            feeders in 1usize..80,
        ) {
            let order = spread_order(&groups, feeders);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..groups.len()).collect::<Vec<_>>());
            let mut last = vec![None; 50];
            for &j in &order {
                let g = groups[j] as usize;
                prop_assert!(last[g].is_none_or(|p| p < j));
                last[g] = Some(j);
            }
        }
    }

    /// Spacing on random inputs: printed with `cargo test -- --nocapture`,
    /// and asserted to be confined to the tail.
    #[test]
    fn spacing_on_random_inputs() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for (group_count, feeders) in [(1000u64, 8usize), (1000, 32), (100, 64)] {
            for group_order in [GroupOrder::FirstAppearance, GroupOrder::LargestFirst] {
                // skewed sizes: group g gets weight ~ 1/(g+1)
                let groups: Vec<u32> = (0..100_000)
                    .map(|_| {
                        let a = next() % group_count;
                        (next() % (a + 1)) as u32
                    })
                    .collect();
                let s = spread_order_by(&groups, feeders, group_order);
                check_spacing(&groups, &s);
                let sp = spacing(&groups, &s.order, feeders);
                let tail = groups.len() - s.tail_start;
                println!(
                    "{group_order:?} groups={group_count} feeders={feeders}: \
                     {} of {} same-group pairs closer than {feeders} ({:.3}%), tail {} of {} jobs",
                    sp.close,
                    sp.pairs,
                    100.0 * sp.close as f64 / sp.pairs.max(1) as f64,
                    tail,
                    groups.len()
                );
            }
        }
    }
}
