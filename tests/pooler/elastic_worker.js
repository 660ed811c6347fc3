// One elastic lease worker in Node.js (node-postgres), started by
// tests/pooler/elastic.py.
//
// It connects through PgBouncer in pool_mode = transaction (the PG*
// environment variables). A timer loop calls claim_leases(ELASTIC_NAME,
// ELASTIC_N, holder, ttl => ELASTIC_TTL_S) every ELASTIC_PERIOD_S on a
// connection of its own; its result is every slot the worker holds. The
// worker loop takes the held slots in turn, fetches a batch of the slot's
// share of `items` with my_items, works on it, and writes it in one
// transaction behind fence(): a PC001 drops the slot until the next call
// returns it. On SIGTERM it finishes its batch, then gives every slot back
// and leaves the live set (claim_leases(..., max => 0)) and exits 0.
//
// Every change of the held slots, batch, write, rejected write and
// reconnection is one JSON line on stdout.
"use strict";
const crypto = require("crypto");
const os = require("os");
const path = require("path");
const { Client } = require("pg");
const { Held } = require(path.join(__dirname, "..", "..", "clients", "node"));

const NAME = process.env.ELASTIC_NAME;
const N = Number(process.env.ELASTIC_N);
const TTL_MS = Number(process.env.ELASTIC_TTL_S) * 1000;
const TTL = `${process.env.ELASTIC_TTL_S} seconds`;
const PERIOD_MS = Number(process.env.ELASTIC_PERIOD_S) * 1000;
const BATCH = Number(process.env.ELASTIC_BATCH);
const ITEM_MS = Number(process.env.ELASTIC_ITEM_MS);
const POLL_MS = 100; // the pause after a round over the held slots that found nothing to do
// one holder: this process, on this host (a pid is reused, the random part is not)
const HOLDER = process.env.ELASTIC_HOLDER || `${os.hostname()}:${process.pid}:${crypto.randomBytes(8).toString("hex")}`;
// A lost connection (08: connection exception, 57P0x: the server shut down or
// ended the session, 25P03: idle in a transaction too long), not a failed batch.
const lost = (e) => /^(08|57P0|25P03|E[A-Z]+$)/.test(e.code ?? "") || /Connection terminated|not queryable|server conn crashed/.test(e.message);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
let stopping = false;

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, worker: HOLDER, t: Date.now() / 1000, ...fields }) + "\n");
}

async function connect() {
  const c = new Client(); // node-postgres prepares no named statements
  c.on("error", () => {}); // a lost connection: the next query fails and says so
  await c.connect();
  return c;
}

// slot -> token (a string: bigint) of the held slots, as the last call
// returned them, with the cursor into each share (the worker library's Held:
// a slot taken anew is walked from its beginning).
const held = new Held({ validMs: TTL_MS });

function changed({ gained, lost }) {
  for (const { slot, token } of lost) emit("lost", { slot, token });
  if (gained.length || lost.length) emit("held", { slots: [...held.snapshot()] });
}

// claim_leases every PERIOD_MS on a connection of its own, whatever the
// worker's batches do; a failed call is tried again at the next period on a
// new connection, and the slots are dropped once none succeeded for a ttl.
async function claimLoop() {
  let c = null;
  while (!stopping) {
    const asked = Date.now();
    try {
      c = c ?? await connect();
      const { rows } = await c.query("SELECT slot, token FROM claim_leases($1, $2, $3, ttl => $4)",
        [NAME, N, HOLDER, TTL]);
      changed(held.replace(rows, asked));
    } catch (e) {
      c?.end().catch(() => {});
      c = null;
      changed({ gained: [], lost: held.failed(Date.now()) });
    }
    await sleep(Math.max(0, asked + PERIOD_MS - Date.now()));
  }
  c?.end().catch(() => {});
}

// One batch of the next held slot; false when there was nothing to do.
async function workOnce(client) {
  const got = held.next();
  if (got === null) return false;
  const { slot, token, cursor: after } = got;
  const { rows } = await client.query(
    "SELECT id, done FROM my_items(NULL::items, $1, $2, route => 'customer', after => $3, batch => $4)",
    [slot, N, after, BATCH]);
  if (rows.length === 0) return false; // the share is walked; new items come after the cursor
  const last = rows[rows.length - 1].id; // bigint comes back as a string
  const todo = rows.filter((r) => !r.done).map((r) => r.id);
  if (todo.length > 0) {
    emit("fetched", { slot, token, items: todo.length });
    await sleep(ITEM_MS * todo.length); // the work on one batch (e-mails, calls, ...)
    try { // the batch's writes commit only if the slot is still ours
      await client.query("BEGIN");
      await client.query("SELECT fence($1, $2, $3)", [NAME, slot, token]);
      await client.query("UPDATE items SET done = true WHERE id = ANY($1)", [todo]);
      await client.query("INSERT INTO processing_log (item, worker, slot, token)"
        + " SELECT unnest($1::bigint[]), $2, $3, $4", [todo, HOLDER, slot, token]);
      await client.query("COMMIT");
    } catch (e) {
      await client.query("ROLLBACK").catch(() => {});
      if (e.code !== "PC001") throw e;
      held.drop(slot, token);
      emit("rejected", { slot, token, items: todo.length, how: "PC001" });
      return true;
    }
    emit("wrote", { slot, token, items: todo.length });
  }
  held.advance(slot, token, last);
  return true;
}

async function main() {
  process.on("SIGTERM", () => { stopping = true; });
  emit("started", { ttl: TTL });
  const claiming = claimLoop();
  let client = null, idle = 0;
  while (!stopping) {
    try {
      client = client ?? await connect();
      if (await workOnce(client)) {
        idle = 0;
      } else if (++idle >= Math.max(1, held.snapshot().size)) { // a round over the held slots found nothing
        idle = 0;
        await sleep(POLL_MS);
      }
    } catch (e) {
      // the connection is gone: connect again; the held slots are the claim loop's
      client?.end().catch(() => {});
      client = null;
      if (!lost(e)) throw e;
      emit("reconnecting", { error: e.message });
      await sleep(POLL_MS);
    }
  }
  client?.end().catch(() => {});
  await claiming;
  // give every slot back and leave the live set
  for (let attempt = 1; ; attempt++) {
    try {
      const c = await connect();
      await c.query("SELECT count(*) FROM claim_leases($1, $2, $3, max => 0)", [NAME, N, HOLDER]);
      await c.end();
      break;
    } catch (e) {
      if (attempt === 3) throw e;
      await sleep(200);
    }
  }
  const gone = [...held.snapshot()];
  held.replace([], Date.now());
  emit("left", { slots: gone });
}

// Exit when the driver is gone or the lifetime is over, whatever the loop does.
const parent = process.ppid;
const end = Date.now() + Number(process.env.ELASTIC_LIFETIME_S || 120) * 1000;
setInterval(() => {
  if (process.ppid !== parent || Date.now() > end) process.exit(3);
}, 500).unref();
process.stdout.on("error", () => process.exit(3));

main().then(() => process.exit(0), (e) => {
  emit("error", { error: `${e.code || ""} ${e.message}` });
  process.exit(1);
});
