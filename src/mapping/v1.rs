//! The per-row SQL functions `slot_of`, `crc32` and `jump_slot` as plain
//! version-1 C-ABI functions.
//!
//! These run once per row in scans, index builds and generated columns, so
//! they skip pgrx's general-purpose argument and memory-context machinery and
//! read the `FunctionCallInfo` directly. Every path that can raise a
//! PostgreSQL ERROR (a bad `n`, detoasting, encoding conversion) runs inside
//! `pgrx_extern_c_guard`, which turns Rust panics and PostgreSQL longjmps into
//! a proper ERROR, exactly as pgrx's own wrappers do; the common path makes no
//! call into PostgreSQL at all.
//!
//! Each function is declared to SQL in `sql/mapping.sql`, with
//! `IMMUTABLE STRICT PARALLEL SAFE` and no `SET` clause; its C name is
//! `pg_claim_<rust name>` (`backend::fmgr`).

use crate::backend::error::check_n;
use crate::mapping::hashing::{crc32, crc32_slot, jump_hash, modulo_slot, uuid_crc32, uuid_text};
use crate::pg_claim_fn;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::pgrx_extern_c_guard;
use std::sync::atomic::{AtomicI32, Ordering};

/// The two arguments of a STRICT two-argument function.
///
/// # Safety
/// `fcinfo` is the current call's, of a function declared with two
/// arguments and STRICT (so neither is NULL).
#[inline(always)]
unsafe fn two_args<'a>(fcinfo: pg_sys::FunctionCallInfo) -> &'a [pg_sys::NullableDatum] {
    // SAFETY: as the caller promises
    unsafe { (*fcinfo).args.as_slice(2) }
}

/// The argument of a one-argument call (`crc32`).
///
/// # Safety
/// `fcinfo` is the current call's, of a function declared with one argument
/// and STRICT (so it is not NULL).
#[inline(always)]
unsafe fn one_arg<'a>(fcinfo: pg_sys::FunctionCallInfo) -> &'a [pg_sys::NullableDatum] {
    // SAFETY: as the caller promises
    unsafe { (*fcinfo).args.as_slice(1) }
}

#[inline(always)]
fn arg_n(args: &[pg_sys::NullableDatum]) -> i32 {
    let n = args[1].value.value() as i32;
    if n < 1 {
        // Raises the ERROR (SQLSTATE 22023); never returns.
        // SAFETY: only reached from the body of a version-1 C function called
        // by the function manager, the boundary the guard is made for; it
        // turns check_n's ERROR into a PostgreSQL ERROR.
        unsafe { pgrx_extern_c_guard(|| check_n(n)) }
    }
    n
}

#[inline(always)]
fn slot_datum(slot: i32) -> pg_sys::Datum {
    pg_sys::Datum::from(slot)
}

/// The bytes of a text/bytea datum. In-line, uncompressed values (nearly all
/// keys) are read in place; toasted or compressed ones are detoasted first.
///
/// # Safety
/// `datum` must be a valid varlena datum that outlives the returned slice.
#[inline(always)]
unsafe fn varlena_bytes<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    let ptr = datum.cast_mut_ptr::<u8>();
    // SAFETY: every varlena starts with at least one header byte.
    let b0 = unsafe { *ptr };
    if b0 & 0x01 == 0x01 {
        if b0 != 0x01 {
            // 1-byte header, in line: total length in the upper 7 bits.
            let len = (b0 >> 1) as usize;
            // SAFETY: the header says `len` bytes follow, header included.
            return unsafe { std::slice::from_raw_parts(ptr.add(1), len - 1) };
        }
    } else {
        // SAFETY: a 4-byte header, possibly unaligned in a packed tuple.
        let header = unsafe { (ptr as *const u32).read_unaligned() };
        if header & 0x03 == 0x00 {
            let len = (header >> 2) as usize;
            // SAFETY: uncompressed 4-byte header, `len` bytes total.
            return unsafe { std::slice::from_raw_parts(ptr.add(4), len - 4) };
        }
    }
    // SAFETY: `datum` is a valid varlena (this function's contract), which is
    // all detoasted_bytes needs.
    unsafe { detoasted_bytes(datum) }
}

/// # Safety
/// `datum` is a valid varlena; the bytes live in the current memory
/// context.
#[cold]
#[inline(never)]
unsafe fn detoasted_bytes<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    // SAFETY: a valid varlena; the detoasted copy lives in the current memory
    // context, which outlives this function call.
    unsafe {
        pgrx_extern_c_guard(|| {
            let v = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
            pgrx::varlena::varlena_to_byte_slice(v)
        })
    }
}

/// The 16 bytes of a uuid datum.
///
/// # Safety
/// `datum` must be a uuid datum that outlives the returned reference.
#[inline(always)]
unsafe fn uuid_bytes<'a>(datum: pg_sys::Datum) -> &'a [u8; 16] {
    // SAFETY: uuid is a fixed 16-byte pass-by-reference type.
    unsafe { &*(datum.cast_mut_ptr::<[u8; 16]>()) }
}

/// Database encoding, read once per backend (it cannot change while connected).
static DB_ENCODING: AtomicI32 = AtomicI32::new(-1);

/// The UTF-8 bytes of a text value. In a UTF-8 (or SQL_ASCII) database these
/// are the stored bytes; in any other encoding the value is converted first,
/// so a key hashes the same whatever the database encoding.
///
/// # Safety
/// `datum` is a non-NULL text argument of the current call, in a backend.
#[inline(always)]
unsafe fn text_utf8<'a>(datum: pg_sys::Datum) -> std::borrow::Cow<'a, [u8]> {
    // SAFETY: the callers pass a non-NULL text argument of the current call
    // (the functions are STRICT), a valid varlena for the whole call, in a
    // backend.
    unsafe { utf8_bytes(varlena_bytes(datum)) }
}

/// The UTF-8 form of text bytes in the database encoding (see `text_utf8`).
///
/// # Safety
/// Called in a backend (the slow path asks PostgreSQL for the encoding and
/// may convert).
#[inline(always)]
pub(crate) unsafe fn utf8_bytes(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let enc = DB_ENCODING.load(Ordering::Relaxed);
    let as_is = enc == pg_sys::pg_enc::PG_UTF8 as i32
        || enc == pg_sys::pg_enc::PG_SQL_ASCII as i32
        || (enc >= 0 && bytes.is_ascii());
    if as_is {
        return std::borrow::Cow::Borrowed(bytes);
    }
    // SAFETY: called in a backend (this function's contract).
    unsafe { text_utf8_slow(bytes) }
}

/// # Safety
/// Called in a backend (it asks PostgreSQL for the encoding and may
/// convert).
#[cold]
#[inline(never)]
unsafe fn text_utf8_slow(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    // SAFETY: in a backend (the caller's contract), under the guard, which
    // turns a conversion ERROR into a PostgreSQL ERROR. pg_server_to_any
    // reads `bytes.len()` bytes of `bytes` and returns either `src` itself or
    // a palloc'd NUL-terminated string, which is copied and then freed.
    unsafe {
        pgrx_extern_c_guard(|| {
            let enc = pg_sys::GetDatabaseEncoding();
            DB_ENCODING.store(enc, Ordering::Relaxed);
            if enc == pg_sys::pg_enc::PG_UTF8 as i32
                || enc == pg_sys::pg_enc::PG_SQL_ASCII as i32
                || bytes.is_ascii()
            {
                return std::borrow::Cow::Borrowed(bytes);
            }
            let src = bytes.as_ptr() as *const std::os::raw::c_char;
            let out =
                pg_sys::pg_server_to_any(src, bytes.len() as i32, pg_sys::pg_enc::PG_UTF8 as i32);
            if std::ptr::eq(out, src) {
                std::borrow::Cow::Borrowed(bytes)
            } else {
                let s = std::ffi::CStr::from_ptr(out).to_bytes().to_vec();
                pg_sys::pfree(out.cast());
                std::borrow::Cow::Owned(s)
            }
        })
    }
}

pg_claim_fn!(raw slot_of_int2, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    slot_datum(modulo_slot(args[0].value.value() as i16 as i64, n))
});

pg_claim_fn!(raw slot_of_int4, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    slot_datum(modulo_slot(args[0].value.value() as i32 as i64, n))
});

pg_claim_fn!(raw slot_of_int8, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    slot_datum(modulo_slot(args[0].value.value() as i64, n))
});

pg_claim_fn!(raw slot_of_text, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    // SAFETY: STRICT, so args[0] is this call's non-NULL text datum, valid
    // for the whole call.
    let bytes = unsafe { text_utf8(args[0].value) };
    slot_datum(crc32_slot(&bytes, n))
});

pg_claim_fn!(raw slot_of_bytea, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    // SAFETY: STRICT, so args[0] is this call's non-NULL bytea datum, valid
    // for the whole call.
    let bytes = unsafe { varlena_bytes(args[0].value) };
    slot_datum(crc32_slot(bytes, n))
});

pg_claim_fn!(raw slot_of_uuid, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    // SAFETY: STRICT, so args[0] is this call's non-NULL uuid datum, valid
    // for the whole call.
    let bytes = unsafe { uuid_bytes(args[0].value) };
    slot_datum(crc32_slot(&uuid_text(bytes), n))
});

pg_claim_fn!(raw crc32_text, |fcinfo| {
    // SAFETY: declared STRICT with one argument in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { one_arg(fcinfo) };
    // SAFETY: STRICT, so args[0] is this call's non-NULL text datum, valid
    // for the whole call.
    let bytes = unsafe { text_utf8(args[0].value) };
    pg_sys::Datum::from(crc32(&bytes) as i64)
});

pg_claim_fn!(raw crc32_bytea, |fcinfo| {
    // SAFETY: declared STRICT with one argument in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { one_arg(fcinfo) };
    // SAFETY: STRICT, so args[0] is this call's non-NULL bytea datum, valid
    // for the whole call.
    let bytes = unsafe { varlena_bytes(args[0].value) };
    pg_sys::Datum::from(crc32(bytes) as i64)
});

pg_claim_fn!(raw jump_slot_int8, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    slot_datum(jump_hash(args[0].value.value() as i64 as u64, n))
});

pg_claim_fn!(raw jump_slot_text, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    // SAFETY: STRICT, so args[0] is this call's non-NULL text datum, valid
    // for the whole call.
    let bytes = unsafe { text_utf8(args[0].value) };
    slot_datum(jump_hash(crc32(&bytes) as u64, n))
});

pg_claim_fn!(raw jump_slot_bytea, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    // SAFETY: STRICT, so args[0] is this call's non-NULL bytea datum, valid
    // for the whole call.
    let bytes = unsafe { varlena_bytes(args[0].value) };
    slot_datum(jump_hash(crc32(bytes) as u64, n))
});

pg_claim_fn!(raw jump_slot_uuid, |fcinfo| {
    // SAFETY: declared STRICT with two arguments in sql/mapping.sql; fcinfo is
    // the function manager's for this call.
    let args = unsafe { two_args(fcinfo) };
    let n = arg_n(args);
    // SAFETY: STRICT, so args[0] is this call's non-NULL uuid datum, valid
    // for the whole call.
    let bytes = unsafe { uuid_bytes(args[0].value) };
    slot_datum(jump_hash(uuid_crc32(bytes) as u64, n))
});

/// The base types whose values `slot_of` and `jump_slot` map, as
/// `key_slot` reads them (a domain's value is its base type's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyForm {
    Int2,
    Int4,
    Int8,
    /// text and varchar
    Text,
    /// char(n): mapped as its text form, without trailing spaces (the cast
    /// `slot_of(text, integer)` receives a char(n) key through)
    Bpchar,
    Bytea,
    Uuid,
}

impl KeyForm {
    /// The form of a base type, or None when neither mapping takes it.
    pub(crate) fn of_base_type(typ: pg_sys::Oid) -> Option<KeyForm> {
        Some(match typ {
            pg_sys::INT2OID => KeyForm::Int2,
            pg_sys::INT4OID => KeyForm::Int4,
            pg_sys::INT8OID => KeyForm::Int8,
            pg_sys::TEXTOID | pg_sys::VARCHAROID => KeyForm::Text,
            pg_sys::BPCHAROID => KeyForm::Bpchar,
            pg_sys::BYTEAOID => KeyForm::Bytea,
            pg_sys::UUIDOID => KeyForm::Uuid,
            _ => return None,
        })
    }
}

/// The slot of a non-NULL key datum of `form`, exactly as the SQL call
/// `slot_of(key, n)` (or `jump_slot(key, n)` with `jump`) computes it.
/// `n` must be at least 1.
///
/// # Safety
/// `datum` is a valid non-NULL value of `form`'s type; called in a backend.
pub(crate) unsafe fn key_slot(form: KeyForm, datum: pg_sys::Datum, n: i32, jump: bool) -> i32 {
    let int = |v: i64| {
        if jump {
            jump_hash(v as u64, n)
        } else {
            modulo_slot(v, n)
        }
    };
    let bytes = |b: &[u8]| {
        if jump {
            jump_hash(crc32(b) as u64, n)
        } else {
            crc32_slot(b, n)
        }
    };
    // SAFETY: as the caller promises
    unsafe {
        match form {
            KeyForm::Int2 => int(datum.value() as i16 as i64),
            KeyForm::Int4 => int(datum.value() as i32 as i64),
            KeyForm::Int8 => int(datum.value() as i64),
            KeyForm::Text => bytes(&text_utf8(datum)),
            KeyForm::Bpchar => {
                let raw = varlena_bytes(datum);
                let len = raw.iter().rposition(|b| *b != b' ').map_or(0, |i| i + 1);
                bytes(&utf8_bytes(&raw[..len]))
            }
            KeyForm::Bytea => bytes(varlena_bytes(datum)),
            KeyForm::Uuid => {
                let u = uuid_bytes(datum);
                if jump {
                    jump_hash(uuid_crc32(u) as u64, n)
                } else {
                    crc32_slot(&uuid_text(u), n)
                }
            }
        }
    }
}

pgrx::extension_sql_file!("../../sql/mapping.sql", name = "slot_of_crc32_jump_slot");
