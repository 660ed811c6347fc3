//! The job spreader: spread_agg (DESIGN.md §5).
