// One lease worker in Node.js (node-postgres), started by tests/pooler/run.py.
//
// It connects through PgBouncer in pool_mode = transaction (the PG*
// environment variables), claims a lease of FLEET_NAME with n = FLEET_N (a
// standby polls until a slot is free), walks its share of `items` with
// my_items and writes each batch in ONE statement guarded by lease_valid().
// It reports every claim, batch, write, rejected write and lost lease as one
// JSON line on stdout.
//
// The part between the "docs/leases.md" markers is shown verbatim in
// docs/leases.md ("Worker loops"); run.py fails when the two differ.
"use strict";
const { Client } = require("pg");

const NAME = process.env.FLEET_NAME;
const N = Number(process.env.FLEET_N);
const TTL = `${process.env.FLEET_TTL_S} seconds`;
const RENEW_MS = Number(process.env.FLEET_RENEW_S) * 1000;
const BATCH = Number(process.env.FLEET_BATCH);
const ITEM_MS = Number(process.env.FLEET_ITEM_MS);
const POLL_MS = 200; // a standby's claim interval, and a walked share's pause
const HOLDER = `js-${process.pid}`;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, worker: HOLDER, t: Date.now() / 1000, ...fields }) + "\n");
}

async function processItems(ids) {
  await sleep(ITEM_MS * ids.length); // the work on one batch (e-mails, calls, ...)
}

// docs/leases.md: begin
// Process the share of `slot` until the lease is lost; returns why.
async function work(client, slot, token) {
  let after = null;
  let renewAt = Date.now() + RENEW_MS;
  for (;;) {
    if (Date.now() >= renewAt) {
      const r = await client.query("SELECT renew_lease($1, $2, $3, $4) AS until", [NAME, slot, token, TTL]);
      if (r.rows[0].until === null) return "renew_lease returned NULL";
      renewAt = Date.now() + RENEW_MS;
    }
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
    await processItems(todo);
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
}

async function main() {
  const client = new Client(); // node-postgres prepares no named statements
  await client.connect();
  for (;;) {
    const r = await client.query("SELECT slot, token FROM claim_lease($1, $2, $3, $4)", [NAME, N, HOLDER, TTL]);
    if (r.rows.length === 0) { // all n slots are leased: a standby
      await sleep(POLL_MS);
      continue;
    }
    const { slot, token } = r.rows[0];
    emit("claimed", { slot, token });
    const why = await work(client, slot, token);
    emit("lost", { slot, token, why });
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
