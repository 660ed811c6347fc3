//! Waking a slot's worker: slot_channel and the trigger function notify_slot
//! (reference: docs/wake.md).
//!
//! All in SQL (`sql/wake.sql`). The pg_regress test `wake` checks the
//! channels and the notifications; `scripts/bench wake` measures the latency
//! against polling.

// PL/pgSQL bodies, resolved when they run: nothing is needed before the file.
pgrx::extension_sql_file!("../sql/wake.sql", name = "wake");
