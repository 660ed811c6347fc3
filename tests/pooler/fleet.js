// One lease worker in Node.js, started by tests/pooler/test_fleets.py: a Worker of
// pg-claim (clients/node, node-postgres) in lease mode.
//
// It connects through PgBouncer in pool_mode = transaction (the PG*
// environment variables) and serves the fleet FLEET_NAME of n = FLEET_N
// slots of the table `items`: the library claims (claim_leases every ttl / 3
// on a connection of its own), walks each held slot's share and calls the
// handler below once per batch inside the batch's transaction, which passed
// fence() first. The handler works FLEET_ITEM_MS per item, then marks the
// rows done and logs each item with the holder and the token. It reports as
// one JSON line on stdout each batch it fetched ("fetched", from inside the
// transaction), each batch committed ("wrote"), each write of the handler
// that failed ("refused": a worker stopped past the TTL finds its session
// ended), and every event of the library.
//
// The part between the "docs/leases.md" markers is shown verbatim in
// docs/leases.md ("Worker loops"); test_claim_slot.py fails when the two differ.
"use strict";
const path = require("path");
const { Worker, makeHolder } = require(path.join(__dirname, "..", "..", "clients", "node"));

const NAME = process.env.FLEET_NAME;
const N = Number(process.env.FLEET_N);
const TTL = `${process.env.FLEET_TTL_S} seconds`;
const BATCH = Number(process.env.FLEET_BATCH);
const ITEM_MS = Number(process.env.FLEET_ITEM_MS);
const HOLDER = makeHolder(); // host:pid:random

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ ...fields, event, worker: HOLDER, t: Date.now() / 1000 }) + "\n");
}

async function processItems(ids) {
  await sleep(ITEM_MS * ids.length); // the work on one batch (e-mails, calls, ...)
}

// docs/leases.md: begin
// One batch: client is the batch's connection inside its transaction, which
// passed fence(name, slot, token) first.
async function handle(client, rows, batch) {
  const ids = rows.map((r) => r.id); // bigint comes back as a string
  emit("fetched", { slot: batch.slot, token: batch.token, items: ids.length });
  await processItems(ids);
  try {
    await client.query("UPDATE items SET done = true WHERE id = ANY($1)", [ids]);
    await client.query("INSERT INTO processing_log (item, worker, token) SELECT unnest($1::bigint[]), $2, $3",
      [ids, HOLDER, batch.token]);
  } catch (e) { // e.g. the server ended the session idle in the transaction
    emit("refused", { slot: batch.slot, token: batch.token, items: ids.length, how: e.message });
    throw e; // the library rolls back, reconnects and claims again
  }
}

const worker = new Worker({
  name: NAME, table: "items", n: N, pending: "done", batch: BATCH, mode: "lease", ttl: TTL,
  holder: HOLDER, pollInterval: 200, handler: handle, balance: process.env.FLEET_BALANCE !== "0",
  onEvent: ({ type, name, holder, ...fields }) => emit(type === "batch" && fields.items ? "wrote" : type, fields),
});
// docs/leases.md: end

// Exit when the driver is gone or the lifetime is over, whatever the loop does.
const parent = process.ppid;
const end = Date.now() + Number(process.env.FLEET_LIFETIME_S || 100) * 1000;
setInterval(() => {
  if (process.ppid !== parent || Date.now() > end) process.exit(3);
}, 500).unref();
process.stdout.on("error", () => process.exit(3));

worker.run({ handleSignals: true }).then(() => process.exit(0), (e) => {
  emit("error", { error: `${e.code || ""} ${e.message}` });
  process.exit(1);
});
