// A Node.js worker of the resize fleet test (test_resize.py): a pg-claim
// Worker in lease mode through the pooler (the PG* environment variables) on
// the ordered outbox, routed by customer with the jump mapping; the same
// handler as resize_worker.py (RESIZE_ITEM_MS of work per message, the batch's messages sent and logged, in id
// order, in its transaction). Every event is one JSON line on stdout.
// SIGTERM: the batch finishes, the slots are given back, exit 0.
"use strict";
const path = require("path");
const { Worker } = require(path.join(__dirname, "..", "..", "clients", "node"));

const env = (k) => process.env[k];
const ITEM_MS = Number(env("RESIZE_ITEM_MS") || 0);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const emit = (event, fields) => process.stdout.write(JSON.stringify({ ...fields, event }) + "\n");

const worker = new Worker({
  name: env("RESIZE_NAME") || "resize", table: "outbox", n: Number(env("RESIZE_N")), pending: "sent_at",
  key: "id", route: "customer_id", method: "jump", batch: Number(env("RESIZE_BATCH") || 50), mode: "lease",
  ttl: `${env("RESIZE_TTL_S") || 2} seconds`, pollInterval: 200,
  handler: async (client, rows, batch) => {
    await sleep(ITEM_MS * rows.length); // the work (I/O), inside the fenced transaction
    const ids = rows.map((r) => r.id);
    await client.query("UPDATE outbox SET sent_at = clock_timestamp() WHERE id = ANY($1)", [ids]);
    await client.query("INSERT INTO sent_log (item, customer_id, slot, token, holder)"
      + " SELECT o.id, o.customer_id, $1, $2, $3 FROM outbox o WHERE o.id = ANY($4) ORDER BY o.id",
    [batch.slot, batch.token, batch.holder, ids]);
  },
  onEvent: (e) => {
    const { type, name, ...rest } = e;
    emit(type, rest);
  },
});
emit("holder", { holder: worker.holder });

// exit when the driver is gone, whatever the loop does
const parent = process.ppid;
setInterval(() => { if (process.ppid !== parent) process.exit(3); }, 500).unref();
process.stdout.on("error", () => process.exit(3));

worker.run({ handleSignals: true }).then(() => {
  emit("exit", {});
  process.exit(0);
}, (e) => {
  emit("error", { error: `${e.code || ""} ${e.message}` });
  process.exit(1);
});
