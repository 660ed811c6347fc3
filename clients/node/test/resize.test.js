"use strict";
// A live lease worker's fleet resized (resize_fleet) against a real server
// (PGHOST/PGPORT/PGUSER): it follows the new n by itself; a worker started
// with the old n afterwards follows it too; every row once, no slot told
// lost for a wrong reason. Skipped when PGPORT is not set.
const test = require("node:test");
const assert = require("node:assert");
const { Worker } = require("..");
const { SKIP, until, freshDatabase, sql: sqlIn } = require("./helpers");

const DB = `node_resize_${process.pid}`;
const sql = (text, params) => sqlIn(DB, text, params);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function worker(events, seen) {
  return new Worker({
    connection: { database: DB }, name: "resize", table: "outbox", n: 4, pending: "sent_at", batch: 10, ttl: "3 seconds",
    pollInterval: 200,
    handler: async (client, rows, batch) => {
      const ids = rows.map((r) => r.id);
      await client.query("UPDATE outbox SET sent_at = now() WHERE id = ANY($1)", [ids]);
      await client.query("INSERT INTO sent SELECT unnest($1::bigint[]), $2, $3", [ids, batch.slot, batch.token]);
      seen.push(batch.slot);
      await sleep(10); // a drain of a few seconds: the resize lands in its middle
    },
    onEvent: (e) => events.push(e),
  });
}

test("a lease worker follows a resize of its fleet", { skip: SKIP }, async (t) => {
  await freshDatabase(t, DB);
  await sql(`CREATE TABLE outbox (id bigint PRIMARY KEY, sent_at timestamptz);
    INSERT INTO outbox SELECT g FROM generate_series(1, 3000) g;
    CREATE TABLE sent (id bigint NOT NULL, slot int NOT NULL, token bigint NOT NULL)`);
  const e1 = [], e2 = [], seen = [];
  const w1 = worker(e1, seen);
  const r1 = w1.run();
  let w2 = null, r2 = null;
  try {
    await until(async () => (await sql("SELECT count(*)::int AS k FROM sent"))[0].k >= 300, 20000, "a part of the drain");
    const before = [...w1.held.keys()];
    assert.ok(before.length > 0 && before.every((s) => s < 4));
    assert.strictEqual((await sql("SELECT resize_fleet('resize', 8) AS old"))[0].old, 4);
    await until(() => e1.some((e) => e.type === "resized"), 20000, "the resized event");
    assert.deepStrictEqual(e1.filter((e) => e.type === "resized").map(({ oldN, n }) => ({ oldN, n })), [{ oldN: 4, n: 8 }]);
    // started with the old n: its first claim is refused (PC002), it follows
    w2 = worker(e2, seen);
    r2 = w2.run();
    await until(() => e2.some((e) => e.type === "resized"), 20000, "the second worker's resized event");
    await until(async () => (await sql("SELECT count(*)::int AS k FROM outbox WHERE sent_at IS NULL"))[0].k === 0, 60000, "the drain");
    await until(() => new Set([...w1.held.keys(), ...w2.held.keys()]).size === 8, 20000, "all 8 slots served");
    assert.strictEqual(w1.n, 8);
    assert.strictEqual(w2.n, 8);
    // a slot handed over between the two holders is unheld for a moment: polled
    let holders = [];
    await until(async () => (holders = await sql("SELECT slot, holder FROM lease_holders('resize') WHERE NOT expired ORDER BY slot")).length === 8,
      20000, "all 8 slots leased");
    assert.deepStrictEqual(holders.map((h) => h.slot), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert.deepStrictEqual(new Set(holders.map((h) => h.holder)), new Set([w1.holder, w2.holder]));
  } finally {
    await w1.stop();
    await r1;
    if (w2) { await w2.stop(); await r2; }
  }
  const dup = await sql("SELECT id FROM sent GROUP BY id HAVING count(*) > 1");
  assert.deepStrictEqual(dup, []);
  assert.strictEqual((await sql("SELECT count(DISTINCT id)::int AS k FROM sent"))[0].k, 3000);
  assert.ok(Math.max(...seen) >= 4);
  // right after the resized event: every slot held then lost as `resized`, then no slot held
  const at = e1.findIndex((e) => e.type === "resized");
  const upto = e1.findIndex((e, i) => i > at && e.type === "slots");
  const told = e1.slice(at + 1, upto).filter((e) => e.type === "lost");
  assert.ok(told.length > 0 && told.every((e) => e.reason === "resized"), JSON.stringify(told));
  assert.deepStrictEqual(e1[upto].held, []);
  // a fence of a lease of the old n refused after the resize is not told as another
  // holder's (`taken`); a lease of the new n that balance moved to the other worker may
  // be (a worker whose batches are fenced loses a slot between two batches at once)
  const old = new Set(e1.slice(0, at).filter((e) => e.type === "gained").map((e) => `${e.slot}:${e.token}`));
  for (const events of [e1, e2]) {
    const refused = new Set(events.filter((e) => e.type === "rejected").map((e) => `${e.slot}:${e.token}`));
    const wrong = events.filter((e) => e.type === "lost" && e.reason === "taken" && refused.has(`${e.slot}:${e.token}`)
      && old.has(`${e.slot}:${e.token}`));
    assert.deepStrictEqual(wrong, []);
    assert.ok(!events.some((e) => e.type === "lost" && e.reason === "expired"), "no slot expired");
  }
  const gainedAfter = e1.slice(at).filter((e) => e.type === "gained").map((e) => e.slot);
  assert.ok(gainedAfter.length > 0 && Math.max(...gainedAfter) < 8);
});

test("a session worker refused with 55000 stops with a clear error", { skip: SKIP }, async (t) => {
  const db = `${DB}_session`;
  await freshDatabase(t, db);
  await sqlIn(db, "CREATE TABLE outbox (id bigint PRIMARY KEY, sent_at timestamptz); INSERT INTO outbox SELECT g FROM generate_series(1, 10) g");
  // the name is leased: claim_slots refuses it (55000), and a session fleet is not resized online
  await sqlIn(db, "SELECT count(*) FROM claim_leases('resize_session', 4, 'someone', ttl => '30 seconds')");
  const events = [];
  const w = new Worker({ connection: { database: db }, name: "resize_session", table: "outbox", n: 4, pending: "sent_at",
    mode: "session", handler: async () => {}, onEvent: (e) => events.push(e) });
  await assert.rejects(w.run(), (e) => e.name === "ResizeError" && /55000/.test(e.message) && /not resized online/.test(e.message));
  assert.ok(!events.some((e) => e.type === "gained"));
});

test("a batch in flight commits before the resize, its next fence is not told as taken", { skip: SKIP }, async (t) => {
  const db = `${DB}_flight`;
  await freshDatabase(t, db);
  await sqlIn(db, `CREATE TABLE outbox (id bigint PRIMARY KEY, sent_at timestamptz);
    INSERT INTO outbox SELECT g FROM generate_series(1, 300) g;
    CREATE TABLE sent (id bigint NOT NULL, slot int NOT NULL, token bigint NOT NULL)`);
  let first = null, release;
  const released = new Promise((resolve) => { release = resolve; });
  const events = [];
  const w = new Worker({
    connection: { database: db }, name: "flight", table: "outbox", n: 2, pending: "sent_at", batch: 10, ttl: "5 seconds",
    pollInterval: 200,
    handler: async (client, rows, batch) => {
      if (first === null) {
        first = { slot: batch.slot, token: batch.token, ids: rows.map((r) => Number(r.id)) };
        await released; // inside the fenced transaction, while the resize is called
      }
      const ids = rows.map((r) => r.id);
      await client.query("UPDATE outbox SET sent_at = now() WHERE id = ANY($1)", [ids]);
      await client.query("INSERT INTO sent SELECT unnest($1::bigint[]), $2, $3", [ids, batch.slot, batch.token]);
    },
    onEvent: (e) => events.push(e),
  });
  const running = w.run();
  let resized = null;
  try {
    await until(() => first !== null, 20000, "a batch started");
    const { Client } = require("pg");
    const c = new Client({ database: db, application_name: "resizer" });
    await c.connect();
    resized = c.query("SELECT resize_fleet('flight', 3) AS old").finally(() => c.end());
    // the resize waits for the batch (a lock wait of its session)
    await until(async () => (await sqlIn(db, "SELECT count(*)::int AS k FROM pg_stat_activity WHERE application_name = 'resizer'"
      + " AND wait_event_type IN ('Lock', 'LWLock')"))[0].k === 1, 20000, "the resize waiting for the batch in flight");
    assert.ok(!events.some((e) => e.type === "resized"));
    release();
    assert.strictEqual((await resized).rows[0].old, 2);
    await until(() => events.some((e) => e.type === "resized"), 20000, "the resized event");
    await until(async () => (await sqlIn(db, "SELECT count(*)::int AS k FROM outbox WHERE sent_at IS NULL"))[0].k === 0, 20000, "the drain");
  } finally {
    release();
    await w.stop();
    await running;
  }
  assert.deepStrictEqual(events.filter((e) => e.type === "resized").map(({ oldN, n }) => ({ oldN, n })), [{ oldN: 2, n: 3 }]);
  const logged = await sqlIn(db, "SELECT id::int, count(*)::int AS k, min(token)::text AS token FROM sent WHERE id = ANY($1) GROUP BY id ORDER BY id", [first.ids]);
  assert.deepStrictEqual(logged.map((r) => r.id), [...first.ids].sort((a, b) => a - b));
  assert.ok(logged.every((r) => r.k === 1 && r.token === String(first.token)));
  assert.deepStrictEqual(await sqlIn(db, "SELECT count(*)::int AS k, count(DISTINCT id)::int AS d FROM sent"), [{ k: 300, d: 300 }]);
  // one worker: nothing else ever holds a slot, so no slot is `taken`
  assert.deepStrictEqual(events.filter((e) => e.type === "lost" && e.reason !== "resized" && e.reason !== "released"), []);
  assert.ok(events.some((e) => e.type === "lost" && e.slot === first.slot && e.reason === "resized"));
});
