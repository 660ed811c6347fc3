"use strict";
// pg-claim's Worker, made of its parts (one file each): the configuration
// (config.js), the connections (conn.js), the claims (claimer.js), an online
// resize of the fleet (resize.js), the walk and the fence (walk.js), the failure path (failures.js), the wake-ups
// (wake.js), the signals (signals.js) and the metrics (metrics.js).
const { isServerState, errorText } = require("./util");
const { Stats, PromMetrics } = require("./metrics");
const config = require("./config");
const { Records, TransientBatch } = require("./failures");
const { handleSignals } = require("./signals");
const { EVENTS } = require("./vocabulary");

const EVENT_NAMES = new Set(EVENTS);

const { configure, NotASessionError } = config;

/**
 * A pg_claim worker: claims slots of a fleet, walks each held slot's share of
 * a table in batches (`my_items`) and hands each batch to `handler` inside a
 * transaction, fenced in lease mode. See README.md.
 */
class Worker {
  /**
   * @param {import('../index').WorkerOptions} options
   */
  constructor(options) {
    configure(this, options);
    /** Counters since the worker was made. */
    this.stats = new Stats();
    /** slot -> token (a string: bigint; null in session mode) of the slots held now */
    this.held = new Map();
    this._walks = new Map(); // slot -> { token, after, heldRoutes, retries: key -> {cursor, at} }
    this._partitions = new Map(); // slot -> partition name
    this._running = false;
    this._stopping = false;
    this._waiter = null;
    this._woken = false;
    // slot -> {token, until}: a slot whose last pass handled nothing, not
    // fetched again at each turn of the busy slots until pollInterval has
    // passed or a notification came (then every slot is looked at again)
    this._resting = new Map();
    this._prom = null;
    this._ready = false;
    this._stopWaiters = new Set();
    this._pause = 0; // the reconnect back-off now
    this._streak = null; // {slot, key, count, pauseMs, error}: transient failures in a row of a batch's first item
    this._records = new Records(); // whether the name has failure records (has_failures)
    this._lostItem = null; // {slot, key, error}: the item whose handler lost the connection, one by one
    this._goodAt = null; // lease mode: when the last good claim call was sent
    this._claimNow = false; // lease mode: a resize was followed, the renewal calls again at once
    this._fatal = null; // an error of the renewal that stops the worker (a resize it cannot follow)
  }

  /**
   * Works until `stop()` (or SIGTERM/SIGINT with `handleSignals`): resolves
   * once the last batch is committed and the slots are given back. Rejects
   * on an error that is not a lost connection (a refused session, a missing
   * table, a handler that breaks the transaction protocol, ...), after giving
   * the slots back.
   * @param {{handleSignals?: boolean}} [opts]
   * @returns {Promise<void>}
   */
  async run(opts = {}) {
    if (this._running) throw new Error("pg-claim: this worker is already running");
    this._running = true;
    this._stopping = false;
    this._done = new Promise((resolve) => { this._resolveDone = resolve; });
    const unhandle = opts.handleSignals ? handleSignals(() => this.stop()) : () => {};
    try {
      if (this.metricsPort !== null && this._prom === null) {
        this._prom = new PromMetrics(this.name);
        /** the port of the Prometheus endpoint (metricsPort, or the one chosen for 0) */
        this.metricsAddress = await this._prom.listen(this.metricsPort, this.metricsHost);
      }
      await this._main();
    } finally {
      unhandle();
      if (this._prom) { await this._prom.close(); this._prom = null; }
      this._running = false;
      this._resolveDone();
    }
  }

  /**
   * Asks the worker to stop: it finishes the batch in progress, gives its
   * slots back and `run()` resolves. Returns a promise of that.
   * @returns {Promise<void>}
   */
  stop() {
    if (!this._running) return Promise.resolve();
    if (!this._stopping) {
      this._stopping = true;
      this._stopDeadline = Date.now() + this.ttlMs - 100;
      this._wake("stop");
      for (const f of [...this._stopWaiters]) f();
      // a claim call still running a quarter of the ttl later, a batch still
      // running half-way to the ttl (a half-open connection, a hung handler)
      // are cut off: the leave gets the rest of the ttl
      const cut = (slot) => { if (this[slot]) this._drop(this[slot], true); };
      this._cutTimers = [setTimeout(cut, this.ttlMs / 4, "_renewClient"), setTimeout(cut, this.ttlMs / 2, "_batchClient")];
    }
    return this._done;
  }

  _emit(type, fields = {}) {
    if (!EVENT_NAMES.has(type)) throw new Error(`pg-claim: ${type} is not an event of the vocabulary`);
    if (this.onEvent === null) return;
    try {
      this.onEvent({ type, name: this.name, holder: this.holder, ...fields });
    } catch (_) { /* a hook's error never stops the worker */ }
  }

  _countHeld() {
    this.stats.slotsHeld = this.held.size;
    if (this._prom) this._prom.held.set({ fleet: this.name }, this.held.size);
  }

  async _main() {
    let lost = false, failed = null, renewal = null, listener = null;
    try {
      while (!this._stopping) {
        let client = null;
        try {
          client = await this._connect(this.connection, "_batchClient");
          const server = await this._check(client);
          if (!this._ready) await this._prepare(client);
          if (this.mode === "lease" && renewal === null) {
            this._renewing = true;
            renewal = this._renewLoop();
          }
          if (this.mode === "lease" && this.notifyConnection && listener === null) listener = this._listenLoop();
          if (lost) this._emit("reconnected", {});
          lost = false;
          if (this.mode === "session") {
            await this._serveSession(client, server);
            await this._releaseSession(client);
          } else await this._serveLease(client);
        } catch (e) {
          // the Worker's own statements (the handler's errors are the items')
          if (!(e instanceof TransientBatch) && !isServerState(e)) throw e;
          if (this.mode === "session") this._setHeld(new Map(), "connection lost");
          if (this._stopping) break;
          lost = true;
          this.stats.reconnects++;
          if (this._prom) this._prom.reconnects.inc({ fleet: this.name });
          // the same back-off as a transient batch's: a handler that ends
          // its client every time is not reconnected for at once
          this._pause = e instanceof TransientBatch ? e.pauseMs : this._nextPause(this._pause);
          this._emit("reconnecting", { error: errorText(e), pauseMs: this._pause });
          await this._pauseFor(this._pause);
        } finally {
          if (client) this._drop(client);
        }
      }
    } catch (e) {
      failed = e;
    }
    // leave: the batch is done; give the slots back
    this._renewing = false;
    this._wake("stop");
    if (renewal) await renewal;
    if (listener) await listener;
    if (this.mode === "lease" && this._ready) await this._leave(this._stopDeadline || Date.now() + this.ttlMs);
    if (!failed && this._fatal) failed = this._fatal;
    for (const timer of this._cutTimers || []) clearTimeout(timer);
    this._setHeld(new Map(), "released");
    this._emit("stopped", { error: failed ? errorText(failed) : null });
    if (failed) throw failed;
  }
}

for (const part of ["./config", "./conn", "./claimer", "./resize", "./walk", "./failures", "./wake"]) {
  Object.assign(Worker.prototype, require(part).methods);
}

module.exports = { Worker, NotASessionError };
