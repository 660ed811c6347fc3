//! Per-backend cache of the query text my_items_query writes, so a worker
//! calling my_items batch after batch pays the catalog look-ups once.
//!
//! An entry is dropped when PostgreSQL invalidates the relcache entry of a
//! relation it was built from (the table, or the partition it reads: ALTER
//! TABLE, CREATE/DROP INDEX, ATTACH/DETACH PARTITION, RENAME, DROP ...), and
//! the whole cache when a schema, type or function changes. A function
//! change also starts a new generation (`generation`), on which the kept
//! plans of `srf` are dropped: the query text is written only after checking
//! that its mapping call resolves to pg_claim's own function, and a plan
//! re-analysed later (after a `search_path` change, say) must not resolve it
//! to a function created since.

use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// Everything the query text depends on besides the catalogs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct QueryKey {
    /// the calling pg_claim function (a new oid when the extension is re-created)
    pub func: u32,
    /// the role the query is written for (privileges decide whether a hash
    /// partition may be read directly)
    pub user: u32,
    pub reltype: u32,
    pub slot: i32,
    pub n: i32,
    pub key: Option<String>,
    pub method: &'static str,
    pub after: bool,
    pub batch: bool,
    pub columns: Option<Vec<String>>,
    pub route: Option<String>,
    pub pending: Option<String>,
}

struct Entry {
    sql: String,
    deps: Vec<pg_sys::Oid>,
}

/// Bound on entries (slots x tables x options a session uses); the cache
/// starts over when full.
const MAX_ENTRIES: usize = 4096;

thread_local! {
    static CACHE: RefCell<HashMap<QueryKey, Entry>> = RefCell::new(HashMap::new());
    static REGISTERED: RefCell<bool> = const { RefCell::new(false) };
    static GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Changes with every function created, altered or dropped in the database
/// (seen by this session) once the cache holds an entry.
pub fn generation() -> u64 {
    GENERATION.with(|g| g.get())
}

pub fn get(key: &QueryKey) -> Option<String> {
    CACHE.with(|c| c.borrow().get(key).map(|e| e.sql.clone()))
}

pub fn put(key: QueryKey, sql: String, deps: Vec<pg_sys::Oid>) {
    register_callbacks();
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= MAX_ENTRIES {
            c.clear();
        }
        c.insert(key, Entry { sql, deps });
    });
}

fn register_callbacks() {
    if REGISTERED.with(|r| r.replace(true)) {
        return;
    }
    // SAFETY: registered once per backend; the callbacks only touch the
    // thread-local map (no allocation in PostgreSQL memory, no ERROR)
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(relcache_changed), pg_sys::Datum::from(0));
        for cache in [
            pg_sys::SysCacheIdentifier::NAMESPACEOID,
            pg_sys::SysCacheIdentifier::TYPEOID,
            pg_sys::SysCacheIdentifier::PROCOID,
        ] {
            pg_sys::CacheRegisterSyscacheCallback(
                cache as _,
                Some(syscache_changed),
                pg_sys::Datum::from(0),
            );
        }
    }
}

/// The relcache callback: forgets the queries that depend on the relation
/// (all of them for a full reset). No allocation, no ERROR.
extern "C-unwind" fn relcache_changed(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let _ = CACHE.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if relid == pg_sys::InvalidOid {
                c.clear();
            } else {
                c.retain(|_, e| !e.deps.contains(&relid));
            }
        }
    });
}

/// The syscache callback: a change of a function starts a new generation;
/// every cached query is forgotten. No allocation, no ERROR.
extern "C-unwind" fn syscache_changed(_arg: pg_sys::Datum, cache: i32, _hash: u32) {
    if cache == pg_sys::SysCacheIdentifier::PROCOID as i32 {
        let _ = GENERATION.try_with(|g| g.set(g.get().wrapping_add(1)));
    }
    let _ = CACHE.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            c.clear();
        }
    });
}
