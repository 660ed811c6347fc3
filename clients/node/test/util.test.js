"use strict";
const test = require("node:test");
const assert = require("node:assert");
const { durationMs, makeHolder, isConnectionLost, isServerState, isTransient, nextPause, nextSlot, diffHeld, dueRows, waitMs, Pass } = require("../lib/util");
const { Worker } = require("..");

test("durationMs reads milliseconds and one-unit intervals", () => {
  assert.strictEqual(durationMs(1500, "ttl"), 1500);
  assert.strictEqual(durationMs("5 seconds", "ttl"), 5000);
  assert.strictEqual(durationMs("500 milliseconds", "ttl"), 500);
  assert.strictEqual(durationMs("1.5s", "ttl"), 1500);
  assert.strictEqual(durationMs("2 min", "ttl"), 120000);
  assert.throws(() => durationMs("5 fortnights", "ttl"), /ttl must be/);
  assert.throws(() => durationMs(-1, "ttl"), /ttl must be/);
  assert.throws(() => durationMs("1 minute 30 seconds", "ttl"), /one unit/);
});

test("makeHolder is host:pid:random and unique", () => {
  const a = makeHolder(), b = makeHolder();
  const [host, pid, rand] = a.split(":");
  assert.ok(host.length > 0);
  assert.strictEqual(Number(pid), process.pid);
  assert.match(rand, /^[0-9a-f]{16}$/);
  assert.notStrictEqual(a, b);
});

test("isConnectionLost tells a lost connection from a statement's error", () => {
  for (const code of ["08006", "08003", "57P01", "57P02", "25P03", "ECONNREFUSED", "ECONNRESET"]) {
    assert.ok(isConnectionLost({ code, message: "" }), code);
  }
  assert.ok(isConnectionLost(new Error("Connection terminated unexpectedly")));
  assert.ok(isConnectionLost(new Error("Client has encountered a connection error and is not queryable")));
  for (const code of ["PC001", "23505", "42P01", "40001", "55000"]) {
    assert.ok(!isConnectionLost({ code, message: "x" }), code);
  }
  assert.ok(!isConnectionLost(new Error("550 no such mailbox")));
  assert.ok(!isConnectionLost(null));
});

test("isServerState: a cancel or a deadlock of the Worker's own statement is not fatal", () => {
  for (const code of ["57014", "55P03", "40001", "40P01", "53300", "58030", "08006", "ECONNRESET"]) {
    assert.ok(isServerState({ code, message: "" }), code);
  }
  for (const code of ["PC001", "23505", "42P01", "22023", "PG_CLAIM_NOT_A_SESSION"]) {
    assert.ok(!isServerState({ code, message: "x" }), code);
  }
  assert.ok(!isServerState(new Error("550 no such mailbox")));
  assert.ok(!isServerState(null));
});

test("isTransient: a handler's lost connection, deadlock or shortage, not its own faults", () => {
  for (const code of ["40001", "40P01", "53300", "53200", "58030", "08006", "57P01", "ECONNRESET"]) {
    assert.ok(isTransient({ code, message: "" }), code);
  }
  assert.ok(isTransient(new Error("Client was closed and is not queryable")));
  assert.ok(isTransient(new Error("Query read timeout")));
  for (const code of ["57014", "23505", "42P01", "22023", "40002", "PC001"]) {
    assert.ok(!isTransient({ code, message: "x" }), code);
  }
  assert.ok(!isTransient(new Error("550 no such mailbox")));
});

test("nextPause doubles from 100 ms up to the cap", () => {
  const seen = [];
  let p = 0;
  for (let i = 0; i < 8; i++) seen.push(p = nextPause(p));
  assert.deepStrictEqual(seen, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
});

test("nextSlot goes round the held slots", () => {
  assert.strictEqual(nextSlot([], -1), null);
  assert.strictEqual(nextSlot([5, 1, 3], -1), 1);
  assert.strictEqual(nextSlot([5, 1, 3], 1), 3);
  assert.strictEqual(nextSlot([5, 1, 3], 5), 1);
  assert.strictEqual(nextSlot([5, 1, 3], 4), 5); // a slot given back meanwhile
});

test("diffHeld: a new token is a slot lost and taken again", () => {
  const before = new Map([[0, "10"], [1, "11"], [2, "12"]]);
  const after = new Map([[1, "11"], [2, "20"], [3, "13"]]);
  const { taken, lost } = diffHeld(before, after);
  assert.deepStrictEqual(lost, [{ slot: 0, token: "10" }, { slot: 2, token: "12" }]);
  assert.deepStrictEqual(taken, [{ slot: 2, token: "20" }, { slot: 3, token: "13" }]);
});

test("dueRows skips dead and waiting items; a waiting item holds back its route", () => {
  const r = (key, failure, route = null) => ({ key, failure, route });
  const rows = [r("1", null, "a"), r("2", "retry", "b"), r("3", null, "b"), r("4", "dead", "c"), r("5", null, "c"), r("6", "due", "d")];
  assert.deepStrictEqual(dueRows(rows, null).map((x) => x.key), ["1", "3", "5", "6"]);
  const held = new Set();
  assert.deepStrictEqual(dueRows(rows, held).map((x) => x.key), ["1", "5", "6"]);
  assert.deepStrictEqual([...held], ["b"]);
  // a later batch of the same pass: route b still waits
  assert.deepStrictEqual(dueRows([r("7", null, "b"), r("8", null, "e")], held).map((x) => x.key), ["8"]);
});

test("waitMs: the next retry if sooner than the poll, never under the floor", () => {
  assert.strictEqual(waitMs(1000, null), 1000);
  assert.strictEqual(waitMs(1000, 300), 300);
  assert.strictEqual(waitMs(1000, 5000), 1000);
  assert.strictEqual(waitMs(1000, -50), 100); // a retry due now: no busy loop
  assert.strictEqual(waitMs(1000, 0), 100);
});

test("Worker checks its options", () => {
  const ok = { name: "mailer", table: "outbox", n: 8, pending: "sent_at", handler: async () => {} };
  const w = new Worker(ok);
  assert.strictEqual(w.mode, "lease");
  assert.strictEqual(w.batch, 50);
  assert.strictEqual(w.ttlMs, 30000);
  assert.strictEqual(w.renewMs, 10000);
  assert.strictEqual(w.idleMs, 30000);
  assert.strictEqual(w.backoff, "10 seconds");
  assert.match(w.holder, /^.+:\d+:[0-9a-f]{16}$/);
  assert.strictEqual(new Worker({ ...ok, ttl: "5 seconds", backoff: 200 }).backoff, "200 milliseconds");
  assert.strictEqual(new Worker({ ...ok, holder: "me" }).holder, "me");
  assert.strictEqual(new Worker({ ...ok, n: 1048576, mode: "session" }).n, 1048576);
  assert.strictEqual(new Worker({ ...ok, n: 1024 }).n, 1024);
  assert.strictEqual(w.metricsHost, "127.0.0.1");
  assert.strictEqual(w.queryTimeoutMs, 30000);
  assert.strictEqual(new Worker({ ...ok, queryTimeout: "2 seconds" }).queryTimeoutMs, 2000);
  // the back-off: 5 s at most, a third of the ttl in lease mode
  assert.strictEqual(w._nextPause(4000), 5000);
  assert.strictEqual(new Worker({ ...ok, ttl: "3 seconds" })._nextPause(4000), 1000);
  assert.strictEqual(new Worker({ ...ok, ttl: "3 seconds", mode: "session" })._nextPause(4000), 5000);
  for (const [bad, msg] of [
    [{ name: undefined }, /name is required/],
    [{ n: 0 }, /n must be an integer of at least 1/],
    [{ n: 2.5 }, /n must be/],
    [{ n: 1025 }, /n must be at most 1024 in lease mode/],
    [{ pending: undefined }, /pending is required/],
    [{ handler: "x" }, /handler must be a function/],
    [{ mode: "pool" }, /mode must be one of lease, session, auto/],
    [{ ttl: "100 milliseconds" }, /ttl must be at least 300/],
    [{ ttl: "3 seconds", renewInterval: "5 seconds" }, /renewInterval must be/],
    [{ batch: 0 }, /batch must be/],
    [{ metricsHost: 8080 }, /metricsHost must be a non-empty string/],
    [{ queryTimeout: "soon" }, /queryTimeout must be/],
  ]) {
    assert.throws(() => new Worker({ ...ok, ...bad }), msg);
  }
});

test("_pick passes over resting slots until their time, unless every slot rests", () => {
  const w = new Worker({ name: "mailer", table: "outbox", n: 8, pending: "sent_at", handler: async () => {} });
  w.held = new Map([[1, 10], [2, 20], [3, 30]]);
  const later = Date.now() + 60000;
  w._resting.set(2, { token: 20, until: later });
  let last = -1;
  const turn = () => { last = w._pick(last).slot; return last; };
  assert.deepStrictEqual([turn(), turn(), turn(), turn()], [1, 3, 1, 3]);
  w._resting.set(2, { token: 21, until: later }); // taken anew since: not resting
  assert.deepStrictEqual([turn(), turn()], [1, 2]);
  w._resting.set(2, { token: 20, until: Date.now() - 1 }); // its time has come
  assert.deepStrictEqual([turn(), turn(), turn()], [3, 1, 2]);
  for (const s of [1, 2, 3]) w._resting.set(s, { token: s * 10, until: later });
  assert.deepStrictEqual([turn(), turn(), turn()], [3, 1, 2]); // all rest: the turn as before
  w._wake("notify");
  assert.strictEqual(w._resting.size, 0); // a notification ends every rest
});

test("stop() before run() resolves at once", async () => {
  const w = new Worker({ name: "mailer", table: "outbox", n: 8, pending: "sent_at", handler: async () => {} });
  await w.stop();
});

test("Pass: quiet after a whole pass that handled nothing, not after the end of a busy one", () => {
  let t = 1000;
  const p = new Pass(() => t);
  assert.strictEqual(p.after(0, { handled: 5, end: false, retryMs: null }, [0]), false);
  // the pass that handled items ends with an empty batch: not quiet, the slot is walked again
  assert.strictEqual(p.after(0, { handled: 0, end: true, retryMs: null }, [0]), false);
  assert.strictEqual(p.after(0, { handled: 0, end: true, retryMs: null }, [0, 1]), false); // slot 1 not yet
  assert.strictEqual(p.after(1, { handled: 0, end: true, retryMs: null }, [0, 1]), true);
  assert.strictEqual(p.retryMs([0, 1]), null);
});

test("Pass: an item failed in a pass is waited for even once its retry is due", () => {
  let t = 1000;
  const p = new Pass(() => t);
  p.after(0, { handled: 3, end: false, retryMs: 200 }, [0]); // one of them failed, retry in 200 ms
  t += 500; // the rest of the pass takes longer than the back-off
  p.after(0, { handled: 0, end: true, retryMs: null }, [0]);
  assert.strictEqual(p.after(0, { handled: 0, end: true, retryMs: null }, [0]), true);
  assert.strictEqual(p.retryMs([0]), 0); // due now: the wait is the floor, not the poll
  assert.strictEqual(waitMs(60000, p.retryMs([0])), 100);
  assert.strictEqual(p.retryMs([1]), null); // another slot's item is not this worker's to wait for
  p.clear();
  assert.strictEqual(p.retryMs([0]), null);
});
