#!/usr/bin/env bash
# Slot claiming: claim_slot + release_slot latency side by side with a bare
# pg_try_advisory_lock + pg_advisory_unlock round trip (target within 1.2x),
# the cost of claiming the last free slot of n = 1024, and takeover latency
# percentiles of a standby blocked in claim_slot(name, n, wait).
# Runs the Rust program bench/src/bin/claim_bench/ against PGHOST/PGPORT.
# Knobs: BENCH_ITERS (default 2000), BENCH_ROUNDS (7), BENCH_TAKEOVERS (40).
source "$(dirname "$0")/lib.sh"
"$(bench_rust claim_bench)"
