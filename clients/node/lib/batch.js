"use strict";
// The Worker's batches (methods mixed into Worker.prototype): the fenced
// transaction, the handler, the item-by-item failure path, the transient
// retries and the retries due at their time.
const { isConnectionLost, isTransient, dueRows, soonest, errorText, TRANSIENT_LIMIT } = require("./util");

// the columns a fetch adds to the table's own (taken off before the handler sees a row)
const KEY = "pg_claim:key", ROUTE = "pg_claim:route", FAILURE = "pg_claim:failure", RETRY = "pg_claim:retry";
/** the most retries a walk keeps a time for (beyond, the walk reaches them) */
const MAX_RETRIES_KEPT = 10000;

/**
 * A handler failed transiently (a lost connection, a deadlock, ...): the
 * batch is retried after `pauseMs`; thrown when the connection is gone.
 */
class TransientBatch extends Error {
  constructor(cause, pauseMs) {
    super(errorText(cause), { cause });
    this.name = "TransientBatch";
    this.pauseMs = pauseMs;
  }
}

/** How the handler left the batch's transaction: null when it is still open and sound. */
function brokenBy(client, error) {
  if (client.pgClaimGone || isConnectionLost(error)) return "lost";
  if (client.pgClaimStatus === "I") return "ended";
  if (client.pgClaimStatus === "E" && !error) return "aborted";
  return null;
}

const ENDED = "pg-claim: the handler ended the batch's transaction (COMMIT or ROLLBACK on the batch's client),"
  + " so what it did after ran unfenced: the batch is not counted and its items are retried one by one";
const ABORTED = "pg-claim: the transaction was aborted (an error inside the handler was caught and ignored)";

const methods = {
  _walk(slot, token) {
    let w = this._walks.get(slot);
    if (!w || w.token !== token) { // a slot taken anew is walked from the start of its share
      w = { token, after: null, heldRoutes: this.route === null ? null : new Set(), retries: new Map() };
      this._walks.set(slot, w);
    }
    return w;
  },

  /** A retry of an item (its batch's cursor) due at `ms` from now; none for a dead or done item. */
  _keepRetry(w, key, cursor, ms) {
    if (ms === null || ms === undefined) w.retries.delete(key);
    else if (w.retries.has(key) || w.retries.size < MAX_RETRIES_KEPT) w.retries.set(key, { cursor, at: Date.now() + ms + 1 });
  },

  /** The held slot with the soonest retry due now, its cursor and the keys due from it; null when none is. */
  _dueRetry() {
    let best = null;
    const now = Date.now();
    for (const slot of this.held.keys()) {
      const w = this._walks.get(slot);
      if (!w || w.token !== this.held.get(slot)) continue;
      for (const [key, r] of w.retries) if (r.at <= now && (best === null || r.at < best.at)) best = { slot, at: r.at, cursor: r.cursor };
    }
    if (best === null) return null;
    const w = this._walks.get(best.slot);
    const only = new Set([...w.retries].filter(([, r]) => r.at <= now && r.cursor === best.cursor).map(([k]) => k));
    return { slot: best.slot, cursor: best.cursor, only };
  },

  /** Milliseconds until the first retry of the held slots is due (0: one is); null when none waits. */
  _nextRetryMs() {
    let at = null;
    for (const slot of this.held.keys()) {
      const w = this._walks.get(slot);
      if (w && w.token === this.held.get(slot)) for (const r of w.retries.values()) at = soonest([at, r.at]);
    }
    return at === null ? null : Math.max(0, at - Date.now());
  },

  async _partition(client, slot) {
    if (!this.partitioned) return null;
    if (!this._partitions.has(slot)) {
      const r = await client.query("SELECT slot_partition($1::regclass, $2, $3)::text AS p", [this._table, slot, this.n]);
      this._partitions.set(slot, r.rows[0].p);
    }
    return this._partitions.get(slot);
  },

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
        this._setHeld(now, "taken");
      }
      return null;
    }
  },

  async _commit(client) {
    const r = await client.query("COMMIT");
    if (r.command === "ROLLBACK") throw new Error(ABORTED);
  },

  /** The fetched rows as items; the due ones (a side batch: only its keys); the retries kept. */
  _items(rows, w, cursor, only) {
    const items = rows.map((r) => {
      const it = { key: r[KEY], route: r[ROUTE], failure: r[FAILURE], retryMs: r[RETRY], row: r };
      delete r[KEY]; delete r[ROUTE]; delete r[FAILURE]; delete r[RETRY];
      return it;
    });
    for (const it of items) {
      if (it.failure === "retry") this._keepRetry(w, it.key, cursor, it.retryMs);
      else if (it.failure === "dead") w.retries.delete(it.key);
    }
    if (only === null) return { items, due: dueRows(items, w.heldRoutes) };
    const seen = new Set(items.map((it) => it.key));
    for (const k of only) if (!seen.has(k)) w.retries.delete(k); // done, or beyond the batch: the walk sees it
    return { items, due: items.filter((it) => only.has(it.key) && (it.failure === null || it.failure === "due")) };
  },

  /** Counts a transient failure of the batch whose first due item is `key`: its number in a row. */
  _transient(slot, key) {
    const s = this._streak;
    if (s && s.slot === slot && s.key === key) s.count++;
    else this._streak = { slot, key, count: 1, pauseMs: 0 };
    this._streak.pauseMs = this._nextPause(this._streak.pauseMs);
    return this._streak;
  },

  /**
   * One batch of `slot`'s share: BEGIN, fence (lease mode) and the fetch in
   * one message, the handler, COMMIT. `side` ({cursor, only}): the items
   * `only` whose retry is due, fetched from their batch's cursor, out of
   * the walk. {handled: items handed, end: the share is walked, retryMs,
   * transient: the batch failed transiently and waits pauseMs}.
   */
  async _batch(client, slot, token, side = null) {
    const w = this._walk(slot, token);
    const partition = await this._partition(client, slot);
    const cursor = side ? side.cursor : w.after;
    const rows = await this._begin(client, slot, token, this._fetchText(slot, cursor));
    if (rows === null) return { handled: 0, end: true, fenced: true };
    let open = true;
    try {
      const end = side ? false : rows.length < this.batch;
      const { items, due } = this._items(rows, w, cursor, side ? side.only : null);
      const retryMs = soonest(items.filter((it) => it.failure === "retry").map((it) => it.retryMs));
      const next = end ? null : items.length ? items[items.length - 1].key : cursor;
      const info = { name: this.name, slot, token, partition, table: this._table, holder: this.holder };
      const advance = () => { if (!side) this._advance(slot, w, next, end); };
      if (due.length === 0) {
        await this._commit(client);
        open = false;
        advance();
        return { handled: 0, end, retryMs };
      }
      const s = this._streak;
      // five transient failures in a row of this first item: the failure path
      let first = s && s.slot === slot && s.key === due[0].key && s.count >= TRANSIENT_LIMIT ? { key: s.key, error: s.error } : null;
      let failure = first ? first.error : null;
      const t0 = process.hrtime.bigint();
      if (failure === null) {
        let error = null;
        try {
          await this._clear(client, due); // inside the transaction: undone with the batch
          await this.handler(client, due.map((it) => it.row), info);
        } catch (e) {
          error = e;
        }
        const broken = brokenBy(client, error);
        if (broken === "lost" || (error && broken === null && isTransient(error))) {
          const st = this._transient(slot, due[0].key);
          st.error = errorText(error || new Error("pg-claim: the handler ended the batch's client"));
          this._emit("transient", { slot, item: due[0].key, error: st.error, count: st.count, pauseMs: st.pauseMs });
          if (broken === "lost") { open = false; throw new TransientBatch(error || new Error(st.error), st.pauseMs); }
          if (st.count < TRANSIENT_LIMIT) {
            await client.query("ROLLBACK");
            open = false;
            return { handled: 0, end: false, retryMs, transient: true, pauseMs: st.pauseMs };
          }
          failure = st.error;
          first = { key: due[0].key, error: st.error };
        } else if (broken !== null || error) {
          failure = errorText(error || new Error(broken === "ended" ? ENDED : ABORTED));
          if (broken === "ended" && error) failure = `${ENDED}: ${failure}`;
        } else {
          await this._commit(client);
          open = false;
          this._streak = null;
          for (const it of due) w.retries.delete(it.key);
          this._counted(slot, token, due.length, 0, t0);
          advance();
          return { handled: due.length, end, retryMs };
        }
      }
      // the item-by-item path, on the rows fetched again (what a handler
      // committed itself is no longer pending)
      if (client.pgClaimStatus !== "I") await client.query("ROLLBACK");
      open = false;
      this._streak = null;
      const r = await this._oneByOne(client, slot, token, w, cursor, side, info, first);
      if (r === null) return { handled: 0, end: true, fenced: true };
      this._counted(slot, token, r.ok, r.failed, t0);
      if (r.complete) advance();
      return { handled: Math.max(1, r.ok + r.failed), end: r.complete && end, retryMs: soonest([retryMs, r.retryMs]) };
    } finally {
      if (open) await client.query("ROLLBACK").catch(() => {});
    }
  },

  /** Counts a committed batch: `ok` items handled, `failed` recorded. */
  _counted(slot, token, ok, failed, t0) {
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    this.stats.items += ok;
    this.stats.batches++;
    this.stats.batchSeconds += seconds;
    if (this._prom) {
      this._prom.items.inc({ fleet: this.name, slot }, ok);
      this._prom.batches.inc({ fleet: this.name, slot });
      this._prom.latency.observe({ fleet: this.name }, seconds);
    }
    this._emit("batch", { slot, token, items: ok, failed, seconds });
  },

  _advance(slot, w, next, end) {
    if (this._walks.get(slot) !== w) return; // the slot moved meanwhile: its next holder walks it from the start
    w.after = next;
    if (end && w.heldRoutes) w.heldRoutes.clear(); // a new pass: the held routes are looked at again
  },

  async _clear(client, items) {
    const cleared = items.filter((it) => it.failure !== null).map((it) => it.key);
    if (cleared.length) await client.query("SELECT clear_failure($1, VARIADIC $2::text[])", [this.name, cleared]);
  },

  async _record(client, w, cursor, it, error) {
    const state = (await client.query("SELECT record_failure($1, $2, $3, $4, $5) AS s",
      [this.name, it.key, error, this.maxAttempts, this.backoff])).rows[0].s;
    let ms = null;
    if (state !== "dead") {
      ms = (await client.query("SELECT extract(epoch FROM retry_at - clock_timestamp())::float8 * 1000 AS ms FROM item_failures($1, $2)",
        [this.name, it.key])).rows[0].ms;
    }
    this._keepRetry(w, it.key, cursor, ms);
    return { state, ms };
  },

  /**
   * The batch again, fetched anew, item by item, each under a savepoint: a
   * failing item is rolled back to its savepoint and recorded with
   * record_failure (back-off, max attempts), the others commit. With
   * `first` (the error of 5 transient failures in a row), the first item is
   * recorded with it, not handed again. An item whose handler ends the
   * transaction is recorded in a transaction of its own and the pass stops
   * there (complete: false: the walk does not move on). {ok, failed,
   * retryMs, complete}; null when the fence refused.
   */
  async _oneByOne(client, slot, token, w, cursor, side, info, first) {
    const rows = await this._begin(client, slot, token, this._fetchText(slot, cursor));
    if (rows === null) return null;
    const { due } = this._items(rows, w, cursor, side ? side.only : null);
    // reported once the transaction has committed: a failure record that a
    // lost connection rolled back is no attempt
    const ok = [], failedRoutes = new Set(), outcomes = [];
    let retryMs = null, complete = true;
    const lost = this._lostItem;
    for (const it of due) {
      if (it.route !== null && failedRoutes.has(it.route)) continue; // behind a failed item of its route
      let error = null;
      if (first !== null && it.key === first.key) error = first.error;
      else if (lost && lost.slot === slot && lost.key === it.key) error = lost.error;
      else {
        await client.query("SAVEPOINT pg_claim_item");
        let thrown = null;
        try {
          if (it.failure !== null) await this._clear(client, [it]);
          await this.handler(client, [it.row], info);
        } catch (e) {
          thrown = e;
        }
        const broken = brokenBy(client, thrown);
        if (broken === "lost") {
          this._lostItem = { slot, key: it.key, error: errorText(thrown || new Error("pg-claim: the handler ended the batch's client")) };
          throw new TransientBatch(thrown || new Error(this._lostItem.error), this._nextPause(0));
        }
        if (broken === "ended") {
          await this._ended(client, slot, token, w, cursor, it, thrown ? `${ENDED}: ${errorText(thrown)}` : ENDED, outcomes);
          complete = false;
          break;
        }
        if (broken === null && thrown === null) {
          await client.query("RELEASE SAVEPOINT pg_claim_item");
          ok.push(it);
          continue;
        }
        await client.query("ROLLBACK TO SAVEPOINT pg_claim_item");
        error = thrown ? errorText(thrown) : ABORTED;
      }
      if (lost && lost.key === it.key) this._lostItem = null;
      const { state, ms } = await this._record(client, w, cursor, it, error);
      if (state !== "dead") retryMs = soonest([retryMs, ms]);
      if (state !== "dead" && it.route !== null) {
        failedRoutes.add(it.route);
        if (w.heldRoutes) w.heldRoutes.add(it.route);
      }
      outcomes.push({ slot, item: it.key, error, state });
    }
    if (complete) {
      await this._commit(client);
      for (const it of ok) w.retries.delete(it.key);
    }
    for (const f of outcomes) {
      this.stats.failures++;
      if (this._prom) this._prom.failures.inc({ fleet: this.name, slot: f.slot });
      if (f.state === "dead") {
        this.stats.deadItems++;
        if (this._prom) this._prom.dead.inc({ fleet: this.name, slot: f.slot });
      }
      this._emit("failure", f);
    }
    return { ok: complete ? ok.length : 0, failed: outcomes.length, retryMs, complete };
  },

  /**
   * The handler of `it` ended the transaction: what the items before did
   * went with it (committed or rolled back). Records `it`'s failure in a
   * fenced transaction of its own if its row is still pending.
   */
  async _ended(client, slot, token, w, cursor, it, error, outcomes) {
    const rows = await this._begin(client, slot, token, this._fetchText(slot, cursor));
    if (rows === null) return;
    if (rows.some((r) => r[KEY] === it.key)) {
      const { state } = await this._record(client, w, cursor, it, error);
      outcomes.push({ slot, item: it.key, error, state });
    } else {
      this._emit("transaction ended", { slot, item: it.key, error });
    }
    await this._commit(client);
  },
};

module.exports = { methods, TransientBatch, KEY, ROUTE, FAILURE, RETRY };
