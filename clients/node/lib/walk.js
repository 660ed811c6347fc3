"use strict";
// A Worker's walk and fence (methods mixed into Worker.prototype): the loops over the held
// slots (lease and session mode), each slot's walk of its share in batches, the fenced
// transaction of a batch and its handler, and the retries due at their time.
const { isConnectionLost, isTransient, dueRows, soonest, nextSlot, Pass, errorText, TRANSIENT_LIMIT } = require("./util");
const { KEY, ROUTE, FAILURE, RETRY, NotASessionError } = require("./config");
const { TransientBatch, brokenBy, ENDED, ABORTED } = require("./failures");
const { SESSION_STATES } = require("./resize");

/** the most retries a walk keeps a time for (beyond, the walk reaches them) */
const MAX_RETRIES_KEPT = 10000;
// session mode: the least time between two claim_slots calls of a worker that holds slots
// (between rounds of batches and while idle). The Python library has the same constant.
const SESSION_CLAIM_MS = 1000;

const methods = {
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
    const candidates = turn.length ? turn : held;
    const weighed = this.balance ? this._backlog.pick(candidates) : null; // by weight, else round robin
    return { slot: weighed === null ? nextSlot(candidates, last) : weighed, side: null };
  },

  /** After a batch: a transient failure waits its back-off (true: retry that slot); else the back-off is over. */
  async _after(done) {
    if (!done.transient) {
      this._pause = 0;
      return false;
    }
    await this._pauseFor(done.pauseMs);
    return true;
  },

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
      const token = this.held.get(slot);
      const done = await this._batch(client, slot, token, side);
      if (this.balance && !done.fenced && !done.transient && this.held.get(slot) === token) {
        if (!side) {
          const before = this._backlog.weight(slot);
          this._backlog.batchDone(slot, this._lastFetch.fetched, this._lastFetch.counted, done.end, Date.now());
          const census = this._countText === null ? [] : this._backlog.census(slot, before, [...this.held.keys()], Date.now());
          if (census.length) await this._census(client, census, slot);
        }
        if (this._wanted.size) { // this slot or others: none is in a batch now
          await this._handOver(client, [...this._wanted].sort((a, b) => a - b));
          continue;
        }
      }
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
  },

  /**
   * Counts the slots from their shares' start (one first window each, one
   * message) and reports their weights with that of `own`, whose batch started
   * the census, in one statement (docs/leases.md, "Balancing"). A failure is
   * left to the slots' own next batches.
   */
  async _census(client, slots, own) {
    const bound = this._backlog.censusBound();
    try {
      const res = await client.query(slots.map((s) => this._countText(s, null, bound)).join("; "));
      const now = Date.now();
      const weights = (Array.isArray(res) ? res : [res]).map((r, i) => this._backlog.counted(slots[i], Number(r.rows[0].pending), r.rows[0].last, now));
      const mine = slots.includes(own) ? null : this._backlog.toSend(own, now);
      const all = mine === null ? slots : [...slots, own];
      await client.query("SELECT count(report_backlog($1, u.s, u.t, u.w, fenced_batches => true)) FROM unnest($2::int[], $3::bigint[], $4::bigint[]) u(s, t, w)",
        [this.name, all, all.map((s) => String(this.held.get(s))), mine === null ? weights : [...weights, mine]]);
    } catch (e) {
      if (isConnectionLost(e)) throw e;
    }
  },

  /**
   * The slots another holder wants (a batch's report said so, of this slot
   * or others): given back now that the batch committed, in one statement
   * (one round trip however many, each waiting through a pooler), so that
   * holder takes them at its next call (the fenced hand-over: the tokens are
   * dead from now on). A slot no longer held is skipped.
   */
  async _handOver(client, slots) {
    for (const s of slots) {
      this._wanted.delete(s);
      this._backlog.forget(s);
    }
    const held = slots.filter((s) => this.held.has(s)).map((s) => [s, this.held.get(s)]);
    if (!held.length) return;
    await client.query("SELECT count(release_lease($1, u.s, u.t)) FROM unnest($2::int[], $3::bigint[]) u(s, t)",
      [this.name, held.map(([s]) => s), held.map(([, t]) => String(t))]);
    const now = new Map(this.held);
    for (const [s, t] of held) if (now.get(s) === t) now.delete(s);
    if (now.size !== this.held.size) this._setHeld(now, "given back");
  },

  /** Lease mode's balance: no slot held, or every held slot walked (its last batch came back short). */
  _hungry() {
    return this.balance && [...this.held.keys()].every((s) => this._backlog.weight(s) === 0);
  },

  async _serveSession(client, server) {
    const listening = new Set();
    let claimedAt = 0;
    const claim = async () => {
      if (this.held.size > 0 && Date.now() - claimedAt < SESSION_CLAIM_MS) return;
      claimedAt = Date.now();
      const r = (await client.query("SELECT claim_slots($1, $2, $3) AS s, pg_backend_pid() AS pid",
        [this.name, this.n, this.maxSlots]).catch((e) => {
        throw SESSION_STATES.includes(e.code) ? this._sessionResized(e) : e;
      })).rows[0];
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
  },

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

  /**
   * Opens the batch's transaction in one message (one round trip): BEGIN, in lease mode the
   * idle limit and the fence first (with `records`' has_failures when it asks), then with
   * `fetch` (the fetch's SQL) the slot's next rows. The rows ([] without `fetch`), or null
   * when the fence refused the token (rolled back).
   */
  async _begin(client, slot, token, fetch = null, count = null, records = null) {
    // a worker paused inside its fenced transaction (SIGSTOP, a GC pause) holds its slot:
    // the server ends that transaction after idleMs, so the slot moves on as a lease would
    const idle = this.idleMs > 0 ? `; SET LOCAL idle_in_transaction_session_timeout = ${this.idleMs}` : "";
    // the guard: lease mode the fence, session mode the session's own lock
    const name = client.escapeLiteral(this.name);
    let guard = token === null ? `SELECT ${slot} = ANY (my_slots(${name})) AS mine` : `SELECT fence(${name}, ${slot}, ${token}::bigint)`;
    // balance: the slot's weight as its batches saw it, and whether another
    // holder wants it (then given back after this batch)
    const { report, weight } = token !== null && this.balance ? this._backlog.report(slot, Date.now()) : { report: false, weight: null };
    if (report) guard += `, report_backlog(${name}, ${slot}, ${token}::bigint, ${weight === null ? "NULL" : weight}::bigint, fenced_batches => true) AS wanted`;
    if (records && records.ask) guard += `, has_failures(${name}) AS failing`; // later fetches may leave the records out
    const open = `BEGIN${idle}; ${guard}`;
    try {
      const r = await client.query([open, fetch, count].filter((x) => x !== null).join("; "));
      if (count !== null) {
        const c = r.pop().rows[0];
        this._lastFetch.counted = { pending: Number(c.pending), last: c.last };
      }
      const guarded = r[idle ? 2 : 1].rows[0]; // the guard's row
      if (token === null && !guarded.mine) throw Object.assign(new Error("pg-claim: the session no longer holds the slot"), { code: "PC001" });
      if (token !== null) for (const s of guarded.wanted || []) this._wanted.add(s); // the worker's slots wanted elsewhere
      if (records && records.ask) this._records.answered(slot, token, guarded.failing, Date.now(), records.gen);
      return fetch === null ? [] : r[r.length - 1].rows;
    } catch (e) {
      if (isConnectionLost(e)) throw e;
      await client.query("ROLLBACK");
      if (e.code !== "PC001") throw e;
      this.stats.fenced++;
      this._emit("rejected", { slot, token });
      if (this._prom) this._prom.fenceRejections.inc({ fleet: this.name });
      if (token !== null && await this._refused(client)) return null; // the fleet was resized: every slot dropped
      if (this.held.get(slot) === token && !this._leaving.has(slot)) { // until a claim returns it again
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
    const t0 = process.hrtime.bigint(); // the batch latency: from its BEGIN (with the fence and fetch) to its COMMIT
    // balance: a window of the slot's pending rows counted in the same message
    const win = !side && token !== null && this.balance && this._countText !== null ? this._backlog.window(slot, cursor, Date.now()) : null;
    this._lastFetch = { fetched: 0, counted: null };
    const records = side ? null : this._records.plan(slot, token, Date.now());
    const rows = await this._begin(client, slot, token, this._fetchText(slot, cursor, records === null || records.join),
      win === null ? null : this._countText(slot, win.after, win.bound), records);
    if (rows === null) return { handled: 0, end: true, fenced: true };
    this._lastFetch.fetched = rows.length;
    let open = true;
    try {
      // my_items_fair (fair, spread) reads the same rows again while none is
      // done: a batch with nothing to do ends the pass
      let end = side ? false : rows.length < this.batch;
      const { items, due } = this._items(rows, w, cursor, side ? side.only : null);
      const retryMs = soonest(items.filter((it) => it.failure === "retry").map((it) => it.retryMs));
      if (this.tenants && !side && due.length === 0) end = true;
      const next = end || this.tenants ? null : items.length ? items[items.length - 1].key : cursor;
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
          this._emit("retrying", { slot, item: due[0].key, error: st.error, count: st.count, pauseMs: st.pauseMs });
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
    // counted as the Python library does: the batches that committed items
    if (ok > 0) this._countBatch(slot, ok, seconds);
    this._emit("batch", { slot, token, items: ok, failed, seconds });
  },

  _countBatch(slot, ok, seconds) {
    this.stats.items += ok;
    this.stats.batches++;
    this.stats.batchSeconds += seconds;
    if (this._prom) {
      this._prom.items.inc({ fleet: this.name, slot }, ok);
      this._prom.batches.inc({ fleet: this.name, slot });
      this._prom.latency.observe({ fleet: this.name }, seconds);
    }
  },

  _advance(slot, w, next, end) {
    if (this._walks.get(slot) !== w) return; // the slot moved meanwhile: its next holder walks it from the start
    w.after = next;
    if (end && w.heldRoutes) w.heldRoutes.clear(); // a new pass: the held routes are looked at again
  },
};

module.exports = { methods };
