//! The one percentile definition of the demo, the benchmarks and the tests.

/// The `p`-th percentile (0..=100) of `sorted` by the nearest-rank method:
/// the smallest value with at least `p`% of the values at or below it;
/// `None` for an empty slice.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    rank_index(sorted.len(), p).map(|i| sorted[i])
}

/// Where the nearest-rank `p`-th percentile (0..=100) stands among `len`
/// sorted things: the 0-based index of the `ceil(p / 100 * len)`-th one
/// (at least the first); `None` when `len` is 0. For picking a whole
/// element, such as the median run of several, by the same definition.
pub fn rank_index(len: usize, p: f64) -> Option<usize> {
    if len == 0 {
        return None;
    }
    let rank = ((p / 100.0) * len as f64).ceil() as usize;
    Some(rank.clamp(1, len) - 1)
}

/// The median (the nearest-rank 50th percentile) of unsorted values; NaN
/// when there are none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(&values, 50.0).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 95.0), Some(95.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(rank_index(5, 50.0), Some(2));
        assert_eq!(rank_index(4, 50.0), Some(1));
        assert_eq!(rank_index(0, 50.0), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        // even count: the lower middle value (nearest rank)
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.0);
        assert!(median(Vec::new()).is_nan());
    }
}
