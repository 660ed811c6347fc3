"use strict";
// Lease mode's census (docs/leases.md, "Balancing") against a real server, as
// clients/python/tests/test_balance.py: a batch that finds rows in a slot
// that weighed 0 counts the worker's other slots that weigh 0 at once and
// reports their weights with its own, so once rows come to every slot of an
// idle worker, every lease carries its weight after its first batch (a
// poll's lag: two), not one batch per slot. Skipped when PGPORT is not set.
const test = require("node:test");
const assert = require("node:assert");
const { Worker } = require("..");

const { SKIP, sleep, until, freshDatabase, sql: sqlIn } = require("./helpers");

const DB = `node_balance_${process.pid}`;
const sql = (text, params) => sqlIn(DB, text, params);
const N = 8;

test("new rows are weighed in every slot at once", { skip: SKIP }, async (t) => {
  await freshDatabase(t, DB);
  await sql("CREATE TABLE cen (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)");
  let batches = 0;
  const w = new Worker({ connection: { database: DB }, name: "cen", table: "cen", n: N, pending: "done", batch: 10,
    ttl: "30 seconds", pollInterval: 200, onEvent: (e) => { if (e.type === "batch") batches++; },
    handler: async (client, rows) => {
      await sleep(200);
      await client.query("UPDATE cen SET done = true WHERE id = ANY($1)", [rows.map((r) => r.id)]);
    } });
  const running = w.run();
  const count = async (where) => (await sql(`SELECT count(*)::int AS k FROM pg_claim_leases WHERE name = 'cen' AND ${where}`))[0].k;
  let seen, weights;
  try {
    await until(async () => (await count("backlog = 0 AND expires_at > now()")) === N, 20000, "every slot weighed 0");
    await sql(`INSERT INTO cen SELECT g FROM generate_series(1, ${N * 100}) g`);
    await until(async () => (await count("backlog > 0")) === N, 20000, "every slot weighed");
    seen = batches;
    weights = (await sql("SELECT backlog::int AS w FROM pg_claim_leases WHERE name = 'cen'")).map((r) => r.w);
  } finally {
    await w.stop();
    await running;
  }
  assert.ok(seen <= 2, `every slot weighed only after ${seen} batches`);
  assert.ok(weights.every((x) => x > 0 && x <= 100), JSON.stringify(weights));
});
