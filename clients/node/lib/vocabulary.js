"use strict";
// The vocabulary both worker libraries share (docs/libraries.md): the
// options of Worker with their defaults, the events it tells onEvent, and
// the metrics it serves. The Python library (pg_claim) has the same table
// in _vocabulary.py, in snake_case; describe() of each gives it in the same
// shape, which the test suites of both compare.

const REQUIRED = "required";

/**
 * [name, default]: a default in quotes is a text, a bare word a number, a
 * boolean, "none", or what the default is made of (ttl, n).
 */
const OPTIONS = [
  ["conninfo", "''"],
  ["connection", "none"],
  ["name", REQUIRED],
  ["table", REQUIRED],
  ["n", REQUIRED],
  ["pending", REQUIRED],
  ["handler", REQUIRED],
  ["batch", "50"],
  ["mode", "'lease'"],
  ["ttl", "'30 seconds'"],
  ["renewInterval", "ttl / 3"],
  ["idleInTransactionTimeout", "ttl"],
  ["queryTimeout", "ttl"],
  ["key", "none"],
  ["route", "none"],
  ["method", "none"],
  ["fair", "none"],
  ["spread", "none"],
  ["shardColumn", "none"],
  ["shardKeys", "none"],
  ["maxSlots", "n"],
  ["holder", "host:pid:random"],
  ["notifyConninfo", "none"],
  ["pollInterval", "1 s, 30 s when listening"],
  ["maxAttempts", "5"],
  ["backoff", "'10 seconds'"],
  ["sessionPool", "false"],
  ["balance", "true"],
  ["metricsPort", "none"],
  ["metricsHost", "'127.0.0.1'"],
  ["onEvent", "none"],
];

/** Options of 0.5.0 that 0.6.0 renamed: old name -> new name. */
const RENAMED = { connectionString: "conninfo", notifyConnectionString: "notifyConninfo" };

/** The events, in the order a worker's life tells them. */
const EVENTS = [
  "mode", "started", "slots", "gained", "lost", "batch", "failed", "dead", "rejected", "resized", "retrying",
  "transaction_ended", "idle", "woken", "reconnecting", "reconnected", "claim_failed", "listen_failed",
  "left", "leave_failed", "stopped",
];

/** The reasons of a `lost` event. */
const LOST_REASONS = ["given back", "taken", "expired", "released", "connection lost", "resized"];

/** [name, type, labels] of the metrics served on metricsPort. */
const METRICS = [
  ["pg_claim_items_total", "counter", ["fleet", "slot"]],
  ["pg_claim_batches_total", "counter", ["fleet", "slot"]],
  ["pg_claim_failures_total", "counter", ["fleet", "slot"]],
  ["pg_claim_dead_items_total", "counter", ["fleet", "slot"]],
  ["pg_claim_handovers_total", "counter", ["fleet", "direction"]],
  ["pg_claim_fence_rejections_total", "counter", ["fleet"]],
  ["pg_claim_reconnects_total", "counter", ["fleet"]],
  ["pg_claim_slots_held", "gauge", ["fleet"]],
  ["pg_claim_batch_duration_seconds", "histogram", ["fleet"]],
];

/** The upper bounds (seconds) of the batch latency histogram's buckets. */
const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** The vocabulary as plain data (JSON-ready), option names in camelCase. */
function describe() {
  return {
    options: OPTIONS.map(([name, dflt]) => ({ name, default: dflt })),
    events: [...EVENTS],
    lost_reasons: [...LOST_REASONS],
    metrics: METRICS.map(([name, type, labels]) => ({ name, type, labels: [...labels] })),
    buckets: [...BUCKETS],
  };
}

module.exports = { OPTIONS, RENAMED, EVENTS, LOST_REASONS, METRICS, BUCKETS, REQUIRED, describe };
