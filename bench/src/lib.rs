//! What more than one of pg_claim's benchmark programs (`src/bin/`) uses:
//!
//! - [`plot`]: line charts of a rate against the number of workers, as SVG.

pub mod plot;
