"use strict";
// A Worker's configuration: its options, checked (configure), and what it
// reads once from the server (methods mixed into Worker.prototype): the
// mode (a session or a pooler), the table, its key, its partitions, the fetch.
const { durationMs, intervalText, makeHolder, isConnectionLost } = require("./util");
const { OPTIONS, RENAMED } = require("./vocabulary");
const { Backlog } = require("./backlog");

const OPTION_NAMES = new Set(OPTIONS.map(([name]) => name));

// the columns a fetch adds to the table's own (taken off before the handler sees a row)
const KEY = "pg_claim:key", ROUTE = "pg_claim:route", FAILURE = "pg_claim:failure", RETRY = "pg_claim:retry";

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

/** The most slots claim_leases serves (its error 22023 above that). */
const MAX_LEASE_SLOTS = 1024;
// Statement texts both libraries send, kept alike in the Python library's
// _config.py (its test_parity compares them): {k} is the key column, {items}
// the slot's share (my_items, or the Citus share of scale-out.md), {name} the
// fleet. A window of the slot's pending rows, counted (one bounded index
// walk), and the key of its last row: a top-1 over the window's keys, not a
// sorted array of them (half the cost).
const COUNT_SQL = "WITH w AS MATERIALIZED (SELECT c.{k} FROM {items} c)"
  + " SELECT count(*) AS pending, (SELECT w.{k}::text FROM w ORDER BY w.{k} DESC LIMIT 1) AS last FROM w";
// The end of the fetch: the batch's rows with their own failure records
// (item_failures with the batch's keys reads those records only, by the
// primary key; a key over 1024 bytes has none, record_failure refuses it).
const FAILURES_SQL = " FROM t LEFT JOIN item_failures({name}, VARIADIC ARRAY(SELECT t.{k}::text FROM t"
  + " WHERE octet_length(t.{k}::text) <= 1024)) f ON f.item = t.{k}::text ORDER BY t.{k}";
// The same end while the name has no failure record (has_failures: see
// failures.js, Records): the same columns, no record read.
const NO_FAILURES_SQL = " FROM t LEFT JOIN (SELECT NULL::text AS item, NULL::text AS state,"
  + " NULL::timestamptz AS retry_at) f ON false ORDER BY t.{k}";
// fill(TEXT, VALUES): TEXT with each {name} replaced by VALUES[name]
const fill = (text, values) => text.replace(/\{(\w+)\}/g, (_, name) => values[name]);

/**
 * Reads and checks a Worker's options (README.md, docs/libraries.md) into `w`.
 * @param {object} w the Worker
 * @param {import('../index').WorkerOptions} options
 */
function configure(w, options) {
  const o = options || {};
  for (const k of Object.keys(o)) {
    if (OPTION_NAMES.has(k)) continue;
    const hint = RENAMED[k] ? ` (renamed ${RENAMED[k]} in 0.6.0)` : "";
    throw new TypeError(`pg-claim: unknown option ${k}${hint}: the options are those of docs/libraries.md (describe().options)`);
  }
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
  w.name = str("name", true);
  w.table = str("table", true);
  w.pending = str("pending", true);
  w.key = str("key");
  w.route = str("route");
  w.method = str("method");
  w.n = int("n", undefined, 1);
  w.batch = int("batch", 50, 1);
  w.maxAttempts = int("maxAttempts", 5, 1);
  // tenants (docs/tenants.md): the batches are my_items_fair's
  w.fair = str("fair");
  w.spread = o.spread === undefined || o.spread === null ? null : int("spread", null, 1);
  if (w.spread !== null && w.spread > w.n) throw new TypeError(`pg-claim: option spread must be between 1 and n = ${w.n}, got ${w.spread}`);
  if (w.spread !== null && w.route === null) {
    throw new TypeError(`pg-claim: option spread needs route: the tenant column, whose rows spread over at most ${w.spread} slots (slot_of_spread(route, key, n, spread))`);
  }
  w.tenants = w.fair !== null || w.spread !== null;
  if (w.tenants && w.method !== null) {
    throw new TypeError(`pg-claim: option method ${JSON.stringify(w.method)} does not go with fair or spread: their batches are read by my_items_fair, with slot_of (or slot_of_spread) of the route column`);
  }
  // Citus (docs/scale-out.md): the distribution column and each slot's value of it
  w.shardColumn = str("shardColumn");
  w.shardKeys = shardKeys(w, o.shardKeys);
  w.maxSlots = int("maxSlots", w.n, 1);
  w._maxSlotsGiven = o.maxSlots === undefined || o.maxSlots === null ? null : w.maxSlots; // a resize keeps it (at most the new n)
  if (w.maxSlots > w.n) throw new TypeError(`pg-claim: option maxSlots must be between 1 and n = ${w.n}, got ${w.maxSlots}`);
  if (typeof o.handler !== "function") throw new TypeError("pg-claim: option handler must be a function (client, rows, batch) => Promise");
  w.handler = o.handler;
  w.mode = o.mode === undefined ? "lease" : o.mode;
  if (!MODES.includes(w.mode)) throw new TypeError(`pg-claim: option mode must be one of ${MODES.join(", ")}, got ${JSON.stringify(o.mode)}`);
  if (w.mode === "lease" && w.n > MAX_LEASE_SLOTS) {
    throw new TypeError(`pg-claim: option n must be at most ${MAX_LEASE_SLOTS} in lease mode (claim_leases serves up to ${MAX_LEASE_SLOTS} slots), got ${w.n}: use fewer slots, or mode "session" on a direct connection`);
  }
  w.ttlMs = durationMs(o.ttl === undefined ? "30 seconds" : o.ttl, "ttl");
  if (w.ttlMs < 300) throw new TypeError(`pg-claim: ttl must be at least 300 milliseconds, got ${w.ttlMs}`);
  w.renewMs = o.renewInterval === undefined ? w.ttlMs / 3 : durationMs(o.renewInterval, "renewInterval");
  if (w.renewMs <= 0 || w.renewMs >= w.ttlMs) throw new TypeError("pg-claim: renewInterval must be above 0 and below ttl");
  w.backoff = o.backoff === undefined ? "10 seconds" : intervalText(durationMs(o.backoff, "backoff"));
  w.pollMs = o.pollInterval === undefined ? null : durationMs(o.pollInterval, "pollInterval");
  w.idleMs = Math.round(o.idleInTransactionTimeout === undefined ? w.ttlMs : durationMs(o.idleInTransactionTimeout, "idleInTransactionTimeout"));
  w.holder = str("holder") || makeHolder();
  w.connection = { ...(o.connection || {}), ...(str("conninfo") ? { connectionString: o.conninfo } : {}) };
  w.notifyConnection = str("notifyConninfo") ? { connectionString: o.notifyConninfo } : null;
  w.sessionPool = Boolean(o.sessionPool);
  if (o.balance !== undefined && typeof o.balance !== "boolean") throw new TypeError(`pg-claim: option balance must be true or false, got ${JSON.stringify(o.balance)}`);
  w.balance = o.balance !== false;
  // lease mode's balance (docs/leases.md, "Balancing"): each held slot's weight as
  // its batches count it (backlog.js), and the slots the last report said
  // another holder wants
  w._backlog = new Backlog(w.batch);
  w._lastFetch = { fetched: 0, counted: null }; // the last batch's rows and its window's count {pending, last}
  w._wanted = new Set();
  w._leaving = new Set();
  w.metricsPort = o.metricsPort === undefined || o.metricsPort === null ? null : int("metricsPort", null, 0);
  w.metricsHost = str("metricsHost") || "127.0.0.1";
  // every wait's deadline: the query timeout (default ttl) on every
  // connection, half the ttl for a connect and the leave
  w.queryTimeoutMs = Math.round(o.queryTimeout === undefined || o.queryTimeout === null ? w.ttlMs : durationMs(o.queryTimeout, "queryTimeout"));
  w._connectMs = Math.max(100, Math.round(w.ttlMs / 2));
  w.onEvent = typeof o.onEvent === "function" ? o.onEvent : null;
}

/** The options shardColumn and shardKeys, checked: both or neither; a key for every slot of n. */
function shardKeys(w, keys) {
  if (w.shardColumn === null && (keys === undefined || keys === null)) return null;
  if (w.shardColumn === null || keys === undefined || keys === null) {
    throw new TypeError("pg-claim: options shardColumn and shardKeys go together: the column Citus distributes the table by, and each slot's value of it (docs/scale-out.md, \"The worker library on Citus\")");
  }
  if (typeof keys !== "object") throw new TypeError(`pg-claim: option shardKeys must map each slot to its shard key (an object, a Map or an array), got ${JSON.stringify(keys)}`);
  if ((w.method !== null && w.method !== "auto") || w.tenants) {
    throw new TypeError(`pg-claim: option shardColumn reads each slot's share as slot_of(route, n): it does not go with method ${JSON.stringify(w.method)}, fair or spread`);
  }
  const map = keys instanceof Map ? new Map([...keys].map(([k, v]) => [Number(k), v])) : new Map(Object.entries(keys).map(([k, v]) => [Number(k), v]));
  for (let s = 0; s < w.n; s++) {
    if (map.get(s) === undefined || map.get(s) === null) throw new TypeError(`pg-claim: option shardKeys has no key for slot ${s} of n = ${w.n}: give every slot its shard key`);
  }
  return map;
}

const methods = {
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
      this._emit("mode", { mode: this.mode, why: direct ? "a direct connection" : this.sessionPool ? "a session pool" : "a pooler answered the start-up" });
      if (this.mode === "lease") return null;
    }
    if (!direct && !this.sessionPool) {
      throw new NotASessionError(`pg-claim: session mode needs one server session per connection, but the server process`
        + ` (pid ${pid}) is not the one the connection was opened with (pid ${client.processID}): a connection pooler`
        + " is in between. Behind a transaction-mode pooler use mode 'lease'; through a pool in session mode, set"
        + " sessionPool: true.");
    }
    return pid;
  },

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
    if (!this.tenants && this.shardKeys === null && (this.method === null || this.method === "pg_hash")) {
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
    // with fair or spread, my_items_fair takes the slot's tenants in turn; it
    // has no cursor, so each batch reads the slot's first pending rows again
    // (the handler's done rows are no longer among them). The slot is
    // slot_of(route, n), route defaulting to the key as for my_items, or
    // slot_of_spread(route, key, n, spread).
    const fixed = (batch) => `key => ${lit(this.key)}, batch => ${lit(batch)}, pending => ${lit(this.pending)}`
      + (this.tenants ? `, fair => ${lit(this.fair || this.route)}, route => ${lit(this.route || this.key)}` : "")
      + (this.spread !== null ? `, spread => ${lit(this.spread)}` : "")
      + (!this.tenants && this.route !== null ? `, route => ${lit(this.route)}` : "")
      + (this.method !== null ? `, method => ${lit(this.method)}` : "");
    const cols = `SELECT t.*, t.${q(this.key)}::text AS "${KEY}", ${this.route === null ? "NULL::text" : `t.${q(this.route)}::text`} AS "${ROUTE}",`
      + ` f.state AS "${FAILURE}", extract(epoch FROM f.retry_at - clock_timestamp())::float8 * 1000 AS "${RETRY}"`;
    // the batch's failure records joined, or left out (while the name has none)
    const tail = fill(FAILURES_SQL, { name: lit(this.name), k: q(this.key) });
    const plain = fill(NO_FAILURES_SQL, { k: q(this.key) });
    const args = (slot, batch = this.batch) => `NULL::${rowType}, ${lit(slot)}, ${lit(this.n)}, ${fixed(batch)}`;
    const fair = (slot) => `my_items_fair(${args(slot)})`;
    const keyOrder = this.shardKeys !== null ? await this._shardShare(client, t, q, lit)
      : (slot, after, batch = this.batch) => `my_items(${args(slot, batch)}, after => ${lit(after)}::text)`;
    this._fetchText = (slot, after, join = true) => `WITH t AS (SELECT * FROM ${this.tenants ? fair(slot) : keyOrder(slot, after)} s) ${cols}${join ? tail : plain}`;
    // balance: COUNT_SQL; my_items_fair has no cursor: no count
    this._countText = this.tenants ? null
      : (slot, after, bound) => fill(COUNT_SQL, { k: q(this.key), items: keyOrder(slot, after, bound) });
    // the first fetch checks the columns and the method now, not at the first batch
    await client.query(`SELECT count(*) FROM (${this._fetchText(0, null)} LIMIT 0) x`);
    if (this.pollMs === null) this.pollMs = this.mode === "session" || this.notifyConnection ? 30000 : 1000;
    this._ready = true;
    this._emit("started", { mode: this.mode, table: t, key: this.key, method: this.method || "auto", partitioned: this.partitioned });
  },

  /**
   * Citus (docs/scale-out.md, "The worker library on Citus"): the slot's
   * share read with the slot's shard key as well, so that Citus sends it to
   * the one shard holding it. The rows of the slot by the mapping
   * (slot_of(route, n), as my_items with method auto) that have the slot's
   * shard key, after the cursor, in key order.
   */
  async _shardShare(client, table, q, lit) {
    const types = new Map((await client.query(
      `SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute
       WHERE attrelid = $1::regclass AND attname = ANY($2::text[]) AND attnum > 0 AND NOT attisdropped`,
      [table, [this.key, this.shardColumn, this.pending]])).rows.map((r) => [r.attname, r.type]));
    if (!types.has(this.shardColumn)) throw new Error(`pg-claim: ${table} has no column ${JSON.stringify(this.shardColumn)} (option shardColumn)`);
    const pending = types.get(this.pending) === "boolean" ? `NOT ${q(this.pending)}` : `${q(this.pending)} IS NULL`;
    const k = q(this.key);
    return (slot, after, batch = this.batch) => `(SELECT * FROM ${table} WHERE ${q(this.shardColumn)} = ${lit(this._shardKey(slot))}`
      + ` AND slot_of(${q(this.route || this.key)}, ${lit(this.n)}) = ${lit(slot)} AND ${pending}`
      + (after === null || after === undefined ? "" : ` AND ${k} > ${lit(after)}::text::${types.get(this.key)}`)
      + ` ORDER BY ${k} LIMIT ${lit(batch)})`;
  },

  _shardKey(slot) {
    const key = this.shardKeys.get(slot);
    if (key === undefined || key === null) throw new Error(`pg-claim: option shardKeys has no key for slot ${slot} of n = ${this.n}: give every slot its shard key`);
    return key;
  },

  async _partition(client, slot) {
    if (!this.partitioned) return null;
    if (!this._partitions.has(slot)) {
      const r = await client.query("SELECT slot_partition($1::regclass, $2, $3)::text AS p", [this._table, slot, this.n]);
      this._partitions.set(slot, r.rows[0].p);
    }
    return this._partitions.get(slot);
  },
};

module.exports = { configure, methods, NotASessionError, MODES, MAX_LEASE_SLOTS, COUNT_SQL, FAILURES_SQL, NO_FAILURES_SQL, KEY, ROUTE, FAILURE, RETRY };
