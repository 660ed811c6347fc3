"use strict";
const { Client } = require("pg");
const {
  durationMs, intervalText, makeHolder, isConnectionLost, isServerState, nextPause, nextSlot, diffHeld, dueRows, waitMs, soonest, Pass,
  errorText,
} = require("./util");
const { Stats, PromMetrics } = require("./metrics");

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
// the columns a fetch adds to the table's own (taken off before the handler sees a row)
const KEY = "pg_claim:key", ROUTE = "pg_claim:route", FAILURE = "pg_claim:failure", RETRY = "pg_claim:retry";

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
    this.metricsHost = o.metricsHost;
    this.onEvent = typeof o.onEvent === "function" ? o.onEvent : null;
    /** Counters since the worker was made. */
    this.stats = new Stats();
    /** slot -> token (a string: bigint; null in session mode) of the slots held now */
    this.held = new Map();
    this._walks = new Map(); // slot -> { token, after, heldRoutes }
    this._partitions = new Map(); // slot -> partition name
    this._running = false;
    this._stopping = false;
    this._waiter = null;
    this._woken = false;
    this._prom = null;
    this._ready = false;
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
    this._stopping = true;
    this._wake("stop");
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

  _wake(why) {
    if (this._waiter) this._waiter(why);
    else if (why === "notify") this._woken = true;
  }

  // ------------------------------------------------------------ connections

  async _connect(config) {
    const c = new Client({ application_name: `pg-claim ${this.name}`, ...config });
    c.on("error", () => {}); // a broken connection: the next query fails and says how
    c.on("notice", () => {});
    try {
      await c.connect();
    } catch (e) {
      c.end().catch(() => {});
      throw e;
    }
    return c;
  }

  async _main() {
    let pause = 0, failed = null, renewal = null, listener = null;
    try {
      while (!this._stopping) {
        let client = null;
        try {
          client = await this._connect(this.connection);
          const server = await this._check(client);
          if (!this._ready) await this._prepare(client);
          if (this.mode === "lease" && renewal === null) {
            this._renewing = true;
            renewal = this._renewLoop();
          }
          if (this.mode === "lease" && this.notifyConnection && listener === null) listener = this._listenLoop();
          if (pause) this._emit("reconnected", {});
          pause = 0;
          if (this.mode === "session") await this._serveSession(client, server);
          else await this._serveLease(client);
        } catch (e) {
          // the Worker's own statements (the handler's errors are the items')
          if (!isServerState(e)) throw e;
          this.stats.reconnects++;
          if (this._prom) this._prom.reconnects.inc({ fleet: this.name });
          pause = nextPause(pause);
          this._emit("reconnecting", { error: errorText(e), pauseMs: pause });
          if (this.mode === "session") this._setHeld(new Map(), "connection lost");
          await this._wait(pause);
        } finally {
          if (client) await client.end().catch(() => {});
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
    if (this.mode === "lease" && this._ready) await this._leave();
    this._setHeld(new Map(), "stopped");
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
    const t = (await client.query("SELECT $1::regclass::text AS t", [this.table])).rows[0].t;
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
    this._fetchText = (slot, after) => `WITH t AS (SELECT * FROM my_items(NULL::${t}, ${lit(slot)}, ${lit(this.n)}, ${fixed},`
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

  // ------------------------------------------------------------ held slots

  /** Replaces the held slots; the slots taken and lost are counted and told. */
  _setHeld(now, reason) {
    const { taken, lost } = diffHeld(this.held, now);
    if (!taken.length && !lost.length) return;
    for (const { slot, token } of lost) {
      this._walks.delete(slot);
      this.stats.slotsLost++;
      if (this._prom) this._prom.handovers.inc({ fleet: this.name, direction: "lost" });
      this._emit("lost", { slot, token, reason });
    }
    for (const { slot, token } of taken) {
      this.stats.slotsTaken++;
      if (this._prom) this._prom.handovers.inc({ fleet: this.name, direction: "gained" });
      this._emit("taken", { slot, token });
    }
    this.held = new Map([...now].sort((a, b) => a[0] - b[0]));
    this._countHeld();
    this._emit("slots", { slots: [...this.held.keys()] });
    if (taken.length) this._wake("slots");
    if (this._onHeld) this._onHeld();
  }

  /** claim_leases every renewInterval (ttl / 3) on a connection of its own. */
  async _renewLoop() {
    let c = null, validUntil = 0;
    this._renewOk = false;
    while (this._renewing) {
      const asked = Date.now();
      try {
        c = c || await this._connect(this.connection);
        const { rows } = await c.query("SELECT slot, token FROM claim_leases($1, $2, $3, ttl => $4)",
          [this.name, this.n, this.holder, intervalText(this.ttlMs)]);
        if (!this._renewing) break;
        validUntil = asked + this.ttlMs;
        this._renewOk = true;
        this._setHeld(new Map(rows.map((r) => [r.slot, r.token])), "given back");
      } catch (e) {
        if (c) c.end().catch(() => {});
        c = null;
        this._renewOk = false; // no new batch until a call succeeds
        this._emit("renewal failed", { error: errorText(e) });
        if (Date.now() >= validUntil) this._setHeld(new Map(), "renewal failed for a ttl");
      }
      const rest = asked + this.renewMs - Date.now();
      if (rest > 0 && this._renewing) await new Promise((resolve) => { this._renewTimer = setTimeout(resolve, rest); this._renewSleep = resolve; });
      this._renewSleep = null;
    }
    if (c) await c.end().catch(() => {});
  }

  /** claim_leases(..., max => 0): every slot given back, the holder out of the live set. */
  async _leave() {
    if (this._renewSleep) { clearTimeout(this._renewTimer); this._renewSleep(); }
    for (let attempt = 1; attempt <= 3; attempt++) {
      let c = null;
      try {
        c = await this._connect(this.connection);
        await c.query("SELECT count(*) FROM claim_leases($1, $2, $3, max => 0)", [this.name, this.n, this.holder]);
        this._emit("left", { slots: [...this.held.keys()] });
        return;
      } catch (e) {
        if (attempt === 3) this._emit("leave failed", { error: errorText(e) }); // the leases expire after ttl
        else await new Promise((r) => setTimeout(r, 200));
      } finally {
        if (c) await c.end().catch(() => {});
      }
    }
  }

  /** LISTEN on the channels of the held slots on the direct notify connection (lease mode). */
  async _listenLoop() {
    let pause = 0;
    while (this._renewing) {
      let c = null;
      try {
        c = await this._connect(this.notifyConnection);
        pause = 0;
        c.on("notification", () => this._wake("notify"));
        let broken = null;
        c.on("error", (e) => { broken = e; this._wake("listener"); });
        const listening = new Set();
        while (this._renewing && broken === null) {
          await this._syncListen(c, listening, [...this.held.keys()]);
          await new Promise((resolve) => { this._onHeld = resolve; setTimeout(resolve, 1000); });
          this._onHeld = null;
        }
        if (broken) throw broken;
      } catch (e) {
        pause = nextPause(pause);
        this._emit("listen failed", { error: errorText(e), pauseMs: pause });
        await new Promise((r) => setTimeout(r, pause));
      } finally {
        if (c) await c.end().catch(() => {});
      }
    }
  }

  async _syncListen(c, listening, slots) {
    for (const s of slots) {
      if (listening.has(s)) continue;
      const ch = (await c.query("SELECT slot_channel($1, $2) AS c", [this.name, s])).rows[0].c;
      await c.query(`LISTEN ${c.escapeIdentifier(ch)}`);
      listening.add(s);
    }
    for (const s of [...listening]) {
      if (slots.includes(s)) continue;
      const ch = (await c.query("SELECT slot_channel($1, $2) AS c", [this.name, s])).rows[0].c;
      await c.query(`UNLISTEN ${c.escapeIdentifier(ch)}`);
      listening.delete(s);
    }
  }

  // ------------------------------------------------------------ the loops

  async _serveLease(client) {
    let last = -1;
    const pass = new Pass();
    while (!this._stopping) {
      if (!this._renewOk || this.held.size === 0) { // no slot, or the claims fail: no work
        await this._wait(this.renewMs);
        continue;
      }
      const slot = nextSlot([...this.held.keys()], last);
      last = slot;
      const done = await this._batch(client, slot, this.held.get(slot));
      if (pass.after(slot, done, this.held.keys())) {
        const why = await this._wait(this._waitingMs(pass));
        if (why === "notify") this._emit("woken", {});
        pass.clear();
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
      for (const slot of [...this.held.keys()]) {
        if (this._stopping) break;
        quiet = pass.after(slot, await this._batch(client, slot, null), this.held.keys());
      }
      if (this._stopping || !quiet) continue;
      const until = Date.now() + this._waitingMs(pass);
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
   * `waiting` event. Until the first retry of an item seen in the held
   * slots' last passes, if that is sooner than the poll.
   */
  _waitingMs(pass) {
    const retryMs = this.held.size ? pass.retryMs(this.held.keys()) : null;
    const ms = waitMs(this.pollMs, retryMs);
    this._emit("waiting", { ms, retryMs });
    return ms;
  }

  _walk(slot, token) {
    let w = this._walks.get(slot);
    if (!w || w.token !== token) { // a slot taken anew is walked from the start of its share
      w = { token, after: null, heldRoutes: this.route === null ? null : new Set() };
      this._walks.set(slot, w);
    }
    return w;
  }

  /**
   * Opens the batch's transaction in one message (one round trip): BEGIN,
   * in lease mode the idle limit and the fence first, then with `fetch` (the
   * fetch's SQL) the slot's next rows. The rows ([] without `fetch`), or
   * null when the fence refused the token (rolled back).
   */
  async _begin(client, slot, token, fetch = null) {
    // a worker paused inside its fenced transaction (SIGSTOP, a GC pause)
    // holds its slot: the server ends that transaction after idleMs, so
    // the slot moves on as a lease would
    const idle = this.idleMs > 0 ? `SET LOCAL idle_in_transaction_session_timeout = ${this.idleMs}; ` : "";
    const open = token === null ? "BEGIN"
      : `BEGIN; ${idle}SELECT fence(${client.escapeLiteral(this.name)}, ${slot}, ${token}::bigint)`;
    try {
      const r = await client.query(fetch === null ? open : `${open}; ${fetch}`);
      return fetch === null ? [] : r[r.length - 1].rows;
    } catch (e) {
      if (isConnectionLost(e)) throw e;
      await client.query("ROLLBACK");
      if (e.code !== "PC001") throw e;
      this.stats.fenced++;
      if (this._prom) this._prom.fenceRejections.inc({ fleet: this.name });
      if (this.held.get(slot) === token) { // until a claim returns it again
        const now = new Map(this.held);
        now.delete(slot);
        this._setHeld(now, "fence refused the token");
      }
      return null;
    }
  }

  async _commit(client) {
    const r = await client.query("COMMIT");
    if (r.command === "ROLLBACK") throw new Error("the transaction was aborted (an error inside the handler was caught and ignored), so COMMIT rolled it back");
  }

  /**
   * One batch of `slot`'s share: BEGIN, fence (lease mode) and the fetch in
   * one message, the handler, COMMIT. {handled: items committed, end: the share is walked}.
   */
  async _batch(client, slot, token) {
    const w = this._walk(slot, token);
    const partition = await this._partition(client, slot);
    const rows = await this._begin(client, slot, token, this._fetchText(slot, w.after));
    if (rows === null) return { handled: 0, end: true, fenced: true };
    let committed = false;
    try {
      const end = rows.length < this.batch;
      const items = rows.map((r) => {
        const it = { key: r[KEY], route: r[ROUTE], failure: r[FAILURE], retryMs: r[RETRY], row: r };
        delete r[KEY]; delete r[ROUTE]; delete r[FAILURE]; delete r[RETRY];
        return it;
      });
      const due = dueRows(items, w.heldRoutes);
      let retryMs = soonest(items.filter((it) => it.failure === "retry").map((it) => it.retryMs));
      const next = end ? null : items[items.length - 1].key;
      const info = { name: this.name, slot, token, partition, table: this._table, holder: this.holder };
      if (due.length === 0) {
        await this._commit(client);
        committed = true;
        this._advance(slot, w, next, end);
        return { handled: 0, end, retryMs };
      }
      const t0 = process.hrtime.bigint();
      let ok = due;
      try {
        await this.handler(client, due.map((it) => it.row), info);
        await this._clear(client, due);
        await this._commit(client);
        committed = true;
      } catch (e) {
        if (isConnectionLost(e)) throw e;
        await client.query("ROLLBACK");
        const r = await this._oneByOne(client, slot, token, due, info, w);
        if (r === null) return { handled: 0, end: true, fenced: true };
        ok = r.ok;
        retryMs = soonest([retryMs, r.retryMs]);
        committed = true;
      }
      this._advance(slot, w, next, end);
      const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
      this.stats.items += ok.length;
      this.stats.batches++;
      this.stats.batchSeconds += seconds;
      if (this._prom) {
        this._prom.items.inc({ fleet: this.name, slot }, ok.length);
        this._prom.batches.inc({ fleet: this.name, slot });
        this._prom.latency.observe({ fleet: this.name }, seconds);
      }
      this._emit("batch", { slot, token, items: ok.length, failed: due.length - ok.length, seconds });
      return { handled: due.length, end, retryMs };
    } finally {
      if (!committed) await client.query("ROLLBACK").catch(() => {});
    }
  }

  _advance(slot, w, next, end) {
    if (this._walks.get(slot) !== w) return; // the slot moved meanwhile: its next holder walks it from the start
    w.after = next;
    if (end && w.heldRoutes) w.heldRoutes.clear(); // a new pass: the held routes are looked at again
  }

  async _clear(client, items) {
    const cleared = items.filter((it) => it.failure !== null).map((it) => it.key);
    if (cleared.length) await client.query("SELECT clear_failure($1, VARIADIC $2::text[])", [this.name, cleared]);
  }

  /**
   * The batch again item by item, each under a savepoint: a failing item is
   * rolled back to its savepoint and recorded with record_failure (back-off,
   * max attempts), the others commit. {ok: the items committed,
   * retryMs: until the first recorded retry}; null when the
   * fence refused.
   */
  async _oneByOne(client, slot, token, due, info, w) {
    if ((await this._begin(client, slot, token)) === null) return null;
    // reported once the transaction has committed: a failure record that a
    // lost connection rolled back is no attempt
    const ok = [], failedRoutes = new Set(), outcomes = [];
    let retryMs = null;
    for (const it of due) {
      if (it.route !== null && failedRoutes.has(it.route)) continue; // behind a failed item of its route
      await client.query("SAVEPOINT pg_claim_item");
      try {
        await this.handler(client, [it.row], info);
        await client.query("RELEASE SAVEPOINT pg_claim_item");
        ok.push(it);
      } catch (e) {
        if (isConnectionLost(e)) throw e;
        await client.query("ROLLBACK TO SAVEPOINT pg_claim_item");
        const error = errorText(e);
        const state = (await client.query("SELECT record_failure($1, $2, $3, $4, $5) AS s",
          [this.name, it.key, error, this.maxAttempts, this.backoff])).rows[0].s;
        if (state !== "dead") {
          retryMs = soonest([retryMs, (await client.query(
            "SELECT extract(epoch FROM retry_at - clock_timestamp())::float8 * 1000 AS ms FROM item_failures($1, $2)",
            [this.name, it.key])).rows[0].ms]);
        }
        if (state !== "dead" && it.route !== null) {
          failedRoutes.add(it.route);
          if (w.heldRoutes) w.heldRoutes.add(it.route);
        }
        outcomes.push({ slot, item: it.key, error, state });
      }
    }
    await this._clear(client, ok);
    await this._commit(client);
    for (const f of outcomes) {
      this.stats.failures++;
      if (this._prom) this._prom.failures.inc({ fleet: this.name, slot: f.slot });
      if (f.state === "dead") {
        this.stats.deadItems++;
        if (this._prom) this._prom.dead.inc({ fleet: this.name, slot: f.slot });
      }
      this._emit("failure", f);
    }
    return { ok, retryMs };
  }
}

module.exports = { Worker, NotASessionError };
