"use strict";
// Held, the held slots of a worker (lib/held.js): the same behaviour and the
// same methods as the Python library's pg_claim.Held.
const test = require("node:test");
const assert = require("node:assert");
const fs = require("fs");
const path = require("path");
const { Held } = require("..");

const slots = (list) => list.map(({ slot, token }) => [slot, token]);

test("replace reports the slots gained and lost", () => {
  const h = new Held({ validMs: 3000, marginMs: 1000 });
  let c = h.replace([[0, "10"], [1, "11"]], 100000);
  assert.deepStrictEqual([slots(c.gained), slots(c.lost)], [[[0, "10"], [1, "11"]], []]);
  h.advance(0, "10", "42");
  c = h.replace([{ slot: 0, token: "10" }, { slot: 1, token: "12" }, { slot: 2, token: "13" }], 101000);
  assert.deepStrictEqual([slots(c.gained), slots(c.lost)], [[[1, "12"], [2, "13"]], [[1, "11"]]]);
  assert.deepStrictEqual([...h.snapshot()], [[0, "10"], [1, "12"], [2, "13"]]);
  // the kept slot keeps its cursor; the one taken anew starts from the start
  assert.deepStrictEqual(h.next(101500), { slot: 0, token: "10", cursor: "42" });
  assert.deepStrictEqual(h.next(101500), { slot: 1, token: "12", cursor: null });
  assert.deepStrictEqual(h.next(101500), { slot: 2, token: "13", cursor: null });
  assert.deepStrictEqual(h.next(101500), { slot: 0, token: "10", cursor: "42" });
});

test("work stops before the ttl and the slots go after it", () => {
  const h = new Held({ validMs: 3000, marginMs: 1000 });
  h.replace([[5, "1"]], 100000);
  assert.ok(h.workable(101900) && h.next(101900) !== null);
  assert.ok(!h.workable(102000) && h.next(102000) === null); // 2/3 of the ttl without a good claim
  assert.deepStrictEqual(h.failed(102500), []); // kept until the ttl
  assert.deepStrictEqual(slots(h.failed(103000)), [[5, "1"]]);
  assert.strictEqual(h.snapshot().size, 0);
  assert.strictEqual(h.validLeft(103000), 0);
});

test("drop, advance and pick need the slot and its token", () => {
  const h = new Held();
  h.replace([[3, "7"]], 0);
  h.advance(3, "6", "x"); // a stale token changes nothing
  assert.deepStrictEqual(h.next(), { slot: 3, token: "7", cursor: null });
  assert.deepStrictEqual(h.pick(3, "9"), { slot: 3, token: "7", cursor: "9" });
  assert.strictEqual(h.pick(4, "9"), null);
  assert.ok(!h.drop(3, "6"));
  assert.ok(h.drop(3, "7"));
  assert.strictEqual(h.next(), null);
});

test("the methods are those of pg_claim.Held", () => {
  const py = fs.readFileSync(path.join(__dirname, "..", "..", "python", "src", "pg_claim", "_held.py"), "utf8");
  const pyMethods = [...py.matchAll(/^ {4}def ([a-z]\w*)\(self/gm)].map((m) => m[1]).sort();
  const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
  const nodeMethods = Object.getOwnPropertyNames(Held.prototype).filter((m) => m !== "constructor" && !m.startsWith("_"));
  assert.deepStrictEqual(nodeMethods.sort(), pyMethods.map(camel).sort());
});
