//! The job spreader: spread_agg (DESIGN.md §5).

pub mod order;
