"use strict";
// Held: the slots a worker holds, shared by the code that claims them and the
// loop that works on them; the Python library's pg_claim.Held, method for
// method (camelCase). No database, no timers (unit-tested alone).

/**
 * slot -> token of the held slots, as the last claim returned them, with the
 * loop's cursor into each slot's share (the text of the last key done) and a
 * round-robin turn over the slots.
 *
 * A slot that is not in a claim's result was given back (or lost): the loop
 * stops working on it at once. A slot whose token changed was taken anew: its
 * cursor is reset, so its share is walked from its start (the previous
 * holder may have left items behind).
 *
 * `validMs` is how long after a successful claim the slots may still be
 * worked on when the next claims fail (the lease's ttl); `marginMs` is how
 * long before that the loop stops starting batches on them. Times are
 * milliseconds (Date.now() by default).
 */
class Held {
  constructor({ validMs = Infinity, marginMs = 0 } = {}) {
    this.validMs = validMs;
    this.marginMs = marginMs;
    this._tokens = new Map();
    this._cursor = new Map();
    this._validUntil = validMs === Infinity ? Infinity : 0;
    this._last = -1;
  }

  /**
   * The result ([{slot, token}] or [[slot, token]]) of a claim made at
   * `asked`. Returns {gained, lost}, lists of {slot, token}: a slot whose
   * token changed is in both.
   */
  replace(rows, asked = Date.now()) {
    const now = new Map(rows.map((r) => (Array.isArray(r) ? [Number(r[0]), r[1]] : [Number(r.slot), r.token])));
    const bySlot = (a, b) => a.slot - b.slot;
    const lost = [...this._tokens].filter(([s, t]) => now.get(s) !== t).map(([slot, token]) => ({ slot, token })).sort(bySlot);
    const gained = [...now].filter(([s, t]) => this._tokens.get(s) !== t).map(([slot, token]) => ({ slot, token })).sort(bySlot);
    for (const { slot } of lost) this._cursor.delete(slot);
    this._tokens = now;
    if (this.validMs !== Infinity) this._validUntil = asked + this.validMs;
    return { gained, lost };
  }

  /**
   * A claim failed at `now`: the slots are kept until `validMs` after the
   * last successful claim was made, then dropped. Returns the dropped ones.
   */
  failed(now = Date.now()) {
    if (now < this._validUntil || this._tokens.size === 0) return [];
    const lost = [...this._tokens].map(([slot, token]) => ({ slot, token })).sort((a, b) => a.slot - b.slot);
    this._tokens = new Map();
    this._cursor = new Map();
    return lost;
  }

  /** The slot's token was refused (fence: PC001): no more work on it until a claim returns it again. True if it was held with `token`. */
  drop(slot, token) {
    if (this._tokens.get(slot) !== token) return false;
    this._tokens.delete(slot);
    this._cursor.delete(slot);
    return true;
  }

  /** slot -> token of the slots held now (a copy, by slot). */
  snapshot() {
    return new Map([...this._tokens].sort((a, b) => a[0] - b[0]));
  }

  /** Whether batches may be started: the last successful claim is recent enough. */
  workable(now = Date.now()) {
    return now < this._validUntil - this.marginMs;
  }

  /** The next slot to work on, round robin: {slot, token, cursor}, or null when none is held or the claims are too old. */
  next(now = Date.now()) {
    if (this._tokens.size === 0 || !this.workable(now)) return null;
    const slots = [...this._tokens.keys()].sort((a, b) => a - b);
    const slot = slots.find((s) => s > this._last) ?? slots[0];
    this._last = slot;
    return { slot, token: this._tokens.get(slot), cursor: this._cursor.get(slot) ?? null };
  }

  /** Milliseconds until the slots are dropped if no claim succeeds. */
  validLeft(now = Date.now()) {
    return this._validUntil - now;
  }

  /** `slot` out of turn, its walk moved back to `cursor` (a retry due): {slot, token, cursor}, or null. */
  pick(slot, cursor, now = Date.now()) {
    if (!this._tokens.has(slot) || !this.workable(now)) return null;
    this._cursor.set(slot, cursor);
    return { slot, token: this._tokens.get(slot), cursor };
  }

  /** The batch of `slot` up to key `cursor` is done (with `token`); null: the share was walked, start again. */
  advance(slot, token, cursor) {
    if (this._tokens.get(slot) === token) this._cursor.set(slot, cursor);
  }
}

module.exports = { Held };
