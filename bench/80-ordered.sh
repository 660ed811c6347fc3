#!/usr/bin/env bash
# Ordered per key: a table of items in groups processed FIFO per group (each
# group's items in id order, one at a time) and in parallel across groups, at
# W = 8 and 32 workers with G = 100 and 10,000 groups, side by side in one run:
#   pg_claim: claim_slot, then the worker's share of groups with
#             my_items(..., route => 'grp', pending => 'done', after, batch)
#   queue:    the head of each group, oldest first, FOR UPDATE SKIP LOCKED
#             (pgmq's grouped read, its heads found by a skip scan of
#             (grp, id) WHERE NOT done), one item per group per transaction
# Items/s of a drain of a loaded table, then the delay from insert to
# processing (p50, p99) with one producer at a fixed rate; after each phase
# the log is checked: every item once, every group in strictly increasing id
# order (the program exits 1 otherwise). See docs/ordered.md.
#
# Knobs: BENCH_ORDERED_ITEMS (default 200000), BENCH_ORDERED_WORKERS (8,32),
# BENCH_ORDERED_GROUPS (100,10000), BENCH_ORDERED_RATE (2000 items/s),
# BENCH_ORDERED_SECONDS (5: the producer's run; a drain stops after 4x that).
# The program: bench/src/bin/ordered_bench/.
source "$(dirname "$0")/lib.sh"
"$(bench_rust ordered_bench)" \
    --items "${BENCH_ORDERED_ITEMS:-200000}" \
    --workers "${BENCH_ORDERED_WORKERS:-8,32}" \
    --groups "${BENCH_ORDERED_GROUPS:-100,10000}" \
    --rate "${BENCH_ORDERED_RATE:-2000}" \
    --seconds "${BENCH_ORDERED_SECONDS:-5}"
