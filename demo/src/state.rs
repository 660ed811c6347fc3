//! What the coordinator, the workers and the display share.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// What the display knows about one slot.
#[derive(Default)]
pub struct SlotView {
    pub total: u64,
    pub done: u64,
    /// `(role, backend pid)` of the current holder.
    pub holder: Option<(String, i32)>,
    /// Rows written by the holder's open transaction, not yet committed.
    pub uncommitted: u64,
    pub finished: bool,
    /// `(time, done)` samples for the items/s figure.
    pub samples: Vec<(Instant, u64)>,
    /// Lease mode: the holder's fencing token, and its lease's expiry in
    /// seconds since the epoch on the server's clock, as the holder last
    /// claimed or renewed it.
    pub token: Option<i64>,
    pub expires: Option<f64>,
}

/// Lease mode: the worker that stopped mid-run, as in a GC pause.
pub struct Pause {
    pub role: String,
    pub slot: i32,
    pub token: i64,
    pub at: Instant,
}

#[derive(Default)]
pub struct Shared {
    pub slots: Vec<SlotView>,
    /// Messages to print once, in order (kill, takeover, errors).
    pub events: Vec<String>,
    /// Standbys and what they do: `(role, pid, state)`.
    pub standbys: Vec<(String, i32, String)>,
    pub kill_time: Option<Instant>,
    pub takeover: Option<std::time::Duration>,
    /// Errors that are not the expected termination of the victim.
    pub failures: Vec<String>,
    /// Lease mode: set by the coordinator, taken by the holder of the victim
    /// slot, which pauses after fetching its next batch.
    pub pause_request: bool,
    pub pause: Option<Pause>,
    /// Lease mode: the takeover of the paused worker's slot, as printed.
    pub takeover_line: Option<String>,
    /// Lease mode: the writes `fence` rejected and the leases lost at a
    /// renewal, as printed.
    pub rejected: Vec<String>,
    /// Lease mode: whether the paused worker's late write was rejected
    /// (`None`: it has not tried yet).
    pub late_write_rejected: Option<bool>,
}

pub type State = Arc<Mutex<Shared>>;

pub fn lock(s: &State) -> MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records a message for the display, stamped with the time since `start`.
pub fn event(s: &State, start: Instant, msg: String) {
    lock(s).events.push(stamp(start, &msg));
}

/// A message stamped with the time since `start`, as the events are printed.
pub fn stamp(start: Instant, msg: &str) -> String {
    let t = start.elapsed().as_secs_f64();
    format!("[{t:6.2}s] {msg}")
}

/// Sets what the standby `role` is doing.
pub fn set_standby(state: &State, role: &str, what: String) {
    if let Some(e) = lock(state).standbys.iter_mut().find(|e| e.0 == role) {
        e.2 = what;
    }
}
