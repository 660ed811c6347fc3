//! Polling a condition until a deadline: statistics that arrive late, a
//! session that has yet to reach a statement, a backend that has yet to exit.

use std::convert::Infallible;
use std::thread;
use std::time::{Duration, Instant};

/// Calls `probe` every `every` until it returns `Some` (or fails), or until
/// `timeout` has passed, then `Ok(None)`. `probe` is called at least once,
/// and once more after the deadline.
pub fn poll<T, E>(
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let start = Instant::now();
    loop {
        if let Some(v) = probe()? {
            return Ok(Some(v));
        }
        if start.elapsed() > timeout {
            return Ok(None);
        }
        thread::sleep(every);
    }
}

/// Calls `cond` every `every` until it is true; the time that took, or
/// `None` when `timeout` passed first.
pub fn wait_until(
    timeout: Duration,
    every: Duration,
    mut cond: impl FnMut() -> bool,
) -> Option<Duration> {
    let start = Instant::now();
    let r: Result<_, Infallible> = poll(timeout, every, || Ok(cond().then(|| start.elapsed())));
    r.unwrap_or_else(|never| match never {})
}

/// [`wait_until`] polling every 2 ms, for the tests and the benchmarks: the
/// time it took, or a panic naming `what` on timeout.
pub fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) -> Duration {
    wait_until(timeout, Duration::from_millis(2), cond)
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_until_true_or_deadline() {
        let mut calls = 0;
        let took = wait_until(Duration::from_secs(5), Duration::ZERO, || {
            calls += 1;
            calls == 3
        });
        assert!(took.is_some());
        assert_eq!(calls, 3);
        assert_eq!(
            wait_until(Duration::from_millis(5), Duration::from_millis(1), || false),
            None
        );
        let r: Result<Option<i32>, &str> =
            poll(Duration::from_secs(5), Duration::ZERO, || Err("x"));
        assert_eq!(r, Err("x"));
    }

    #[test]
    #[should_panic(expected = "waiting for: never")]
    fn wait_for_panics_on_timeout() {
        wait_for("never", Duration::from_millis(5), || false);
    }
}
