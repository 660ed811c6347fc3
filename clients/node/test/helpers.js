"use strict";
// Shared by the tests against a server: PGHOST/PGPORT/PGUSER (libpq's
// variables) name one where pg_claim is installed.
const net = require("net");
const { Client } = require("pg");

const SKIP = process.env.PGPORT ? false : "PGPORT is not set: no server to test against";
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The rows of `text` in `database`, on a connection of its own. */
async function sql(database, text, params = []) {
  const c = new Client({ database });
  await c.connect();
  try {
    return (await c.query(text, params)).rows;
  } finally {
    await c.end();
  }
}

/** Polls `fn` every 50 ms until it returns a truthy value (returned), or fails after `ms`. */
async function until(fn, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/** A fresh database `name` with pg_claim, dropped after the test `t`. */
async function freshDatabase(t, name) {
  await sql("postgres", `DROP DATABASE IF EXISTS ${name}`);
  await sql("postgres", `CREATE DATABASE ${name}`);
  await sql(name, "CREATE EXTENSION pg_claim");
  t.after(() => sql("postgres", `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
}

/**
 * A TCP proxy on 127.0.0.1 to the server of PGHOST/PGPORT (its socket or
 * its port). freeze(keep) stops forwarding, in both directions, on every
 * connection but those numbered in `keep` (0: the first accepted) and on
 * every new one, without closing a socket: a half-open network path.
 * thaw() lets new connections through again (the frozen ones stay so).
 */
async function halfOpenProxy() {
  const host = process.env.PGHOST || "/var/run/postgresql", port = Number(process.env.PGPORT || 5432);
  const target = host.startsWith("/") ? { path: `${host}/.s.PGSQL.${port}` } : { host, port };
  const pairs = [];
  let freezeNew = false;
  const server = net.createServer((down) => {
    const up = net.connect(target);
    const pair = { down, up, frozen: freezeNew };
    pairs.push(pair);
    for (const [from, to] of [[down, up], [up, down]]) {
      from.on("data", (d) => { if (!pair.frozen) to.write(d); });
      from.on("error", () => {});
      from.on("close", () => { if (!pair.frozen) to.destroy(); });
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: server.address().port,
    connections: () => pairs.length,
    freeze(keep = []) {
      freezeNew = true;
      pairs.forEach((p, i) => { if (!keep.includes(i)) p.frozen = true; });
    },
    thaw() { freezeNew = false; },
    close() {
      for (const p of pairs) { p.down.destroy(); p.up.destroy(); }
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

module.exports = { SKIP, sleep, sql, until, freshDatabase, halfOpenProxy };
