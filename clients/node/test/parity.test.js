"use strict";
// The Node.js and Python libraries share one vocabulary (docs/libraries.md):
// the same options with the same defaults, the same events, the same
// metrics. The checks read the code itself (the options the constructor
// takes, the events the sources tell, the declarations), not only the tables.
const test = require("node:test");
const assert = require("node:assert");
const fs = require("fs");
const path = require("path");
const { execFileSync } = require("child_process");
const { Worker, describe } = require("..");
const { OPTIONS, EVENTS, RENAMED } = require("../lib/vocabulary");

const ROOT = path.join(__dirname, "..", "..", "..");
const snake = (s) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const base = { name: "f", table: "t", n: 4, pending: "done", handler: async () => {} };

// the Python library's table, read from its own file (no psycopg needed)
function python() {
  const file = path.join(ROOT, "clients", "python", "src", "pg_claim", "_vocabulary.py");
  const code = "import importlib.util, json, sys\n"
    + "s = importlib.util.spec_from_file_location('v', sys.argv[1]); m = importlib.util.module_from_spec(s)\n"
    + "s.loader.exec_module(m); print(json.dumps(m.describe()))";
  return JSON.parse(execFileSync("python3", ["-c", code, file], { encoding: "utf8" }));
}

test("the Python library has the same options, defaults, events and metrics", () => {
  const py = python();
  const node = describe();
  assert.deepStrictEqual(node.options.map((o) => [snake(o.name), o.default]), py.options.map((o) => [o.name, o.default]));
  assert.deepStrictEqual(node.events, py.events);
  assert.deepStrictEqual(node.lost_reasons, py.lost_reasons);
  assert.deepStrictEqual(node.metrics, py.metrics);
  assert.deepStrictEqual(node.buckets, py.buckets);
});

test("every option of the table is taken, any other refused with its new name", () => {
  for (const [k, dflt] of OPTIONS) {
    if (dflt === "required") {
      const o = { ...base };
      delete o[k];
      assert.throws(() => new Worker(o), new RegExp(`option ${k}`), k);
    }
  }
  assert.throws(() => new Worker({ ...base, maxslots: 2 }), /unknown option maxslots: the options are those of docs\/libraries\.md/);
  for (const [old, now] of Object.entries(RENAMED)) {
    assert.throws(() => new Worker({ ...base, [old]: "x" }), new RegExp(`unknown option ${old} \\(renamed ${now} in 0\\.6\\.0\\)`));
  }
  const w = new Worker({ ...base, ttl: "3 seconds" });
  assert.strictEqual(w.batch, 50);
  assert.strictEqual(w.maxSlots, 4);
  assert.strictEqual(w.renewMs, 1000);
  assert.strictEqual(w.idleMs, 3000);
  assert.strictEqual(w.queryTimeoutMs, 3000);
  assert.strictEqual(w.maxAttempts, 5);
  assert.strictEqual(w.backoff, "10 seconds");
  assert.strictEqual(w.sessionPool, false);
  assert.strictEqual(w.metricsHost, "127.0.0.1");
  assert.strictEqual(new Worker(base).ttlMs, 30000);
  assert.throws(() => new Worker({ ...base, maxSlots: 5 }), /maxSlots must be between 1 and n = 4/);
});

test("the declarations name every option of the table", () => {
  const dts = fs.readFileSync(path.join(__dirname, "..", "index.d.ts"), "utf8");
  const body = dts.split("export interface WorkerOptions")[1].split("\n}\n")[0];
  const declared = [...body.matchAll(/^ {2}(\w+)\??:/gm)].map((m) => m[1]);
  assert.deepStrictEqual([...declared].sort(), OPTIONS.map(([k]) => k).sort());
});

test("the events are those the code tells, and no other is told", () => {
  const told = new Set();
  for (const f of fs.readdirSync(path.join(__dirname, "..", "lib"))) {
    const text = fs.readFileSync(path.join(__dirname, "..", "lib", f), "utf8");
    for (const m of text.matchAll(/_emit\("([a-z_]+)"/g)) told.add(m[1]);
  }
  assert.deepStrictEqual([...told].sort(), [...EVENTS].sort());
  assert.throws(() => new Worker(base)._emit("sent"), /sent is not an event of the vocabulary/);
});

test("a resize is told with the same event, fields and lost reason as in Python", () => {
  const py = python();
  assert.ok(py.events.includes("resized") && py.lost_reasons.includes("resized"));
  const read = (dir, ext) => fs.readdirSync(dir).filter((f) => f.endsWith(ext)).map((f) => fs.readFileSync(path.join(dir, f), "utf8")).join("\n");
  const js = [...read(path.join(__dirname, "..", "lib"), ".js").matchAll(/_emit\("resized", \{([^}]*)\}/g)].map((m) => m[1]);
  const pySrc = [...read(path.join(ROOT, "clients", "python", "src", "pg_claim"), ".py").matchAll(/_emit\("resized", ([^)]*)\)/g)].map((m) => m[1]);
  assert.strictEqual(js.length, 1);
  assert.strictEqual(pySrc.length, 1);
  assert.deepStrictEqual(js[0].split(",").map((f) => snake(f.split(":")[0].trim())), pySrc[0].split(",").map((f) => f.split("=")[0].trim()));
});
