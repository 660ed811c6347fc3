"use strict";
// The options and the session-mode behaviour docs/libraries.md gave the
// Node.js library in 0.6.0 (the Python library had them before): maxSlots in
// both modes; in session mode the idle limit inside each batch, the check of
// my_slots and release_slot on leaving. Against a real server (PGPORT).
const test = require("node:test");
const assert = require("node:assert");
const { Worker } = require("..");

const { SKIP, until, freshDatabase, sql: sqlIn } = require("./helpers");

const DB = `node_options_${process.pid}`;
const direct = { database: DB };
const sql = (text, params, database = DB) => sqlIn(database, text, params);

test("options against a server", { skip: SKIP }, async (t) => {
  await freshDatabase(t, DB);
  await sql(`CREATE TABLE jobs (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false);
    INSERT INTO jobs SELECT generate_series(1, 200)`);

  for (const mode of ["lease", "session"]) {
    await t.test(`${mode} mode: maxSlots caps the slots of a worker`, async () => {
      const name = `capped_${mode}`;
      const w = new Worker({ connection: direct, name, table: "jobs", n: 4, pending: "done", mode, maxSlots: 1,
        ttl: "3 seconds", pollInterval: 100, handler: async () => {} });
      const running = w.run();
      await until(async () => w.held.size === 1, 10000, "a slot");
      const held = await sql(mode === "lease" ? "SELECT count(*)::int AS k FROM lease_holders($1) WHERE holder IS NOT NULL AND NOT expired"
        : "SELECT count(*)::int AS k FROM slot_holders($1)", [name]);
      await w.stop();
      await running;
      assert.strictEqual(held[0].k, 1);
    });
  }

  await t.test("session mode: the idle limit in each batch, release_slot on leaving", async () => {
    const seen = new Set();
    const events = [];
    const w = new Worker({
      connection: direct, name: "limits", table: "jobs", n: 2, pending: "done", mode: "session", ttl: "4 seconds",
      pollInterval: 100, onEvent: (e) => events.push(e),
      handler: async (client, rows) => {
        const r = await client.query("SELECT current_setting('idle_in_transaction_session_timeout') AS idle");
        seen.add(r.rows[0].idle);
        await client.query("UPDATE jobs SET done = true WHERE id = ANY($1)", [rows.map((x) => x.id)]);
      },
    });
    const running = w.run();
    await until(async () => (await sql("SELECT count(*)::int AS k FROM jobs WHERE NOT done"))[0].k === 0, 10000, "the drain");
    await w.stop();
    await running;
    assert.deepStrictEqual([...seen], ["4s"]);
    assert.ok(events.some((e) => e.type === "left" && e.slots.length === 2), "a left event with both slots");
    assert.strictEqual((await sql("SELECT count(*)::int AS k FROM slot_holders('limits')"))[0].k, 0);
  });
});
