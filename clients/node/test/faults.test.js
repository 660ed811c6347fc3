"use strict";
// The failures a handler, the network or another holder can cause, against
// a real server (PGHOST/PGPORT): a handler that ends the transaction, one
// that fails transiently, retries due at their time, a half-open network
// path (a proxy that stops forwarding), the reasons a slot is lost, a table
// named like a built-in type, the metrics endpoint's address.
const test = require("node:test");
const assert = require("node:assert");
const { Client } = require("pg");
const { Worker } = require("..");
const { SKIP, sleep, until, freshDatabase, sql: sqlIn, halfOpenProxy } = require("./helpers");

const DB = `node_faults_${process.pid}`;
const direct = { database: DB };
const sql = (text, params) => sqlIn(DB, text, params);

/** A table `tbl` of ids 1..rows (done false) and its log of handled ids. */
async function table(tbl, rows) {
  await sql(`CREATE TABLE ${tbl} (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
    INSERT INTO ${tbl} (id) SELECT generate_series(1, ${rows});
    CREATE TABLE ${tbl}_log (seq serial, id bigint NOT NULL)`);
}

/** Marks the rows done and logs them, in the batch's transaction. */
const mark = (tbl) => async (client, rows) => {
  const ids = rows.map((r) => r.id);
  await client.query(`UPDATE ${tbl} SET done = true WHERE id = ANY($1)`, [ids]);
  await client.query(`INSERT INTO ${tbl}_log (id) SELECT unnest($1::bigint[])`, [ids]);
};

/** Every row but `except` logged exactly once. */
async function exactlyOnce(tbl, rows, except) {
  const [r] = await sql(`SELECT count(*)::int AS k, count(DISTINCT id)::int AS d,
    count(*) FILTER (WHERE id = ANY($1))::int AS bad FROM ${tbl}_log`, [except]);
  assert.deepStrictEqual(r, { k: rows - except.length, d: rows - except.length, bad: 0 });
}

const failure = async (name, item) => (await sql("SELECT state, attempts, last_error FROM item_failures($1, $2)", [name, String(item)]))[0];

test("faults", { skip: SKIP }, async (t) => {
  await freshDatabase(t, DB);

  await t.test("a handler that runs ROLLBACK or COMMIT: never counted, its item reaches dead", async () => {
    // item 5 rolls the batch back and returns; item 15 commits half-way
    // (SELECT 1; COMMIT in one string) and goes on in autocommit
    await table("ends", 30);
    let calls = 0;
    const w = new Worker({
      connection: direct, name: "ends", table: "ends", n: 1, pending: "done", batch: 10, mode: "lease", ttl: "3 seconds",
      maxAttempts: 3, backoff: 100, pollInterval: 100,
      handler: async (client, rows) => {
        calls++;
        for (const r of rows) {
          if (r.id === "5") { await client.query("ROLLBACK"); return; }
          await mark("ends")(client, [r]);
          if (r.id === "15") await client.query("SELECT 1; COMMIT");
        }
      },
    });
    const running = w.run();
    await until(async () => (await failure("ends", 5))?.state === "dead", 15000, "item 5 dead");
    await until(async () => (await sql("SELECT count(*)::int AS k FROM ends WHERE NOT done"))[0].k === 1, 10000, "the drain");
    await w.stop();
    await running;
    await exactlyOnce("ends", 30, [5]);
    const f = await failure("ends", 5);
    assert.strictEqual(f.attempts, 3);
    assert.match(f.last_error, /ended the batch's transaction/);
    assert.strictEqual(await failure("ends", 15), undefined); // committed by the handler: no false record
    assert.ok(calls < 40, `${calls} handler calls`);
    assert.ok(w.stats.items <= 29, `${w.stats.items} items counted`);
  });

  for (const how of ["raises 40001", "ends its client"]) {
    await t.test(`a handler that ${how} every time: back-off, then the failure path`, async () => {
      const tbl = how.startsWith("raises") ? "serial" : "ender";
      await table(tbl, 20);
      const attempts = [];
      const w = new Worker({
        connection: direct, name: tbl, table: tbl, n: 1, pending: "done", batch: 10, mode: "lease", ttl: "6 seconds",
        maxAttempts: 1, pollInterval: 100,
        handler: async (client, rows) => {
          if (rows.some((r) => r.id === "1")) {
            attempts.push(Date.now());
            if (tbl === "ender") { await client.end(); return; }
            const e = new Error("could not serialize access");
            e.code = "40001";
            throw e;
          }
          await mark(tbl)(client, rows);
        },
      });
      const running = w.run();
      await until(async () => (await failure(tbl, 1))?.state === "dead", 15000, "item 1 dead");
      await until(async () => (await sql(`SELECT count(*)::int AS k FROM ${tbl} WHERE NOT done`))[0].k === 1, 10000, "the drain");
      await w.stop();
      await running;
      await exactlyOnce(tbl, 20, [1]);
      // 5 attempts of the batch, 0.1, 0.2, 0.4, 0.8 s apart; then recorded with the error, not handed again
      assert.strictEqual(attempts.length, 5, JSON.stringify(attempts));
      const gaps = attempts.slice(1).map((a, i) => a - attempts[i]);
      [100, 200, 400, 800].forEach((want, i) => assert.ok(gaps[i] >= want - 15 && gaps[i] < want + 900, `gaps ${gaps}`));
      const f = await failure(tbl, 1);
      assert.match(f.last_error, tbl === "ender" ? /ended the batch's client|not queryable|terminated/ : /could not serialize/);
      if (tbl === "ender") assert.ok(w.stats.reconnects >= 5 && w.stats.reconnects <= 6, `${w.stats.reconnects} reconnects`);
      else assert.strictEqual(w.stats.reconnects, 0);
    });
  }

  await t.test("a retry is due at its time, not when the walk comes round", async () => {
    // a long share (a pass takes several seconds); item 1 fails always:
    // its attempts come backoff, 2 x, 4 x backoff apart, and it is dead
    // within the first pass
    await table("walk", 3000);
    const failures = [];
    const w = new Worker({
      connection: direct, name: "walk", table: "walk", n: 1, pending: "done", batch: 10, mode: "lease", ttl: "5 seconds",
      maxAttempts: 4, backoff: 300, pollInterval: 100,
      handler: async (client, rows) => {
        if (rows.some((r) => r.id === "1")) throw new Error("item 1 fails");
        await sleep(20);
        await mark("walk")(client, rows);
      },
      onEvent: (e) => { if (e.type === "failed" || e.type === "dead") failures.push({ state: e.state }); },
    });
    const running = w.run();
    await until(async () => (await failure("walk", 1))?.state === "dead", 15000, "item 1 dead");
    const [{ left }] = await sql("SELECT count(*)::int AS left FROM walk WHERE NOT done");
    await w.stop();
    await running;
    assert.ok(left > 100, `the first pass was over (${left} rows left) before item 1 was dead`);
    assert.deepStrictEqual(failures.map((f) => f.state), ["retry", "retry", "retry", "dead"]);
    // dead 0.3 + 0.6 + 1.2 s after the first failure (the server's clock)
    const [{ span }] = await sql(`SELECT extract(epoch FROM last_failed_at - first_failed_at)::float8 * 1000 AS span
      FROM item_failures('walk', '1')`);
    assert.ok(span >= 2100 && span < 2100 + 900, `dead ${span} ms after the first failure`);
  });

  await t.test("a half-open network path: no batch after 2/3 of the ttl, slots dropped after a ttl, stop within it", async () => {
    await table("halfopen", 5000);
    const proxy = await halfOpenProxy();
    t.after(() => proxy.close());
    const TTL = 3000, starts = [], lost = [];
    const w = new Worker({
      connection: { host: "127.0.0.1", port: proxy.port, database: DB }, name: "halfopen", table: "halfopen", n: 2,
      pending: "done", batch: 5, mode: "lease", ttl: TTL, pollInterval: 100,
      handler: async (client, rows) => { starts.push(Date.now()); await sleep(20); await mark("halfopen")(client, rows); },
      onEvent: (e) => { if (e.type === "lost") lost.push({ t: Date.now(), reason: e.reason }); },
    });
    const running = w.run();
    await until(() => w.held.size === 2 && starts.length > 5, 10000, "the slots and some batches");
    // the claims' path breaks (the batch connection, opened first, still works)
    const frozen = Date.now();
    proxy.freeze([0]);
    await until(() => w.held.size === 0, TTL + 2000, "every slot dropped");
    const dropped = Date.now() - frozen;
    assert.ok(dropped <= TTL + 700, `slots dropped ${dropped} ms after the path broke`);
    assert.ok(lost.length === 2 && lost.every((l) => l.reason === "expired"), JSON.stringify(lost));
    const late = starts.filter((s) => s > frozen + (2 * TTL) / 3 + 400);
    assert.deepStrictEqual(late.map((s) => s - frozen), [], "batches started after 2/3 of the ttl without a good claim");
    // the path comes back: the worker claims and works again
    proxy.thaw();
    const before = starts.length;
    await until(() => w.held.size === 2 && starts.length > before + 3, 10000, "the slots again");
    // every path breaks in the middle of the work: stop() returns within the ttl
    proxy.freeze();
    const t0 = Date.now();
    await w.stop();
    await running;
    assert.ok(Date.now() - t0 <= TTL + 500, `stop() took ${Date.now() - t0} ms`);
  });

  await t.test("a claim answered late but within 2/3 of the ttl keeps the slots", async () => {
    // ttl 6 s: the claimer's call waits 3 s on a row lock another session
    // holds on the holder's member row (longer than the renew period of 2 s,
    // shorter than 2/3 of the ttl)
    await table("late", 0);
    const events = [];
    const w = new Worker({
      connection: direct, name: "late", table: "late", n: 2, pending: "done", mode: "lease", ttl: "6 seconds",
      holder: "late-reply", pollInterval: 100, handler: mark("late"), onEvent: (e) => events.push({ t: Date.now(), type: e.type }),
    });
    const running = w.run();
    try {
      await until(() => w.held.size === 2, 10000, "both slots");
      const t0 = Date.now();
      const locker = new Client({ database: DB });
      await locker.connect();
      try {
        await locker.query("BEGIN");
        await locker.query("SELECT 1 FROM pg_claim_lease_members WHERE name = 'late' AND holder = 'late-reply' FOR UPDATE");
        await until(async () => (await sql(`SELECT count(*)::int AS k FROM pg_stat_activity WHERE wait_event_type = 'Lock'
          AND query LIKE '%claim_leases%' AND now() - query_start > interval '3 seconds'`))[0].k > 0, 10000, "a claim_leases call waiting 3 s");
        await locker.query("COMMIT");
      } finally {
        await locker.end();
      }
      await sql("INSERT INTO late (id) SELECT generate_series(1, 20)");
      await until(async () => (await sql("SELECT count(*)::int AS k FROM late WHERE NOT done"))[0].k === 0, 10000, "the rows done after the lock");
      const late = events.filter((e) => e.t > t0 && (e.type === "claim_failed" || e.type === "lost"));
      assert.deepStrictEqual(late, []);
      assert.strictEqual(w.held.size, 2);
    } finally {
      await w.stop();
      await running;
    }
  });

  await t.test("a lost slot's reason: taken by another holder, given back for balance", async () => {
    await table("reasons", 10);
    const lost = [];
    const w = new Worker({
      connection: direct, name: "reasons", table: "reasons", n: 2, pending: "done", mode: "lease", ttl: "6 seconds",
      pollInterval: 100, handler: mark("reasons"), onEvent: (e) => { if (e.type === "lost") lost.push(e); },
    });
    const running = w.run();
    try {
      await until(() => w.held.size === 2, 10000, "both slots");
      // another holder takes slot 0 (released and claimed in one transaction)
      await sql(`BEGIN; SELECT release_lease('reasons', 0, (SELECT token FROM lease_holders('reasons') WHERE slot = 0));
        SELECT count(*) FROM claim_leases('reasons', 2, 'other', max => 1); COMMIT`);
      await until(() => lost.length >= 1, 10000, "slot 0 lost");
      assert.deepStrictEqual(lost.map((l) => [l.slot, l.reason]), [[0, "taken"]]);
      await sql("SELECT count(*) FROM claim_leases('reasons', 2, 'other', max => 0)");
      await until(() => w.held.size === 2, 10000, "slot 0 back");
      // a live newcomer: the worker gives one slot back
      await sql("SELECT count(*) FROM claim_leases('reasons', 2, 'newcomer', ttl => '1 minute')");
      await until(() => lost.length >= 2, 10000, "a slot given back");
      assert.deepStrictEqual(lost.slice(1).map((l) => l.reason), ["given back"]);
    } finally {
      await w.stop();
      await running;
      await sql("SELECT count(*) FROM claim_leases('reasons', 2, 'newcomer', max => 0)");
    }
    assert.ok(lost.slice(2).every((l) => l.reason === "released"), JSON.stringify(lost.slice(2)));
  });

  await t.test("a table named like a built-in type (box)", async () => {
    await sql(`CREATE TABLE box (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
      INSERT INTO box (id) SELECT generate_series(1, 50)`);
    const w = new Worker({
      connection: direct, name: "box", table: "box", n: 2, pending: "done", mode: "session", pollInterval: 100,
      handler: async (client, rows) => { await client.query("UPDATE box SET done = true WHERE id = ANY($1)", [rows.map((r) => r.id)]); },
    });
    const running = w.run();
    await until(async () => (await sql("SELECT count(*)::int AS k FROM box WHERE NOT done"))[0].k === 0, 10000, "the drain");
    await w.stop();
    await running;
  });

  await t.test("the metrics endpoint listens on 127.0.0.1 unless metricsHost says otherwise", async () => {
    for (const [metricsHost, want] of [[undefined, "127.0.0.1"], ["::1", "::1"]]) {
      const w = new Worker({ connection: direct, name: "metrics", table: "reasons", n: 1, pending: "done", mode: "session",
        metricsPort: 0, metricsHost, handler: mark("reasons") });
      const running = w.run();
      await until(() => w.metricsAddress !== undefined, 5000, "the endpoint");
      const address = w._prom.server.address().address;
      await w.stop();
      await running;
      assert.strictEqual(address, want);
    }
  });
});
