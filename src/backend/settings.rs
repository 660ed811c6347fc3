//! pg_claim's configuration parameters (`pg_claim.*`), registered when the
//! library loads, and what they switch on in a session.
//!
//! | parameter | default | who may change it |
//! |---|---|---|
//! | `pg_claim.client_connection_check_interval` | 1 s | any role |
//! | `pg_claim.standby_poll_max` | 5 ms | any role |
//! | `pg_claim.max_locks_per_session` | 1024 | superusers (per role: `ALTER ROLE ... SET`) |
//!
//! The prefix is reserved: `SET pg_claim.misspelled = ...` is an ERROR once
//! the library is loaded.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::ffi::CString;

/// `pg_claim.client_connection_check_interval`, in milliseconds.
pub static CLIENT_CHECK_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// `pg_claim.standby_poll_max`, in milliseconds.
pub static STANDBY_POLL_MAX: GucSetting<i32> = GucSetting::<i32>::new(5);
/// `pg_claim.max_locks_per_session`: the advisory locks one session may hold
/// through pg_claim (slots, their records, group memberships, partitions).
pub static MAX_LOCKS_PER_SESSION: GucSetting<i32> = GucSetting::<i32>::new(1024);

/// Registers the parameters and reserves the prefix; called from `_PG_init`.
pub fn init() {
    GucRegistry::define_int_guc(
        c"pg_claim.client_connection_check_interval",
        c"client_connection_check_interval that claim_slot applies to claiming sessions (0: leave the session's setting alone).",
        c"A holder whose client dies while its backend runs a query loses its slot within about this time. claim_slot sets the session's client_connection_check_interval to this value when it is 0 (disabled) or larger.",
        &CLIENT_CHECK_INTERVAL,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_claim.standby_poll_max",
        c"Longest sleep, in milliseconds, between two attempts of a claim_slot(name, n, wait) standby.",
        c"A waiting standby retries after 1 ms, then sleeps 1 ms longer after each attempt up to this value. Lower means faster takeover and more lock-table reads.",
        &STANDBY_POLL_MAX,
        1,
        1000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_claim.max_locks_per_session",
        c"Most advisory locks one session may hold through pg_claim.",
        c"Every held slot, group membership and partition is an entry in the server's shared lock table, which all sessions share (max_locks_per_transaction x max_connections entries). A call that would take more is refused with SQLSTATE 53400. Only superusers may change it, so one role cannot fill the lock table.",
        &MAX_LOCKS_PER_SESSION,
        16,
        crate::backend::limits::MAX_KEY_INDEX,
        GucContext::Suset,
        GucFlags::default(),
    );
    // SAFETY: called once at library load, after the parameters are defined
    unsafe { pg_sys::MarkGUCPrefixReserved(c"pg_claim".as_ptr()) };
}

/// Make this session notice a dead client within
/// `pg_claim.client_connection_check_interval`, also while it runs a query,
/// and arm the check for the running statement (PostgreSQL arms it only when
/// a statement starts). `for_session`: keep the setting for the session (a
/// claiming session); otherwise only until the transaction ends.
pub fn apply_client_check(for_session: bool) {
    let want = CLIENT_CHECK_INTERVAL.get();
    if want <= 0 {
        return;
    }
    // SAFETY: reading a GUC variable of this backend.
    let cur = unsafe { pg_sys::client_connection_check_interval };
    if cur == 0 || cur > want {
        let value = CString::new(want.to_string()).expect("digits contain no NUL");
        let action = if for_session {
            pg_sys::GucAction::GUC_ACTION_SET
        } else {
            pg_sys::GucAction::GUC_ACTION_LOCAL
        };
        // SAFETY: valid C strings; a user-settable GUC set at session level.
        unsafe {
            pg_sys::set_config_option(
                c"client_connection_check_interval".as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                action,
                true,
                0,
                false,
            );
        }
    }
    // SAFETY: plain reads of backend globals, and the timeout API of the
    // backend we run in; only regular client backends have a port.
    unsafe {
        let id = CLIENT_CONNECTION_CHECK_TIMEOUT;
        let interval = pg_sys::client_connection_check_interval;
        if interval > 0
            && pg_sys::IsUnderPostmaster
            && !pg_sys::MyProcPort.is_null()
            && !get_timeout_active(id)
        {
            enable_timeout_after(id, interval);
        }
    }
}

/// The server's timeout id of the client connection check (`TimeoutId` in
/// `utils/timeout.h`, which is not in pgrx's bindings and differs between
/// major versions): read from the headers of this build by `build.rs`.
const CLIENT_CONNECTION_CHECK_TIMEOUT: i32 =
    match i32::from_str_radix(env!("PG_CLAIM_CLIENT_CONNECTION_CHECK_TIMEOUT"), 10) {
        Ok(id) => id,
        Err(_) => panic!("build.rs writes a number"),
    };

// Neither function raises an ERROR (they only arm a timer and read a flag).
unsafe extern "C" {
    fn enable_timeout_after(id: i32, delay_ms: i32);
    fn get_timeout_active(id: i32) -> bool;
}
