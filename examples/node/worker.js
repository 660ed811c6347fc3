#!/usr/bin/env node
// A pg_claim worker in Node.js on the pg-claim library (clients/node) for the
// example schema (examples/schema.sql): it sends the messages of `outbox`.
//
//     PGHOST=... PGDATABASE=app node examples/node/worker.js [--exit-when-empty]
//
// The library claims the slots, walks their shares in batches, retries a
// failed batch item by item (record_failure), wakes on NOTIFY, reconnects,
// and stops on SIGTERM or SIGINT. This file is the handler and the output.
// MAILER_MODE: session (the default: claim_slots and LISTEN on a direct
// connection; refuses a transaction-mode pooler, status 2), or lease
// (claim_leases: through PgBouncer in transaction mode).
"use strict";
const { Worker, NotASessionError } = require("pg-claim");

const WORKER = `node-${process.pid}`;
const EXIT_WHEN_EMPTY = process.argv.includes("--exit-when-empty");
const say = (...words) => console.log(words.join(" "));

// Deliver one message. Here: a row in `deliveries`, in the batch's
// transaction; the reserved domain .invalid stands for a bounce.
async function send(client, recipient, body, item) {
  if (recipient.endsWith(".invalid")) throw new Error(`550 no such mailbox: ${recipient}`);
  await client.query("INSERT INTO deliveries (outbox_id, worker) VALUES ($1, $2)", [item, WORKER]);
}

// docs/workers.md: begin
const worker = new Worker({
  name: "mailer", table: "outbox", n: 8, pending: "sent_at", batch: 50, // PGHOST, PGDATABASE, ... from the environment
  mode: process.env.MAILER_MODE || "session",
  ttl: process.env.MAILER_TTL || "30 seconds", // lease mode: a dead worker's slots move on after this
  sessionPool: process.env.MAILER_SESSION_POOL === "1", // a pool in session mode is in between
  maxAttempts: Number(process.env.MAILER_MAX_ATTEMPTS || 5),
  backoff: process.env.MAILER_BACKOFF || "10 seconds",
  pollInterval: 1000 * Number(process.env.MAILER_POLL_S || 30),
  // one batch, in one transaction: mark each message sent, and deliver it
  handler: async (client, rows) => {
    for (const { id, recipient, body } of rows) {
      const u = await client.query("UPDATE outbox SET sent_at = now() WHERE id = $1 AND sent_at IS NULL", [id]);
      if (u.rowCount === 0) say("skipped", id); // sent meanwhile by another kind of worker (docs/migrating.md)
      else await send(client, recipient, body, id);
    }
  },
  onEvent: (e) => {
    if (e.type === "slots") say("slots", ...e.held);
    else if (e.type === "failed" || e.type === "dead") say(e.type, e.item, e.error);
    else if (e.type === "reconnecting") say("reconnecting", `in ${e.pauseMs / 1000} s:`, e.error);
    else if (e.type === "woken") say("woken");
    else if (e.type === "idle") {
      if (EXIT_WHEN_EMPTY && e.retryMs === null) { // nothing left to send or retry in this worker's slots
        emptied = true;
        worker.stop();
      } else say("waiting");
    }
  },
});
let emptied = false;

worker.run({ handleSignals: true }).then(
  () => say("exit", emptied ? "nothing left" : "told to stop"),
  (e) => {
    if (!(e instanceof NotASessionError)) throw e;
    say("exit", "refused:", e.message);
    process.exitCode = 2;
  });
// docs/workers.md: end
