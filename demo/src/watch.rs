//! What both coordinators watch while a run goes on: the timeout, and
//! slots nobody serves.

use crate::config::Config;
use crate::state::{event, lock, State};
use crate::table::unserved;
use postgres::Client;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Whether the run is past `--timeout` (recorded as an event).
pub fn timeout(cfg: &Config, state: &State, start: Instant) -> bool {
    if start.elapsed() <= cfg.timeout {
        return false;
    }
    event(
        state,
        start,
        format!(
            "TIMEOUT after {:?}: not every share was finished",
            cfg.timeout
        ),
    );
    true
}

/// Watches `slot_status` once a second for slots nobody serves: a slot
/// unserved (and unfinished) for `limit` has nobody left to take it, its
/// items would never be done, and the run stops. Timed per slot: in an
/// elastic fleet some slot is briefly unserved at almost every check (a
/// hand-over waits for the taker's next claim_leases, a leaver's and a
/// paused holder's slots for the others' calls), which is no gap.
pub struct GapWatch {
    pub limit: Duration,
    /// The unfinished slots unserved at every check since then.
    since: HashMap<i32, Instant>,
    last_check: Instant,
}

impl GapWatch {
    pub fn new(cfg: &Config) -> GapWatch {
        GapWatch {
            limit: Duration::from_secs(3).max(2 * cfg.ttl),
            since: HashMap::new(),
            last_check: Instant::now(),
        }
    }

    /// The unfinished slots unserved for longer than `limit`, if any.
    pub fn check(
        &mut self,
        admin: &mut Client,
        cfg: &Config,
        state: &State,
    ) -> Result<Option<Vec<i32>>, String> {
        if self.last_check.elapsed() < Duration::from_secs(1) {
            return Ok(None);
        }
        self.last_check = Instant::now();
        let gap = unserved(admin, cfg)?;
        let unfinished: Vec<i32> = {
            let s = lock(state);
            gap.into_iter()
                .filter(|&g| s.slots.get(g as usize).is_some_and(|v| !v.finished))
                .collect()
        };
        Ok(self.note(Instant::now(), &unfinished))
    }

    /// Records the unfinished slots a check found unserved at `now`; those
    /// of them unserved at every check for `limit`, if any.
    fn note(&mut self, now: Instant, unfinished: &[i32]) -> Option<Vec<i32>> {
        self.since.retain(|s, _| unfinished.contains(s));
        let stuck: Vec<i32> = unfinished
            .iter()
            .copied()
            .filter(|s| now.duration_since(*self.since.entry(*s).or_insert(now)) >= self.limit)
            .collect();
        (!stuck.is_empty()).then_some(stuck)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> GapWatch {
        GapWatch {
            limit: Duration::from_secs(4),
            since: HashMap::new(),
            last_check: Instant::now(),
        }
    }

    /// Hand-overs, a leave and a paused holder of an elastic fleet
    /// leave a different slot unserved at each check; no slot is stuck.
    #[test]
    fn another_slot_unserved_at_each_check_is_no_gap() {
        let (mut g, t0) = (watch(), Instant::now());
        for (i, slots) in [[0], [5], [0], [3], [1]].iter().enumerate() {
            let at = t0 + Duration::from_millis(1050 * i as u64);
            assert_eq!(g.note(at, slots), None, "check {i}");
        }
    }

    #[test]
    fn one_slot_unserved_for_the_limit_stops_the_run() {
        let (mut g, t0) = (watch(), Instant::now());
        for i in 0..4u64 {
            assert_eq!(
                g.note(t0 + Duration::from_secs(i), &[2, i as i32 + 3]),
                None
            );
        }
        assert_eq!(g.note(t0 + Duration::from_secs(4), &[2]), Some(vec![2]));
        // served again: its clock starts over
        assert_eq!(g.note(t0 + Duration::from_secs(5), &[]), None);
        assert_eq!(g.note(t0 + Duration::from_secs(6), &[2]), None);
    }
}
