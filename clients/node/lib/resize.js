"use strict";
// A Worker following an online resize of its fleet (lease mode; methods
// mixed into Worker.prototype). resize_fleet(name, n) waits for the fenced
// batches in flight, invalidates every lease of the name and sets the
// fleet's new n: from then on claim_leases with the old n raises PC002 and
// every old token fails its fence with PC001. The worker learns it either
// way: the renewal's call (PC002), or a batch whose fence refused its
// token while fleet_n(name) says another n (without that look a refused
// fence would be told as `taken`, which it is not). It then drops every
// held slot (reason `resized`: the tokens are dead), sets n (the claim and
// the fetch read it at each call), looks at the partitions again and
// claims again at once. The n option stays the n a worker starts with.
// Session fleets are not resized online: a PC002 or 55000 from claim_slots
// stops a session-mode worker with an error that says so.
const { isConnectionLost, errorText } = require("./util");
const { MAX_LEASE_SLOTS } = require("./config");

/** claim_leases called with a fleet's old n after resize_fleet. */
const RESIZED = "PC002";
/** Session mode: what a resized (or resizing) fleet answers claim_slots with. */
const SESSION_STATES = [RESIZED, "55000"];

/** A resize the worker cannot follow, or a session fleet refused as resized: it stops the worker. */
class ResizeError extends Error {
  constructor(message) {
    super(message);
    this.name = "ResizeError";
  }
}

const methods = {
  /** The fleet's n as the server has it now (the live fleet's, else its definition's), or null. */
  async _fleetN(c) {
    const r = await c.query({ text: "SELECT fleet_n($1) AS n", values: [this.name], query_timeout: this.ttlMs });
    return r.rows[0].n === null ? null : Number(r.rows[0].n);
  },

  /**
   * The renewal's call with `usedN` raised PC002: reads the new n and
   * follows it (nothing to do when a batch's refused fence followed it
   * meanwhile). Throws ResizeError when the server has no n for the name
   * (the fleet was dropped) or the call's own.
   */
  async _follow(c, e, usedN) {
    const n = await this._fleetN(c);
    if (n === null || n === usedN) {
      throw new ResizeError(`pg-claim: claim_leases(${JSON.stringify(this.name)}, ${usedN}) was refused as resized`
        + ` (${errorText(e)}), but fleet_n is ${n === null ? "NULL" : n}: nothing to follow; start the workers again with the fleet's n`);
    }
    await this._resized(n, c);
  },

  /**
   * A fence refused a token (PC001), the transaction rolled back: true when
   * that was a resize (fleet_n differs from the worker's n), now followed;
   * false for a slot taken by another holder (or no fleet_n to ask).
   */
  async _refused(client) {
    let n;
    try {
      n = await this._fleetN(client);
    } catch (e) {
      if (isConnectionLost(e)) throw e;
      return false;
    }
    return n !== null && this._resized(n, client);
  },

  /**
   * Follows the fleet to `n`: every held slot dropped (`lost`, reason
   * `resized`), n set, the renewal called again at once. False when the
   * worker's n already is `n`.
   */
  async _resized(n, c) {
    const oldN = this.n;
    if (n === oldN) return false;
    if (!(n >= 1 && n <= MAX_LEASE_SLOTS)) {
      throw new ResizeError(`pg-claim: fleet ${JSON.stringify(this.name)} was resized to n = ${n}, which this worker cannot serve (at most ${MAX_LEASE_SLOTS} slots in lease mode)`);
    }
    // synchronous up to the first await: no batch or call sees half of it
    this.n = n;
    this.maxSlots = Math.min(this._maxSlotsGiven === null ? n : this._maxSlotsGiven, n);
    this._partitions.clear();
    this._resting.clear();
    this._emit("resized", { oldN, n });
    this._setHeld(new Map(), "resized");
    this._claimNow = true;
    if (this._renewSleep) { clearTimeout(this._renewTimer); this._renewSleep(); }
    await this._repartition(c);
    return true;
  },

  /** A table hash-partitioned with the old n as modulus is read and written through the table with the new n. */
  async _repartition(c) {
    if (!this.partitioned) return;
    try {
      await c.query("SELECT slot_partition($1::regclass, 0, $2)", [this._table, this.n]);
    } catch (e) {
      if (isConnectionLost(e) || !["22023", "42501"].includes(e.code)) throw e;
      this.partitioned = false;
    }
  },

  /** Session mode: claim_slots refused as resized (PC002) or not in a state for it (55000: its name is leased). */
  _sessionResized(e) {
    return new ResizeError(`pg-claim: fleet ${JSON.stringify(this.name)} (session mode, n = ${this.n}): claim_slots was refused`
      + ` with ${e.code}: ${errorText(e)}. A session fleet keeps its n for the life of its sessions (it is not resized online),`
      + " and its name cannot be leased at the same time: stop every worker of the name and start them again in one mode with the fleet's n");
  },
};

module.exports = { methods, ResizeError, RESIZED, SESSION_STATES };
