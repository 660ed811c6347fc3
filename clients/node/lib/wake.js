"use strict";
// A Worker's wake-ups (methods mixed into Worker.prototype): the idle wait
// (a notification, a change of slots, stop, the poll or the first retry
// due), the back-off pauses, and LISTEN on the held slots' channels.
const { nextPause, waitMs, errorText, BACKOFF_CAP_MS } = require("./util");

const methods = {
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
  },

  /** Sleeps `ms` (a back-off); only stop() ends it sooner. */
  _pauseFor(ms) {
    if (this._stopping) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => { clearTimeout(timer); this._stopWaiters.delete(done); resolve(); };
      const timer = setTimeout(done, ms);
      this._stopWaiters.add(done);
    });
  },

  /** The next pause of the back-off: doubled from 100 ms up to 5 s, in lease mode at most ttl / 3. */
  _nextPause(pause) {
    return nextPause(pause, this.mode === "lease" ? Math.min(BACKOFF_CAP_MS, this.ttlMs / 3) : BACKOFF_CAP_MS);
  },

  _wake(why) {
    if (why === "notify") this._resting.clear();
    if (this._waiter) this._waiter(why);
    else if (why === "notify") this._woken = true;
  },

  /**
   * A whole round found nothing to do: how long to wait, told as a
   * `waiting` event. Until the first retry of an item of the held slots is
   * due, if that is sooner than the poll.
   */
  _waitingMs() {
    const retryMs = this._nextRetryMs();
    const ms = waitMs(this.pollMs, retryMs);
    this._emit("idle", { ms, retryMs });
    return ms;
  },

  /** LISTEN on the channels of the held slots on the direct notify connection (lease mode). */
  async _listenLoop() {
    let pause = 0;
    while (this._renewing) {
      let c = null;
      try {
        c = await this._connect(this.notifyConnection, "_listenClient");
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
        pause = this._nextPause(pause);
        this._emit("listen_failed", { error: errorText(e), pauseMs: pause });
        await this._pauseFor(pause);
      } finally {
        if (c) this._drop(c);
      }
    }
  },

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
  },
};

module.exports = { methods };
