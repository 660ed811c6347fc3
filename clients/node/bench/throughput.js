#!/usr/bin/env node
// Throughput of pg-claim's Worker next to a plain FOR UPDATE SKIP LOCKED
// loop with the same handler, through a transaction-mode pooler.
//
//   node bench/throughput.js --direct postgresql://postgres@127.0.0.1:5432/postgres \
//        --pooled postgresql://postgres@127.0.0.1:6432 [--items 50000] [--workers 4,8] [--n 16] [--io-ms 0,10]
//        [--row-ms 0] [--batch 50] [--rounds 3] [--failures 0]
//
// For each handler (--io-ms: milliseconds of I/O per batch, an awaited
// timer standing for one call to another service; --row-ms: milliseconds
// per row of the batch, added to it), each number of workers
// and each way, that many workers in this process, each on connections of
// its own through --pooled, start on an empty table and poll it every 200 ms;
// once they are ready (the Workers hold their shares of the n slots),
// --items rows are inserted (with ANALYZE, in one transaction) and the time
// from that commit until all are done is measured. Batches of --batch (50);
// the handler waits inside the batch's transaction, then marks the batch
// done. Each case runs --rounds times each way, alternating which way goes
// first, so that the noise of a shared machine hits both; prints the median
// items/s of each way and the ratio of the medians (with the lowest and
// highest ratio of a round), and the machine's load average when the case
// ended. Then, for each way, where a batch's time went (medians of the
// rounds, per batch of --batch items): the round trips through the pooler
// and the time they waited for a server connection (PgBouncer's SHOW STATS
// on its admin database), this process's CPU time, and, where the server
// loads pg_stat_statements, the server's execution time. --failures N keeps
// N dead failure records of the name (keys not in the table) during the
// runs.
"use strict";
const os = require("os");
const { Client } = require("pg");
const { Worker } = require("..");

const arg = (k, d) => { const i = process.argv.indexOf(`--${k}`); return i > 0 ? process.argv[i + 1] : d; };
const DIRECT = arg("direct"), POOLED = arg("pooled");
const ITEMS = Number(arg("items", 50000)), N = Number(arg("n", 16)), BATCH = Number(arg("batch", 50)), ROUNDS = Number(arg("rounds", 3));
const WORKERS = arg("workers", "4,8").split(",").map(Number);
const IO = arg("io-ms", "0,10").split(",").map(Number);
const ROW = arg("row-ms", "0").split(",").map(Number);
const FAILURES = Number(arg("failures", 0));
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
// the rows to do and the statistics of the table with them, in one commit
const fill = () => on(dbUrl(DIRECT), (c) => c.query(`BEGIN;
  INSERT INTO jobs (id, payload) SELECT g, 'job ' || g FROM generate_series(1, ${ITEMS}) g;
  ANALYZE jobs;
  COMMIT`));
const left = () => on(dbUrl(DIRECT), async (c) => Number((await c.query("SELECT count(*) FROM jobs WHERE NOT done")).rows[0].count));

async function handle(client, ids, ioMs) {
  const ms = ioMs.batch + ioMs.row * ids.length;
  if (ms) await sleep(ms);
  await client.query("UPDATE jobs SET done = true WHERE id = ANY($1)", [ids]);
}

// Each way: start the fleet on the empty table, wait until it is ready (the
// leases shared out), insert the items, and time the drain.
async function skipLocked(count, ioMs, timed) {
  let stop = false;
  const loop = async () => {
    const c = new Client({ connectionString: dbUrl(POOLED) });
    await c.connect();
    while (!stop) {
      await c.query("BEGIN");
      const { rows } = await c.query("SELECT * FROM jobs WHERE NOT done ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED", [BATCH]);
      if (rows.length) await handle(c, rows.map((r) => r.id), ioMs);
      await c.query("COMMIT");
      if (!rows.length) await sleep(200); // the same poll as the Worker's
    }
    await c.end();
  };
  const loops = Array.from({ length: count }, loop);
  const s = await timed();
  stop = true;
  await Promise.all(loops);
  return s;
}

async function library(count, ioMs, timed) {
  const workers = Array.from({ length: count }, () => new Worker({
    conninfo: dbUrl(POOLED), name: "bench", table: "jobs", n: N, pending: "done", batch: BATCH,
    mode: "lease", ttl: "6 seconds", pollInterval: 200,
    handler: (client, rows) => handle(client, rows.map((r) => r.id), ioMs),
  }));
  const runs = workers.map((w) => w.run());
  const share = Math.floor(N / count);
  while (!workers.every((w) => w.held.size >= share)) await sleep(50);
  const s = await timed();
  await Promise.all(workers.map((w) => w.stop()));
  await Promise.all(runs);
  return s;
}

// Where a timed run's time went: the pooler's round trips and waits for a
// server connection (SHOW STATS), this process's CPU time, the server's
// execution time (pg_stat_statements, where the server loads it).
let statements = false;
const poolerStats = () => on(POOLED.replace(/\/[^/]*$/, "/pgbouncer"), async (c) => {
  const r = (await c.query("SHOW STATS")).rows.find((x) => x.database === DB);
  return r ? [Number(r.total_query_count), Number(r.total_wait_time)] : [0, 0];
});
// [execution, planning] ms (planning: 0 unless pg_stat_statements.track_planning)
const serverMs = () => on(dbUrl(DIRECT), async (c) => (await c.query(
  `SELECT coalesce(sum(total_exec_time), 0)::float8 AS run, coalesce(sum(total_plan_time), 0)::float8 AS plan
   FROM pg_stat_statements
   WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND query !~* 'pg_stat_statements|count\\(\\*\\) FROM jobs'`)).rows.map((r) => [r.run, r.plan])[0]);

async function drain() {
  if (statements) await on(dbUrl(DIRECT), (c) => c.query("SELECT pg_stat_statements_reset()"));
  const [q0, w0] = await poolerStats();
  const cpu0 = process.cpuUsage();
  await fill();
  const t0 = process.hrtime.bigint();
  while (await left() > 0) await sleep(10);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0), [q1, w1] = await poolerStats(), batches = ITEMS / BATCH;
  const [run, plan] = statements ? await serverMs() : [0, 0];
  return { s, diag: [(q1 - q0) / batches, (w1 - w0) / 1000 / batches, (cpu.user + cpu.system) / 1000 / batches,
    statements ? (run + plan) / batches : null, plan / batches] };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const fmt = (x) => Math.round(x).toLocaleString("en-US");

(async () => {
  await on(DIRECT, async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
    await c.query(`CREATE DATABASE ${DB}`);
  });
  await on(dbUrl(DIRECT), (c) => c.query("CREATE EXTENSION pg_claim"));
  statements = await on(dbUrl(DIRECT), (c) => c.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT count(*) FROM pg_stat_statements")
    .then(() => true, () => false));
  if (FAILURES) { // kept during the runs (the Worker's fetch reads the batch's own records)
    await on(dbUrl(DIRECT), (c) => c.query("SELECT count(record_failure('bench', 'gone-' || g, 'an error', 1))"
      + " FROM generate_series(1, $1::int) g", [FAILURES]));
  }
  console.log(`${ITEMS} items, batches of ${BATCH}, n = ${N} (pg-claim), through ${POOLED.replace(/^.*@/, "")};`
    + ` ${ROUNDS} rounds each way, alternating; medians${FAILURES ? `; ${FAILURES} dead failure records of the name` : ""}`);
  console.log("| handler | workers | pg-claim Worker (lease) | SKIP LOCKED loop | ratio (lowest, highest round)"
    + " | load average (1 min) after the case |");
  console.log("|---|---|---|---|---|---|");
  const spent = [];
  for (const io of IO) {
    for (const row of ROW) {
      for (const w of WORKERS) {
        const got = { lib: [], queue: [] }, diag = { lib: [], queue: [] };
        for (let r = 0; r < ROUNDS; r++) {
          for (const way of r % 2 === 0 ? ["lib", "queue"] : ["queue", "lib"]) {
            await fresh();
            const { s, diag: d } = await (way === "lib" ? library : skipLocked)(w, { batch: io, row }, drain);
            got[way].push(ITEMS / s);
            diag[way].push(d);
          }
        }
        const ratios = got.lib.map((x, i) => x / got.queue[i]);
        const lib = median(got.lib), q = median(got.queue);
        const what = [io ? `${io} ms per batch` : "", row ? `${row} ms per row` : ""].filter(Boolean).join(" + ") || "0 ms";
        console.log(`| ${what} | ${w} | ${fmt(lib)} items/s | ${fmt(q)} items/s | ${(lib / q).toFixed(2)}x`
          + ` (${Math.min(...ratios).toFixed(2)}x, ${Math.max(...ratios).toFixed(2)}x) | ${os.loadavg()[0].toFixed(1)} |`);
        spent.push({ what, w, diag });
      }
    }
  }
  console.log(`\nwhere a batch's time went (per batch of ${BATCH} items, medians of the rounds): round trips through the pooler,`
    + " ms waited for a server connection, client CPU ms (this process),"
    + ` server ms${statements ? "" : " (not measured: no pg_stat_statements)"}`
    + " (execution, and planning where pg_stat_statements.track_planning is on)");
  console.log("| handler | workers | way | round trips | pool wait | client CPU | server time |");
  console.log("|---|---|---|---|---|---|---|");
  for (const { what, w, diag } of spent) {
    for (const [way, label] of [["lib", "pg-claim Worker"], ["queue", "SKIP LOCKED loop"]]) {
      const m = (i) => median(diag[way].map((d) => d[i]));
      console.log(`| ${what} | ${w} | ${label} | ${m(0).toFixed(2)} | ${m(1).toFixed(3)} ms | ${m(2).toFixed(3)} ms`
        + ` | ${statements ? `${m(3).toFixed(3)} ms${m(4) ? ` (planning ${m(4).toFixed(3)} ms)` : ""}` : "-"} |`);
    }
  }
  await on(DIRECT, (c) => c.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`));
})().catch((e) => { console.error(e); process.exit(1); });
