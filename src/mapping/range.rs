//! `range_slot(anyelement, anyarray)`: the number of bounds `<=` key, by
//! binary search with the element type's default btree comparison.
//!
//! Bounds must be strictly increasing and contain no NULLs. A call site keeps
//! the last bounds array it saw, already deconstructed and validated, in
//! `fn_extra`: with constant bounds (the usual case) each row costs a byte
//! comparison of the array and log2(len) comparisons.

use super::poly::{AnyArrayDatum, AnyDatum};
use crate::backend::catalog::{effective_collation, type_name};
use crate::backend::error::{invalid_parameter, raise};
use crate::mapping::hashing::{first_not_increasing, upper_bound_by};
use pgrx::prelude::*;
use std::cmp::Ordering;
use std::ffi::CStr;

/// How two elements are compared. Integer-like by-value types, whose default
/// btree comparison is plain signed integer order, are compared natively; all
/// others through the type's btree comparison support function.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
enum Compare {
    Int16,
    Int32,
    Int64,
    Support,
}

impl Compare {
    fn for_type(typoid: pg_sys::Oid) -> Compare {
        match typoid {
            pg_sys::INT2OID => Compare::Int16,
            pg_sys::INT4OID | pg_sys::DATEOID => Compare::Int32,
            pg_sys::INT8OID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID | pg_sys::TIMEOID => {
                Compare::Int64
            }
            _ => Compare::Support,
        }
    }
}

/// The bounds array one call site saw last, allocated in `flinfo->fn_mcxt`.
#[repr(C)]
struct RangeCache {
    elemtype: pg_sys::Oid,
    how: Compare,
    collation: pg_sys::Oid,
    typlen: i16,
    typbyval: bool,
    typalign: std::ffi::c_char,
    cmp: pg_sys::FmgrInfo,
    /// private copy of the flat (detoasted) array, `raw_len` bytes
    raw: *mut u8,
    raw_len: usize,
    /// its elements (by-reference ones point into `raw`)
    elems: *mut pg_sys::Datum,
    nelems: usize,
    /// the TOAST pointer the cached bounds were last read through, when
    /// `has_pointer` (zeroed memory reads as "none")
    has_pointer: bool,
    pointer: [u8; TOAST_POINTER_LEN],
}

/// Bytes of an on-disk TOAST pointer: the 2-byte external header and
/// `varatt_external` (raw size, extsize and compression, value OID, TOAST
/// table OID).
const TOAST_POINTER_LEN: usize = 2 + std::mem::size_of::<pg_sys::varatt_external>();

/// The TOAST pointer of a bounds array stored out of line in a table (bounds
/// read per row, or from a scalar subquery over a table, arrive this way).
/// A TOAST value is never changed in place and its OID is not reused while
/// it exists, so the same pointer names the same bounds, and a call site can
/// reuse them without fetching and decompressing the value on every row.
///
/// # Safety
/// `v` is a non-NULL varlena datum (at least its first header byte
/// readable).
unsafe fn ondisk_toast_pointer(v: *const pg_sys::varlena) -> Option<[u8; TOAST_POINTER_LEN]> {
    // SAFETY: the caller passes a non-NULL varlena datum (range_slot's STRICT
    // bounds), which has at least its first header byte; the tag byte and the
    // TOAST_POINTER_LEN bytes copied are read only when that header says the
    // value is an on-disk TOAST pointer, which is exactly that long.
    unsafe {
        let b = v as *const u8;
        // 1-byte external header (0x01 on little-endian, 0x80 on big-endian), then the tag
        let external = if cfg!(target_endian = "little") {
            *b == 0x01
        } else {
            *b == 0x80
        };
        if external && *b.add(1) as u32 == pg_sys::vartag_external::VARTAG_ONDISK {
            let mut out = [0u8; TOAST_POINTER_LEN];
            std::ptr::copy_nonoverlapping(b, out.as_mut_ptr(), TOAST_POINTER_LEN);
            Some(out)
        } else {
            None
        }
    }
}

/// # Safety
/// `flinfo` is the current call's and `elemtype` the element type of its
/// bounds array.
unsafe fn new_cache(
    flinfo: *mut pg_sys::FmgrInfo,
    fncollation: pg_sys::Oid,
    elemtype: pg_sys::Oid,
) -> *mut RangeCache {
    // SAFETY: `flinfo` is the current call's (range_slot passes its own); the
    // type cache entry of an array's element type exists and stays valid; the
    // cache is zero-allocated in fn_mcxt, which lives as long as flinfo and
    // its fn_extra, where it is stored.
    unsafe {
        let tc = pg_sys::lookup_type_cache(elemtype, pg_sys::TYPECACHE_CMP_PROC_FINFO as i32);
        if (*tc).cmp_proc_finfo.fn_oid == pg_sys::InvalidOid {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                format!(
                    "type {} has no default btree operator class, so range_slot cannot order it",
                    type_name(elemtype)
                ),
                "The function range_slot accepts the types PARTITION BY RANGE accepts; cast the key and the bounds \
                 to one of them (for example ::text).",
            );
        }
        let mcxt = (*flinfo).fn_mcxt;
        let cache = pg_sys::MemoryContextAllocZero(mcxt, std::mem::size_of::<RangeCache>())
            as *mut RangeCache;
        (*cache).elemtype = elemtype;
        (*cache).how = Compare::for_type(elemtype);
        (*cache).collation = effective_collation(fncollation, elemtype);
        (*cache).typlen = (*tc).typlen;
        (*cache).typbyval = (*tc).typbyval;
        (*cache).typalign = (*tc).typalign;
        pg_sys::fmgr_info_cxt((*tc).cmp_proc_finfo.fn_oid, &mut (*cache).cmp, mcxt);
        (*flinfo).fn_extra = cache as *mut std::ffi::c_void;
        cache
    }
}

/// # Safety
/// `cache` was made by [`new_cache`], and `a` and `b` are datums of its
/// element type.
#[inline]
unsafe fn compare(cache: *mut RangeCache, a: pg_sys::Datum, b: pg_sys::Datum) -> Ordering {
    // SAFETY: the callers pass a cache made by new_cache (its `cmp` set up by
    // fmgr_info_cxt for the element type's btree support function) and two
    // datums of that element type.
    unsafe {
        match (*cache).how {
            Compare::Int16 => (a.value() as i16).cmp(&(b.value() as i16)),
            Compare::Int32 => (a.value() as i32).cmp(&(b.value() as i32)),
            Compare::Int64 => (a.value() as i64).cmp(&(b.value() as i64)),
            Compare::Support => {
                let r = pg_sys::FunctionCall2Coll(&mut (*cache).cmp, (*cache).collation, a, b);
                (r.value() as i32).cmp(&0)
            }
        }
    }
}

/// The text form of a value as a quoted SQL literal, for error messages.
///
/// # Safety
/// `value` is a datum of type `typoid`.
unsafe fn value_text(typoid: pg_sys::Oid, value: pg_sys::Datum) -> String {
    // SAFETY: the caller passes a datum of type `typoid` (a bounds element);
    // its output function returns a palloc'd NUL-terminated string.
    unsafe {
        let mut out = pg_sys::InvalidOid;
        let mut varlena = false;
        pg_sys::getTypeOutputInfo(typoid, &mut out, &mut varlena);
        let text = CStr::from_ptr(pg_sys::OidOutputFunctionCall(out, value)).to_string_lossy();
        format!("'{}'", text.replace('\'', "''"))
    }
}

/// Take `arr` (flat, 4-byte header) as the call site's bounds: copy it into
/// the cache, deconstruct and validate it. Raises 22023 on bad bounds.
///
/// # Safety
/// `cache` was made by [`new_cache`] for the call whose `fn_mcxt` is
/// `mcxt`; `arr` is a detoasted array with a plain 4-byte header, `len`
/// bytes long, of the cache's element type.
unsafe fn load_bounds(
    cache: *mut RangeCache,
    mcxt: pg_sys::MemoryContext,
    arr: *mut pg_sys::ArrayType,
    len: usize,
) {
    // SAFETY: the caller (range_slot) passes a cache made by new_cache, its
    // flinfo's fn_mcxt, and a detoasted array with a plain 4-byte header of
    // `len` bytes and that cache's element type. The copy is made in fn_mcxt
    // and deconstructed there, with the element type's length, by-value flag
    // and alignment from the type cache; the dimensions are read only when
    // ndim is 1, and the null flags and elements only up to nelems.
    unsafe {
        if !(*cache).raw.is_null() {
            pg_sys::pfree((*cache).raw as *mut std::ffi::c_void);
            (*cache).raw = std::ptr::null_mut();
            (*cache).raw_len = 0;
        }
        if !(*cache).elems.is_null() {
            pg_sys::pfree((*cache).elems as *mut std::ffi::c_void);
            (*cache).elems = std::ptr::null_mut();
            (*cache).nelems = 0;
        }
        let ndim = (*arr).ndim;
        if ndim > 1 {
            invalid_parameter(
                format!("bounds must be a one-dimensional array, got {ndim} dimensions"),
                "Pass the bounds as a flat sorted array, for example ARRAY[10, 20, 30].",
            );
        }
        // ARR_LBOUND: the dimensions follow the header, then the lower bounds.
        let lbound = if ndim == 1 {
            let dims =
                (arr as *const u8).add(std::mem::size_of::<pg_sys::ArrayType>()) as *const i32;
            *dims.add(1)
        } else {
            1
        };
        let raw = pg_sys::MemoryContextAlloc(mcxt, len) as *mut u8;
        std::ptr::copy_nonoverlapping(arr as *const u8, raw, len);
        let mut elems: *mut pg_sys::Datum = std::ptr::null_mut();
        let mut nulls: *mut bool = std::ptr::null_mut();
        let mut nelems: i32 = 0;
        let old = pg_sys::MemoryContextSwitchTo(mcxt);
        pg_sys::deconstruct_array(
            raw as *mut pg_sys::ArrayType,
            (*cache).elemtype,
            (*cache).typlen as i32,
            (*cache).typbyval,
            (*cache).typalign,
            &mut elems,
            &mut nulls,
            &mut nelems,
        );
        pg_sys::MemoryContextSwitchTo(old);
        let n = nelems.max(0) as usize;
        // Validate before publishing, so a failed call leaves no half-loaded cache.
        if n > 0 {
            let nulls_s = std::slice::from_raw_parts(nulls, n);
            if let Some(i) = nulls_s.iter().position(|&x| x) {
                pg_sys::pfree(raw as *mut std::ffi::c_void);
                invalid_parameter(
                    format!(
                        "bounds must not contain NULL, found one at bounds[{}]",
                        lbound as i64 + i as i64
                    ),
                    "Remove the NULLs, for example with array_remove(bounds, NULL).",
                );
            }
            let es = std::slice::from_raw_parts(elems, n);
            if let Some(i) = first_not_increasing(n, |a, b| compare(cache, es[a], es[b])) {
                let prev = value_text((*cache).elemtype, es[i - 1]);
                let this = value_text((*cache).elemtype, es[i]);
                pg_sys::pfree(raw as *mut std::ffi::c_void);
                invalid_parameter(
                    format!(
                        "bounds must be strictly increasing, but bounds[{}] = {} is not greater than bounds[{}] = {}",
                        lbound as i64 + i as i64,
                        this,
                        lbound as i64 + i as i64 - 1,
                        prev
                    ),
                    "Sort the bounds and remove duplicates, for example \
                     ARRAY(SELECT DISTINCT b FROM unnest(bounds) b ORDER BY b).",
                );
            }
        }
        if !nulls.is_null() {
            pg_sys::pfree(nulls as *mut std::ffi::c_void);
        }
        (*cache).raw = raw;
        (*cache).raw_len = len;
        (*cache).elems = elems;
        (*cache).nelems = n;
    }
}

/// `range_slot(key anyelement, bounds anyarray)`: the number of bounds `<=`
/// key. Slot 0 is below `bounds[1]`; slot i holds `[bounds[i], bounds[i+1])`.
#[pg_extern(immutable, strict, parallel_safe)]
fn range_slot(key: AnyDatum, bounds: AnyArrayDatum, fcinfo: pg_sys::FunctionCallInfo) -> i32 {
    // SAFETY: fcinfo is this call's; fn_extra is NULL or a RangeCache stored
    // by this function in the same flinfo; the array datum is non-NULL (STRICT).
    unsafe {
        let flinfo = (*fcinfo).flinfo;
        let raw = bounds.0.cast_mut_ptr::<pg_sys::varlena>();
        let pointer = ondisk_toast_pointer(raw);
        let mut cache = (*flinfo).fn_extra as *mut RangeCache;
        let known = match pointer {
            Some(p) => !cache.is_null() && (*cache).has_pointer && (*cache).pointer == p,
            None => false,
        };
        if !known {
            // detoast only when needed (compressed, external, short-header, expanded)
            let arr = if pgrx::varlena::varatt_is_4b_u(raw) {
                raw as *mut pg_sys::ArrayType
            } else {
                pg_sys::pg_detoast_datum(raw) as *mut pg_sys::ArrayType
            };
            let elemtype = (*arr).elemtype;
            if cache.is_null() || (*cache).elemtype != elemtype {
                cache = new_cache(flinfo, (*fcinfo).fncollation, elemtype);
            }
            // a plain 4-byte header either way
            let len = pgrx::varlena::varsize_4b(arr as *const pg_sys::varlena);
            let same = !(*cache).raw.is_null()
                && (*cache).raw_len == len
                && std::slice::from_raw_parts((*cache).raw, len)
                    == std::slice::from_raw_parts(arr as *const u8, len);
            if !same {
                (*cache).has_pointer = false;
                load_bounds(cache, (*flinfo).fn_mcxt, arr, len);
            }
            if let Some(p) = pointer {
                (*cache).pointer = p;
            }
            (*cache).has_pointer = pointer.is_some();
        }
        if (*cache).nelems == 0 {
            return 0;
        }
        let es = std::slice::from_raw_parts((*cache).elems, (*cache).nelems);
        let k = key.0;
        upper_bound_by(es.len(), |i| compare(cache, es[i], k)) as i32
    }
}
