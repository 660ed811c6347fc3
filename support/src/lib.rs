//! What pg_claim's client programs share: the demo (`demo/`), the benchmarks
//! (`bench/`) and the multi-session tests (`sessions/`) all connect, describe
//! errors, poll with a deadline and compute percentiles through this crate,
//! and the demo and the elastic benchmark run their lease fleets' members
//! through it, so each of those is defined once.
//!
//! - [`elastic`]: a member of an elastic lease fleet (`claim_leases`), the
//!   loop of the demo's lease mode and of the elastic benchmark;
//! - [`conn`]: the connection string, connecting with an `application_name`,
//!   creating the extension, the backend's pid and whether it is busy;
//! - [`error`]: readable errors, SQLSTATEs, lost connections;
//! - [`wait`]: polling a condition until a deadline;
//! - [`stats`]: the one percentile definition (nearest rank) and the median;
//! - [`opts`]: `--name value` command-line options;
//! - [`work`]: the work table and processing log of the demo and the queue
//!   benchmark;
//! - [`fmt`]: numbers and durations as the programs print them.

pub mod conn;
pub mod elastic;
pub mod error;
pub mod fmt;
pub mod opts;
pub mod stats;
pub mod wait;
pub mod work;

pub use conn::{backend_pid, connect, dsn_from_env, ensure_extension, is_active, session};
pub use error::{describe, is_connection_loss, sqlstate};
pub use fmt::{ms, thousands};
pub use opts::{parse_list, Opts};
pub use stats::{median, percentile, rank_index};
pub use wait::{poll, wait_for, wait_until};
pub use work::create_work_tables;
