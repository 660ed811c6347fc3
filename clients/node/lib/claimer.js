"use strict";
// A Worker's claims (methods mixed into Worker.prototype): the held slots,
// claim_leases on a timer on a connection of its own, the reasons a slot
// was lost, and the leave.
const { intervalText, diffHeld, errorText } = require("./util");
const { RESIZED, ResizeError } = require("./resize");

// Balance: the pause of a worker with nothing to do, or whose last calls
// gained slots, before it calls claim_leases again (a slot wanted for it is
// given back after the giver's batch), and how many such calls in a row
// before renewInterval applies again.
const HUNGRY_MS = 200;
const HUNGRY_CALLS = 10;
// How long the claimer waits for the reply to its claim_leases: 2/3 of the
// ttl. A reply later than that grants nothing a batch could use (none
// starts once 2/3 of the ttl passed since the last good call was sent), and
// a shorter wait gives up on a call that a busy server or pool answers late
// but in time. The Python library has the same rule (CLAIM_DEADLINE).
const claimDeadlineMs = (ttlMs) => Math.round((ttlMs * 2) / 3);

/** Whether the claimer's next call comes after HUNGRY_MS (not the period). */
function quick(burst) {
  return burst > 0 && burst <= HUNGRY_CALLS;
}

// Balance: the claimer's count of quick calls after a call that `gained`
// slots or not, the worker `hungry` (nothing to do) or not; the next call
// comes after HUNGRY_MS while it is 1 .. HUNGRY_CALLS, else after
// renewInterval. A worker whose call gained slots (a joiner taking its share
// as the givers release it after their batches) asks again quickly
// HUNGRY_CALLS times after its last gain, as a call between two givers'
// batches may gain nothing; one with nothing to do, up to HUNGRY_CALLS times
// in a row. (The Python library's next_burst.)
function nextBurst(burst, gained, hungry) {
  if (gained) return 1;
  return quick(burst) || hungry ? burst + 1 : 0;
}

const methods = {
  /**
   * Replaces the held slots; the slots taken and lost are counted and told.
   * `reason`: the reason of every lost slot, or a function slot -> reason.
   */
  _setHeld(now, reason) {
    const { taken, lost } = diffHeld(this.held, now);
    if (!taken.length && !lost.length) return;
    for (const { slot } of [...lost, ...taken]) {
      this._backlog.forget(slot);
      this._wanted.delete(slot);
    }
    for (const { slot, token } of lost) {
      this._walks.delete(slot);
      this.stats.slotsLost++;
      if (this._prom) this._prom.handovers.inc({ fleet: this.name, direction: "lost" });
      this._emit("lost", { slot, token, reason: typeof reason === "function" ? reason(slot) : reason });
    }
    for (const { slot, token } of taken) {
      this.stats.slotsTaken++;
      if (this._prom) this._prom.handovers.inc({ fleet: this.name, direction: "gained" });
      this._emit("gained", { slot, token });
    }
    this.held = new Map([...now].sort((a, b) => a[0] - b[0]));
    this._countHeld();
    this._emit("slots", { held: [...this.held.keys()], gained: taken.map((t) => t.slot), lost: lost.map((l) => l.slot) });
    if (taken.length) this._wake("slots");
    if (this._onHeld) this._onHeld();
  },

  /** Lease mode: whether a claim call succeeded within 2/3 of the ttl (new batches start only then). */
  _leaseOk() {
    return this._goodAt !== null && Date.now() < this._goodAt + (2 * this.ttlMs) / 3;
  },

  /**
   * Why each slot held before was lost: "expired" (the lease ran out: the
   * slot came back in the claim's result `now`, slot -> token, with a new
   * token, or no good call for a ttl), "taken" (another holder has it),
   * "given back" (claim_leases gave it to another holder for balance).
   * `gone`: the slots missing from `now`.
   */
  async _lostReasons(c, gone, now, expired) {
    const others = new Set();
    if (gone.length) {
      const h = await c.query("SELECT slot FROM lease_holders($1) WHERE slot = ANY($2) AND NOT expired"
        + " AND holder IS DISTINCT FROM $3", [this.name, gone, this.holder]);
      for (const r of h.rows) others.add(r.slot);
    }
    return (slot) => (now.has(slot) || expired ? "expired" : others.has(slot) ? "taken" : "given back");
  },

  /**
   * claim_leases every renewInterval (ttl / 3) on a connection of its own,
   * each call bounded by 2/3 of the ttl (claimDeadlineMs; through a busy
   * pool a call may queue a while): no new batch once no call succeeded
   * for 2/3 of the ttl (_leaseOk), every slot dropped after a ttl (a
   * timer). A call refused as resized (PC002) follows the new n and calls
   * again at once (resize.js).
   */
  async _renewLoop() {
    let c = null;
    let burst = 0;
    this._goodAt = null;
    const drop = () => { this._dropTimer = null; this._setHeld(new Map(), "expired"); };
    while (this._renewing) {
      const asked = Date.now();
      let gained = false;
      const usedN = this.n;
      this._claimNow = false;
      try {
        c = c || await this._connect(this.connection, "_renewClient");
        const { rows } = await c.query({ text: "SELECT slot, token FROM claim_leases($1, $2, $3, max => $4, ttl => $5)",
          values: [this.name, usedN, this.holder, this.maxSlots, intervalText(this.ttlMs)], query_timeout: claimDeadlineMs(this.ttlMs) });
        if (!this._renewing) break;
        if (this.n !== usedN) continue; // a refused fence followed a resize meanwhile: these tokens are dead
        // the leases are good for a ttl from when the call was sent, at the least
        const validMs = this.ttlMs - (Date.now() - asked);
        if (validMs <= 0) throw new Error(`pg-claim: claim_leases answered after ${Date.now() - asked} ms, past the ttl`);
        const expired = this._goodAt === null || asked >= this._goodAt + this.ttlMs;
        // the slots this call gave back: a batch whose fence refuses one of
        // them meanwhile leaves its reason to this call (_begin)
        const now = new Map(rows.map((r) => [r.slot, r.token]));
        const gone = [...this.held.keys()].filter((s) => !now.has(s));
        this._leaving = new Set(gone);
        const reasons = await this._lostReasons(c, gone, now, expired);
        this._goodAt = asked;
        clearTimeout(this._dropTimer);
        this._dropTimer = setTimeout(drop, validMs);
        gained = rows.some((r) => this.held.get(r.slot) !== r.token);
        this._setHeld(now, reasons);
        this._leaving = new Set();
      } catch (e) {
        this._leaving = new Set();
        if (e.code === RESIZED && c && this._renewing) {
          try {
            await this._follow(c, e, usedN);
            continue;
          } catch (e2) {
            if (e2 instanceof ResizeError) { this._fatal = e2; this.stop(); break; }
            // fleet_n failed: tried again at the next period
          }
        }
        if (c) this._drop(c);
        c = null;
        this._emit("claim_failed", { error: errorText(e) });
        if (this._goodAt === null || Date.now() >= this._goodAt + this.ttlMs) this._setHeld(new Map(), "expired");
      }
      burst = nextBurst(burst, Boolean(this.balance && gained), this._hungry());
      const end = asked + (quick(burst) ? HUNGRY_MS : this.renewMs);
      for (let rest = end - Date.now(); rest > 0 && this._renewing; rest = end - Date.now()) {
        await new Promise((resolve) => { this._renewTimer = setTimeout(resolve, Math.min(rest, HUNGRY_MS)); this._renewSleep = resolve; });
        if (this._claimNow || (burst < HUNGRY_CALLS && Date.now() >= asked + HUNGRY_MS && this._hungry())) break;
      }
      this._renewSleep = null;
    }
    clearTimeout(this._dropTimer);
    if (c) this._drop(c);
  },

  /**
   * claim_leases(..., max => 0): every slot given back, the holder out of
   * the live set; tried until `deadline` (ms since the epoch).
   */
  async _leave(deadline) {
    if (this._renewSleep) { clearTimeout(this._renewTimer); this._renewSleep(); }
    for (let attempt = 1; ; attempt++) {
      let c = null;
      const left = deadline - Date.now();
      try {
        c = await this._connect({ ...this.connection, connectionTimeoutMillis: Math.max(100, Math.min(this._connectMs, left)) });
        const give = (n) => c.query({ text: "SELECT count(*) FROM claim_leases($1, $2, $3, max => 0)",
          values: [this.name, n, this.holder], query_timeout: Math.max(100, Math.min(this._connectMs, deadline - Date.now())) });
        try {
          await give(this.n);
        } catch (e) {
          const n = e.code === RESIZED ? await this._fleetN(c) : null;
          if (n === null) throw e;
          await give(n); // resized since the last call
        }
        this._emit("left", { slots: [...this.held.keys()] });
        return;
      } catch (e) {
        if (attempt >= 3 || Date.now() + 200 >= deadline) {
          this._emit("leave_failed", { error: errorText(e) }); // the leases expire after ttl
          return;
        }
        await new Promise((r) => setTimeout(r, 200));
      } finally {
        if (c) this._drop(c);
      }
    }
  },

  /** Session mode, on leaving: release_slot gives every slot back at once (the session stays open for nothing). */
  async _releaseSession(client) {
    if (client.pgClaimGone) return;
    try {
      await client.query({ text: "SELECT release_slot($1)", values: [this.name], query_timeout: this._connectMs });
      this._emit("left", { slots: [...this.held.keys()] });
    } catch (e) {
      this._emit("leave_failed", { error: errorText(e) }); // the slots go with the session
    }
  },
};

module.exports = { methods, nextBurst };
