//! `range_slot(anyelement, anyarray)`: the number of bounds `<=` key, by
//! binary search with the element type's default btree comparison.
//!
//! Bounds must be strictly increasing and contain no NULLs. A call site keeps
//! the last bounds array it saw, already deconstructed and validated, in
//! `fn_extra`: with constant bounds (the usual case) each row costs a byte
//! comparison of the array and log2(len) comparisons.

use super::pg_hash::{effective_collation, type_name};
use crate::error::{invalid_parameter, raise};
use crate::hashing::{first_not_increasing, upper_bound_by};
use pgrx::prelude::*;
use pgrx::{AnyArray, AnyElement};
use std::cmp::Ordering;
use std::ffi::CStr;

/// The bounds array one call site saw last, allocated in `flinfo->fn_mcxt`.
#[repr(C)]
struct RangeCache {
    elemtype: pg_sys::Oid,
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
}

unsafe fn new_cache(
    flinfo: *mut pg_sys::FmgrInfo,
    fncollation: pg_sys::Oid,
    elemtype: pg_sys::Oid,
) -> *mut RangeCache {
    unsafe {
        let tc = pg_sys::lookup_type_cache(elemtype, pg_sys::TYPECACHE_CMP_PROC_FINFO as i32);
        if (*tc).cmp_proc_finfo.fn_oid == pg_sys::InvalidOid {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                format!(
                    "type {} has no default btree operator class, so range_slot cannot order it",
                    type_name(elemtype)
                ),
                "range_slot accepts the types PARTITION BY RANGE accepts; cast the key and the bounds \
                 to one of them (for example ::text).",
            );
        }
        let mcxt = (*flinfo).fn_mcxt;
        let cache = pg_sys::MemoryContextAllocZero(mcxt, std::mem::size_of::<RangeCache>())
            as *mut RangeCache;
        (*cache).elemtype = elemtype;
        (*cache).collation = effective_collation(fncollation, elemtype);
        (*cache).typlen = (*tc).typlen;
        (*cache).typbyval = (*tc).typbyval;
        (*cache).typalign = (*tc).typalign;
        pg_sys::fmgr_info_cxt((*tc).cmp_proc_finfo.fn_oid, &mut (*cache).cmp, mcxt);
        (*flinfo).fn_extra = cache as *mut std::ffi::c_void;
        cache
    }
}

#[inline]
unsafe fn compare(cache: *mut RangeCache, a: pg_sys::Datum, b: pg_sys::Datum) -> Ordering {
    unsafe {
        let r = pg_sys::FunctionCall2Coll(&mut (*cache).cmp, (*cache).collation, a, b);
        (r.value() as i32).cmp(&0)
    }
}

/// The text form of a value as a quoted SQL literal, for error messages.
unsafe fn value_text(typoid: pg_sys::Oid, value: pg_sys::Datum) -> String {
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
unsafe fn load_bounds(
    cache: *mut RangeCache,
    mcxt: pg_sys::MemoryContext,
    arr: *mut pg_sys::ArrayType,
    len: usize,
) {
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
                "pass the bounds as a flat sorted array, for example ARRAY[10, 20, 30].",
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
                    "remove the NULLs, for example with array_remove(bounds, NULL).",
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
                    "sort the bounds and remove duplicates, for example \
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
fn range_slot(key: AnyElement, bounds: AnyArray, fcinfo: pg_sys::FunctionCallInfo) -> i32 {
    // SAFETY: fcinfo is this call's; fn_extra is NULL or a RangeCache stored
    // by this function in the same flinfo; the array datum is non-NULL (STRICT).
    unsafe {
        let flinfo = (*fcinfo).flinfo;
        let arr = pg_sys::pg_detoast_datum(bounds.datum().cast_mut_ptr::<pg_sys::varlena>())
            as *mut pg_sys::ArrayType;
        let elemtype = (*arr).elemtype;
        let mut cache = (*flinfo).fn_extra as *mut RangeCache;
        if cache.is_null() || (*cache).elemtype != elemtype {
            cache = new_cache(flinfo, (*fcinfo).fncollation, elemtype);
        }
        // detoasting always yields a 4-byte header
        let len = pgrx::varlena::varsize_4b(arr as *const pg_sys::varlena);
        let same = !(*cache).raw.is_null()
            && (*cache).raw_len == len
            && std::slice::from_raw_parts((*cache).raw, len)
                == std::slice::from_raw_parts(arr as *const u8, len);
        if !same {
            load_bounds(cache, (*flinfo).fn_mcxt, arr, len);
        }
        if (*cache).nelems == 0 {
            return 0;
        }
        let es = std::slice::from_raw_parts((*cache).elems, (*cache).nelems);
        let k = key.datum();
        upper_bound_by(es.len(), |i| compare(cache, es[i], k)) as i32
    }
}
