"use strict";
// The options shardColumn and shardKeys (docs/scale-out.md, "The worker
// library on Citus") against a real server without Citus, as the Python
// library's clients/python/tests/test_shard.py: each slot's batches read
// only the rows with the slot's shard key, and by the mapping, so a row
// under another slot's key is read by no worker; every other row is handled
// once, each customer's in key order. Skipped when PGPORT is not set.
const test = require("node:test");
const assert = require("node:assert");
const { Worker } = require("..");

const { SKIP, until, freshDatabase, sql: sqlIn } = require("./helpers");

const DB = `node_shard_${process.pid}`;
const sql = (text, params) => sqlIn(DB, text, params);
const N = 4, CUSTS = 12, ROWS = 600;
const KEYS = { 0: 100, 1: 101, 2: 102, 3: 103 };

test("each slot reads its shard key only", { skip: SKIP }, async (t) => {
  await freshDatabase(t, DB);
  // the rows with id % 97 = 0 under the next slot's key (misplaced)
  await sql(`CREATE TABLE sk (id bigint NOT NULL, skey int NOT NULL, cust int NOT NULL,
    done boolean NOT NULL DEFAULT false, PRIMARY KEY (skey, id))`);
  await sql(`INSERT INTO sk (id, skey, cust) SELECT g, ($1::int[])[(slot_of(g % ${CUSTS}, ${N}) + (g % 97 = 0)::int) % ${N} + 1],
    g % ${CUSTS} FROM generate_series(1, ${ROWS}) g`, [Object.values(KEYS)]);
  await sql("CREATE TABLE shard_log (item bigint, cust int, skey int, slot int, ord bigserial)");
  const [{ misplaced }] = await sql("SELECT count(*)::int AS misplaced FROM sk WHERE id % 97 = 0");
  const idle = new Set();
  const ws = [0, 1].map((i) => new Worker({ connection: { database: DB }, name: "sk", table: "sk", n: N, pending: "done",
    key: "id", route: "cust", batch: 20, ttl: "3 seconds", pollInterval: 200, shardColumn: "skey",
    shardKeys: new Map(Object.entries(KEYS)), onEvent: (e) => { if (e.type === "idle") idle.add(i); },
    handler: async (client, rows, batch) => {
      await client.query("UPDATE sk SET done = true WHERE skey = $1 AND id = ANY($2)", [KEYS[batch.slot], rows.map((r) => r.id)]);
      await client.query("INSERT INTO shard_log (item, cust, skey, slot) SELECT u.*, $4 FROM unnest($1::bigint[], $2::int[], $3::int[]) u",
        [rows.map((r) => r.id), rows.map((r) => r.cust), rows.map((r) => r.skey), batch.slot]);
    } }));
  const running = ws.map((w) => w.run());
  try {
    await until(async () => (await sql("SELECT count(*)::int AS k FROM sk WHERE NOT done"))[0].k === misplaced, 20000,
      "every row under its slot's key done");
    await until(() => idle.size === 2, 10000, "both workers idle"); // the misplaced rows stay pending
  } finally {
    await Promise.all(ws.map((w) => w.stop()));
    await Promise.all(running);
  }
  const [r] = await sql(`SELECT count(*)::int AS rows, count(DISTINCT item)::int AS d,
    (count(*) FILTER (WHERE slot <> slot_of(cust, ${N}) OR skey <> ($1::int[])[slot + 1]))::int AS wrong FROM shard_log`,
  [Object.values(KEYS)]);
  assert.deepStrictEqual(r, { rows: ROWS - misplaced, d: ROWS - misplaced, wrong: 0 });
  const [{ done }] = await sql("SELECT count(*)::int AS done FROM sk WHERE done AND id % 97 = 0");
  assert.strictEqual(done, 0);
  await assert.rejects(new Worker({ connection: { database: DB }, name: "sk_bad", table: "sk", n: N, pending: "done", key: "id",
    shardColumn: "shard", shardKeys: KEYS, handler: async () => {} }).run(), /sk has no column "shard" \(option shardColumn\)/);
  const [{ back }] = await sql(`SELECT count(*)::int AS back FROM (SELECT item < lag(item) OVER (PARTITION BY cust ORDER BY ord) AS b
    FROM shard_log) s WHERE b`);
  assert.strictEqual(back, 0);
});

test("the shard options are checked", () => {
  const base = { name: "f", table: "t", n: N, pending: "done", handler: async () => {} };
  assert.throws(() => new Worker({ ...base, shardColumn: "skey" }), /options shardColumn and shardKeys go together/);
  assert.throws(() => new Worker({ ...base, shardKeys: KEYS }), /options shardColumn and shardKeys go together/);
  assert.throws(() => new Worker({ ...base, shardColumn: "skey", shardKeys: 42 }), /option shardKeys must map each slot to its shard key/);
  assert.throws(() => new Worker({ ...base, shardColumn: "skey", shardKeys: { 0: 1, 1: 2, 2: 3 } }), /option shardKeys has no key for slot 3 of n = 4/);
  assert.throws(() => new Worker({ ...base, shardColumn: "skey", shardKeys: KEYS, method: "jump" }), /does not go with method "jump", fair or spread/);
  assert.throws(() => new Worker({ ...base, shardColumn: "skey", shardKeys: KEYS, fair: "cust" }), /does not go with method null, fair or spread/);
  assert.deepStrictEqual([...new Worker({ ...base, shardColumn: "skey", shardKeys: [100, 101, 102, 103] }).shardKeys], Object.entries(KEYS).map(([s, k]) => [Number(s), k]));
});
