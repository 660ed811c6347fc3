// One lease worker in Node.js (node-postgres), started by tests/pooler/run.py.
//
// It connects through PgBouncer in pool_mode = transaction (the PG*
// environment variables), claims a lease of FLEET_NAME with n = FLEET_N (a
// standby polls until a slot is free), walks its share of `items` with
// my_items and writes each batch in ONE statement guarded by lease_valid();
// a timer renews the lease on its own connection every FLEET_RENEW_S, whatever
// the batch does.
// It reports every claim, batch, write, rejected write and lost lease as one
// JSON line on stdout.
//
// The part between the "docs/leases.md" markers is shown verbatim in
// docs/leases.md ("Worker loops"); run.py fails when the two differ.
"use strict";
const crypto = require("crypto");
const os = require("os");
const { Client } = require("pg");

const NAME = process.env.FLEET_NAME;
const N = Number(process.env.FLEET_N);
const TTL = `${process.env.FLEET_TTL_S} seconds`;
const RENEW_MS = Number(process.env.FLEET_RENEW_S) * 1000;
const BATCH = Number(process.env.FLEET_BATCH);
const ITEM_MS = Number(process.env.FLEET_ITEM_MS);
const POLL_MS = 200; // a standby's claim interval, and a walked share's pause
// one claim instance: this process, on this host (a pid is reused, the random part is not)
const HOLDER = `${os.hostname()}:${process.pid}:${crypto.randomBytes(8).toString("hex")}`;
const TTL_MS = Number(process.env.FLEET_TTL_S) * 1000;
// A lost connection (08: connection exception, 57P0x: the server shut down or
// ended the session, 25P03: idle in a transaction too long), not a failed batch.
const lost = (e) => /^(08|57P0|25P03|E[A-Z]+$)/.test(e.code ?? "") || /Connection terminated|not queryable|server conn crashed/.test(e.message);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, worker: HOLDER, t: Date.now() / 1000, ...fields }) + "\n");
}

async function processItems(ids) {
  await sleep(ITEM_MS * ids.length); // the work on one batch (e-mails, calls, ...)
}

// docs/leases.md: begin
// The lease of `slot`, renewed every RENEW_MS on a connection of its own,
// whatever the batch in progress does (a batch may wait in the pool behind
// other clients' transactions). `over` is set when the lease is lost (a
// renewal returned NULL, or none succeeded for a TTL) or given up (stop).
function keepRenewed(slot, token) {
  const lease = { slot, token, over: false, why: null, stop() { this.over = true; } };
  (async () => {
    let validUntil = Date.now() + TTL_MS, renewer = null;
    for (;;) {
      await sleep(RENEW_MS);
      if (lease.over) break;
      const asked = Date.now();
      let until = null;
      try {
        if (renewer === null) {
          renewer = new Client();
          renewer.on("error", () => {}); // a lost connection: the next query fails and says so
          await renewer.connect();
        }
        until = (await renewer.query("SELECT renew_lease($1, $2, $3, $4) AS until", [NAME, slot, token, TTL])).rows[0].until;
      } catch (e) { // again at the next period, on a new connection
        renewer?.end().catch(() => {});
        renewer = null;
        if (Date.now() < validUntil) continue;
      }
      if (until === null) {
        lease.why = "renew_lease returned NULL or failed for a TTL";
        lease.over = true;
      } else {
        validUntil = asked + TTL_MS;
      }
    }
    renewer?.end().catch(() => {});
  })();
  return lease;
}

// Process the share of the lease's slot until the lease is over; returns why.
async function work(client, lease) {
  const { slot, token } = lease;
  let after = null;
  while (!lease.over) {
    const { rows } = await client.query(
      "SELECT id, done FROM my_items(NULL::items, $1, $2, after => $3, batch => $4)",
      [slot, N, after, BATCH]);
    if (rows.length === 0) { // the whole share is walked: start again from its beginning
      after = null;
      await sleep(POLL_MS);
      continue;
    }
    after = rows[rows.length - 1].id; // bigint comes back as a string
    const todo = rows.filter((r) => !r.done).map((r) => r.id);
    if (todo.length === 0) continue;
    emit("fetched", { slot, token, items: todo.length });
    await processItems(todo); // a batch takes well under the TTL
    // one statement: it writes only if the lease is still ours
    const w = await client.query(
      `WITH done AS (
         UPDATE items SET done = true
         WHERE id = ANY($3) AND (SELECT lease_valid($1, $2, $4))
         RETURNING id)
       INSERT INTO processing_log (item, worker, token) SELECT id, $5, $4 FROM done`,
      [NAME, slot, todo, token, HOLDER]);
    if (w.rowCount === 0) {
      emit("rejected", { slot, token, items: todo.length, how: "lease_valid false" });
      return "lease_valid returned false";
    }
    emit("wrote", { slot, token, items: todo.length });
  }
  return lease.why;
}

// Claim a lease (or wait as a standby) and work on it, again and again.
async function serve(client) {
  for (;;) {
    const r = await client.query("SELECT slot, token FROM claim_lease($1, $2, $3, $4)", [NAME, N, HOLDER, TTL]);
    if (r.rows.length === 0) { // all n slots are leased: a standby
      await sleep(POLL_MS);
      continue;
    }
    const lease = keepRenewed(r.rows[0].slot, r.rows[0].token);
    emit("claimed", { slot: lease.slot, token: lease.token });
    let why;
    try {
      why = await work(client, lease);
    } finally {
      lease.stop();
    }
    emit("lost", { slot: lease.slot, token: lease.token, why });
  }
}

async function main() {
  for (;;) {
    const client = new Client(); // node-postgres prepares no named statements
    client.on("error", () => {}); // a lost connection: the next query fails and says so
    try {
      await client.connect();
      await serve(client);
    } catch (e) {
      client.end().catch(() => {});
      // the connection is gone (a server restart, the network, the server
      // ending a session idle in a transaction for too long): connect and
      // claim again; the same holder gets its lease back if it is still its own
      if (!lost(e)) throw e;
      emit("reconnecting", { error: e.message });
      await sleep(POLL_MS);
    }
  }
}
// docs/leases.md: end

// Exit when the driver is gone or the lifetime is over, whatever the loop does.
const parent = process.ppid;
const end = Date.now() + Number(process.env.FLEET_LIFETIME_S || 100) * 1000;
setInterval(() => {
  if (process.ppid !== parent || Date.now() > end) process.exit(3);
}, 500).unref();
process.stdout.on("error", () => process.exit(3));

main().catch((e) => {
  emit("error", { error: `${e.code || ""} ${e.message}` });
  process.exit(1);
});
