//! `pg_hash_slot(anyelement, n)`: the remainder of the hash partition that
//! PostgreSQL's own `PARTITION BY HASH (key)` with `MODULUS n` routes a key to.
//!
//! The server hashes a partition key column with the extended hash support
//! function (number 2) of the column type's default hash operator class, seeded
//! with `HASH_PARTITION_SEED`, folds the per-column hashes with `hash_combine64`
//! starting from 0, and routes the row to remainder `hash % modulus`. This does
//! the same for a single-column key. The support function and collation are
//! looked up once per call site and kept in `fn_extra`.

use super::poly::{arg_type, AnyDatum};
use crate::backend::catalog::{effective_collation, type_name};
use crate::backend::error::{check_n, raise};
use crate::mapping::hashing::{partition_remainder, HASH_PARTITION_SEED};
use pgrx::prelude::*;

/// Support function number of a hash opclass's extended (seeded, 64-bit) hash.
const HASHEXTENDED_PROC: i16 = 2;

/// What one call site needs, allocated in `flinfo->fn_mcxt`.
#[repr(C)]
struct HashCache {
    collation: pg_sys::Oid,
    hash: pg_sys::FmgrInfo,
}

/// Look up the partition hash function of `typoid` the way the server does for
/// a partition key column: default hash opclass, its family's extended hash
/// support function for the opclass's input type.
///
/// # Safety
/// `fcinfo` is the current call's, with a valid `flinfo`, and `typoid` the
/// type of its key argument as the parser resolved it.
unsafe fn build_cache(fcinfo: pg_sys::FunctionCallInfo, typoid: pg_sys::Oid) -> *mut HashCache {
    // SAFETY: `fcinfo` is the current call's (pg_hash_slot passes its own);
    // catalog look-ups on a type the parser resolved; the cache is
    // zero-allocated in fn_mcxt, which lives as long as flinfo and its
    // fn_extra, where it is stored.
    unsafe {
        let flinfo = (*fcinfo).flinfo;
        if typoid == pg_sys::InvalidOid {
            raise(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "could not determine the type of the key".to_string(),
                "Call pg_hash_slot from SQL, where the key's type is known.",
            );
        }
        let opclass = pg_sys::GetDefaultOpClass(typoid, pg_sys::HASH_AM_OID);
        if opclass == pg_sys::InvalidOid {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                format!(
                    "type {} has no default hash operator class, so it cannot be a hash partition key",
                    type_name(typoid)
                ),
                "The function pg_hash_slot accepts the types PARTITION BY HASH accepts; cast the key to one of them \
                 (for example key::text), or use slot_of or jump_slot.",
            );
        }
        let family = pg_sys::get_opclass_family(opclass);
        let intype = pg_sys::get_opclass_input_type(opclass);
        let proc_oid = pg_sys::get_opfamily_proc(family, intype, intype, HASHEXTENDED_PROC);
        if proc_oid == pg_sys::InvalidOid {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                format!(
                    "type {} has no extended hash function in its default hash operator class",
                    type_name(typoid)
                ),
                "PARTITION BY HASH needs the opclass's support function 2; cast the key to a type that \
                 has one (for example key::text).",
            );
        }
        let mcxt = (*flinfo).fn_mcxt;
        let cache = pg_sys::MemoryContextAllocZero(mcxt, std::mem::size_of::<HashCache>())
            as *mut HashCache;
        (*cache).collation = effective_collation((*fcinfo).fncollation, typoid);
        pg_sys::fmgr_info_cxt(proc_oid, &mut (*cache).hash, mcxt);
        (*flinfo).fn_extra = cache as *mut std::ffi::c_void;
        cache
    }
}

/// `pg_hash_slot(key anyelement, n integer)`: the remainder of the partition
/// that `PARTITION BY HASH (key)` with `MODULUS n` routes `key` to.
#[pg_extern(immutable, strict, parallel_safe)]
fn pg_hash_slot(key: AnyDatum, n: i32, fcinfo: pg_sys::FunctionCallInfo) -> i32 {
    check_n(n);
    // SAFETY: fcinfo is this call's; fn_extra is either NULL or a HashCache
    // this function stored in the same flinfo (whose argument types are fixed).
    unsafe {
        let flinfo = (*fcinfo).flinfo;
        let mut cache = (*flinfo).fn_extra as *mut HashCache;
        if cache.is_null() {
            cache = build_cache(fcinfo, arg_type(fcinfo, 0));
        }
        let hash = pg_sys::FunctionCall2Coll(
            &mut (*cache).hash,
            (*cache).collation,
            key.0,
            pg_sys::Datum::from(HASH_PARTITION_SEED),
        );
        partition_remainder(hash.value() as u64, n)
    }
}
