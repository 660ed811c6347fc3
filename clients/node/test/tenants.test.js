"use strict";
// The tenant options (docs/tenants.md) against a real server, as the Python
// library's tests (clients/python/tests/test_server.py): `fair` reaches the
// small tenants of a slot within two batches behind a large one, `spread`
// keeps a tenant on at most k slots. Skipped when PGPORT is not set.
const test = require("node:test");
const assert = require("node:assert");
const { Worker } = require("..");

const { SKIP, until, freshDatabase, sql: sqlIn } = require("./helpers");

const DB = `node_tenants_${process.pid}`;
const direct = { database: DB };
const sql = (text, params, database = DB) => sqlIn(database, text, params);

/** A large tenant's rows first (ids 1 .. big), then `small` tenants of `each` rows. */
async function makeTenants(tbl, big, small, each) {
  await sql(`CREATE TABLE ${tbl} (id bigint PRIMARY KEY, tenant text NOT NULL, done boolean NOT NULL DEFAULT false)`);
  await sql(`INSERT INTO ${tbl} SELECT g, 'big', false FROM generate_series(1, $1::int) g`, [big]);
  await sql(`INSERT INTO ${tbl} SELECT $1::int + row_number() OVER (), 'small-' || t, false
             FROM generate_series(1, $2::int) t, generate_series(1, $3::int) r`, [big, small, each]);
}

/** Marks the rows done and logs each with its slot and its batch's number (this worker's count, from 1). */
function handlerFor(tbl) {
  let count = 0;
  return async (client, rows, batch) => {
    count++;
    await client.query(`UPDATE ${tbl} SET done = true WHERE id = ANY($1)`, [rows.map((r) => r.id)]);
    await client.query("INSERT INTO tlog SELECT $1, i, t, $2, $3 FROM unnest($4::bigint[], $5::text[]) u(i, t)",
      [tbl, batch.slot, count, rows.map((r) => r.id), rows.map((r) => r.tenant)]);
  };
}

const drained = (tbl) => async () => (await sql(`SELECT bool_and(done) AS d FROM ${tbl}`))[0].d;

test("the tenant options against a server", { skip: SKIP }, async (t) => {
  await freshDatabase(t, DB);
  await sql("CREATE TABLE tlog (tbl text, item bigint, tenant text, slot int, batch int)");

  for (const fair of [null, "tenant"]) {
    await t.test(`one slot, 600 rows of one tenant before 20 small ones, fair = ${fair}`, async () => {
      const tbl = `ten_${fair || "key"}`;
      await makeTenants(tbl, 600, 20, 2);
      await sql(`CREATE INDEX ON ${tbl} ((slot_of(id, 1)), tenant, id) WHERE NOT done`);
      const w = new Worker({ connection: direct, name: tbl, table: tbl, n: 1, pending: "done", batch: 50, ttl: "3 seconds",
        pollInterval: 200, handler: handlerFor(tbl), ...(fair ? { fair } : {}) });
      const running = w.run();
      await until(drained(tbl), 20000, "the drain");
      await w.stop();
      await running;
      const [r] = await sql(`SELECT count(*)::int AS rows, count(DISTINCT item)::int AS d,
        max(batch) FILTER (WHERE tenant <> 'big') AS "lastSmall", max(batch) AS batches FROM tlog WHERE tbl = $1`, [tbl]);
      assert.strictEqual(r.rows, 640);
      assert.strictEqual(r.d, 640);
      if (fair) {
        assert.ok(r.lastSmall <= 2, `the last small tenant's row in batch ${r.lastSmall}`);
        assert.strictEqual(r.batches, 13); // no batch came back short while rows remained
      } else {
        assert.ok(r.lastSmall >= 12, `the last small tenant's row in batch ${r.lastSmall}`);
      }
    });
  }

  await t.test("spread = 2 of n = 8, two workers: a tenant on at most 2 slots, each row once", async () => {
    const tbl = "ten_spread";
    await makeTenants(tbl, 400, 30, 4);
    await sql(`CREATE INDEX ON ${tbl} ((slot_of_spread(tenant, id, 8, 2)), tenant, id) WHERE NOT done`);
    const ws = [0, 1].map(() => new Worker({ connection: direct, name: tbl, table: tbl, n: 8, pending: "done", batch: 20,
      ttl: "3 seconds", pollInterval: 200, route: "tenant", spread: 2, handler: handlerFor(tbl) }));
    const running = ws.map((w) => w.run());
    await until(drained(tbl), 20000, "the drain");
    await Promise.all(ws.map((w) => w.stop()));
    await Promise.all(running);
    const [r] = await sql(`SELECT count(*)::int AS rows, count(DISTINCT l.item)::int AS d,
      (count(*) FILTER (WHERE l.slot <> slot_of_spread(t.tenant, t.id, 8, 2)))::int AS wrong
      FROM tlog l JOIN ${tbl} t ON t.id = l.item WHERE l.tbl = $1`, [tbl]);
    assert.deepStrictEqual(r, { rows: 520, d: 520, wrong: 0 });
    const per = await sql("SELECT tenant, count(DISTINCT slot)::int AS k FROM tlog WHERE tbl = $1 GROUP BY 1", [tbl]);
    assert.strictEqual(per.find((p) => p.tenant === "big").k, 2);
    assert.ok(per.every((p) => p.k <= 2), JSON.stringify(per));
  });

  await t.test("fair: a poison item is set aside, the rest drains, the worker goes idle", async () => {
    const tbl = "ten_poison";
    await makeTenants(tbl, 200, 5, 3);
    const [{ poison }] = await sql(`SELECT min(id)::int AS poison FROM ${tbl} WHERE tenant = 'small-1'`);
    const inner = handlerFor(tbl);
    const events = [];
    const w = new Worker({ connection: direct, name: tbl, table: tbl, n: 2, pending: "done", batch: 20, ttl: "3 seconds",
      fair: "tenant", maxAttempts: 2, backoff: 100, pollInterval: 200, onEvent: (e) => events.push(e),
      handler: async (client, rows, batch) => {
        if (rows.some((r) => Number(r.id) === poison)) throw new Error("poison");
        await inner(client, rows, batch);
      } });
    const running = w.run();
    try {
      await until(async () => (await sql(`SELECT count(*)::int AS k FROM ${tbl} WHERE NOT done`))[0].k === 1, 20000, "the drain");
      await until(async () => (await sql("SELECT state FROM item_failures($1) WHERE item = $2", [tbl, String(poison)]))[0]?.state === "dead", 10000, "the poison item dead");
      const idle = () => events.filter((e) => e.type === "idle").length;
      await until(() => idle() > 0, 5000, "the worker idle");
      const batches = w.stats.batches, seen = idle();
      await until(() => idle() >= seen + 2, 5000, "two more idle rounds");
      assert.strictEqual(w.stats.batches, batches); // idle rounds commit no batch
    } finally {
      await w.stop();
      await running;
    }
    const [r] = await sql("SELECT count(*)::int AS rows, count(DISTINCT item)::int AS d FROM tlog WHERE tbl = $1", [tbl]);
    assert.deepStrictEqual(r, { rows: 214, d: 214 });
  });
});

test("the tenant options are checked", () => {
  const base = { name: "f", table: "t", n: 8, pending: "done", handler: async () => {} };
  assert.throws(() => new Worker({ ...base, spread: 2 }), /option spread needs route/);
  assert.throws(() => new Worker({ ...base, route: "tenant", spread: 9 }), /option spread must be between 1 and n = 8, got 9/);
  assert.throws(() => new Worker({ ...base, fair: "tenant", method: "jump" }), /option method "jump" does not go with fair or spread/);
});
