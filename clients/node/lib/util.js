"use strict";
// Pure helpers of the worker: no database, no timers (unit-tested alone).
const crypto = require("crypto");
const os = require("os");

const UNITS = {
  ms: 1, msec: 1, msecs: 1, millisecond: 1, milliseconds: 1,
  s: 1000, sec: 1000, secs: 1000, second: 1000, seconds: 1000,
  min: 60000, mins: 60000, minute: 60000, minutes: 60000,
  h: 3600000, hour: 3600000, hours: 3600000,
};

/**
 * Milliseconds of a duration given as a number of milliseconds or as the text
 * of a PostgreSQL interval in one unit (`'5 seconds'`, `'500 milliseconds'`,
 * `'2 min'`, `'1.5s'`).
 * @param {number|string} value
 * @param {string} what the option's name, for the error message
 * @returns {number}
 */
function durationMs(value, what) {
  if (typeof value === "number") {
    if (!Number.isFinite(value) || value < 0) throw new TypeError(`${what} must be a non-negative number of milliseconds, got ${value}`);
    return value;
  }
  if (typeof value === "string") {
    const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$/i.exec(value);
    if (m && UNITS[m[2].toLowerCase()] !== undefined) return Number(m[1]) * UNITS[m[2].toLowerCase()];
  }
  throw new TypeError(`${what} must be milliseconds or an interval in one unit such as '5 seconds', got ${JSON.stringify(value)}`);
}

/** The interval text PostgreSQL reads for `ms` milliseconds. */
const intervalText = (ms) => `${ms} milliseconds`;

/**
 * A holder name unique to this process and this call: `host:pid:random`
 * (8 random bytes in hex), so two processes never share one, on one machine
 * or after a pid is reused.
 * @returns {string}
 */
function makeHolder() {
  return `${os.hostname()}:${process.pid}:${crypto.randomBytes(8).toString("hex")}`;
}

/**
 * Whether an error is a lost connection (the server restarted or ended the
 * session, the network failed, the pooler dropped the client) rather than
 * an error of the statement: class 08 (connection exception), 57P01-57P03
 * (shutdown), 25P03 (idle in transaction too long), a socket error code
 * (`ECONNREFUSED`, `ECONNRESET`, ...), or node-postgres' own messages (a
 * query past its `query_timeout` included: its connection is given up).
 * @param {any} e
 */
function isConnectionLost(e) {
  if (!e) return false;
  const code = typeof e.code === "string" ? e.code : "";
  if (/^(08|57P0[123]|25P03)/.test(code) || /^E[A-Z]+$/.test(code)) return true;
  return /Connection terminated|not queryable|Query read timeout|server conn crashed|Client has encountered a connection error|connection (?:is )?closed|timeout expired|Connection refused/i
    .test(String(e.message || ""));
}

/**
 * Whether an error of one of the Worker's own statements (claim, fetch,
 * fence, commit; never the handler's) is the server's state rather than a
 * fault of the Worker: a lost connection, or class 40 (serialization
 * failure, deadlock), 53 (resources), 57 (a cancel, an operator
 * intervention), 58 (system error) or a lock wait given up (55P03: a claim
 * gives up waiting for its fleet's claim mutex after ttl / 3). The Worker
 * reconnects and goes on.
 * @param {any} e
 */
function isServerState(e) {
  if (isConnectionLost(e)) return true;
  const code = e && typeof e.code === "string" ? e.code : "";
  return /^(40|53|57|58|55P03)/.test(code);
}

/** The first pause of the back-off (transient failures, reconnects), and its longest. */
const BACKOFF_FIRST_MS = 100, BACKOFF_CAP_MS = 5000;
/** Transient failures in a row of a batch's first item after which the batch takes the failure path. */
const TRANSIENT_LIMIT = 5;

/** The next pause of a back-off: doubled, from 100 ms up to `cap`. */
const nextPause = (pause, cap = BACKOFF_CAP_MS) => Math.min(cap, pause ? pause * 2 : BACKOFF_FIRST_MS);

/**
 * Whether a handler's error is transient, worth the batch again after a
 * back-off rather than a failure of its items: a lost connection (class 08,
 * 57P01-57P03, a socket error, the client ended), a serialization failure
 * (40001), a deadlock (40P01), class 53 (resources) or 58 (system error).
 * @param {any} e
 */
function isTransient(e) {
  if (isConnectionLost(e)) return true;
  const code = e && typeof e.code === "string" ? e.code : "";
  return /^(53|58|40001|40P01)/.test(code);
}

/**
 * The next slot to serve after `last`, round robin over the held slots.
 * @param {number[]} slots held slots, any order
 * @param {number} last the slot served last (-1: none)
 * @returns {number|null}
 */
function nextSlot(slots, last) {
  if (slots.length === 0) return null;
  const sorted = [...slots].sort((a, b) => a - b);
  return sorted.find((s) => s > last) ?? sorted[0];
}

/**
 * What changed between two maps slot -> token: the slots taken (new, or held
 * again with a new token) and the slots lost (gone, or their token changed).
 * @param {Map<number,string>} before
 * @param {Map<number,string>} after
 */
function diffHeld(before, after) {
  const taken = [], lost = [];
  for (const [slot, token] of before) if (after.get(slot) !== token) lost.push({ slot, token });
  for (const [slot, token] of after) if (before.get(slot) !== token) taken.push({ slot, token });
  return { taken, lost };
}

/**
 * The rows of a batch to hand to the handler: the due ones (no failure
 * record, or one whose back-off is over), skipping dead items and items
 * waiting for a retry; with `route`, a row whose route value waits for an
 * earlier failed row (in `heldRoutes`, which it updates) is held back too,
 * so one route value's rows stay in key order.
 * @param {{failure: string|null, route: string|null}[]} rows
 * @param {Set<string>|null} heldRoutes
 */
function dueRows(rows, heldRoutes) {
  const due = [];
  for (const r of rows) {
    if (r.failure === "dead") continue;
    if (heldRoutes && r.route !== null && heldRoutes.has(r.route)) continue;
    if (r.failure === "retry") {
      if (heldRoutes && r.route !== null) heldRoutes.add(r.route);
      continue;
    }
    due.push(r);
  }
  return due;
}

/**
 * How long to wait when a whole round found nothing to do: until the next
 * retry of a failed item if it is sooner than the poll, never less than
 * `floor` (no busy loop on a retry that is due now).
 * @param {number} pollMs
 * @param {number|null} retryInMs milliseconds until the next retry; null: none
 */
function waitMs(pollMs, retryInMs, floor = 100) {
  const ms = retryInMs === null || retryInMs === undefined ? pollMs : Math.min(pollMs, retryInMs);
  return Math.max(floor, ms);
}

/** The smallest of the numbers that are not null or undefined; null when none is. */
function soonest(values) {
  let min = null;
  for (const v of values) if (v !== null && v !== undefined && (min === null || v < min)) min = v;
  return min;
}

/**
 * What the batches of the held slots found since the worker last waited. A
 * slot is quiet once a whole pass over its share, from its start to its end,
 * handled nothing; an item waiting for a retry, seen in a pass or failed in
 * it, is due again at the time kept for its slot. `now` is for the tests.
 */
class Pass {
  constructor(now = Date.now) {
    this.now = now;
    this.busy = new Set(); // slots whose current pass handled an item
    this.quiet = new Set(); // slots whose last whole pass handled nothing
    this.due = new Map(); // slot -> the time its first waiting item is due
  }

  /**
   * After a batch of `slot` ({handled, end, retryMs}): true when every slot
   * of `held` is quiet.
   */
  after(slot, done, held) {
    if (done.retryMs !== null && done.retryMs !== undefined) {
      this.due.set(slot, soonest([this.due.get(slot), this.now() + done.retryMs]));
    }
    if (done.handled) {
      this.busy.add(slot);
      this.quiet.delete(slot);
    }
    if (done.end) {
      if (this.busy.delete(slot)) this.quiet.delete(slot);
      else this.quiet.add(slot);
    }
    const slots = [...held];
    return slots.length > 0 && slots.every((s) => this.quiet.has(s));
  }

  /** Milliseconds until the first item of `held` is due (0 when one is); null when none waits. */
  retryMs(held) {
    const at = soonest([...held].map((s) => this.due.get(s)));
    return at === null ? null : Math.max(0, at - this.now());
  }

  /** After a wait: every slot is looked at anew. */
  clear() {
    this.busy.clear();
    this.quiet.clear();
    this.due.clear();
  }
}

/** The first line of an error's message, as stored with a failure. */
function errorText(e) {
  if (e instanceof Error) return `${e.name === "Error" ? "" : e.name + ": "}${e.message}`;
  return String(e);
}

module.exports = {
  durationMs, intervalText, makeHolder, isConnectionLost, isServerState, isTransient, nextPause, nextSlot, diffHeld, dueRows, waitMs,
  soonest, Pass, errorText, BACKOFF_FIRST_MS, BACKOFF_CAP_MS, TRANSIENT_LIMIT,
};
