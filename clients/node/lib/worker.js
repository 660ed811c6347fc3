"use strict";
const { Client } = require("pg");
const { durationMs, intervalText, makeHolder, isConnectionLost, isServerState, nextPause, nextSlot, waitMs, Pass, errorText, BACKOFF_CAP_MS } = require("./util");
const { Stats, PromMetrics } = require("./metrics");
const lease = require("./lease");
const batch = require("./batch");

/**
 * Raised by `run()` in session mode when the connection is not one server
 * session (a transaction-mode pooler is in between).
 */
class NotASessionError extends Error {
  constructor(message) {
    super(message);
    this.name = "NotASessionError";
    this.code = "PG_CLAIM_NOT_A_SESSION";
  }
}

const MODES = ["lease", "session", "auto"];
const { KEY, ROUTE, FAILURE, RETRY, TransientBatch } = batch;

/** The most slots claim_leases serves (its error 22023 above that). */
const MAX_LEASE_SLOTS = 1024;

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
    const o = options || {};
    const str = (k, required) => {
      if (o[k] === undefined || o[k] === null) {
        if (required) throw new TypeError(`pg-claim: option ${k} is required`);
        return null;
      }
      if (typeof o[k] !== "string" || o[k] === "") throw new TypeError(`pg-claim: option ${k} must be a non-empty string`);
      return o[k];
    };
    const int = (k, dflt, min) => {
      const v = o[k] === undefined || o[k] === null ? dflt : o[k];
      if (!Number.isInteger(v) || v < min) throw new TypeError(`pg-claim: option ${k} must be an integer of at least ${min}, got ${v}`);
      return v;
    };
    this.name = str("name", true);
    this.table = str("table", true);
    this.pending = str("pending", true);
    this.key = str("key");
    this.route = str("route");
    this.method = str("method");
    this.n = int("n", undefined, 1);
    this.batch = int("batch", 50, 1);
    this.maxAttempts = int("maxAttempts", 5, 1);
    if (typeof o.handler !== "function") throw new TypeError("pg-claim: option handler must be a function (client, rows, batch) => Promise");
    this.handler = o.handler;
    this.mode = o.mode === undefined ? "lease" : o.mode;
    if (!MODES.includes(this.mode)) throw new TypeError(`pg-claim: option mode must be one of ${MODES.join(", ")}, got ${JSON.stringify(o.mode)}`);
    if (this.mode === "lease" && this.n > MAX_LEASE_SLOTS) {
      throw new TypeError(`pg-claim: option n must be at most ${MAX_LEASE_SLOTS} in lease mode (claim_leases serves up to ${MAX_LEASE_SLOTS} slots), got ${this.n}: use fewer slots, or mode "session" on a direct connection`);
    }
    this.ttlMs = durationMs(o.ttl === undefined ? "30 seconds" : o.ttl, "ttl");
    if (this.ttlMs < 300) throw new TypeError(`pg-claim: ttl must be at least 300 milliseconds, got ${this.ttlMs}`);
    this.renewMs = o.renewInterval === undefined ? this.ttlMs / 3 : durationMs(o.renewInterval, "renewInterval");
    if (this.renewMs <= 0 || this.renewMs >= this.ttlMs) throw new TypeError("pg-claim: renewInterval must be above 0 and below ttl");
    this.backoff = o.backoff === undefined ? "10 seconds" : intervalText(durationMs(o.backoff, "backoff"));
    this.pollMs = o.pollInterval === undefined ? null : durationMs(o.pollInterval, "pollInterval");
    this.idleMs = Math.round(o.idleInTransactionTimeout === undefined ? this.ttlMs : durationMs(o.idleInTransactionTimeout, "idleInTransactionTimeout"));
    this.holder = str("holder") || makeHolder();
    this.connection = { ...(o.connection || {}), ...(o.connectionString ? { connectionString: o.connectionString } : {}) };
    this.notifyConnection = o.notifyConnectionString ? { connectionString: o.notifyConnectionString } : null;
    this.sessionPool = Boolean(o.sessionPool);
    this.metricsPort = o.metricsPort === undefined || o.metricsPort === null ? null : int("metricsPort", null, 0);
    this.metricsHost = str("metricsHost") || "127.0.0.1";
    // every wait's deadline: the query timeout (default ttl) on every
    // connection, half the ttl for a connect and the leave
    this.queryTimeoutMs = Math.round(o.queryTimeout === undefined || o.queryTimeout === null ? this.ttlMs : durationMs(o.queryTimeout, "queryTimeout"));
    this._connectMs = Math.max(100, Math.round(this.ttlMs / 2));
    this.onEvent = typeof o.onEvent === "function" ? o.onEvent : null;
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
    this._prom = null;
    // slot -> {token, until}: a slot whose last pass handled nothing, not
    // fetched again at each turn of the busy slots until pollInterval has
    // passed or a notification came (then every slot is looked at again)
    this._resting = new Map();
    this._ready = false;
    this._stopWaiters = new Set();
    this._pause = 0; // the reconnect back-off now
    this._streak = null; // {slot, key, count, pauseMs, error}: transient failures in a row of a batch's first item
    this._lostItem = null; // {slot, key, error}: the item whose handler lost the connection, one by one
    this._goodAt = null; // lease mode: when the last good claim call was sent
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
    const onSignal = () => { this.stop(); };
    if (opts.handleSignals) for (const s of ["SIGTERM", "SIGINT"]) process.on(s, onSignal);
    try {
      if (this.metricsPort !== null && this._prom === null) {
        this._prom = new PromMetrics(this.name);
        /** the port of the Prometheus endpoint (metricsPort, or the one chosen for 0) */
        this.metricsAddress = await this._prom.listen(this.metricsPort, this.metricsHost);
      }
      await this._main();
    } finally {
      if (opts.handleSignals) for (const s of ["SIGTERM", "SIGINT"]) process.removeListener(s, onSignal);
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

  // ------------------------------------------------------------------ events

  _emit(type, fields = {}) {
    if (this.onEvent === null) return;
    try {
      this.onEvent({ type, name: this.name, holder: this.holder, ...fields });
    } catch (_) { /* a hook's error never stops the worker */ }
  }

  _countHeld() {
    this.stats.slotsHeld = this.held.size;
    if (this._prom) this._prom.held.set({ fleet: this.name }, this.held.size);
  }

  // ------------------------------------------------------------- wake / wait

  /** Until woken (a notification, a change of slots, stop) or `ms` pass; the reason. */
  _wait(ms) {
    if (this._stopping) return Promise.resolve("stop");
    if (this._woken) {
      this._woken = false;
      return Promise.resolve("notify");
    }
    return new Promise((resolve) => {
      const timer = setTimeout(() => finish("timeout"), ms);
      const finish = (why) => {
        clearTimeout(timer);
        this._waiter = null;
        resolve(why);
      };
      this._waiter = finish;
    });
  }

  /** Sleeps `ms` (a back-off); only stop() ends it sooner. */
  _pauseFor(ms) {
    if (this._stopping) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => { clearTimeout(timer); this._stopWaiters.delete(done); resolve(); };
      const timer = setTimeout(done, ms);
      this._stopWaiters.add(done);
    });
  }

  /** The next pause of the back-off: doubled from 100 ms up to 5 s, in lease mode at most ttl / 3. */
  _nextPause(pause) {
    return nextPause(pause, this.mode === "lease" ? Math.min(BACKOFF_CAP_MS, this.ttlMs / 3) : BACKOFF_CAP_MS);
  }

  _wake(why) {
    if (why === "notify") this._resting.clear();
    if (this._waiter) this._waiter(why);
    else if (why === "notify") this._woken = true;
  }

  // ------------------------------------------------------------ connections

  /**
   * A new connection, every wait on it bounded: the connect by half the
   * ttl, each query by the query timeout, TCP keepalives after a third of
   * the ttl. Its transaction status (ReadyForQuery's byte: I, T or E)
   * is kept in `pgClaimStatus`; `pgClaimGone` once it broke or ended. With
   * `slot`, it is kept in this[slot] while open (stop() cuts it off).
   */
  async _connect(config, slot = null) {
    const c = new Client({
      application_name: `pg-claim ${this.name}`, connectionTimeoutMillis: this._connectMs, keepAlive: true,
      keepAliveInitialDelayMillis: Math.round(this.ttlMs / 3), query_timeout: this.queryTimeoutMs || undefined, ...config,
    });
    c.pgClaimStatus = null;
    c.pgClaimGone = false;
    c.connection.on("readyForQuery", (m) => { c.pgClaimStatus = m.status; });
    c.on("error", () => { c.pgClaimGone = true; }); // a broken connection: the next query fails and says how
    c.on("end", () => { c.pgClaimGone = true; });
    c.on("notice", () => {});
    try {
      await c.connect();
    } catch (e) {
      this._drop(c);
      throw e;
    }
    if (slot) {
      this[slot] = c;
      c.once("end", () => { if (this[slot] === c) this[slot] = null; });
    }
    return c;
  }

  /** Closes a connection without waiting for it: destroyed at once with `now`, else 0.5 s after asking. */
  _drop(c, now = false) {
    c.pgClaimGone = true;
    const stream = c.connection && c.connection.stream;
    if (now) { if (stream) stream.destroy(); return; }
    c.end().catch(() => {});
    if (stream) setTimeout(() => stream.destroy(), 500).unref();
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
          if (this.mode === "session") await this._serveSession(client, server);
          else await this._serveLease(client);
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
    for (const timer of this._cutTimers || []) clearTimeout(timer);
    this._setHeld(new Map(), "released");
    this._emit("stopped", { error: failed ? errorText(failed) : null });
    if (failed) throw failed;
  }

  /**
   * The server process of a new connection. In session mode, refuses a
   * connection whose server process is not the one the start-up reply named:
   * a pooler answers the start-up itself (its own BackendKeyData), so the
   * two differ behind PgBouncer, RDS Proxy, Supavisor or pgcat. In auto
   * mode, that decides the mode once: session on a direct connection, lease
   * otherwise.
   */
  async _check(client) {
    if (this.mode === "lease") return null;
    const pid = (await client.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
    const direct = pid === client.processID;
    if (this.mode === "auto") {
      this.mode = direct || this.sessionPool ? "session" : "lease";
      this._emit("mode", { mode: this.mode, why: direct ? "a direct connection" : this.sessionPool ? "sessionPool" : "a pooler answered the start-up" });
      if (this.mode === "lease") return null;
    }
    if (!direct && !this.sessionPool) {
      throw new NotASessionError(`pg-claim: session mode needs one server session per connection, but the server process`
        + ` (pid ${pid}) is not the one the connection was opened with (pid ${client.processID}): a connection pooler`
        + " is in between. Behind a transaction-mode pooler use mode 'lease'; through a pool in session mode, set"
        + " sessionPool: true.");
    }
    return pid;
  }

  /** Once: the table's name as the server spells it, its key, partitions, the fetch. */
  async _prepare(client) {
    // the row type by its schema-qualified name: a table named like a
    // built-in type (box, point, ...) is not that type
    const { t, rowType } = (await client.query(
      `SELECT c.oid::regclass::text AS t, format('%I.%I', n.nspname, c.relname) AS "rowType"
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::regclass`, [this.table])).rows[0];
    this._table = t;
    if (this.key === null) {
      const r = await client.query(
        `SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
         WHERE i.indrelid = $1::regclass AND i.indisprimary AND i.indnkeyatts = 1`, [t]);
      if (r.rows.length === 0) throw new Error(`pg-claim: ${t} has no single-column primary key: give the key column (option key)`);
      this.key = r.rows[0].attname;
    }
    // a table hash-partitioned with modulus n: each slot's share is one partition (pg_hash)
    this.partitioned = false;
    if (this.method === null || this.method === "pg_hash") {
      try {
        await client.query("SELECT slot_partition($1::regclass, 0, $2)", [t, this.n]);
        this.partitioned = true;
        if (this.method === null) this.method = "pg_hash";
      } catch (e) {
        if (isConnectionLost(e) || !["22023", "42501"].includes(e.code)) throw e;
      }
    }
    const q = (id) => client.escapeIdentifier(id);
    // the fetch goes out in the same message as BEGIN and the fence (one
    // round trip): a simple-protocol query, so its values are literals
    const esc = client.escapeLiteral.bind(client);
    const lit = (v) => (v === null || v === undefined ? "NULL" : typeof v === "number" ? String(v) : esc(String(v)));
    const fixed = `key => ${lit(this.key)}, batch => ${lit(this.batch)}, pending => ${lit(this.pending)}`
      + (this.route !== null ? `, route => ${lit(this.route)}` : "")
      + (this.method !== null ? `, method => ${lit(this.method)}` : "");
    const cols = `SELECT t.*, t.${q(this.key)}::text AS "${KEY}", ${this.route === null ? "NULL::text" : `t.${q(this.route)}::text`} AS "${ROUTE}",`
      + ` f.state AS "${FAILURE}", extract(epoch FROM f.retry_at - clock_timestamp())::float8 * 1000 AS "${RETRY}"`;
    // the batch's rows with their own failure records (item_failures with
    // the batch's keys reads those records only, by the primary key; a key
    // over 1024 bytes has none, record_failure refuses it)
    const tail = ` FROM t LEFT JOIN item_failures(${lit(this.name)}, VARIADIC ARRAY(SELECT t.${q(this.key)}::text FROM t`
      + ` WHERE octet_length(t.${q(this.key)}::text) <= 1024)) f ON f.item = t.${q(this.key)}::text ORDER BY t.${q(this.key)}`;
    this._fetchText = (slot, after) => `WITH t AS (SELECT * FROM my_items(NULL::${rowType}, ${lit(slot)}, ${lit(this.n)}, ${fixed},`
      + ` after => ${lit(after)}::text)) ${cols}${tail}`;
    // the first fetch checks the columns and the method now, not at the first batch
    await client.query(`SELECT count(*) FROM (${this._fetchText(0, null)} LIMIT 0) x`);
    if (this.pollMs === null) this.pollMs = this.mode === "session" || this.notifyConnection ? 30000 : 1000;
    this._ready = true;
    this._emit("start", { mode: this.mode, table: t, key: this.key, method: this.method || "auto", partitioned: this.partitioned });
  }

  async _partition(client, slot) {
    if (!this.partitioned) return null;
    if (!this._partitions.has(slot)) {
      const r = await client.query("SELECT slot_partition($1::regclass, $2, $3)::text AS p", [this._table, slot, this.n]);
      this._partitions.set(slot, r.rows[0].p);
    }
    return this._partitions.get(slot);
  }

  // ------------------------------------------------------------ the loops

  /**
   * The next batch to run: a side batch of the retry due soonest, if one is
   * due; else the next slot of the round robin after `last`. {slot, side}.
   */
  _pick(last) {
    const due = this._dueRetry();
    if (due) return { slot: due.slot, side: due };
    const now = Date.now(), held = [...this.held.keys()];
    const turn = held.filter((s) => {
      const r = this._resting.get(s);
      return !r || r.until <= now || r.token !== this.held.get(s);
    });
    return { slot: nextSlot(turn.length ? turn : held, last), side: null };
  }

  /** After a batch: a transient failure waits its back-off (true: retry that slot); else the back-off is over. */
  async _after(done) {
    if (!done.transient) {
      this._pause = 0;
      return false;
    }
    await this._pauseFor(done.pauseMs);
    return true;
  }

  async _serveLease(client) {
    let last = -1;
    const pass = new Pass();
    while (!this._stopping) {
      if (!this._leaseOk() || this.held.size === 0) { // no slot, or no good claim for 2/3 of the ttl: no work
        await this._wait(Math.min(this.renewMs, 250));
        continue;
      }
      const { slot, side } = this._pick(last);
      if (!side) last = slot;
      const done = await this._batch(client, slot, this.held.get(slot), side);
      if (await this._after(done)) {
        if (!side) last = slot - 1; // the same slot again
        continue;
      }
      const quiet = pass.after(slot, done, this.held.keys());
      if (!side && done.end && pass.quiet.has(slot)) this._resting.set(slot, { token: this.held.get(slot), until: Date.now() + this.pollMs });
      if (quiet) {
        const why = await this._wait(this._waitingMs());
        if (why === "notify") this._emit("woken", {});
        pass.clear();
        this._resting.clear();
      }
    }
  }

  async _serveSession(client, server) {
    const listening = new Set();
    const claim = async () => {
      const r = (await client.query("SELECT claim_slots($1, $2, $3) AS s, pg_backend_pid() AS pid",
        [this.name, this.n, this.n])).rows[0];
      if (r.pid !== server) {
        throw new NotASessionError(`pg-claim: claim_slots ran in server process ${r.pid}, not ${server}:`
          + " the pool is not in session mode (its claim stays with that server connection)");
      }
      this._setHeld(new Map(r.s.map((s) => [s, null])), "given back");
      await this._syncListen(client, listening, r.s);
    };
    client.on("notification", () => this._wake("notify"));
    const pass = new Pass();
    while (!this._stopping) {
      await claim(); // between rounds: take unserved slots, give one back to a waiting newcomer
      let quiet = this.held.size === 0;
      for (let i = 0, slots = [...this.held.keys()]; i < slots.length && !this._stopping;) {
        const due = this._dueRetry();
        const slot = due ? due.slot : slots[i];
        const done = await this._batch(client, slot, null, due);
        if (await this._after(done)) continue; // the same batch again
        if (!due) i++;
        quiet = pass.after(slot, done, this.held.keys());
      }
      if (this._stopping || !quiet) continue;
      const until = Date.now() + this._waitingMs();
      let why = "timeout";
      while (!this._stopping && Date.now() < until) { // each second, claim again: a slot may be given up for this one
        why = await this._wait(Math.min(1000, until - Date.now()));
        if (why !== "timeout") break;
        const before = [...this.held.keys()].join();
        await claim();
        if ([...this.held.keys()].join() !== before) { why = "slots"; break; }
      }
      if (why === "notify") this._emit("woken", {});
      pass.clear();
    }
  }

  /**
   * A whole round found nothing to do: how long to wait, told as a
   * `waiting` event. Until the first retry of an item of the held slots is
   * due, if that is sooner than the poll.
   */
  _waitingMs() {
    const retryMs = this._nextRetryMs();
    const ms = waitMs(this.pollMs, retryMs);
    this._emit("waiting", { ms, retryMs });
    return ms;
  }
}

Object.assign(Worker.prototype, lease.methods, batch.methods);

module.exports = { Worker, NotASessionError };
