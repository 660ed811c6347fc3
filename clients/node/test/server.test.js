"use strict";
// Against a real server: PGHOST/PGPORT/PGUSER (libpq's variables) name one
// where pg_claim is installed; PGC_POOLER_PORT a PgBouncer in transaction
// mode in front of it (optional). Skipped when PGPORT is not set.
const test = require("node:test");
const assert = require("node:assert");
const http = require("http");
const { Worker, NotASessionError } = require("..");

const { SKIP, sleep, until, freshDatabase, sql: sqlIn } = require("./helpers");

const DB = `node_unit_${process.pid}`;
const direct = { database: DB };
const sql = (text, params, database = DB) => sqlIn(database, text, params);

const markSent = async (client, rows) => {
  await client.query("UPDATE outbox SET sent_at = now() WHERE id = ANY($1)", [rows.map((r) => r.id)]);
};

test("the library against a server", { skip: SKIP }, async (t) => {
  await freshDatabase(t, DB);
  // calls of the extension's functions by their signature (track_functions in the Workers' sessions)
  const functionCalls = async (fns) => Object.fromEntries((await sql(
    `SELECT p.oid::regprocedure::text AS f, coalesce(s.calls, 0)::int AS calls FROM pg_proc p
     LEFT JOIN pg_stat_user_functions s ON s.funcid = p.oid WHERE p.oid::regprocedure::text = ANY ($1)`, [fns])).map((r) => [r.f, r.calls]));

  await t.test("lease mode: every row once, a poison item dead, counters and /metrics", async () => {
    await sql(`CREATE TABLE outbox (id bigint PRIMARY KEY, body text, sent_at timestamptz);
      INSERT INTO outbox (id, body) SELECT g, CASE WHEN g = 77 THEN 'poison' ELSE 'hello' END FROM generate_series(1, 500) g;
      CREATE INDEX ON outbox ((slot_of(id, 4)), id) WHERE sent_at IS NULL;
      CREATE TABLE sent (id bigint NOT NULL, slot int NOT NULL, token bigint NOT NULL)`);
    const events = [];
    const w = new Worker({
      connection: direct, name: "unit", table: "outbox", n: 4, pending: "sent_at", batch: 20, ttl: "2 seconds",
      maxAttempts: 2, backoff: 50, pollInterval: 100, metricsPort: 0, metricsHost: "127.0.0.1",
      handler: async (client, rows, batch) => {
        if (rows.some((r) => r.body === "poison")) throw new Error("poison");
        await markSent(client, rows);
        await client.query("INSERT INTO sent SELECT unnest($1::bigint[]), $2, $3", [rows.map((r) => r.id), batch.slot, batch.token]);
      },
      onEvent: (e) => events.push(e),
    });
    const running = w.run();
    await until(async () => (await sql("SELECT count(*)::int AS k FROM outbox WHERE sent_at IS NULL"))[0].k === 1, 10000, "the drain");
    await until(async () => (await sql("SELECT state FROM item_failures('unit') WHERE item = '77'"))[0]?.state === "dead", 5000, "the poison item dead");
    const body = await new Promise((resolve, reject) => http.get(`http://127.0.0.1:${w.metricsAddress}/metrics`, (res) => {
      let s = "";
      res.on("data", (d) => { s += d; });
      res.on("end", () => resolve(s));
    }).on("error", reject));
    await w.stop();
    await running;
    // the metric set and labels of the Python library (the fleet: `fleet`, as the exporter's)
    assert.deepStrictEqual([...body.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => `${m[1]} ${m[2]}`).sort(), [
      "pg_claim_batch_duration_seconds histogram", "pg_claim_batches_total counter",
      "pg_claim_dead_items_total counter", "pg_claim_failures_total counter",
      "pg_claim_fence_rejections_total counter", "pg_claim_handovers_total counter",
      "pg_claim_items_total counter", "pg_claim_reconnects_total counter", "pg_claim_slots_held gauge",
    ]);
    assert.doesNotMatch(body, /[{,]name="/);
    const [{ poisonSlot }] = await sql("SELECT slot_of(77::bigint, 4) AS \"poisonSlot\"");
    assert.match(body, /^pg_claim_items_total\{fleet="unit",slot="\d"\} \d+$/m);
    assert.match(body, /^pg_claim_batches_total\{fleet="unit",slot="\d"\} \d+$/m);
    assert.match(body, new RegExp(`^pg_claim_failures_total\\{fleet="unit",slot="${poisonSlot}"\\} 2$`, "m"));
    assert.match(body, new RegExp(`^pg_claim_dead_items_total\\{fleet="unit",slot="${poisonSlot}"\\} 1$`, "m"));
    assert.match(body, /^pg_claim_handovers_total\{fleet="unit",direction="gained"\} [1-9]\d*$/m);
    assert.match(body, /^pg_claim_handovers_total\{fleet="unit",direction="lost"\} \d+$/m);
    assert.match(body, /^pg_claim_fence_rejections_total\{fleet="unit"\} \d+$/m);
    assert.match(body, /^pg_claim_reconnects_total\{fleet="unit"\} \d+$/m);
    assert.match(body, /^pg_claim_slots_held\{fleet="unit"\} \d+$/m);
    assert.match(body, /^pg_claim_batch_duration_seconds_bucket\{le="\+Inf",fleet="unit"\} [1-9]\d*$/m);
    assert.match(body, /^pg_claim_batch_duration_seconds_count\{fleet="unit"\} [1-9]\d*$/m);
    const [{ k, d }] = await sql("SELECT count(*)::int AS k, count(DISTINCT id)::int AS d FROM sent");
    assert.strictEqual(k, 499);
    assert.strictEqual(d, 499);
    const [f] = await sql("SELECT state, attempts FROM item_failures('unit')");
    assert.deepStrictEqual(f, { state: "dead", attempts: 2 });
    assert.strictEqual(w.stats.items, 499);
    assert.strictEqual(w.stats.failures, 2);
    assert.strictEqual(w.stats.deadItems, 1);
    assert.ok(events.some((e) => e.type === "left"));
    assert.deepStrictEqual(await sql("SELECT slot FROM lease_holders('unit') WHERE NOT expired"), []);
    // the foreign slots: every row written by the holder of its slot
    assert.deepStrictEqual(await sql("SELECT id FROM sent WHERE slot_of(id, 4) <> slot"), []);
  });

  await t.test("a hash-partitioned table: each slot's partition, pg_hash", async () => {
    await sql(`CREATE TABLE events (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false) PARTITION BY HASH (id);
      CREATE TABLE events_0 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 0);
      CREATE TABLE events_1 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 1);
      INSERT INTO events (id) SELECT generate_series(1, 100)`);
    const seen = new Set();
    const w = new Worker({
      connection: direct, name: "parts", table: "events", n: 2, pending: "done", mode: "session", pollInterval: 100,
      handler: async (client, rows, batch) => {
        seen.add(`${batch.slot}:${batch.partition}`);
        await client.query(`UPDATE ${batch.partition} SET done = true WHERE id = ANY($1)`, [rows.map((r) => r.id)]);
      },
    });
    const running = w.run();
    await until(async () => (await sql("SELECT count(*)::int AS k FROM events WHERE NOT done"))[0].k === 0, 10000, "the drain");
    await w.stop();
    await running;
    assert.strictEqual(w.method, "pg_hash");
    assert.deepStrictEqual([...seen].sort(), ["0:events_0", "1:events_1"]);
  });

  for (const mode of ["lease", "session"]) {
    await t.test(`${mode} mode: the fetch reads only the batch's failure records`, async () => {
      // 1,000 dead records of keys not in the table, one dead and one due
      // item in it: the dead one skipped, the due one done and its record
      // cleared; item_failures called with the batch's keys only, never
      // item_failures(name) (counted by track_functions in the Worker's sessions)
      const tbl = `keyed_${mode}`, name = `keyed_${mode}`;
      await sql(`CREATE TABLE ${tbl} (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
        INSERT INTO ${tbl} (id) SELECT generate_series(1, 300)`);
      await sql("SELECT count(record_failure($1, 'gone-' || g, 'e', 1)) FROM generate_series(1, 1000) g", [name]);
      await sql("SELECT record_failure($1, '40', 'set aside', 1), record_failure($1, '41', 'due now', 5, '0')", [name]);
      const calls = () => functionCalls(["item_failures(text)", "item_failures(text,text[])"]);
      const before = await calls();
      const w = new Worker({
        connection: { ...direct, options: "-c track_functions=pl" }, name, table: tbl, n: 2, pending: "done", batch: 25,
        mode, ttl: "3 seconds", pollInterval: 100,
        handler: async (client, rows) => {
          await client.query(`UPDATE ${tbl} SET done = true WHERE id = ANY($1)`, [rows.map((r) => r.id)]);
        },
      });
      const running = w.run();
      await until(async () => (await sql(`SELECT count(*)::int AS k FROM ${tbl} WHERE done`))[0].k === 299, 10000, "the drain");
      await w.stop();
      await running;
      assert.deepStrictEqual(await sql(`SELECT id::int FROM ${tbl} WHERE NOT done`), [{ id: 40 }]);
      assert.deepStrictEqual(await sql("SELECT item, state FROM item_failures($1, '40', '41')", [name]), [{ item: "40", state: "dead" }]);
      // the Worker's sessions ended: their counts reach the statistics
      await until(async () => (await calls())["item_failures(text,text[])"] > before["item_failures(text,text[])"], 5000, "the keyed calls counted");
      const after = await calls();
      assert.strictEqual(after["item_failures(text)"], before["item_failures(text)"]);
      assert.ok(after["item_failures(text,text[])"] - before["item_failures(text,text[])"] >= 300 / 25, JSON.stringify([before, after]));
    });
  }

  await t.test("a fleet without failure records fetches without them", async () => {
    // while the name has no failure record (has_failures, asked about once a
    // second and at each slot's first batch), a lease Worker's fetch leaves the
    // join with item_failures out: far fewer keyed item_failures calls than batches
    await sql(`CREATE TABLE nofail (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
      INSERT INTO nofail (id) SELECT generate_series(1, 600)`);
    const fns = ["item_failures(text,text[])", "has_failures(text)"];
    const before = await functionCalls(fns);
    const w = new Worker({
      connection: { ...direct, options: "-c track_functions=pl" }, name: "nofail", table: "nofail", n: 2, pending: "done",
      batch: 10, ttl: "3 seconds", pollInterval: 100,
      handler: async (client, rows) => { await client.query("UPDATE nofail SET done = true WHERE id = ANY($1)", [rows.map((r) => r.id)]); },
    });
    const running = w.run();
    await until(async () => (await sql("SELECT count(*)::int AS k FROM nofail WHERE done"))[0].k === 600, 20000, "the drain");
    await w.stop();
    await running;
    await until(async () => (await functionCalls(fns))[fns[1]] > before[fns[1]], 5000, "the checks counted");
    const after = await functionCalls(fns);
    const [joined, asked] = fns.map((f) => after[f] - before[f]);
    const batches = w.stats.batches;
    assert.ok(batches >= 60 && asked >= 2 && asked < batches / 2, JSON.stringify({ batches, asked }));
    assert.ok(joined <= asked, JSON.stringify({ joined, asked }));
  });

  await t.test("a failure recorded elsewhere is seen within a second", async () => {
    // a record made while a Worker fetches without the failure records (by
    // other code than the fleet's workers) counts from its next check, at most
    // a second later: the item set aside then is not handled
    await sql(`CREATE TABLE elsewhere (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
      INSERT INTO elsewhere (id) SELECT generate_series(1, 300)`);
    const handled = [];
    const w = new Worker({
      connection: direct, name: "elsewhere", table: "elsewhere", n: 1, pending: "done", batch: 10, ttl: "3 seconds",
      pollInterval: 100,
      handler: async (client, rows) => {
        await sleep(100); // 30 batches: the item 290 comes about 3 s after the first batch
        handled.push(...rows.map((r) => Number(r.id)));
        await client.query("UPDATE elsewhere SET done = true WHERE id = ANY($1)", [rows.map((r) => r.id)]);
      },
    });
    const running = w.run();
    await until(async () => (await sql("SELECT count(*)::int AS k FROM elsewhere WHERE done"))[0].k >= 10, 10000, "the first batch");
    await sql("SELECT record_failure('elsewhere', '290', 'set aside by hand', 1)");
    await until(async () => (await sql("SELECT count(*)::int AS k FROM elsewhere WHERE done"))[0].k === 299, 20000, "the drain");
    await w.stop();
    await running;
    assert.deepStrictEqual(await sql("SELECT id::int FROM elsewhere WHERE NOT done"), [{ id: 290 }]);
    assert.ok(!handled.includes(290));
  });

  await t.test("keys over 1024 bytes: no failure record to read, the rows handled", async () => {
    await sql(`CREATE TABLE longkeys (id text PRIMARY KEY, done boolean NOT NULL DEFAULT false);
      INSERT INTO longkeys SELECT repeat('k', 1100) || g FROM generate_series(1, 30) g;
      INSERT INTO longkeys VALUES ('short')`);
    const failures = [];
    const w = new Worker({
      connection: direct, name: "longkeys", table: "longkeys", n: 2, pending: "done", batch: 8, mode: "session", pollInterval: 100,
      handler: async (client, rows) => { await client.query("UPDATE longkeys SET done = true WHERE id = ANY($1)", [rows.map((r) => r.id)]); },
      onEvent: (e) => { if (e.type === "failed" || e.type === "dead") failures.push(e); },
    });
    const running = w.run();
    await until(async () => (await sql("SELECT bool_and(done) AS d FROM longkeys"))[0].d === true, 10000, "the drain");
    await w.stop();
    await running;
    assert.deepStrictEqual(failures, []);
  });

  await t.test("route: a failed item holds back its route's later items", async () => {
    await sql(`CREATE TABLE orders (id bigint PRIMARY KEY, customer int NOT NULL, sent_at timestamptz);
      INSERT INTO orders (id, customer) SELECT g, g % 3 FROM generate_series(1, 30) g;
      CREATE TABLE order_log (seq serial, id bigint, customer int)`);
    let failures = 0;
    const w = new Worker({
      connection: direct, name: "orders", table: "orders", n: 2, pending: "sent_at", route: "customer", batch: 5,
      mode: "session", maxAttempts: 5, backoff: 100, pollInterval: 100,
      handler: async (client, rows) => {
        for (const r of rows) {
          if (r.id === "4" && failures++ < 2) throw new Error("not yet");
          await client.query("UPDATE orders SET sent_at = now() WHERE id = $1", [r.id]);
          await client.query("INSERT INTO order_log (id, customer) VALUES ($1, $2)", [r.id, r.customer]);
        }
      },
    });
    const running = w.run();
    await until(async () => (await sql("SELECT count(*)::int AS k FROM orders WHERE sent_at IS NULL"))[0].k === 0, 10000, "the drain");
    await w.stop();
    await running;
    const rows = await sql("SELECT id::int, customer FROM order_log ORDER BY seq");
    const byCustomer = {};
    for (const r of rows) (byCustomer[r.customer] ||= []).push(r.id);
    for (const ids of Object.values(byCustomer)) assert.deepStrictEqual(ids, [...ids].sort((a, b) => a - b));
    assert.strictEqual(rows.length, 30);
  });

  await t.test("wake-ups by NOTIFY through the notify connection", async () => {
    await sql(`CREATE TABLE inbox (id bigserial PRIMARY KEY, sent_at timestamptz);
      CREATE TRIGGER inbox_wake AFTER INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION notify_slot('wake', '4', 'id')`);
    const done = [];
    const w = new Worker({
      connection: direct, notifyConninfo: `postgresql:///${DB}`, name: "wake", table: "inbox", n: 4,
      pending: "sent_at", pollInterval: 60000, ttl: "3 seconds",
      handler: async (client, rows) => {
        await client.query("UPDATE inbox SET sent_at = now() WHERE id = ANY($1)", [rows.map((r) => r.id)]);
        done.push(...rows.map((r) => r.id));
      },
    });
    const running = w.run();
    await until(() => w.held.size === 4, 5000, "the slots");
    await sleep(1500); // the listener is on; the worker waits (poll: 60 s)
    const t0 = Date.now();
    await sql("INSERT INTO inbox DEFAULT VALUES");
    await until(() => done.length === 1, 5000, "the new row handled");
    const ms = Date.now() - t0;
    await w.stop();
    await running;
    assert.ok(ms < 3000, `woken after ${ms} ms`);
  });

  await t.test("session mode refuses a transaction pooler; auto picks lease there", { skip: process.env.PGC_POOLER_PORT ? false : "no PgBouncer (PGC_POOLER_PORT)" }, async () => {
    const pooled = { host: "127.0.0.1", port: Number(process.env.PGC_POOLER_PORT), database: DB, user: "postgres" };
    const opts = { connection: pooled, name: "pooled", table: "outbox", n: 4, pending: "sent_at", handler: markSent };
    await assert.rejects(new Worker({ ...opts, mode: "session" }).run(), (e) => e instanceof NotASessionError && /pooler/.test(e.message));
    assert.deepStrictEqual(await sql("SELECT * FROM slot_holders('pooled')"), []);
    const w = new Worker({ ...opts, mode: "auto", ttl: "2 seconds" });
    const running = w.run();
    await until(() => w.held.size === 4, 5000, "the leases");
    assert.strictEqual(w.mode, "lease");
    await w.stop();
    await running;
  });

  await t.test("lease mode, balance: a joiner gets slots handed over within seconds, every row once", async () => {
    await sql(`CREATE TABLE bal (id bigint PRIMARY KEY, sent_at timestamptz);
      INSERT INTO bal (id) SELECT g FROM generate_series(1, 2000) g;
      CREATE TABLE bal_sent (id bigint NOT NULL)`);
    const opts = (events) => ({
      connection: direct, name: "bal", table: "bal", n: 4, pending: "sent_at", batch: 10, ttl: "30 seconds", pollInterval: 200,
      handler: async (client, rows) => {
        await sleep(5 * rows.length);
        await client.query("UPDATE bal SET sent_at = now() WHERE id = ANY($1)", [rows.map((r) => r.id)]);
        await client.query("INSERT INTO bal_sent SELECT unnest($1::bigint[])", [rows.map((r) => r.id)]);
      },
      onEvent: (e) => events.push(e),
    });
    const firstEvents = [];
    const secondEvents = [];
    const first = new Worker(opts(firstEvents));
    const runs = [first.run()];
    // past the damping (least(ttl / 3, 5 s)): the first worker's leases are 5 s old
    await until(async () => (await sql("SELECT count(*)::int AS k FROM lease_holders('bal') WHERE NOT expired"
      + " AND acquired_at < now() - interval '5.2 seconds'"))[0].k === 4, 15000, "the first worker's leases, 5 s old");
    // a slot's weight is its pending rows ahead of the cursor, counted (lib/backlog.js):
    // not the batch size a full batch shows, never above the slot's own rows
    const [{ most }] = await sql("SELECT max(k)::int AS most FROM (SELECT count(*) AS k FROM bal GROUP BY slot_of(id, 4)) x");
    const weights = async () => (await sql("SELECT coalesce(max(backlog), 0)::int AS m FROM pg_claim_leases WHERE name = 'bal'"))[0].m;
    let heaviest = 0;
    await until(async () => (heaviest = Math.max(heaviest, await weights())) > 10, 5000, "a weight above the batch size");
    assert.ok(heaviest <= most, `a weight above the slot's rows: ${heaviest} > ${most}`);
    const joined = Date.now();
    const second = new Worker(opts(secondEvents));
    runs.push(second.run());
    await until(async () => secondEvents.some((e) => e.type === "gained"), 8000, "the joiner's first slot");
    const took = Date.now() - joined;
    assert.ok(took < 5000, `the joiner got its first slot ${took} ms after it started`);
    // taken between two batches (the first worker learns it at its next fence
    // of the slot), or marked and given back after a batch
    await until(() => firstEvents.some((e) => e.type === "lost" && (e.reason === "given back" || e.reason === "taken")),
      5000, "the first worker's slot lost for balance");
    assert.ok((await sql("SELECT count(backlog)::int AS k FROM pg_claim_leases WHERE name = 'bal'"))[0].k > 0);
    await until(async () => (await sql("SELECT count(*)::int AS k FROM bal WHERE sent_at IS NULL"))[0].k === 0, 60000, "the drain");
    await first.stop();
    await second.stop();
    await Promise.all(runs);
    const [{ k, d }] = await sql("SELECT count(*)::int AS k, count(DISTINCT id)::int AS d FROM bal_sent");
    assert.strictEqual(k, 2000);
    assert.strictEqual(d, 2000);
  });
});
