//! What both coordinators watch while a run goes on: the timeout, and
//! slots nobody serves.

use crate::config::Config;
use crate::state::{event, lock, State};
use crate::table::unserved;
use postgres::Client;
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
/// items would never be done, and the run stops.
pub struct GapWatch {
    pub limit: Duration,
    since: Option<Instant>,
    last_check: Instant,
}

impl GapWatch {
    pub fn new(cfg: &Config) -> GapWatch {
        GapWatch {
            limit: Duration::from_secs(3).max(2 * cfg.ttl),
            since: None,
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
        if unfinished.is_empty() {
            self.since = None;
        } else if self.since.get_or_insert_with(Instant::now).elapsed() >= self.limit {
            return Ok(Some(unfinished));
        }
        Ok(None)
    }
}
