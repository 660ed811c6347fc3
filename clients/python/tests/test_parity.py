"""The Python and Node.js libraries share one vocabulary (docs/libraries.md):
the same options with the same defaults, the same events, the same
metrics, and the same extension functions called with the same named
arguments. Each check reads the code itself (the signature, the sources,
the Prometheus exposition), not only the declared tables."""
import inspect
import json
import os
import re
import shutil
import subprocess

import pytest

import pg_claim
from pg_claim import _vocabulary as vocab

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
PY_SRC = os.path.join(ROOT, "clients", "python", "src", "pg_claim")
NODE = os.path.join(ROOT, "clients", "node")
DOC = os.path.join(ROOT, "docs", "libraries.md")
# the functions of the extension a worker calls (docs/libraries.md, "The SQL they send")
FUNCTIONS = ("claim_leases", "claim_slots", "release_slot", "my_slots", "lease_holders", "fence", "report_backlog",
             "release_lease", "my_items", "my_items_fair", "item_failures", "has_failures", "record_failure",
             "clear_failure", "slot_channel", "slot_partition", "fleet_n")


def snake(name):
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def sources(folder, ext):
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(ext):
            with open(os.path.join(folder, f), encoding="utf-8") as fh:
                out[f] = fh.read()
    return out


@pytest.fixture(scope="module")
def node():
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    out = subprocess.run(["node", "-e", "process.stdout.write(JSON.stringify(require(process.argv[1]).describe()))",
                          NODE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_options_are_the_signature_of_worker():
    sig = inspect.signature(pg_claim.Worker).parameters
    assert list(sig) == [k for k, _ in vocab.OPTIONS]
    for k, d in vocab.OPTIONS:
        p = sig[k]
        if d == vocab.REQUIRED:
            assert p.default is inspect.Parameter.empty, k
        elif d.startswith("'"):
            assert p.default == d.strip("'"), k
        elif d.isdigit():
            assert p.default == int(d), k
        elif d == "false":
            assert p.default is False, k
        elif d == "true":
            assert p.default is True, k
        else:  # none, or made of other options (ttl, n, ...): the code fills it in
            assert p.default is None, k


def test_the_events_are_those_the_code_tells():
    told = set()
    for text in sources(PY_SRC, ".py").values():
        told |= set(re.findall(r"_emit\(\"([a-z_]+)\"", text))
    assert told == set(vocab.EVENTS)
    node_told = set()
    for text in sources(os.path.join(NODE, "lib"), ".js").values():
        node_told |= set(re.findall(r"_emit\(\"([a-z_]+)\"", text))
    assert node_told == set(vocab.EVENTS)


def test_an_event_outside_the_vocabulary_is_refused():
    w = pg_claim.Worker("", name="f", table="t", n=2, pending="done", handler=lambda tx, rows: None)
    with pytest.raises(ValueError, match="'sent' is not an event"):
        w._emit("sent")


def test_the_metrics_are_those_served():
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from pg_claim._metrics import Collector
    stats = pg_claim.Stats()
    stats.batch(0, 1, 0.01)
    stats.failure(0, True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector("f", stats))
    text = generate_latest(registry).decode()
    served = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    want = {m: t for m, t, _ in vocab.METRICS}
    assert served == want
    for m, t, labels in vocab.METRICS:
        line = re.search(rf"^{m}(?:_count)?\{{([^}}]*)\}}", text, re.M)
        assert line, m
        assert sorted(re.findall(r"(\w+)=", line.group(1))) == sorted(labels), m
    bounds = re.findall(r'^pg_claim_batch_duration_seconds_bucket\{.*le="([^"]+)"', text, re.M)
    assert [float(b) for b in bounds if b != "+Inf"] == list(vocab.BUCKETS)


def test_the_node_library_has_the_same_vocabulary(node):
    py = pg_claim.describe()
    assert [(snake(o["name"]), o["default"]) for o in node["options"]] == \
        [(o["name"], o["default"]) for o in py["options"]]
    assert node["events"] == py["events"]
    assert node["lost_reasons"] == py["lost_reasons"]
    assert node["metrics"] == py["metrics"]
    assert node["buckets"] == py["buckets"]


def test_the_doc_tables_are_the_vocabulary(node):
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()

    def table(heading):
        part = doc.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
        return [[c.strip() for c in line.strip().strip("|").split("|")] for line in part.splitlines()
                if line.startswith("| ") and not line.startswith("|---")][1:]
    options = [(r[0].strip("`"), r[1].strip("`"), r[2].strip("`")) for r in table("Options")]
    assert options == [(p["name"], n["name"], p["default"])
                       for p, n in zip(pg_claim.describe()["options"], node["options"])]
    assert [r[0].strip("`") for r in table("Events")] == list(vocab.EVENTS)
    assert [(r[0].strip("`"), r[1], sorted(re.findall(r"`(\w+)`", r[2]))) for r in table("Metrics")] == \
        [(m, t, sorted(ls)) for m, t, ls in vocab.METRICS]


def test_the_lost_reasons_are_those_of_the_doc_and_the_code():
    with open(DOC, encoding="utf-8") as f:
        row = next(line for line in f if line.startswith("| `lost` |"))
    assert re.findall(r"`([a-z ]+)` \(", row) == list(vocab.LOST_REASONS)
    for folder, ext in ((PY_SRC, ".py"), (os.path.join(NODE, "lib"), ".js")):
        text = "\n".join(sources(folder, ext).values())
        for reason in vocab.LOST_REASONS:
            assert f'"{reason}"' in text, (folder, reason)


def test_the_resized_event_has_the_same_fields_in_both():
    """Python tells resized(old_n=, n=), Node.js { oldN, n }: the same
    fields (docs/libraries.md, "A resize")."""
    py = re.findall(r'_emit\("resized", ([^)]*)\)', "\n".join(sources(PY_SRC, ".py").values()))
    js = re.findall(r'_emit\("resized", \{([^}]*)\}', "\n".join(sources(os.path.join(NODE, "lib"), ".js").values()))
    assert len(py) == 1 and len(js) == 1
    py_fields = [f.split("=")[0].strip() for f in py[0].split(",")]
    js_fields = [snake(f.split(":")[0].strip()) for f in js[0].split(",")]
    assert py_fields == js_fields == ["old_n", "n"]


def calls(texts):
    """(the extension functions the sources call, the named arguments their
    statements pass: `name =>` inside the sources' string literals)."""
    functions, named = set(), set()
    for text in texts:
        functions |= set(re.findall(r"\b(%s)\(" % "|".join(FUNCTIONS), text))
        for lit in re.findall(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`', text):
            named |= set(re.findall(r"\b(\w+) =>", lit))
    return functions, named


# The one difference, docs/libraries.md ("The SQL they send"): Node.js asks
# lease_holders after a renewal that lost a slot, to tell `taken` from
# `given back`; Python does not send a second statement there.
NODE_ONLY = {"lease_holders"}


def test_both_send_the_same_functions_with_the_same_named_arguments():
    py = calls(sources(PY_SRC, ".py").values())
    node_calls = calls(sources(os.path.join(NODE, "lib"), ".js").values())
    assert py[0] | NODE_ONLY == node_calls[0] and not py[0] & NODE_ONLY
    assert py[1] == node_calls[1]
    assert node_calls[0] == set(FUNCTIONS)


# one Worker's weights of a slot through counts, batches and a pass's end
# (batch 10): each step and what both libraries answer
BACKLOG_TRACE = [
    ["window", 0, None, 0.0], ["done", 0, 10, [400, "k400"], False, 0.0], ["send", 0, 0.0],
    ["window", 0, "k10", 0.2], ["done", 0, 10, None, False, 0.2], ["send", 0, 0.2],
    ["window", 0, "k20", 1.0], ["done", 0, 10, [300, "k700"], False, 1.0], ["send", 0, 1.0],
    ["window", 0, "k30", 2.0], ["done", 0, 10, None, False, 2.0], ["send", 0, 2.0],
    ["window", 0, "k40", 6.1], ["done", 0, 10, [5, "k705"], False, 6.1], ["send", 0, 6.1],
    ["done", 0, 3, None, True, 6.5], ["send", 0, 6.5], ["window", 0, None, 7.0],
    # two slots, one ten times the other's weight, served in turn by weight
    ["window", 1, None, 8.0], ["done", 1, 10, [399, "k399"], False, 8.0],
    ["window", 2, None, 8.0], ["done", 2, 10, [49, "k49"], False, 8.0],
] + [["pick", [1, 2]]] * 22 + [
    # a report when a weight is to be sent, else at most every 0.2 s
    ["report", 1, 9.0], ["report", 2, 9.05], ["report", 1, 9.1], ["report", 1, 9.3],
    # a weight that moved by a tenth is sent once the last one sent is 1 s old
    ["done", 1, 100, None, False, 9.4], ["report", 1, 9.6], ["report", 1, 10.0],
]


def backlog_python(trace):
    from pg_claim._backlog import Backlog
    b, out = Backlog(10), []
    for op, slot, *args in trace:
        if op == "window":
            w = b.window(slot, args[0], args[1])
            out.append(None if w is None else list(w))
        elif op == "done":
            b.batch_done(slot, args[0], None if args[1] is None else tuple(args[1]), end=args[2], now=args[3])
            out.append(b.weight(slot))
        elif op == "pick":
            out.append(b.pick(slot))
        elif op == "report":
            out.append(list(b.report(slot, args[0])))
        else:
            out.append(b.to_send(slot, args[0]))
    return out


def test_both_weigh_a_slot_by_the_same_rule(node):
    js = """
const { Backlog } = require(process.argv[1] + "/lib/backlog");
const b = new Backlog(10), out = [];
for (const [op, slot, ...a] of JSON.parse(process.argv[2])) {
  if (op === "window") { const w = b.window(slot, a[0], a[1] * 1000); out.push(w === null ? null : [w.after, w.bound]); }
  else if (op === "done") { b.batchDone(slot, a[0], a[1] === null ? null : { pending: a[1][0], last: a[1][1] }, a[2], a[3] * 1000); out.push(b.weight(slot)); }
  else if (op === "pick") out.push(b.pick(slot));
  else if (op === "report") { const r = b.report(slot, a[0] * 1000); out.push([r.report, r.weight]); }
  else out.push(b.toSend(slot, a[0] * 1000));
}
process.stdout.write(JSON.stringify(out));"""
    got = json.loads(subprocess.run(["node", "-e", js, NODE, json.dumps(BACKLOG_TRACE)], capture_output=True,
                                    text=True, check=True).stdout)
    want = backlog_python(BACKLOG_TRACE)
    assert got == want
    # the rule itself: a first window from the cursor, a larger one after its
    # last row, then a refresh; the rows counted less those walked; 0 at the end;
    # a weight is sent as it will be once the next batch (10 rows) is done;
    # none while the count is partial (the first window came back full: 400
    # of 400), the first once it is whole (at 1 s)
    assert want[:18] == [[None, 400], 390, None, None, 380, None, ["k400", 800], 670, 660, None, 660, None,
                         ["k700", 400], 655, 645, 0, 0, [None, 400]]
    # 389 and 39 rows left: ten batches of the heavy slot per batch of the light one
    picks = want[-29:-7]
    assert picks.count(1) == 20 and picks.count(2) == 2, picks
    assert want[-7:-3] == [[True, 379], [True, 29], [False, None], [True, None]]
    # 289 left 0.6 s after 379 was sent: asked without it, then sent at 1 s
    assert want[-3:] == [289, [True, None], [True, 279]]


def test_both_take_a_census_by_the_same_rule(node):
    """A batch that finds rows in a slot that weighed 0 counts the other
    held slots that weigh 0 at once, at most once per CENSUS_EVERY_S; their
    counts are their weights, taken as sent."""
    js = """
const { Backlog } = require(process.argv[1] + "/lib/backlog");
const b = new Backlog(10), out = [];
for (const [op, slot, ...a] of JSON.parse(process.argv[2])) {
  if (op === "done") { b.batchDone(slot, a[0], a[1] === null ? null : { pending: a[1][0], last: a[1][1] }, a[2], a[3] * 1000); out.push(b.weight(slot)); }
  else if (op === "census") out.push(b.census(slot, a[0], a[1], a[2] * 1000));
  else if (op === "counted") out.push(b.counted(slot, a[0], a[1], a[2] * 1000));
  else out.push(b.toSend(slot, a[0] * 1000));
}
process.stdout.write(JSON.stringify(out));"""
    trace = [["done", s, 0, [0, None], True, 0.0] for s in (1, 2, 3, 4)] + [
        ["done", 1, 10, [300, "k300"], False, 1.0], ["census", 1, 0, [1, 2, 3, 4], 1.0],
        ["counted", 2, 250, "k250", 1.0], ["counted", 3, 0, None, 1.0], ["counted", 4, 5, "k5", 1.0],
        ["send", 2, 1.5], ["send", 4, 1.5],
        ["done", 4, 5, None, True, 2.5], ["done", 3, 10, [90, "k90"], False, 3.0], ["census", 3, 0, [1, 2, 3, 4], 3.0],
        ["done", 2, 10, None, True, 6.0], ["done", 3, 10, None, True, 6.2], ["done", 3, 10, [40, "k40"], False, 6.5],
        ["census", 3, 0, [1, 2, 3, 4], 6.5], ["census", 1, 290, [1, 2, 3, 4], 7.0],
        # slots 6 and 5 taken: counted at the next batch of another, once each
        ["census", 1, 290, [1, 2, 3, 4, 6, 5], 7.1], ["census", 1, 290, [1, 2, 3, 4, 6, 5], 7.2],
        ["census", 5, None, [1, 2, 3, 4, 6, 5, 7], 7.3], ["census", 8, None, [8, 9], 7.4],
        # a census window that came back full (400 of 400): partial, nothing sent
        ["counted", 9, 400, "k400", 7.5], ["send", 9, 7.6]]
    got = json.loads(subprocess.run(["node", "-e", js, NODE, json.dumps(trace)], capture_output=True,
                                    text=True, check=True).stdout)
    b, want = pg_claim._backlog.Backlog(10), []
    for op, slot, *a in trace:
        if op == "done":
            b.batch_done(slot, a[0], None if a[1] is None else tuple(a[1]), end=a[2], now=a[3])
            want.append(b.weight(slot))
        elif op == "census":
            want.append(b.census(slot, a[0], a[1], a[2]))
        elif op == "counted":
            want.append(b.counted(slot, a[0], a[1], a[2]))
        else:
            want.append(b.to_send(slot, a[0]))
    assert got == want
    # every slot 0; slot 1 found 300 rows: the census counts 2, 3 and 4, their
    # weights as counted (at least a batch) and not sent again; slot 3 wakes
    # at 3 s while slot 4 weighs 0: no census (one per 5 s); at 6.5 s slots 2
    # and 4 are counted; a slot that did not weigh 0 starts none; slots taken
    # since (no weight yet) are counted once, in the batch of any slot (its
    # own first one included); a partial count sends nothing
    assert want[4:] == [290, [2, 3, 4], 250, 0, 10, None, None, 0, 80, [], 0, 0, 30, [2, 4], [], [5, 6], [], [7], [8, 9],
                        None, None]


def test_both_claim_again_by_the_same_rule(node):
    """The claimer's quick calls after a gain or with nothing to do
    (next_burst, nextBurst), over every case up to past HUNGRY_CALLS."""
    from pg_claim._claimer import HUNGRY_CALLS, next_burst
    cases = [[b, g, h] for b in range(HUNGRY_CALLS + 3) for g in (False, True) for h in (False, True)]
    js = """
const { nextBurst } = require(process.argv[1] + "/lib/claimer");
process.stdout.write(JSON.stringify(JSON.parse(process.argv[2]).map(([b, g, h]) => nextBurst(b, g, h))));"""
    got = json.loads(subprocess.run(["node", "-e", js, NODE, json.dumps(cases)], capture_output=True,
                                    text=True, check=True).stdout)
    assert got == [next_burst(b, g, h) for b, g, h in cases]


# the timing and size constants both libraries keep, by name (a duration is
# NAME_S in Python and NAME_MS in Node.js)
SHARED_CONSTANTS = {"FIRST_WINDOW", "MAX_WINDOW", "COUNT_EVERY", "REFRESH", "SEND_CHANGE", "SEND_MIN", "SEND_EVERY",
                    "REPORT_EVERY", "SHARE_CAP", "HUNGRY", "HUNGRY_CALLS", "SESSION_CLAIM", "TRANSIENT_LIMIT",
                    "MAX_LEASE_SLOTS", "CENSUS_EVERY", "CHECK_EVERY"}


def constants(texts, pattern, scale):
    """{name: value} of the module-level numeric constants, durations in seconds."""
    out = {}
    for text in texts:
        for name, unit, value in re.findall(pattern, text, re.M):
            out[name] = float(value) / scale if unit else float(value)
    return out


def test_both_keep_the_same_constants():
    py = constants(sources(PY_SRC, ".py").values(), r"^([A-Z][A-Z_]*?)(_S)? = ([0-9.]+)\b", 1)
    js = constants(sources(os.path.join(NODE, "lib"), ".js").values(), r"^const ([A-Z][A-Z_]*?)(_MS)? = ([0-9.]+);",
                   1000)
    assert SHARED_CONSTANTS <= set(py) & set(js), SHARED_CONSTANTS - (set(py) & set(js))
    assert {k: py[k] for k in SHARED_CONSTANTS} == {k: js[k] for k in SHARED_CONSTANTS}


def test_both_send_the_same_statement_texts(node):
    """The statements both compose from one text, with the same placeholders:
    the balance count's window and the fetch's failure join, with and
    without the records."""
    from pg_claim import _config
    js = """
const c = require(process.argv[1] + "/lib/config");
process.stdout.write(JSON.stringify([c.COUNT_SQL, c.FAILURES_SQL, c.NO_FAILURES_SQL]));"""
    got = json.loads(subprocess.run(["node", "-e", js, NODE], capture_output=True, text=True, check=True).stdout)
    assert got == [_config.COUNT_SQL, _config.FAILURES_SQL, _config.NO_FAILURES_SQL]
    # each is used: composed in both sources from the one text
    py_config = sources(PY_SRC, ".py")["_config.py"]
    assert "sql.SQL(COUNT_SQL)" in py_config and "(FAILURES_SQL, NO_FAILURES_SQL)" in py_config
    node_config = sources(os.path.join(NODE, "lib"), ".js")["config.js"]
    assert "fill(COUNT_SQL," in node_config and "fill(FAILURES_SQL," in node_config
    assert "fill(NO_FAILURES_SQL," in node_config
