// One elastic lease worker in Node.js, started by tests/pooler/test_elastic.py:
// a Worker of pg-claim (clients/node, node-postgres) in lease mode.
//
// It connects through PgBouncer in pool_mode = transaction (the PG*
// environment variables) and holds, with the holder ELASTIC_HOLDER, every
// slot of the n = ELASTIC_N slots of ELASTIC_NAME its share gives it: the
// library calls claim_leases(..., ttl => ELASTIC_TTL_S) every
// ELASTIC_PERIOD_S on a connection of its own, walks each held slot's share
// of `items` (routed by customer) in batches of ELASTIC_BATCH and calls the
// handler below once per batch inside the batch's transaction, which passed
// fence() first. The handler works ELASTIC_ITEM_MS per item, then marks the
// rows done and logs each item with the holder, the slot and the token.
// Balance by remaining work is off (claim_leases shares the slots by
// count). On SIGTERM the library finishes its batch, gives every slot back
// (claim_leases(..., max => 0)) and run() resolves: exit 0.
//
// Every event of the library is one JSON line on stdout, in the words the
// test reads: "fetched" (the handler, before its work), "wrote" (a batch
// that committed), "refused" (a write of the handler that failed: a worker
// stopped past the ttl inside its batch finds its session ended by the
// server), "rejected" (the fence refused the token, PC001), "held" (the
// held slots changed: slot and token pairs), and the library's own names
// for the others ("lost" with its reason, "started", "reconnecting",
// "left", ...).
"use strict";
const path = require("path");
const { Worker, makeHolder } = require(path.join(__dirname, "..", "..", "clients", "node"));

const NAME = process.env.ELASTIC_NAME;
const N = Number(process.env.ELASTIC_N);
const TTL_MS = Number(process.env.ELASTIC_TTL_S) * 1000;
const PERIOD_MS = Number(process.env.ELASTIC_PERIOD_S) * 1000;
const BATCH = Number(process.env.ELASTIC_BATCH);
const ITEM_MS = Number(process.env.ELASTIC_ITEM_MS);
const POLL_MS = 100; // an idle share's poll (the table has no notify_slot trigger)
const HOLDER = process.env.ELASTIC_HOLDER || makeHolder(); // host:pid:random

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ ...fields, event, worker: HOLDER, t: Date.now() / 1000 }) + "\n");
}

// One batch: client is the batch's connection inside its transaction, which
// passed fence(name, slot, token) first.
async function handle(client, rows, batch) {
  const ids = rows.map((r) => r.id); // bigint comes back as a string
  emit("fetched", { slot: batch.slot, token: batch.token, items: ids.length });
  await sleep(ITEM_MS * ids.length); // the work on one batch (e-mails, calls, ...)
  try {
    await client.query("UPDATE items SET done = true WHERE id = ANY($1)", [ids]);
    await client.query("INSERT INTO processing_log (item, worker, slot, token)"
      + " SELECT unnest($1::bigint[]), $2, $3, $4", [ids, HOLDER, batch.slot, batch.token]);
  } catch (e) { // e.g. the server ended the session idle in the transaction
    emit("refused", { slot: batch.slot, token: batch.token, items: ids.length, how: e.message });
    throw e; // the library rolls back, reconnects and claims again
  }
}

const worker = new Worker({
  name: NAME, table: "items", n: N, pending: "done", batch: BATCH, mode: "lease", ttl: TTL_MS,
  renewInterval: PERIOD_MS, route: "customer", holder: HOLDER, balance: false, pollInterval: POLL_MS,
  handler: handle,
  onEvent: ({ type, name, holder, ...fields }) => {
    if (type === "batch") {
      if (fields.items) emit("wrote", fields); // committed
    } else if (type === "rejected") emit("rejected", { ...fields, how: "PC001" });
    else if (type === "slots") emit("held", { slots: [...worker.held], gained: fields.gained, lost: fields.lost });
    else if (type !== "idle" && type !== "woken") emit(type, fields);
  },
});

// Exit when the driver is gone or the lifetime is over, whatever the loop does.
const parent = process.ppid;
const end = Date.now() + Number(process.env.ELASTIC_LIFETIME_S || 120) * 1000;
setInterval(() => {
  if (process.ppid !== parent || Date.now() > end) process.exit(3);
}, 500).unref();
process.stdout.on("error", () => process.exit(3));

worker.run({ handleSignals: true }).then(() => process.exit(0), (e) => {
  emit("error", { error: `${e.code || ""} ${e.message}` });
  process.exit(1);
});
