"""The measurements and the outputs of the balance benchmark (bench/balance.py):
what one run's table and samples say (measure), the ratios between schemes
(ratios), the text table (table) and the SVG plot of scenario a (svg, a small
hand-written writer)."""
import bisect
import math
import statistics
from xml.sax.saxutils import escape

BUCKET_S = 0.5  # the plot's resolution


def nearest_rank(values, p):
    """The p-th percentile, nearest-rank (as everywhere in the benchmarks)."""
    v = sorted(values)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)] if v else None


def cpu_used(run):
    """CPU seconds from the release to the last row done: the worker
    processes' and the server processes' (those there at both ends; a
    worker that joined counts from 0, one killed or gone before the end
    not at all), and per 1,000 rows."""
    a, b = run.cpu_at_release, run.cpu_at_end
    if a is None or b is None:
        return {}
    def spent(kind, new_from_zero):
        total = 0.0
        for k, v in b[kind].items():
            start = a[kind].get(k, 0.0 if new_from_zero else None)
            if v is not None and start is not None:
                total += v - start
        return total
    workers, server = spent("workers", True), spent("server", False)
    per = 1000 / run.spec.rows
    return {"cpu_workers_s": round(workers, 2), "cpu_server_s": round(server, 2),
            "cpu_ms_per_1000_rows": {"workers": round(workers * per * 1000, 1), "server": round(server * per * 1000, 1)}}


def measure(d, run, ttl_s):
    """The figures of one finished run (d: a connection to its database)."""
    spec, t0 = run.spec, run.t0
    r = cpu_used(run)
    if run.tracked:
        r["functions"] = run.functions
        r["claim_calls"] = run.claim_calls
    missing, dup = d.execute("SELECT count(*) FILTER (WHERE done_at IS NULL),"
                             " count(*) FILTER (WHERE times <> 1) FROM items").fetchone()
    r["exactly_once"] = missing == 0 and dup == 0
    if not r["exactly_once"]:
        r["once_error"] = f"{missing} rows never done, {dup} rows not done exactly once (times <> 1)"
    (end,) = d.execute("SELECT extract(epoch FROM max(done_at))::float8 FROM items").fetchone()
    r["makespan_s"] = round(end - t0, 3)
    r["items_per_s"] = round(spec.rows / (end - t0), 1)
    # the idle tail: the first worker still running at the end that had nothing
    # left to do (its last row), to the end
    last = {w: (t, c) for w, t, c in d.execute(
        "SELECT done_by, extract(epoch FROM max(done_at))::float8, count(*) FROM items"
        " WHERE done_by IS NOT NULL GROUP BY done_by")}
    r["rows_by_worker"] = {w: c for w, (_t, c) in sorted(last.items())}
    running = [w for w in run.procs if w not in run.gone]
    joined = {label: t0 + at for at, action, label in run.applied if action == "join"}
    idle_from = {w: last[w][0] if w in last else max(t0, run.started(w) or joined.get(w, t0)) for w in running}
    first = min(idle_from, key=idle_from.get)
    r["idle_tail_s"] = round(end - idle_from[first], 3)
    r["idle_tail_pct"] = round(100 * r["idle_tail_s"] / r["makespan_s"], 1)
    r["first_idle"] = first
    # hand-overs: a change of writer of a slot's rows, in the order they were done
    ho, mean, most = d.execute(
        "WITH s AS (SELECT done_by, lag(done_by) OVER w AS prev,"
        " count(*) OVER (PARTITION BY slot) - row_number() OVER w + 1 AS moved"
        " FROM items WINDOW w AS (PARTITION BY slot ORDER BY done_at, id))"
        " SELECT count(*), avg(moved)::float8, max(moved) FROM s WHERE prev <> done_by").fetchone()
    r["handovers"] = ho
    r["rows_moved_mean"] = round(mean, 1) if mean is not None else None
    r["rows_moved_max"] = most
    (heaviest,) = d.execute("SELECT max(c) FROM (SELECT count(*) AS c FROM items GROUP BY slot) s").fetchone()
    r["heaviest_slot_rows"] = heaviest
    if spec.handler_ms:
        r["slot_bound_s"] = round(heaviest * spec.handler_ms / 1000, 3)
        r["ratio_to_bound"] = round(r["makespan_s"] / r["slot_bound_s"], 3)
    if run.scheme != "queue":
        done = {} if run.scheme != "lease" else dict(d.execute(
            "SELECT slot, array_agg(extract(epoch FROM done_at)::float8 ORDER BY done_at) FROM items GROUP BY slot"))
        r["handover_latency_s"] = latencies(run, done)
        if done:
            r["joiner_share"] = joiner_share(run, done)
        lat = [x for x in r["handover_latency_s"].values() if x is not None]
        for p in (50, 99):
            r[f"handover_p{p}_s"] = nearest_rank(lat, p)
        r["handover_max_s"] = max(lat) if lat else None
        r["handover_never"] = sum(1 for x in r["handover_latency_s"].values() if x is None)
        r["joiner_most_slots"] = most_held(run)
        r["handover_trace"] = handover_trace(run)
    r["series"] = series(d, t0)
    # when each worker made its first call, after the release (joiners: their start-up)
    r["started_s"] = {w: round(run.started(w) - t0, 2) for w in run.procs if run.started(w) is not None}
    return r


def share(run, holders):
    """The slots a joiner's whole share is among `holders` live holders:
    floor(n/H) by count; by weight (the lease scheme) the planner balances
    within its slack, a tenth of the mean weight, so floor(0.9 n/H) (every
    scenario with a hand-over figure has slots of even weight)."""
    even = run.spec.n / holders
    return max(1, int(0.9 * even) if run.scheme == "lease" else int(even))


def latencies(run, done):
    """joiner -> seconds from its first claim_leases call (its "started"
    event) to the first sample (every 0.1 s) where it holds its whole
    share, None if never. By count: the sample of lease_holders where it
    holds share() slots (H the live holders then, itself included). By
    weight (the lease scheme; done: slot -> its rows' done times, in
    order): the sample of the slots' holders where the rows its slots still
    had to do then (done after that time) are at least 0.9 of the mean over
    the live holders, the planner's slack: a joiner takes the heaviest
    slots first, so its share by weight can be fewer slots than floor(0.9
    n/H) once the others have walked part of theirs."""
    def left(slot, t):
        return rows_left(done, slot, t)

    out = {}
    for _at, action, label in run.applied:
        if action != "join":
            continue
        began = run.started(label)
        out[label] = None
        if began is None:
            continue
        if run.scheme != "lease":
            for t, held in run.samples:
                if t >= began and held.get(label, 0) >= share(run, len(set(held) | {label})):
                    out[label] = round(t - began, 3)
                    break
            continue
        for t, holder_of in run.slots:
            if t < began:
                continue
            total = sum(left(s, t) for s in done)
            mine = sum(left(s, t) for s, h in holder_of.items() if h == label)
            holders = len(set(holder_of.values()) | {label})
            if total > 0 and mine >= 0.9 * total / holders:
                out[label] = round(t - began, 3)
                break
    return out


def rows_left(done, slot, t):
    """The rows of `slot` still to do at time t (done after it)."""
    times = done.get(slot, ())
    return len(times) - bisect.bisect_right(times, t)


def joiner_share(run, done):
    """joiner -> [[seconds after its start, slots held, their rows left,
    the live holders' mean rows left], ...] every 0.5 s of the samples."""
    out = {}
    for _at, action, label in run.applied:
        began = run.started(label)
        if action != "join" or began is None:
            continue
        pts, next_t = [], began
        for t, holder_of in run.slots:
            if t < next_t:
                continue
            next_t = t + 0.5
            mine = [s for s, h in holder_of.items() if h == label]
            holders = len(set(holder_of.values()) | {label})
            pts.append([round(t - began, 2), len(mine), sum(rows_left(done, s, t) for s in mine),
                        round(sum(rows_left(done, s, t) for s in done) / holders)])
        out[label] = pts
    return out


def handover_trace(run, window_s=3.0):
    """joiner -> where a hand-over's time goes, from the workers' "slots"
    events in the window_s after the joiner's "started": "own", the
    joiner's changes [seconds after its start, slots held, slots gained];
    "given", the seconds after its start at which the other workers gave a
    slot back (one entry per slot)."""
    out = {}
    for _at, action, label in run.applied:
        began = run.started(label)
        if action != "join" or began is None:
            continue
        own, given = [], []
        for w, p in run.procs.items():
            with p.cond:
                events = [e for e in p.events if e["event"] == "slots" and began <= e["t"] <= began + window_s]
            for e in events:
                if w == label:
                    own.append([round(e["t"] - began, 3), len(e["held"]), len(e["gained"])])
                else:
                    given += [round(e["t"] - began, 3)] * len(e["lost"])
        out[label] = {"own": own, "given": sorted(given)}
    return out


def most_held(run):
    """joiner -> the most slots it held in any sample."""
    return {label: max((held.get(label, 0) for _t, held in run.samples), default=0)
            for _at, action, label in run.applied if action == "join"}


def series(d, t0):
    """worker -> [[seconds, rows done by then], ...] every BUCKET_S."""
    out = {}
    for w, b, c in d.execute(
            "SELECT done_by, floor((extract(epoch FROM done_at)::float8 - %s) / %s)::int AS b, count(*)"
            " FROM items GROUP BY 1, 2 ORDER BY 1, 2", (t0, BUCKET_S)):
        pts = out.setdefault(w, [[b * BUCKET_S, 0]])  # from the start of its first bucket
        pts.append([round((b + 1) * BUCKET_S, 2), pts[-1][1] + c])
    return out


def ratios(results):
    """Each run's makespan and items/s against the queue's in the same
    scenario and round; the balancing planner's items/s against the count
    planner's (balance=False) in the same scenario and round."""
    def key(r):
        return r["scenario"], r.get("round", 1)
    def at(scheme):
        return {key(r): r for r in results if r["scheme"] == scheme and "makespan_s" in r}
    queue, count = at("queue"), at("count")
    for r in results:
        c = count.get(key(r))
        if r["scheme"] == "lease" and c is not None and "makespan_s" in r:
            r["items_per_s_to_count"] = round(r["items_per_s"] / c["items_per_s"], 3)
        q = queue.get(key(r))
        if q is not None and "makespan_s" in r:
            r["ratio_to_queue"] = round(r["makespan_s"] / q["makespan_s"], 3)
            r["items_per_s_ratio"] = round(r["items_per_s"] / q["items_per_s"], 3)


def case(r, meta):
    """A run's scenario, with its round when the scenarios were repeated."""
    return f"{r['scenario']}/{r['round']}" if meta.get("repeat", 1) > 1 else r["scenario"]


def balance_cost(results):
    """Per scenario: the balancing planner's items/s against the count
    planner's, each round and the median of the rounds."""
    lines, by = [], {}
    for r in results:
        if "items_per_s_to_count" in r:
            by.setdefault(r["scenario"], []).append(r["items_per_s_to_count"])
    for name, got in by.items():
        lines.append(f"balance against count: {name}: items/s pg_claim (lease) / pg_claim (count)"
                     f" {', '.join(f'{x:.2f}x' for x in got)}" + (f"; median of {len(got)} rounds {statistics.median(got):.2f}x" if len(got) > 1 else ""))
    return lines


def fmt(v, spec="{:.2f}"):
    return "-" if v is None else spec.format(v)


def table(meta, results):
    lines = [f"balance: {meta['date']}, {meta['cores']} cores, PostgreSQL {meta['postgresql']}, through PgBouncer"
             f" (transaction mode, pool {meta['pool'] or '?'}), ttl {meta['ttl_s']:g} s, batches of {meta['batch']};"
             f" pg_claim's planner: {meta['planner']}",
             f"command: {meta['command']}; {meta['seconds']} s; load average (5 min) {meta['load_avg_5min'][0]:g}"
             f" at the start, {meta['load_avg_5min'][1]:g} at the end", ""]
    head = (f"{'case':<5} {'scheme':<6} {'rows':>7} {'makespan s':>10} {'x queue':>7} {'items/s':>8}"
            f" {'idle tail s':>11} {'tail %':>6} {'hand-overs':>10} {'rows/ho':>8} {'ho p50 s':>8}"
            f" {'ho p99 s':>8} {'ho max s':>8} {'bound s':>7} {'x bound':>7} {'once':>4}")
    lines += [head, "-" * len(head)]
    for r in results:
        if "makespan_s" not in r:
            lines.append(f"{case(r, meta):<5} {r['scheme']:<6} FAILED: {r.get('error')}")
            continue
        lease = r["scheme"] != "queue"
        lines.append(
            f"{case(r, meta):<5} {r['scheme']:<6} {r['rows']:>7} {r['makespan_s']:>10.2f}"
            f" {fmt(r.get('ratio_to_queue'), '{:.2f}x'):>7} {r['items_per_s']:>8.0f}"
            f" {r['idle_tail_s']:>11.2f} {r['idle_tail_pct']:>6.1f} {r['handovers']:>10}"
            f" {fmt(r['rows_moved_mean'], '{:.0f}') if lease else '-':>8}"
            f" {fmt(r.get('handover_p50_s')):>8} {fmt(r.get('handover_p99_s')):>8}"
            f" {fmt(r.get('handover_max_s')):>8} {fmt(r.get('slot_bound_s'), '{:.1f}'):>7}"
            f" {fmt(r.get('ratio_to_bound'), '{:.2f}x'):>7} {'yes' if r['exactly_once'] else 'NO':>4}")
    lines.append("")
    for r in results:
        if r["scheme"] != "queue" and "ratio_to_queue" in r:
            line = (f"ratio: {r['scenario']} ({r['title']}): makespan pg_claim ({r['scheme']}) / queue {r['ratio_to_queue']:.2f}x,"
                    f" items/s {r['items_per_s_ratio']:.2f}x; idle tail {r['idle_tail_pct']:.1f}% of the makespan")
            if r.get("ratio_to_bound") is not None:
                line += (f"; {r['ratio_to_bound']:.2f}x the bound of the heaviest slot"
                         f" ({r['heaviest_slot_rows']} rows x {r['handler_ms']} ms = {r['slot_bound_s']:.1f} s)")
            lines.append(line)
    lines += balance_cost(results)
    for r in results:
        if "cpu_workers_s" in r:
            per = r["cpu_ms_per_1000_rows"]
            lines.append(f"cpu: {case(r, meta)} {r['scheme']}: workers {r['cpu_workers_s']:.1f} s, server"
                         f" {r['cpu_server_s']:.1f} s, from the release to the last row"
                         f" ({per['workers']:.0f} and {per['server']:.0f} ms per 1,000 rows)")
        if r.get("functions"):
            lines.append(f"functions: {case(r, meta)} {r['scheme']}: "
                         + "; ".join(f"{f['function']} {f['calls']} calls {f['self_ms']:.0f} ms self"
                                     f" ({f['total_ms']:.0f} ms total)" for f in r["functions"][:8]))
    lines.append("(hand-overs: changes of the worker writing a slot's rows; rows/ho: the slot's rows done after"
                 " each; ho: from a joiner's first claim_leases to holding its share, floor(n/H) slots by count,"
                 " by weight slots of at least 0.9 the mean weight (the planner's slack is a tenth of the mean); bound: the heaviest"
                 " slot's rows x the handler's time per row; the queue has no slots: its hand-overs count the"
                 " changes of writer between its batches)")
    return "\n".join(lines)


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
MARKS = {"join": "#2ca02c", "kill": "#d62728", "stop": "#9467bd", "cont": "#9467bd", "leave": "#ff7f0e"}


class Svg:
    """The few SVG elements the plot needs."""

    def __init__(self, width, height):
        self.width, self.height, self.parts = width, height, []

    def line(self, x1, y1, x2, y2, color="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"'
                          f' stroke="{color}" stroke-width="{width}"{d}/>')

    def polyline(self, pts, color, width=1.5):
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.parts.append(f'<polyline points="{p}" fill="none" stroke="{color}" stroke-width="{width}"/>')

    def text(self, x, y, s, size=12, anchor="start", color="#000", weight="normal"):
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"'
                          f' fill="{color}" font-weight="{weight}">{escape(str(s))}</text>')

    def rect(self, x, y, w, h, color):
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{color}"/>')

    def render(self):
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}"'
                f' viewBox="0 0 {self.width} {self.height}" font-family="sans-serif">\n'
                f'<rect width="100%" height="100%" fill="#fff"/>\n' + "\n".join(self.parts) + "\n</svg>\n")


def nice_step(span, ticks=6):
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def svg(runs, meta):
    """Rows done over time per worker in scenario a, one panel per scheme,
    on the same axes, with the timeline's events."""
    names = {"lease": "pg_claim.Worker, lease mode (balanced by work)", "count": "pg_claim.Worker, balance=False (count shares)",
             "queue": "FOR UPDATE SKIP LOCKED queue"}
    W, PH, L, R, T = 920, 260, 70, 130, 50
    g = Svg(W, T + len(runs) * (PH + 60) + 30)
    xmax = max(r["makespan_s"] for r in runs) * 1.02
    ymax = max(pts[-1][1] for r in runs for pts in r["series"].values()) * 1.05
    workers = sorted({w for r in runs for w in r["series"]}, key=lambda w: int(w[1:]))
    g.text(W / 2, 22, f"Scenario a: {runs[0]['rows']:,} rows, n = {runs[0]['n']}, {runs[0]['handler_ms']} ms per row,"
           f" through PgBouncer: rows done per worker", 15, "middle", weight="bold")
    g.text(W / 2, 40, f"{meta['date']}, {meta['cores']} cores; {meta['command']}", 11, "middle", "#555")
    for i, r in enumerate(runs):
        top = T + 20 + i * (PH + 60)
        x = lambda t: L + (W - L - R) * t / xmax  # noqa: E731
        y = lambda v: top + PH - PH * v / ymax  # noqa: E731
        g.text(L, top - 6, f"{names[r['scheme']]}: makespan {r['makespan_s']:.1f} s"
               f"{'' if r['scheme'] == 'queue' else ', %.2fx the queue' % r.get('ratio_to_queue', float('nan'))},"
               f" idle tail {r['idle_tail_s']:.1f} s", 13, weight="bold")
        step = nice_step(xmax)
        t = 0.0
        while t <= xmax:
            g.line(x(t), top, x(t), top + PH, "#eee")
            g.text(x(t), top + PH + 15, f"{t:g}", 10, "middle")
            t += step
        ystep = nice_step(ymax, 4)
        v = 0.0
        while v <= ymax:
            g.line(L, y(v), W - R, y(v), "#eee")
            g.text(L - 5, y(v) + 4, f"{v:,.0f}", 10, "end")
            v += ystep
        g.line(L, top + PH, W - R, top + PH)
        g.line(L, top, L, top + PH)
        g.text((L + W - R) / 2, top + PH + 30, "seconds after the rows were released", 11, "middle")
        for at, action, label in r["timeline"]:
            g.line(x(at), top, x(at), top + PH, MARKS[action], 1, "4,3")
        seen = {}
        for at, action, label in r["timeline"]:
            key = (at, action)
            seen[key] = seen.get(key, []) + [label]
        for k, ((at, action), who) in enumerate(sorted(seen.items())):
            g.text(x(at) + 3, top + 12 + 12 * (k % 4), f"{action} {','.join(who)}", 10, color=MARKS[action])
        g.line(x(r["makespan_s"]), top, x(r["makespan_s"]), top + PH, "#000", 1, "2,2")
        for j, w in enumerate(workers):
            pts = r["series"].get(w)
            if pts and len(pts) > 1 and pts[0][1] == 0:  # no slope before its first rows
                pts = [[max(pts[0][0], pts[1][0] - BUCKET_S), 0]] + pts[1:]
            if pts:
                g.polyline([(x(min(t, r["makespan_s"])), y(c)) for t, c in pts], COLORS[j % len(COLORS)])
        for j, w in enumerate(workers):
            g.rect(W - R + 15, top + 10 + 16 * j, 12, 3, COLORS[j % len(COLORS)])
            rows = r["rows_by_worker"].get(w, 0)
            g.text(W - R + 32, top + 15 + 16 * j, f"{w} ({rows:,})", 11)
    g.text(L, g.height - 10, "each line: the rows a worker has marked done; dashed: the timeline's events"
           " and the makespan", 11, color="#555")
    return g.render()
