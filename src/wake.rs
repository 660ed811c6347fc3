//! Waking a slot's worker: slot_channel and the trigger function notify_slot
//! (reference: docs/wake.md).
//!
//! `slot_channel` is PL/pgSQL (`sql/wake.sql`). `notify_slot` is a
//! version-1 C trigger function: the first row a trigger fires for reads
//! its arguments, finds the key column and its type, and works out the
//! channel names' prefixes; that set-up is kept per trigger for the session
//! (dropped when the table's relcache entry is invalidated: ALTER TABLE,
//! CREATE OR REPLACE TRIGGER, DROP). Each row then costs one mapping of the
//! key (the same Rust code as `slot_of` / `jump_slot`, called directly, so
//! no SQL function is resolved and nothing another role creates can stand
//! in for it) and one `Async_Notify`. The pg_regress test `wake` checks the
//! set-ups and their errors, the isolation spec `wake` the notifications;
//! `bench/85-notify-cost.sh` measures the cost per row.

use crate::backend::catalog::{cstr_to_string, qualified_rel_name, quote_ident, type_name};
use crate::backend::error::{invalid_parameter, raise};
use crate::backend::limits::MAX_N;
use crate::mapping::hashing::crc32;
use crate::mapping::v1::{key_slot, utf8_bytes, KeyForm};
use crate::pg_claim_fn;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_char;
use std::rc::Rc;

unsafe extern "C-unwind" {
    // commands/async.h (not in pgrx's bindings)
    fn Async_Notify(channel: *const c_char, payload: *const c_char);
}

/// What the first row of a trigger worked out, for every later row.
struct Setup {
    relid: pg_sys::Oid,
    attnum: i32,
    form: KeyForm,
    n: i32,
    jump: bool,
    /// `pg_claim_<name>_` when the name is a plain lower-case identifier
    plain_prefix: Option<Vec<u8>>,
    /// `pg_claim__<crc32 of name, 8 hex digits>_`
    hashed_prefix: Vec<u8>,
}

impl Setup {
    /// The channel of `slot` as `slot_channel(name, slot)` names it, with a
    /// terminating NUL, into `buf`.
    fn channel(&self, slot: i32, buf: &mut Vec<u8>) {
        let digits = slot.to_string();
        buf.clear();
        // slot_channel: plain while 10 + octet_length(name) + digits <= 63,
        // i.e. the prefix ("pg_claim_" + name + "_") plus the digits
        match &self.plain_prefix {
            Some(p) if p.len() + digits.len() <= 63 => buf.extend_from_slice(p),
            _ => buf.extend_from_slice(&self.hashed_prefix),
        }
        buf.extend_from_slice(digits.as_bytes());
        buf.push(0);
    }
}

thread_local! {
    static SETUPS: RefCell<HashMap<u32, Rc<Setup>>> = RefCell::new(HashMap::new());
    static CALLBACK: Cell<bool> = const { Cell::new(false) };
    static CHANNEL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Relcache invalidation: forget the set-ups of the relation (all of them
/// for a full reset).
#[pgrx::pg_guard]
extern "C-unwind" fn forget_setups(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    SETUPS.with(|s| {
        if let Ok(mut map) = s.try_borrow_mut() {
            if relid == pg_sys::InvalidOid {
                map.clear();
            } else {
                map.retain(|_, v| v.relid != relid);
            }
        }
    });
}

const EXAMPLE_HINT: &str =
    "EXECUTE FUNCTION notify_slot('mailer', '8', 'id') or notify_slot('mailer', '8', 'id', 'jump_slot').";

/// Whether `name` is a plain lower-case identifier (slot_channel's
/// `^[a-z][a-z0-9_]*$`).
fn plain_name(name: &[u8]) -> bool {
    matches!(name.first(), Some(b'a'..=b'z'))
        && name
            .iter()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
}

/// Parse n as the old PL/pgSQL body did: 1 to 7 digits, 1 .. 1048576.
fn parse_n(text: &str) -> Option<i32> {
    if text.is_empty() || text.len() > 7 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: i32 = text.parse().ok()?;
    (1..=MAX_N).contains(&n).then_some(n)
}

/// Read a trigger's arguments and its table's key column.
///
/// # Safety
/// `td` is the current trigger call's.
unsafe fn build_setup(td: *mut pg_sys::TriggerData) -> Setup {
    // SAFETY: the trigger manager's data for this call
    unsafe {
        let trigger = (*td).tg_trigger;
        let rel = (*td).tg_relation;
        let relid = (*rel).rd_id;
        let nargs = (*trigger).tgnargs as usize;
        if nargs != 3 && nargs != 4 {
            invalid_parameter(
                format!(
                    "notify_slot takes 3 or 4 trigger arguments (name, n, column [, mapping]), got {nargs}"
                ),
                EXAMPLE_HINT,
            );
        }
        let args: Vec<String> = (0..nargs)
            .map(|i| cstr_to_string(*(*trigger).tgargs.add(i)))
            .collect();
        let n = parse_n(&args[1]).unwrap_or_else(|| {
            invalid_parameter(
                format!(
                    "n must be an integer between 1 and 1048576, got \"{}\"",
                    args[1]
                ),
                "The second trigger argument is the n the workers use, e.g. '8'.",
            )
        });
        let mapping = args.get(3).map_or("slot_of", String::as_str);
        let jump = match mapping {
            "slot_of" => false,
            "jump_slot" => true,
            other => invalid_parameter(
                format!("mapping must be slot_of or jump_slot, got \"{other}\""),
                "Use the mapping of the workers' walk; leave the fourth argument out for slot_of.",
            ),
        };
        let col = &args[2];
        let table = qualified_rel_name(relid);
        let desc = pgrx::PgTupleDesc::from_pg_unchecked((*rel).rd_att);
        let found = desc
            .iter()
            .find(|a| !a.is_dropped() && a.attnum > 0 && a.name() == col.as_str())
            .map(|a| (a.attnum, a.atttypid));
        let Some((attnum, atttypid)) = found else {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!("table {table} has no column \"{col}\""),
                "The third trigger argument is the key column the workers' slot_of uses, e.g. 'id'.",
            )
        };
        let base = pg_sys::getBaseType(atttypid);
        let form = KeyForm::of_base_type(base).unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                format!(
                    "notify_slot cannot map column {} of table {table}: {mapping} does not take type {}",
                    quote_ident(col),
                    type_name(atttypid)
                ),
                &format!(
                    "The key column must be smallint, integer, bigint, text, varchar, char(n), bytea or uuid \
                     (or a domain over one), as for the workers' {mapping}; name such a column, e.g. a generated \
                     column ({}::text)."
                ,
                    quote_ident(col)
                ),
            )
        });
        let name = args[0].as_bytes();
        let plain_prefix = plain_name(name).then(|| {
            let mut p = b"pg_claim_".to_vec();
            p.extend_from_slice(name);
            p.push(b'_');
            p
        });
        let hashed_prefix = format!("pg_claim__{:08x}_", crc32(&utf8_bytes(name))).into_bytes();
        Setup {
            relid,
            attnum: attnum as i32,
            form,
            n,
            jump,
            plain_prefix,
            hashed_prefix,
        }
    }
}

/// The set-up of the trigger of this call, made on its first row.
///
/// # Safety
/// `td` is the current trigger call's.
unsafe fn setup_of(td: *mut pg_sys::TriggerData) -> Rc<Setup> {
    // SAFETY: the trigger manager's data for this call
    let tgoid = unsafe { (*(*td).tg_trigger).tgoid }.to_u32();
    if let Some(s) = SETUPS.with(|s| s.borrow().get(&tgoid).cloned()) {
        return s;
    }
    if !CALLBACK.get() {
        // SAFETY: registered once per backend, for the life of the backend
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(forget_setups), pg_sys::Datum::from(0));
        }
        CALLBACK.set(true);
    }
    // SAFETY: as the caller promises
    let setup = Rc::new(unsafe { build_setup(td) });
    SETUPS.with(|s| s.borrow_mut().insert(tgoid, setup.clone()));
    setup
}

const TRIGGER_EVENT_OPMASK: u32 = 0x03;
const TRIGGER_EVENT_INSERT: u32 = 0x00;
const TRIGGER_EVENT_DELETE: u32 = 0x01;
const TRIGGER_EVENT_UPDATE: u32 = 0x02;
const TRIGGER_EVENT_ROW: u32 = 0x04;

pg_claim_fn!(guarded
/// `notify_slot() RETURNS trigger`, used as
/// `EXECUTE FUNCTION notify_slot(name, n, column [, mapping])`: NOTIFY
/// `slot_channel(name, mapping(NEW.column, n))` for each new row (nothing
/// for a NULL key).
notify_slot, |fcinfo| {
    // SAFETY: the function manager's call data; the trigger manager's data
    // when called as a trigger
    unsafe {
        let ctx = (*fcinfo).context;
        if ctx.is_null() || !pgrx::is_a(ctx, pg_sys::NodeTag::T_TriggerData) {
            raise(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "trigger functions can only be called as triggers".to_string(),
                "Use notify_slot in CREATE TRIGGER ... FOR EACH ROW EXECUTE FUNCTION notify_slot('mailer', '8', 'id').",
            );
        }
        let td = ctx as *mut pg_sys::TriggerData;
        let event = (*td).tg_event;
        let op = event & TRIGGER_EVENT_OPMASK;
        let row = event & TRIGGER_EVENT_ROW != 0;
        if !row || (op != TRIGGER_EVENT_INSERT && op != TRIGGER_EVENT_UPDATE) {
            let op_name = match op {
                TRIGGER_EVENT_INSERT => "INSERT",
                TRIGGER_EVENT_DELETE => "DELETE",
                TRIGGER_EVENT_UPDATE => "UPDATE",
                _ => "TRUNCATE",
            };
            raise(
                PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                format!(
                    "notify_slot must be a FOR EACH ROW trigger on INSERT or UPDATE, not {} on {op_name}",
                    if row { "ROW" } else { "STATEMENT" }
                ),
                "CREATE TRIGGER ... AFTER INSERT ON tbl FOR EACH ROW EXECUTE FUNCTION notify_slot('mailer', '8', 'id').",
            );
        }
        let tuple = if op == TRIGGER_EVENT_UPDATE {
            (*td).tg_newtuple
        } else {
            (*td).tg_trigtuple
        };
        let setup = setup_of(td);
        let mut isnull = false;
        let key = pg_sys::heap_getattr(tuple, setup.attnum, (*(*td).tg_relation).rd_att, &mut isnull);
        if !isnull {
            let slot = key_slot(setup.form, key, setup.n, setup.jump);
            CHANNEL.with(|c| {
                let mut buf = c.borrow_mut();
                setup.channel(slot, &mut buf);
                // as pg_notify: no NOTIFY during recovery
                pg_sys::PreventCommandDuringRecovery(c"NOTIFY".as_ptr());
                pg_sys::ffi::pg_guard_ffi_boundary(|| {
                    Async_Notify(buf.as_ptr().cast(), c"".as_ptr())
                });
            });
        }
        pg_sys::Datum::from(tuple)
    }
});

// PL/pgSQL bodies and the trigger function's declaration.
pgrx::extension_sql_file!("../sql/wake.sql", name = "wake");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_parses_as_before() {
        assert_eq!(parse_n("8"), Some(8));
        assert_eq!(parse_n("1048576"), Some(1_048_576));
        assert_eq!(parse_n("0000008"), Some(8));
        for bad in [
            "", "0", "1048577", "eight", "-1", "+8", " 8", "00000008", "9999999",
        ] {
            assert_eq!(parse_n(bad), None, "{bad}");
        }
    }

    fn setup(name: &str) -> Setup {
        Setup {
            relid: pg_sys::InvalidOid,
            attnum: 1,
            form: KeyForm::Int8,
            n: 8,
            jump: false,
            plain_prefix: plain_name(name.as_bytes())
                .then(|| format!("pg_claim_{name}_").into_bytes()),
            hashed_prefix: format!("pg_claim__{:08x}_", crc32(name.as_bytes())).into_bytes(),
        }
    }

    fn channel(name: &str, slot: i32) -> String {
        let mut buf = Vec::new();
        setup(name).channel(slot, &mut buf);
        assert_eq!(buf.pop(), Some(0));
        String::from_utf8(buf).unwrap()
    }

    /// The names slot_channel gives (pg_regress `wake` shows the same).
    #[test]
    fn channels_as_slot_channel() {
        assert_eq!(channel("mailer", 3), "pg_claim_mailer_3");
        // 10 + 46 + 7 = 63 bytes: still plain; one byte more: hashed
        let m46 = "m".repeat(46);
        assert_eq!(channel(&m46, 1_048_575), format!("pg_claim_{m46}_1048575"));
        let m47 = "m".repeat(47);
        assert_eq!(
            channel(&m47, 1_048_575),
            format!("pg_claim__{:08x}_1048575", crc32(m47.as_bytes()))
        );
        assert_eq!(channel(&m47, 1), format!("pg_claim_{m47}_1"));
        assert_eq!(
            channel("Mailer", 3),
            format!("pg_claim__{:08x}_3", crc32(b"Mailer"))
        );
        for (name, slot) in [("mailer", 0), (&m46[..], 1_048_575), ("mail-er", 7)] {
            assert!(channel(name, slot).len() <= 63);
        }
    }

    #[test]
    fn plain_names() {
        assert!(plain_name(b"mailer"));
        assert!(plain_name(b"a_1"));
        for bad in [
            &b""[..],
            b"Mailer",
            b"1a",
            b"mail-er",
            b"_a",
            "é".as_bytes(),
        ] {
            assert!(!plain_name(bad));
        }
    }
}
