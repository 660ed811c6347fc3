//! Dynamic groups: membership, positions and fair partition ownership (DESIGN.md §4).
