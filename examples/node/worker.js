#!/usr/bin/env node
// A pg_claim worker in Node.js (node-postgres) for the example schema
// (examples/schema.sql): it sends the messages of `outbox`.
//
//     PGHOST=... PGDATABASE=app node examples/node/worker.js [--exit-when-empty]
//
// The same worker as examples/python/worker.py (its docstring says what it
// does): claim_slots, my_items, a failure record per failed message, LISTEN on
// the slots' channels with a fallback poll, reconnect with back-off, exit on
// SIGTERM or SIGINT, or with --exit-when-empty once its slots have nothing left.
// Like it, it refuses to work behind a pooler (status 2) unless
// MAILER_SESSION_POOL=1 says the pool is in session mode.
"use strict";
const { Client, DatabaseError } = require("pg");

const NAME = "mailer", N = 8, BATCH = 50;
const MAX_ATTEMPTS = Number(process.env.MAILER_MAX_ATTEMPTS || 5);
const BACKOFF = process.env.MAILER_BACKOFF || "10 seconds";
const POLL_MS = 1000 * Number(process.env.MAILER_POLL_S || 30); // the fallback poll
const EXIT_WHEN_EMPTY = process.argv.includes("--exit-when-empty");
const WORKER = `node-${process.pid}`;
const SESSION_POOL = process.env.MAILER_SESSION_POOL === "1"; // a pooler in session mode is in between
let stopping = false;
let wakeUp = () => {}; // ends the current wait early

const say = (...words) => console.log(words.join(" "));
// A lost connection (the server restarted, the network failed, ...), not a failed message.
const lost = (e) => /^(08|57P0|E[A-Z]+$)/.test(e.code ?? "") || /Connection terminated|not queryable/.test(e.message);
// The connection is not one server session: a pooler in between.
class NotASession extends Error {}

// Deliver one message. Here: a row in `deliveries`, in the caller's
// transaction; the reserved domain .invalid stands for a bounce.
async function send(client, recipient, body, item) {
  if (recipient.endsWith(".invalid")) throw new Error(`550 no such mailbox: ${recipient}`);
  await client.query("INSERT INTO deliveries (outbox_id, worker) VALUES ($1, $2)", [item, WORKER]);
}

// docs/workers.md: begin
const FETCH = `
  SELECT o.id, o.recipient, o.body, o.sent_at IS NULL AS pending, f.state AS failure
  FROM my_items(NULL::outbox, $1, $2, after => $3, pending => 'sent_at', batch => $4) o
  LEFT JOIN item_failures($5) f ON f.item = o.id::text`;
const CLAIM = "SELECT claim_slots($1, $2, $3, '1 second') AS s, pg_backend_pid() AS pid";
// seconds until the first retry of a failed, still unsent message of this
// session's slots; NULL: none (a record of a message sent meanwhile by another
// kind of worker does not count)
const NEXT_RETRY = `
  SELECT extract(epoch FROM min(f.retry_at) - clock_timestamp())::float8 AS s
  FROM item_failures($1) f JOIN outbox o ON o.id = f.item::bigint AND o.sent_at IS NULL
  WHERE f.state <> 'dead' AND slot_of(o.id, $2) = ANY (my_slots($1))`;

// This session's slots, claimed again: its own plus unserved ones.
async function claim(client, server) {
  const { s, pid } = (await client.query(CLAIM, [NAME, N, N])).rows[0];
  if (pid !== server) { // a transaction-mode pooler: the claim stays with another connection
    throw new NotASession(`claim_slots ran in server process ${pid}, not ${server}: the pool is not in session mode`);
  }
  return s;
}

// Send one message and mark it sent in one transaction; record a failure.
async function processItem(client, { id, recipient, body, failure }) {
  try {
    await client.query("BEGIN");
    const u = await client.query("UPDATE outbox SET sent_at = now() WHERE id = $1 AND sent_at IS NULL", [id]);
    if (u.rowCount === 0) { // sent meanwhile by another kind of worker (docs/migrating.md)
      await client.query("COMMIT");
      say("skipped", id);
      return;
    }
    await send(client, recipient, body, id);
    if (failure !== null) await client.query("SELECT clear_failure($1, $2)", [NAME, id]); // it failed before: forget that
    await client.query("COMMIT");
  } catch (e) {
    // the database's error, not the message's: never recorded as its failure
    if (lost(e) || e instanceof DatabaseError) throw e;
    await client.query("ROLLBACK"); // the delivery failed
    const r = await client.query("SELECT record_failure($1, $2, $3, $4, $5) AS state",
      [NAME, id, e.message, MAX_ATTEMPTS, BACKOFF]);
    say(r.rows[0].state === "retry" ? "failed" : "dead", id, e.message);
  }
}

// Work until told to stop (true) or the share is empty (false).
async function serve(client, server) {
  let slots = [], quiet = {};
  const after = {}, busy = new Set();
  while (!stopping) {
    // between batches: take unserved slots, give one back to a waiting newcomer
    const held = await claim(client, server);
    for (const s of new Set([...slots, ...held])) { // LISTEN on the channels of the slots held
      if (slots.includes(s) === held.includes(s)) continue;
      const ch = (await client.query("SELECT slot_channel($1, $2) AS c", [NAME, s])).rows[0].c;
      await client.query(`${held.includes(s) ? "LISTEN" : "UNLISTEN"} ${client.escapeIdentifier(ch)}`);
      delete after[s];
      busy.delete(s);
      quiet[s] = false;
    }
    if (held.join() !== slots.join()) say("slots", ...held);
    slots = held;
    for (const s of slots) { // one batch of each slot's share
      const { rows } = await client.query(FETCH, [s, N, after[s] ?? null, BATCH, NAME]);
      const due = rows.filter((r) => r.pending && (r.failure === null || r.failure === "due"));
      for (const r of due) {
        if (stopping) return true;
        await processItem(client, r);
      }
      if (due.length) {
        busy.add(s);
        quiet[s] = false;
      }
      if (rows.length < BATCH) { // the share is walked: quiet if nothing was due
        delete after[s];
        quiet[s] = !busy.has(s);
        busy.delete(s);
      } else {
        after[s] = rows[rows.length - 1].id; // a bigint comes back as a string
      }
    }
    if (!slots.length || !slots.every((s) => quiet[s])) continue;
    const retryIn = (await client.query(NEXT_RETRY, [NAME, N])).rows[0].s;
    if (retryIn === null && EXIT_WHEN_EMPTY) return false;
    say("waiting");
    // at least 0.1 s: a retry due now is fetched by the next pass, not by a busy loop
    const until = Date.now() + (retryIn === null ? POLL_MS : Math.min(POLL_MS, Math.max(retryIn, 0.1) * 1000));
    while (Date.now() < until && !stopping) {
      if (await wait(client, Math.min(until - Date.now(), 1000))) {
        say("woken");
        break;
      }
      // each second: claim again, as another worker may have given a slot up for this one
      if ((await claim(client, server)).join() !== slots.join()) break;
    }
    quiet = {}; // woken or not: walk every share again
  }
  return true;
}
// docs/workers.md: end

// Until a notification arrives (true), `ms` pass or a signal comes.
function wait(client, ms) {
  return new Promise((resolve) => {
    const done = (woken) => {
      clearTimeout(timer);
      client.removeListener("notification", onNotify);
      client.removeListener("error", onError);
      wakeUp = () => {};
      resolve(woken);
    };
    const onNotify = () => done(true);
    const onError = () => done(false); // the connection broke: the next query says how
    const timer = setTimeout(() => done(false), ms);
    client.on("notification", onNotify);
    client.on("error", onError);
    wakeUp = () => done(false);
    if (stopping) done(false);
  });
}

const sleep = (ms) => new Promise((resolve) => { const t = setTimeout(resolve, ms); wakeUp = () => { clearTimeout(t); resolve(); }; });

// The server process of this connection; refuses one behind a pooler.
async function checkSession(client) {
  const pid = (await client.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
  if (pid !== client.processID && !SESSION_POOL) {
    throw new NotASession(`the server process (pid ${pid}) is not the one the connection was opened with`
      + ` (pid ${client.processID}): a connection pooler is in between. This worker holds its slots with`
      + " session locks and LISTENs, which need one server session per connection: connect to PostgreSQL"
      + " directly, or through a pool in session mode and set MAILER_SESSION_POOL=1. Behind a"
      + " transaction-mode pooler use leases (docs/leases.md).");
  }
  return pid;
}

async function main() {
  for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => { stopping = true; wakeUp(); });
  let pause = 100;
  for (;;) {
    const client = new Client({ application_name: NAME }); // PGHOST, PGDATABASE, ... from the environment
    client.on("error", () => {}); // a broken connection: the next query fails, and says how
    try {
      await client.connect();
      pause = 100;
      const told = await serve(client, await checkSession(client));
      await client.end();
      say("exit", told ? "told to stop" : "nothing left");
      return;
    } catch (e) {
      client.end().catch(() => {});
      if (e instanceof NotASession) {
        say("exit", "refused:", e.message);
        process.exitCode = 2;
        return;
      }
      if (!lost(e)) throw e;
      say("reconnecting", `in ${pause / 1000} s:`, e.message);
      await sleep(pause);
      if (stopping) { say("exit", "told to stop"); return; }
      pause = Math.min(pause * 2, 5000);
    }
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
