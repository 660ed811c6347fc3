"use strict";
// The worker's counters, and the optional Prometheus endpoint (prom-client).
const http = require("http");

/** Upper bounds of the batch latency histogram, in seconds. */
const { BUCKETS } = require("./vocabulary");

/** Plain counters, always kept (`worker.stats`). */
class Stats {
  constructor() {
    /** items handled and committed */
    this.items = 0;
    /** batches committed */
    this.batches = 0;
    /** failed attempts recorded with record_failure (dead ones included) */
    this.failures = 0;
    /** items set aside: record_failure returned 'dead' */
    this.deadItems = 0;
    /** slots taken (new, or again with a new token) */
    this.slotsTaken = 0;
    /** slots given back or lost (a claim's result without them, a fence that refused) */
    this.slotsLost = 0;
    /** writes refused by fence (PC001): the slot moved while the batch was handled */
    this.fenced = 0;
    /** connections lost and opened again */
    this.reconnects = 0;
    /** seconds of the batches committed, summed */
    this.batchSeconds = 0;
    /** slots held now */
    this.slotsHeld = 0;
  }
}

/**
 * Prometheus metrics of one worker in a registry of its own, served on
 * http://host:port/metrics. prom-client is an optional dependency: loaded
 * only when a port is given.
 *
 * The same metric set as the Python library's, with the fleet's name in the
 * label `fleet` (as in the exporter's queries of contrib/prometheus/):
 * - pg_claim_items_total, pg_claim_batches_total, pg_claim_failures_total,
 *   pg_claim_dead_items_total {fleet, slot}
 * - pg_claim_handovers_total {fleet, direction: "gained" or "lost"}
 * - pg_claim_fence_rejections_total, pg_claim_reconnects_total {fleet}
 * - the gauge pg_claim_slots_held {fleet}
 * - the histogram pg_claim_batch_duration_seconds {fleet}
 */
class PromMetrics {
  /** @param {string} name the fleet's name: the value of the label `fleet` */
  constructor(name) {
    let prom;
    try {
      prom = require("prom-client");
    } catch (e) {
      throw new Error("metricsPort needs the package prom-client: npm install prom-client", { cause: e });
    }
    this.registry = new prom.Registry();
    const labels = { registers: [this.registry] };
    const c = (metric, help, labelNames = ["fleet"]) => new prom.Counter({ name: metric, help, labelNames, ...labels });
    this.items = c("pg_claim_items_total", "Items handled and committed", ["fleet", "slot"]);
    this.batches = c("pg_claim_batches_total", "Batches committed", ["fleet", "slot"]);
    this.failures = c("pg_claim_failures_total", "Failed attempts recorded with record_failure", ["fleet", "slot"]);
    this.dead = c("pg_claim_dead_items_total", "Items set aside (dead) after max attempts", ["fleet", "slot"]);
    /** lease hand-overs: `direction` "gained" (slots taken) or "lost" (given back or lost) */
    this.handovers = c("pg_claim_handovers_total",
      "Lease hand-overs: slots gained by this worker or lost by it", ["fleet", "direction"]);
    this.fenceRejections = c("pg_claim_fence_rejections_total", "Batches refused by the fence (PC001: slot lost)");
    this.reconnects = c("pg_claim_reconnects_total", "Connections lost and opened again");
    this.latency = new prom.Histogram({
      name: "pg_claim_batch_duration_seconds",
      help: "batch latency: seconds from the batch's BEGIN (with its fence and fetch) to its COMMIT,"
        + " item-by-item retries included (the batches that committed items)",
      labelNames: ["fleet"], buckets: BUCKETS, ...labels,
    });
    this.held = new prom.Gauge({ name: "pg_claim_slots_held", help: "Slots held now", labelNames: ["fleet"], ...labels });
    this.name = name;
    // the fleet's series from the start, at 0 (as the Python library's): the
    // per-slot ones appear with their slot's first batch or failure
    const fleet = { fleet: name };
    this.handovers.inc({ ...fleet, direction: "gained" }, 0);
    this.handovers.inc({ ...fleet, direction: "lost" }, 0);
    this.fenceRejections.inc(fleet, 0);
    this.reconnects.inc(fleet, 0);
    this.held.set(fleet, 0);
    this.latency.zero(fleet);
  }

  /** Starts the HTTP endpoint; resolves with the port it listens on. */
  listen(port, host) {
    this.server = http.createServer(async (req, res) => {
      if (req.url !== "/metrics" && !req.url.startsWith("/metrics?")) {
        res.writeHead(404).end("not found: /metrics\n");
        return;
      }
      try {
        const body = await this.registry.metrics();
        res.writeHead(200, { "Content-Type": this.registry.contentType }).end(body);
      } catch (e) {
        res.writeHead(500).end(String(e));
      }
    });
    return new Promise((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(port, host, () => resolve(this.server.address().port));
    });
  }

  close() {
    return new Promise((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}

module.exports = { Stats, PromMetrics, BUCKETS };
