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
}

pub type State = Arc<Mutex<Shared>>;

pub fn lock(s: &State) -> MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records a message for the display, stamped with the time since `start`.
pub fn event(s: &State, start: Instant, msg: String) {
    let t = start.elapsed().as_secs_f64();
    lock(s).events.push(format!("[{t:6.2}s] {msg}"));
}

/// Sets what the standby `role` is doing.
pub fn set_standby(state: &State, role: &str, what: String) {
    if let Some(e) = lock(state).standbys.iter_mut().find(|e| e.0 == role) {
        e.2 = what;
    }
}
