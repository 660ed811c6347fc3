//! A worker's share of a table: my_items, slot_counts (DESIGN.md §3).
