"use strict";
// A Worker's connections (methods mixed into Worker.prototype): every wait
// bounded (the connect, each query, TCP keepalives), and closed without
// waiting for a path that does not answer.
const { Client } = require("pg");

const methods = {
  /**
   * A new connection, every wait on it bounded: the connect by half the
   * ttl, each query by the query timeout, TCP keepalives after a third of
   * the ttl. Its transaction status (ReadyForQuery's byte: I, T or E)
   * is kept in `pgClaimStatus`; `pgClaimGone` once it broke or ended. With
   * `slot`, it is kept in this[slot] while open (stop() cuts it off).
   */
  async _connect(config, slot = null) {
    const c = new Client({
      application_name: process.env.PGAPPNAME ? undefined : `pg_claim ${this.name}`.slice(0, 63), connectionTimeoutMillis: this._connectMs, keepAlive: true,
      keepAliveInitialDelayMillis: Math.round(this.ttlMs / 3), query_timeout: this.queryTimeoutMs || undefined, ...config,
    });
    c.pgClaimStatus = null;
    c.pgClaimGone = false;
    c.connection.on("readyForQuery", (m) => { c.pgClaimStatus = m.status; });
    c.on("error", () => { c.pgClaimGone = true; }); // a broken connection: the next query fails and says how
    c.on("end", () => { c.pgClaimGone = true; });
    c.on("notice", () => {});
    try {
      await c.connect();
    } catch (e) {
      this._drop(c);
      throw e;
    }
    if (slot) {
      this[slot] = c;
      c.once("end", () => { if (this[slot] === c) this[slot] = null; });
    }
    return c;
  },

  /** Closes a connection without waiting for it: destroyed at once with `now`, else 0.5 s after asking. */
  _drop(c, now = false) {
    c.pgClaimGone = true;
    const stream = c.connection && c.connection.stream;
    if (now) { if (stream) stream.destroy(); return; }
    c.end().catch(() => {});
    if (stream) setTimeout(() => stream.destroy(), 500).unref();
  },
};

module.exports = { methods };
