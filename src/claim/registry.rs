//! The name registry (`sql/names.sql`) and the mode check of session claims,
//! called from Rust through the extension's internal SECURITY DEFINER
//! functions (`crate::backend::internal`).
//!
//! - [`register_name`]: before a session takes a new claim of a name (slot,
//!   group membership), `pg_claim_register_name(name)` records the name under
//!   its lock key, or raises 42710 when another name already has the key.
//!   A name registered by a committed transaction of this backend is not
//!   registered again: the backend remembers it, for the life of the
//!   extension (its OID).
//! - [`leased`]: whether the name has a live lease (`pg_claim_leased(name)`),
//!   after waiting for any `claim_lease` of the name in progress.
//!
//! With the SQL objects of an earlier release (before `ALTER EXTENSION
//! pg_claim UPDATE`), which lack these functions, claims work as in that
//! release: no registry, no mode check.

use crate::backend::internal::{extension, internal_fn_if_installed};
use pgrx::pg_sys;
use pgrx::IntoDatum;
use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::HashSet;

#[derive(Default)]
struct Registered {
    /// The extension these entries belong to (a new one after DROP/CREATE).
    ext: pg_sys::Oid,
    /// Names whose registration this backend saw committed.
    committed: HashSet<String>,
    /// Names registered in the current transaction, by the subtransaction
    /// that registered them; committed with it, forgotten with its abort.
    pending: HashMap<String, pg_sys::SubTransactionId>,
    /// Names only checked (read-only transaction, hot standby): enough for
    /// the idempotent path of a claim taken then, not for a new claim.
    checked: HashSet<String>,
    /// Whether the transaction callbacks are registered (once per backend).
    callbacks: bool,
}

thread_local! {
    static REGISTERED: RefCell<Registered> = RefCell::new(Registered::default());
}

/// Whether this backend registered `name` (committed, or in the current
/// transaction) for the extension it last saw. A hash look-up: the claiming
/// functions' idempotent paths call it, and register again only when a
/// registration was rolled back while the session kept its claim (advisory
/// locks are session-level and outlive the transaction that took them).
pub fn known(name: &str) -> bool {
    REGISTERED.with(|r| {
        let r = r.borrow();
        r.committed.contains(name) || r.pending.contains_key(name)
    })
}

/// As [`known`], or checked without writing (a claim taken in a read-only
/// transaction or on a hot standby, where nothing can be registered): what
/// the idempotent paths of the claiming functions need, so that a session on
/// a standby does not check again at every call.
pub fn known_or_checked(name: &str) -> bool {
    known(name) || REGISTERED.with(|r| r.borrow().checked.contains(name))
}

/// Register `name` in the registry, or raise 42710 when its lock key belongs
/// to another name. In a read-only transaction or during recovery this only
/// checks (nothing is written, nothing remembered).
pub fn register_name(name: &str) {
    let (ext, _) = extension();
    let known = REGISTERED.with(|r| {
        let mut r = r.borrow_mut();
        if r.ext != ext {
            r.ext = ext;
            r.committed.clear();
            r.pending.clear();
            r.checked.clear();
        }
        r.committed.contains(name) || r.pending.contains_key(name)
    });
    if known {
        return;
    }
    // SQL objects of a release before the registry (not yet updated): no
    // registry, as then
    let Some(f) = internal_fn_if_installed("pg_claim_register_name", &[pg_sys::TEXTOID]) else {
        return;
    };
    let arg = name.into_datum().expect("a text datum");
    // SAFETY: a direct call of the extension's own function, exact signature
    // (text) -> void; plpgsql returns a non-NULL void datum.
    unsafe { pg_sys::OidFunctionCall1Coll(f, pg_sys::InvalidOid, arg) };
    // SAFETY: reads of backend globals
    let wrote = unsafe { !pg_sys::RecoveryInProgress() && !pg_sys::XactReadOnly };
    if wrote {
        ensure_callbacks();
        // SAFETY: inside a transaction
        let sub = unsafe { pg_sys::GetCurrentSubTransactionId() };
        REGISTERED.with(|r| r.borrow_mut().pending.insert(name.to_string(), sub));
    } else {
        REGISTERED.with(|r| r.borrow_mut().checked.insert(name.to_string()));
    }
}

/// Whether `name` has a live lease (`claim_lease`). Waits for a
/// `claim_lease` of the name in progress to end first.
pub fn leased(name: &str) -> bool {
    let Some(f) = internal_fn_if_installed("pg_claim_leased", &[pg_sys::TEXTOID]) else {
        return false;
    };
    let arg = name.into_datum().expect("a text datum");
    // SAFETY: a direct call of the extension's own function, exact signature
    // (text) -> boolean, which never returns NULL.
    let d = unsafe { pg_sys::OidFunctionCall1Coll(f, pg_sys::InvalidOid, arg) };
    d.value() != 0
}

/// Whether `name`'s lock key is free or registered to `name` itself (false
/// when another name has it): the readers of the lock table show nothing
/// for a name whose key belongs to another name. True at once for a name
/// this backend registered.
pub fn owns_key(name: &str) -> bool {
    if known(name) {
        return true;
    }
    let Some(f) = internal_fn_if_installed("pg_claim_name_owns_key", &[pg_sys::TEXTOID]) else {
        return true;
    };
    let arg = name.into_datum().expect("a text datum");
    // SAFETY: a direct call of the extension's own function, exact signature
    // (text) -> boolean, which never returns NULL.
    let d = unsafe { pg_sys::OidFunctionCall1Coll(f, pg_sys::InvalidOid, arg) };
    d.value() != 0
}

fn ensure_callbacks() {
    let done = REGISTERED.with(|r| std::mem::replace(&mut r.borrow_mut().callbacks, true));
    if !done {
        // SAFETY: registered once per backend; the callbacks only touch
        // this module's thread-local state and raise nothing.
        unsafe {
            pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
        }
    }
}

/// The transaction callback (`RegisterXactCallback`): a commit keeps the
/// names registered in the transaction, an abort forgets them.
#[pgrx::pg_guard]
extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    REGISTERED.with(|r| {
        let mut r = r.borrow_mut();
        match event {
            pg_sys::XactEvent::XACT_EVENT_COMMIT
            | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT => {
                let names: Vec<String> = r.pending.drain().map(|(n, _)| n).collect();
                r.committed.extend(names);
            }
            pg_sys::XactEvent::XACT_EVENT_ABORT
            | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
            | pg_sys::XactEvent::XACT_EVENT_PREPARE => r.pending.clear(),
            _ => {}
        }
    });
}

/// The subtransaction callback (`RegisterSubXactCallback`): a committed
/// subtransaction's names pass to its parent, an aborted one's are
/// forgotten.
#[pgrx::pg_guard]
extern "C-unwind" fn on_subxact(
    event: pg_sys::SubXactEvent::Type,
    sub: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    REGISTERED.with(|r| {
        let mut r = r.borrow_mut();
        match event {
            pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => {
                for s in r.pending.values_mut() {
                    if *s == sub {
                        *s = parent;
                    }
                }
            }
            pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => r.pending.retain(|_, s| *s != sub),
            _ => {}
        }
    });
}
