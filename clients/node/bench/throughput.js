#!/usr/bin/env node
// Throughput of pg-claim's Worker next to a plain FOR UPDATE SKIP LOCKED
// loop with the same handler, through a transaction-mode pooler.
//
//   node bench/throughput.js --direct postgresql://postgres@127.0.0.1:5432/postgres \
//        --pooled postgresql://postgres@127.0.0.1:6432 [--items 20000] [--workers 8] [--n 16] [--io-ms 0,20]
//
// For each handler (--io-ms: milliseconds of I/O per batch, an awaited
// timer standing for one call to another service) and each way, --workers
// workers in this process, each on connections of its own through --pooled,
// start on an empty table and poll it every 50 ms; once they are ready (the
// Workers hold their shares of the n slots), --items rows are inserted and
// the time until all are done is measured. Batches of 50; the handler waits
// io-ms inside the batch's transaction, then marks the batch done.
"use strict";
const { Client } = require("pg");
const { Worker } = require("..");

const arg = (k, d) => { const i = process.argv.indexOf(`--${k}`); return i > 0 ? process.argv[i + 1] : d; };
const DIRECT = arg("direct"), POOLED = arg("pooled");
const ITEMS = Number(arg("items", 20000)), WORKERS = Number(arg("workers", 8)), N = Number(arg("n", 16)), BATCH = 50;
const IO = arg("io-ms", "0,20").split(",").map(Number);
const DB = "node_bench";
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
if (!DIRECT || !POOLED) { console.error("--direct URL and --pooled URL (without a database) are required"); process.exit(2); }

async function on(url, fn) {
  const c = new Client({ connectionString: url });
  await c.connect();
  try { return await fn(c); } finally { await c.end(); }
}
const dbUrl = (url) => `${url.replace(/\/[^/]*$/, "")}/${DB}`;

async function fresh() {
  await on(dbUrl(DIRECT), (c) => c.query(`
    DROP TABLE IF EXISTS jobs;
    CREATE TABLE jobs (id bigint PRIMARY KEY, payload text NOT NULL, done boolean NOT NULL DEFAULT false);
    CREATE INDEX ON jobs ((slot_of(id, ${N})), id) WHERE NOT done;
    CREATE INDEX ON jobs (id) WHERE NOT done`));
}
const fill = () => on(dbUrl(DIRECT), async (c) => {
  await c.query(`INSERT INTO jobs (id, payload) SELECT g, 'job ' || g FROM generate_series(1, ${ITEMS}) g`);
  await c.query("ANALYZE jobs");
});
const left = () => on(dbUrl(DIRECT), async (c) => Number((await c.query("SELECT count(*) FROM jobs WHERE NOT done")).rows[0].count));

async function handle(client, ids, ioMs) {
  if (ioMs) await sleep(ioMs);
  await client.query("UPDATE jobs SET done = true WHERE id = ANY($1)", [ids]);
}

// Each way: start the fleet on the empty table, wait until it is ready (the
// leases shared out), insert the items, and time the drain.
async function skipLocked(ioMs, timed) {
  let stop = false;
  const loop = async () => {
    const c = new Client({ connectionString: dbUrl(POOLED) });
    await c.connect();
    while (!stop) {
      await c.query("BEGIN");
      const { rows } = await c.query("SELECT id FROM jobs WHERE NOT done ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED", [BATCH]);
      if (rows.length) await handle(c, rows.map((r) => r.id), ioMs);
      await c.query("COMMIT");
      if (!rows.length) await sleep(50); // the same poll as the Worker's
    }
    await c.end();
  };
  const loops = Array.from({ length: WORKERS }, loop);
  const s = await timed();
  stop = true;
  await Promise.all(loops);
  return s;
}

async function library(ioMs, timed) {
  const workers = Array.from({ length: WORKERS }, () => new Worker({
    connectionString: dbUrl(POOLED), name: "bench", table: "jobs", n: N, pending: "done", batch: BATCH,
    mode: "lease", ttl: "3 seconds", pollInterval: 50,
    handler: (client, rows) => handle(client, rows.map((r) => r.id), ioMs),
  }));
  const runs = workers.map((w) => w.run());
  const share = Math.floor(N / WORKERS);
  while (!workers.every((w) => w.held.size >= share)) await sleep(50);
  const s = await timed();
  await Promise.all(workers.map((w) => w.stop()));
  await Promise.all(runs);
  return s;
}

async function drain() {
  await fill();
  const t0 = process.hrtime.bigint();
  while (await left() > 0) await sleep(10);
  return Number(process.hrtime.bigint() - t0) / 1e9;
}

(async () => {
  await on(DIRECT, async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
    await c.query(`CREATE DATABASE ${DB}`);
  });
  await on(dbUrl(DIRECT), (c) => c.query("CREATE EXTENSION pg_claim"));
  console.log(`${ITEMS} items, ${WORKERS} workers, batches of ${BATCH}, n = ${N} (pg-claim), through ${POOLED.replace(/^.*@/, "")}`);
  for (const io of IO) {
    const out = {};
    for (const [way, fn] of [["SKIP LOCKED loop", skipLocked], ["pg-claim Worker", library]]) {
      await fresh();
      const s = await fn(io, drain);
      out[way] = ITEMS / s;
      console.log(`handler ${io} ms of I/O per batch: ${way}: ${s.toFixed(2)} s, ${Math.round(ITEMS / s)} items/s`);
    }
    console.log(`handler ${io} ms: pg-claim / SKIP LOCKED = ${(out["pg-claim Worker"] / out["SKIP LOCKED loop"]).toFixed(2)}x`);
  }
  await on(DIRECT, (c) => c.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`));
})().catch((e) => { console.error(e); process.exit(1); });
