//! The C-level set-returning function behind `my_items(anyelement, ...)`.
//!
//! It resolves the row type of its first argument, gets the share's query
//! text (`share_query`, cached per session), and runs that query through a
//! plan prepared once per session (SPI_prepare + SPI_keepplan; PostgreSQL's
//! plan cache re-plans it after DDL), streaming the rows straight into the
//! result tuplestore, as PL/pgSQL's RETURN QUERY does. The argument values
//! reach the query only as parameters.

use crate::pg_claim_fn;
use pgrx::fcinfo::pg_getarg;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, CString};

extern "C-unwind" {
    // executor/tstoreReceiver.h (not in pgrx's bindings)
    fn SetTuplestoreDestReceiverParams(
        receiver: *mut pg_sys::DestReceiver,
        store: *mut pg_sys::Tuplestorestate,
        context: pg_sys::MemoryContext,
        detoast: bool,
        target_tupdesc: pg_sys::TupleDesc,
        map_failure_msg: *const c_char,
    );
}

/// Prepared plans kept per session, keyed by query text.
const MAX_PLANS: usize = 256;

thread_local! {
    static PLANS: RefCell<HashMap<String, usize>> = RefCell::new(HashMap::new());
    /// the cache generation the kept plans were prepared in
    static PLANS_GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How the share query is planned: always the generic plan (the query's
/// shape is fixed, n is a literal in the slot expression, so the expression
/// index matches, and a generic plan costs no planning per batch), except in
/// a database with Citus: Citus cannot plan a distributed query whose
/// parameters have no values, so there each batch gets a custom plan, with
/// the argument values.
///
/// # Safety
/// Called inside a transaction (it reads the catalog).
unsafe fn plan_options() -> i32 {
    // SAFETY: a catalog lookup inside a transaction
    let citus = unsafe { pg_sys::get_extension_oid(c"citus".as_ptr(), true) } != pg_sys::InvalidOid;
    if citus {
        pg_sys::CURSOR_OPT_CUSTOM_PLAN as i32
    } else {
        pg_sys::CURSOR_OPT_GENERIC_PLAN as i32
    }
}

/// The kept plan for `sql` (parameters int4, int4, text, int4), prepared
/// once per session and planning option. Call only while connected to SPI.
///
/// # Safety
/// Called while connected to SPI, inside a transaction.
unsafe fn plan_for(sql: &str) -> pg_sys::SPIPlanPtr {
    // SAFETY: connected to SPI, inside a transaction
    let options = unsafe { plan_options() };
    let key = format!("{options} {sql}");
    let generation = super::cache::generation();
    if PLANS_GENERATION.with(|g| g.replace(generation)) != generation {
        // a function was created, altered or dropped since they were made
        PLANS.with(|p| {
            for (_, old) in p.borrow_mut().drain() {
                // SAFETY: plans this module kept
                unsafe { pg_sys::SPI_freeplan(old as pg_sys::SPIPlanPtr) };
            }
        });
    }
    if let Some(p) = PLANS.with(|p| p.borrow().get(&key).copied()) {
        return p as pg_sys::SPIPlanPtr;
    }
    let text = CString::new(sql).expect("query text has no NUL");
    let mut types = [
        pg_sys::INT4OID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
    ];
    // SAFETY: connected to SPI; the argument array outlives the call
    unsafe {
        let plan = pg_sys::SPI_prepare_cursor(
            text.as_ptr(),
            types.len() as i32,
            types.as_mut_ptr(),
            options,
        );
        if plan.is_null() {
            crate::backend::error::internal("prepare the share query", sql);
        }
        pg_sys::SPI_keepplan(plan);
        PLANS.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() >= MAX_PLANS {
                for (_, old) in p.drain() {
                    pg_sys::SPI_freeplan(old as pg_sys::SPIPlanPtr);
                }
            }
            p.insert(key, plan as usize);
        });
        plan
    }
}

pg_claim_fn!(guarded
/// `my_items(rel anyelement, slot, n, key, method, after, batch) RETURNS SETOF anyelement`
///
my_items, |fcinfo| {
    // SAFETY: fcinfo is the function manager's, for my_items as declared in
    // sql/items.sql (positions 1, 2, 5 and 6 exist in every declaration since
    // 0.2.0; omitted arguments get their defaults). InitMaterializedSRF
    // raises unless the caller accepts a materialized set, then sets up
    // rsinfo's tuplestore and descriptor, which the receiver writes into in
    // the per-query memory context. SPI is connected before the kept plan is
    // looked up and run, and finished after; the parameter list has the 4
    // parameters the plan was prepared with.
    unsafe {
        let reltype = pg_sys::get_fn_expr_argtype((*fcinfo).flinfo, 0);
        if reltype == pg_sys::InvalidOid {
            crate::backend::error::raise(
                PgSqlErrorCode::ERRCODE_INDETERMINATE_DATATYPE,
                "my_items could not determine the row type of its first argument".into(),
                "Pass a typed NULL of the table: SELECT * FROM my_items(NULL::my_table, slot, n).",
            );
        }
        let sql = super::share_query(fcinfo, reltype);
        let slot: Option<i32> = pg_getarg(fcinfo, 1);
        let n: Option<i32> = pg_getarg(fcinfo, 2);
        let after: Option<&str> = pg_getarg(fcinfo, 5);
        let batch: Option<i32> = pg_getarg(fcinfo, 6);

        // the result: a tuplestore of the table's row type
        pg_sys::InitMaterializedSRF(fcinfo, 0);
        let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;

        // parameters $1 slot, $2 n, $3 after, $4 batch, as constants so the
        // planner sees their values
        let params = pg_sys::makeParamList(4);
        let values: [(Option<pg_sys::Datum>, pg_sys::Oid); 4] = [
            (slot.into_datum(), pg_sys::INT4OID),
            (n.into_datum(), pg_sys::INT4OID),
            (after.into_datum(), pg_sys::TEXTOID),
            (batch.into_datum(), pg_sys::INT4OID),
        ];
        let slots = (*params).params.as_mut_slice(4);
        for (p, (v, t)) in slots.iter_mut().zip(values) {
            p.value = v.unwrap_or(pg_sys::Datum::from(0));
            p.isnull = v.is_none();
            p.pflags = pg_sys::PARAM_FLAG_CONST as u16;
            p.ptype = t;
        }

        let dest = pg_sys::CreateDestReceiver(pg_sys::CommandDest::DestTuplestore);
        SetTuplestoreDestReceiverParams(
            dest,
            (*rsinfo).setResult,
            (*(*rsinfo).econtext).ecxt_per_query_memory,
            false,
            (*rsinfo).setDesc,
            c"structure of the share query does not match the table's row type".as_ptr(),
        );

        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            crate::backend::error::internal("connect to SPI", "SPI_connect failed");
        }
        let plan = plan_for(&sql);
        let options = pg_sys::SPIExecuteOptions {
            params,
            read_only: true,
            allow_nonatomic: false,
            must_return_tuples: true,
            tcount: 0,
            dest,
            owner: std::ptr::null_mut(),
        };
        let rc = pg_sys::SPI_execute_plan_extended(plan, &options);
        if rc < 0 {
            crate::backend::error::internal("run the share query", format!("SPI code {rc}: {sql}"));
        }
        pg_sys::SPI_finish();
        if let Some(destroy) = (*dest).rDestroy {
            destroy(dest);
        }
        pg_sys::Datum::from(0)
    }
});
