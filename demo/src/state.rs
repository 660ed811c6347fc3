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
    /// The leases it held when it stopped, `(slot, token)`.
    pub held: Vec<(i32, i64)>,
    pub at: Instant,
}

#[derive(Default)]
pub struct Shared {
    pub slots: Vec<SlotView>,
    /// Messages to print once, in order (kill, takeover, errors).
    pub events: Vec<String>,
    /// Session mode: standbys and what they do: `(role, pid, state)`.
    pub standbys: Vec<(String, i32, String)>,
    pub kill_time: Option<Instant>,
    pub takeover: Option<std::time::Duration>,
    /// Errors that are not the expected termination of the victim.
    pub failures: Vec<String>,
    /// Lease mode: set by the coordinator, taken by the worker that fetches
    /// the next batch of the victim slot, which pauses before writing it.
    pub pause_request: bool,
    pub pause: Option<Pause>,
    /// Lease mode: the takeovers of the paused worker's slots, as printed.
    pub takeover_lines: Vec<String>,
    /// Lease mode: the writes `fence` rejected, as printed.
    pub rejected: Vec<String>,
    /// Lease mode: whether the paused worker's late write was rejected
    /// (`None`: it has not tried yet).
    pub late_write_rejected: Option<bool>,
    /// Lease mode: the fleet's shares as `lease_holders` last showed them,
    /// one line (for the live view).
    pub shares: String,
    /// Lease mode: batches fetched and worked on whose slot `claim_leases`
    /// gave back before the write; dropped unwritten (the slot's next
    /// holder does them).
    pub dropped_batches: u64,
    /// Lease mode: slots given back after a batch because a holder with
    /// less work wanted them (`report_backlog`).
    pub handovers: u64,
    /// Lease mode: the mid-run leave, as printed, once the leaving worker's
    /// `claim_leases(..., max => 0)` returned.
    pub left: Option<String>,
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
