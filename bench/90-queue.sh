#!/usr/bin/env bash
# The headline benchmark: the same table and work (fetch a batch of items, mark
# it done and log it in one statement) drained by W = 1, 2, 4, 8, 16, 32
# workers with pg_claim (claim_slot + slot_of expression index, + my_items, and
# in a queue-style transaction), the standard FOR UPDATE SKIP LOCKED queue, and
# PgQ; items/s and batch latency percentiles per W side by side in one run, a
# duplicate check per run, ratio lines for W = 8 and W = 32. The queue runs
# in two forms: prepared statements in four round trips per batch
# (skip_locked), and two simple-protocol round trips (skip_locked_simple).
# Writes docs/queue-results.md and
# docs/queue-throughput.svg (see docs/benchmark-queue.md).
#
# Options (environment):
#   BENCH_QUEUE_ITEMS    items per run           (default 200000)
#   BENCH_QUEUE_WORKERS  the W values            (default 1,2,4,8,16,32)
#   BENCH_QUEUE_BATCH    items per transaction   (default 50)
#   BENCH_QUEUE_WORK_US  simulated work per item (default 0)
#   BENCH_QUEUE_ROUNDS   rounds, median reported (default 5)
#   BENCH_QUEUE_METHODS  default pg_claim,my_items,pg_claim_tx,skip_locked,skip_locked_simple,pgq
#   BENCH_QUEUE_FILLFACTOR  of the work table, for every method (default 100)
#   BENCH_QUEUE_OUT      output directory        (default docs)
# Needs PGHOST/PGPORT/PGUSER of a cluster where pg_claim and pgq can be
# created (scripts/bench provides one).
# The program: bench/src/bin/queue_bench/.
source "$(dirname "$0")/lib.sh"
"$(bench_rust queue_bench)" \
    --items "${BENCH_QUEUE_ITEMS:-200000}" \
    --workers "${BENCH_QUEUE_WORKERS:-1,2,4,8,16,32}" \
    --batch "${BENCH_QUEUE_BATCH:-50}" \
    --work-us "${BENCH_QUEUE_WORK_US:-0}" \
    --rounds "${BENCH_QUEUE_ROUNDS:-5}" \
    --fillfactor "${BENCH_QUEUE_FILLFACTOR:-100}" \
    --methods "${BENCH_QUEUE_METHODS:-pg_claim,my_items,pg_claim_tx,skip_locked,skip_locked_simple,pgq}" \
    --out-dir "${BENCH_QUEUE_OUT:-docs}"
