"use strict";
// Lease mode's balance (docs/leases.md, "Balancing"): each held slot's
// weight, its pending rows ahead of the walk's cursor, as a Worker's batches
// count them. The same rule as clients/python/src/pg_claim/_backlog.py (its
// docstring tells it in full): windows of my_items counted in a batch's own
// message, the first from the cursor, each next one after the last row the
// previous one counted while that one came back full (at most once per
// COUNT_EVERY_MS, each twice as large, up to MAX_WINDOW batches), then one
// every REFRESH_MS for the rows inserted since; between counts the rows
// counted less the rows the walk fetched since; 0 once a pass reaches the
// share's end. A batch's report sends the slot's weight once that batch is
// done (less the batch's rows, at least 1). A weight is sent again only when
// it reached or left 0, moved by SEND_CHANGE once the last one sent is
// SEND_MIN_MS old, or the last one sent is SEND_EVERY_MS old; a partial count
// (its last window came back full) sends nothing until it is whole or its
// windows have grown to MAX_WINDOW (a lower bound would make its holder look
// light). A batch with
// no weight to send carries no report unless the worker's last one is
// REPORT_EVERY_MS old (the report also tells the slots wanted elsewhere). A worker
// serves its held slots in proportion to their weights (stride scheduling,
// at most SHARE_CAP batches of a heavy slot per batch of the lightest); equal
// weights, or none known, are plain round robin. A batch that finds rows in a
// slot that weighed 0 starts a census, at most once per CENSUS_EVERY_MS: every
// other held slot that weighs 0 is counted at once (one first window each, in
// one message) and the weights are reported together; so are the slots it
// took since its last batch, once each.

const FIRST_WINDOW = 40; // batches
const MAX_WINDOW = 1000; // batches
const COUNT_EVERY_MS = 250;
const REFRESH_MS = 5000;
const SEND_CHANGE = 0.1;
const SEND_MIN_MS = 1000;
const SEND_EVERY_MS = 5000;
const SHARE_CAP = 100;
const REPORT_EVERY_MS = 200;
const CENSUS_EVERY_MS = 5000;

class Backlog {
  constructor(batch) {
    this.batch = batch;
    this._counts = new Map(); // slot -> {known, last, full, walked, at, window}
    this._weights = new Map();
    this._sent = new Map(); // slot -> {weight, at}
    this._pending = new Map(); // slot -> {first, bound}
    this._pass = new Map();
    this._reported = -Infinity;
    this._censusAt = -Infinity;
    this._asked = new Set(); // held slots a census counts for the first time
  }

  /** The window to count in the slot's next batch: {after, bound}, or null when no count is due. */
  window(slot, cursor, now) {
    const c = this._counts.get(slot);
    if (c && now - c.at < (c.full ? COUNT_EVERY_MS : REFRESH_MS)) return null;
    if (!c || c.last === null || c.walked >= c.known) { // from the cursor (the walk passed the count)
      this._pending.set(slot, { first: true, bound: FIRST_WINDOW * this.batch });
      return { after: cursor, bound: FIRST_WINDOW * this.batch };
    }
    const bound = (c.full ? c.window : FIRST_WINDOW) * this.batch;
    this._pending.set(slot, { first: false, bound });
    return { after: c.last, bound };
  }

  /** After a batch of the walk: the rows it fetched, its window's {pending, last} (or null), whether the share was walked to its end. */
  batchDone(slot, fetched, counted, end, now) {
    const { first, bound } = this._pending.get(slot) || { first: true, bound: 0 };
    this._pending.delete(slot);
    if (end) {
      this._counts.delete(slot);
      this._weights.set(slot, 0);
      return;
    }
    let c = this._counts.get(slot);
    if (counted) {
      if (first || !c) {
        c = { known: counted.pending, last: null, full: false, walked: 0, at: 0, window: 2 * FIRST_WINDOW };
        this._counts.set(slot, c);
      } else {
        c.known += counted.pending;
        if (c.full) c.window = Math.min(c.window * 2, MAX_WINDOW); // each next window of a count twice the one before
      }
      if (counted.last !== null) c.last = counted.last;
      c.full = counted.pending >= bound;
      c.at = now;
    }
    if (!c) {
      this._weights.set(slot, Math.max(this.batch, this._weights.get(slot) || 0));
      return;
    }
    c.walked += fetched;
    this._weights.set(slot, Math.max(this.batch, c.known - c.walked));
  }

  /** The slot of `turn` (held, not resting) to serve next, by weight; null when fewer than two or no weight: round robin. */
  pick(turn) {
    const known = turn.map((s) => this._weights.get(s)).filter((w) => w);
    if (turn.length < 2 || !known.length) return null;
    const lightest = Math.min(...known);
    const passes = turn.filter((s) => this._pass.has(s)).map((s) => this._pass.get(s));
    const front = passes.length ? Math.min(...passes) : 0;
    for (const s of turn) this._pass.set(s, Math.max(this._pass.has(s) ? this._pass.get(s) : front, front)); // new, or back from resting: at the front
    const sorted = [...turn].sort((a, b) => a - b);
    let slot = sorted[0];
    for (const s of sorted) if (this._pass.get(s) < this._pass.get(slot)) slot = s;
    const share = Math.min(Math.max((this._weights.get(slot) || lightest) / lightest, 1), SHARE_CAP);
    this._pass.set(slot, this._pass.get(slot) + 1 / share);
    return slot;
  }

  /**
   * After a batch of `slot`, which weighed `before`: the other held slots to
   * count now: those of `held` it had no weight of (taken since its last
   * batch, `slot` too when this was its first batch: each once), and, when the batch found rows in a slot that
   * weighed 0, those that weigh 0, at most once per CENSUS_EVERY_MS.
   */
  census(slot, before, held, now) {
    const fresh = held.filter((s) => (!this._weights.has(s) || (s === slot && before === null)) && !this._asked.has(s));
    for (const s of fresh) this._asked.add(s);
    const bySlot = (a, b) => a - b;
    if (before !== 0 || !this._weights.get(slot) || now - this._censusAt < CENSUS_EVERY_MS) return fresh.sort(bySlot);
    const empty = held.filter((s) => s !== slot && this._weights.get(s) === 0);
    if (empty.length) this._censusAt = now;
    return fresh.concat(empty).sort(bySlot);
  }

  /** The rows a census counts at most per slot: one first window. */
  censusBound() {
    return FIRST_WINDOW * this.batch;
  }

  /** A census's count of the slot from its share's start: its weight, taken as sent (null: partial, none sent). */
  counted(slot, pending, last, now) {
    this._pending.delete(slot);
    if (pending === 0) {
      this._counts.delete(slot);
      this._weights.set(slot, 0);
    } else {
      this._counts.set(slot, { known: pending, last, full: pending >= this.censusBound(), walked: 0, at: now, window: 2 * FIRST_WINDOW });
      this._weights.set(slot, Math.max(this.batch, pending));
      if (this.partial(slot)) return null;
    }
    this._sent.set(slot, { weight: this._weights.get(slot), at: now });
    return this._weights.get(slot);
  }

  /** Whether the slot's count is a lower bound too small to send (its last window full, below MAX_WINDOW). */
  partial(slot) {
    const c = this._counts.get(slot);
    return c !== undefined && c.full && c.window < MAX_WINDOW;
  }

  weight(slot) {
    return this._weights.has(slot) ? this._weights.get(slot) : null;
  }

  /** The slot's weight once the batch about to run is done (a counted weight less its rows, at least 1). */
  ahead(slot) {
    const w = this._weights.get(slot);
    if (!w || !this._counts.has(slot)) return w;
    return Math.max(1, w - this.batch);
  }

  /** The weight a batch's report sends: null (the last one stands) unless due, see above. */
  toSend(slot, now) {
    if (!this._weights.has(slot) || this.partial(slot)) return null;
    const w = this.ahead(slot);
    const last = this._sent.get(slot);
    if (last && now - last.at < SEND_EVERY_MS && (w === 0) === (last.weight === 0)
      && (Math.abs(w - last.weight) < SEND_CHANGE * Math.max(last.weight, 1) || now - last.at < SEND_MIN_MS)) {
      return null;
    }
    this._sent.set(slot, { weight: w, at: now });
    return w;
  }

  /** Whether the slot's next batch carries a report, and its weight (null: the last one stands). */
  report(slot, now) {
    const weight = this.toSend(slot, now);
    if (weight === null && now - this._reported < REPORT_EVERY_MS) return { report: false, weight: null };
    this._reported = now;
    return { report: true, weight };
  }

  forget(slot) {
    for (const m of [this._counts, this._weights, this._sent, this._pending, this._pass, this._asked]) m.delete(slot);
  }

  clear() {
    for (const m of [this._counts, this._weights, this._sent, this._pending, this._pass, this._asked]) m.clear();
  }
}

module.exports = { Backlog, FIRST_WINDOW, MAX_WINDOW };
