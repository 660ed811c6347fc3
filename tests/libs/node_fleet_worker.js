// One worker of the Node.js library's fleet test (tests/libs/test_node_fleet.py):
// a pg-claim Worker in lease mode through PgBouncer (the PG* environment
// variables). Its handler works FLEET_ITEM_MS per item (an I/O-bound call),
// marks the rows done and logs each item with the holder, slot and token;
// the item FLEET_POISON always fails. Every event of the worker is one JSON
// line on stdout. SIGTERM: run({ handleSignals: true }) finishes the batch,
// gives the slots back and resolves; the process exits 0.
"use strict";
const path = require("path");
const { Worker } = require(path.join(__dirname, "..", "..", "clients", "node"));

const env = (k) => process.env[k];
const ITEM_MS = Number(env("FLEET_ITEM_MS"));
const POISON = env("FLEET_POISON");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const emit = (event, fields) => process.stdout.write(JSON.stringify({ ...fields, event, t: Date.now() / 1000 }) + "\n");

const worker = new Worker({
  name: env("FLEET_NAME"), table: "items", n: Number(env("FLEET_N")), pending: "done",
  batch: Number(env("FLEET_BATCH")), mode: "lease", ttl: `${env("FLEET_TTL_S")} seconds`,
  holder: env("FLEET_HOLDER") || undefined, pollInterval: 200, maxAttempts: 3, backoff: "300 milliseconds",
  handler: async (client, rows, batch) => {
    emit("fetched", { slot: batch.slot, token: batch.token, items: rows.length });
    await sleep(ITEM_MS * rows.length); // the work: a call per item
    if (rows.some((r) => r.id === POISON)) throw new Error(`item ${POISON} is poison`);
    const ids = rows.map((r) => r.id);
    await client.query("UPDATE items SET done = true WHERE id = ANY($1)", [ids]);
    await client.query("INSERT INTO processing_log (item, worker, slot, token) SELECT unnest($1::bigint[]), $2, $3, $4",
      [ids, batch.holder, batch.slot, batch.token]);
  },
  onEvent: (e) => {
    const { type, name, ...rest } = e;
    emit(type, rest);
  },
});
emit("started", { holder: worker.holder });

// Exit when the driver is gone or the lifetime is over, whatever the loop does.
const parent = process.ppid;
const end = Date.now() + Number(env("FLEET_LIFETIME_S") || 300) * 1000;
setInterval(() => { if (process.ppid !== parent || Date.now() > end) process.exit(3); }, 500).unref();
process.stdout.on("error", () => process.exit(3));

worker.run({ handleSignals: true }).then(() => {
  emit("exit", { stats: worker.stats });
  process.exit(0);
}, (e) => {
  emit("error", { error: `${e.code || ""} ${e.message}` });
  process.exit(1);
});
