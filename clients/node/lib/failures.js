"use strict";
// A Worker's failure path (methods mixed into Worker.prototype): transient
// failures in a row, a failed batch again item by item, record_failure and
// clear_failure.
const { isConnectionLost, soonest, errorText } = require("./util");
const { KEY } = require("./config");

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

/** How long a worker goes by an answer of has_failures (docs/failures.md). */
const CHECK_EVERY_MS = 1000;

/**
 * Whether the fleet's name has failure records, as has_failures last
 * answered: while it has none, a batch's fetch leaves the join with
 * item_failures out. A lease-mode batch asks again in its first statement
 * when the last answer is CHECK_EVERY_MS old, or when it is the first batch
 * of its slot with this token (the slot's former holders may have recorded
 * failures; a holder's records are fenced, so none comes later); a failure
 * this worker records counts at once. Session mode and the batches of due
 * retries always join. The same rule as the Python library's
 * _failures.Records.
 */
class Records {
  constructor() {
    this._any = null; // null: not asked yet
    this._at = 0;
    this._gen = 0; // counts this worker's records: an answer asked before one is stale
    this._checked = new Map(); // slot -> the token last checked with
  }

  /** {ask: has_failures in this batch, join: the failure records, gen: for answered}. */
  plan(slot, token, now) {
    if (token === null) return { ask: false, join: true, gen: this._gen };
    const ask = this._any === null || now - this._at >= CHECK_EVERY_MS || this._checked.get(slot) !== token;
    return { ask, join: ask || this._any, gen: this._gen };
  }

  answered(slot, token, any, now, gen) {
    this._checked.set(slot, token);
    if (gen === this._gen) { this._any = Boolean(any); this._at = now; }
  }

  /** This worker records a failure (before the statement). */
  recorded() {
    this._gen++;
    this._any = true;
  }
}

const ENDED = "pg-claim: the handler ended the batch's transaction (COMMIT or ROLLBACK on the batch's client),"
  + " so what it did after ran unfenced: the batch is not counted and its items are retried one by one";
const ABORTED = "pg-claim: the transaction was aborted (an error inside the handler was caught and ignored)";

const methods = {
  /** Counts a transient failure of the batch whose first due item is `key`: its number in a row. */
  _transient(slot, key) {
    const s = this._streak;
    if (s && s.slot === slot && s.key === key) s.count++;
    else this._streak = { slot, key, count: 1, pauseMs: 0 };
    this._streak.pauseMs = this._nextPause(this._streak.pauseMs);
    return this._streak;
  },

  async _clear(client, items) {
    const cleared = items.filter((it) => it.failure !== null).map((it) => it.key);
    if (cleared.length) await client.query("SELECT clear_failure($1, VARIADIC $2::text[])", [this.name, cleared]);
  },

  async _record(client, w, cursor, it, error) {
    this._records.recorded();
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
      if (f.state === "dead") this._emit("dead", f);
      else this._emit("failed", f);
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
      this._emit("transaction_ended", { slot, item: it.key, error });
    }
    await this._commit(client);
  },
};

module.exports = { methods, Records, TransientBatch, brokenBy, ENDED, ABORTED };
