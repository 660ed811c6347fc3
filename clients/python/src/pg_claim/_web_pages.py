"""The HTML of `pg-claim web`: the fleets, one fleet (its grid of slots, its
holders, its rate plot, its failure records), an action's outcome.

Every value from the database (fleet, table and holder names, items, errors)
is user data: each goes through esc(), which escapes HTML's special
characters and shows control characters as escapes (cli.shown). A page is a
whole document; its <main> alone is what the page's script fetches to update
itself (part=main)."""
from __future__ import annotations

import datetime
import html
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .cli import Row, fmt_age, fmt_int, fmt_rate, shown
from ._web_data import PAGE_SIZE


def esc(v: Any) -> str:
    return "" if v is None else html.escape(shown(str(v)), quote=True)


def fleet_href(name: str, page: int = 0) -> str:
    q = {"name": name}
    if page:
        q["page"] = str(page)
    return "/fleet?" + urllib.parse.urlencode(q)


def fmt_in(d: Optional[datetime.timedelta]) -> str:
    """A time from now: 'in 4s', '3s ago'."""
    if d is None:
        return "-"
    s = d.total_seconds()
    return f"in {fmt_age(d)}" if s >= 0 else f"{fmt_age(-d)} ago"


def document(title: str, body: str, refresh_s: float, status_line: str) -> str:
    """A whole page: the head (a refresh for a browser without JavaScript,
    the stylesheet), the header line, the main part, the update script."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title>"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<noscript><meta http-equiv=\"refresh\" content=\"{max(1, round(refresh_s))}\"></noscript>"
        "<link rel=\"stylesheet\" href=\"/static/web.css\"></head>\n<body>"
        f"<header><a href=\"/\">pg-claim web</a> <span class=\"where\">{status_line}</span></header>\n"
        f"<main id=\"main\" data-refresh=\"{refresh_s:g}\">{body}</main>\n"
        "<script src=\"/static/web.js\"></script></body></html>\n")


def table(headers: Sequence[str], rows: List[Sequence[str]], cls: str) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class=\"{cls}\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def stamp(now: float) -> str:
    t = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%H:%M:%S")
    return f"<p class=\"stamp\">read at <time>{t}</time> UTC</p>"


# --- the fleets ----------------------------------------------------------------

FLEET_COLUMNS = ["fleet", "table", "slots", "holders", "unserved", "pending", "oldest", "failing", "dead"]


def fleets_main(rows: List[Row], now: float) -> str:
    if not rows:
        return ("<h1>Fleets</h1><p class=\"empty\">no fleets defined "
                "(SELECT define_fleet(name, table, n, pending =&gt; column))</p>" + stamp(now))
    body = [[f"<a class=\"fleet\" href=\"{esc(fleet_href(r['fleet']))}\">{esc(r['fleet'])}</a>",
             esc(r["tbl"]), str(r["n"]), fmt_int(r["holders"]), fmt_int(r["unserved"]), fmt_int(r["pending"]),
             fmt_age(r["oldest_age"]), fmt_int(r["failing"]), fmt_int(r["dead"])] for r in rows]
    return "<h1>Fleets</h1>" + table(FLEET_COLUMNS, body, "fleets") + stamp(now)


# --- one fleet -------------------------------------------------------------------

def level(pending: Optional[int], most: int) -> str:
    """The backlog colour of a slot: b0 (nothing pending) to b5 (the most)."""
    if pending is None:
        return "bq"
    if pending <= 0:
        return "b0"
    return f"b{1 + min(4, (4 * pending) // max(1, most))}"


def action_form(csrf: str, fleet: str, action: str, label: str, fields: Dict[str, str]) -> str:
    hidden = "".join(f"<input type=\"hidden\" name=\"{k}\" value=\"{esc(v)}\">"
                     for k, v in [("csrf", csrf), ("fleet", fleet), ("action", action)] + list(fields.items()))
    return (f"<form class=\"act act-{action}\" method=\"post\" action=\"/action\">{hidden}"
            f"<button type=\"submit\">{label}</button></form>")


def slot_cell(s: Row, lease: Optional[Row], rate: Optional[float], most: int, csrf: Optional[str],
              fleet: str) -> str:
    held = s["mode"] is not None
    if held:
        who = esc(s["holder"]) if s["holder"] is not None else "(not visible)"
        state = f"held ({esc(s['mode'])})"
    else:
        who = "unserved" + (f" {fmt_age(s['unserved_for'])}" if s["unserved_for"] is not None else "")
        state = "unserved"
    if lease is None or not held or s["mode"] != "lease":
        expires = "session" if held and s["mode"] == "session" else "-"
    else:
        expires = fmt_in(lease["expires_in"])
    release = ""
    if csrf is not None and held and s["mode"] == "lease" and s["token"] is not None:
        release = action_form(csrf, fleet, "release", "release lease",
                              {"slot": str(s["slot"]), "token": str(s["token"])})
    return (f"<div class=\"slot {level(s['pending'], most)} {'held' if held else 'unserved'}\" "
            f"id=\"slot-{s['slot']}\" data-slot=\"{s['slot']}\" title=\"slot {s['slot']}: {state}\">"
            f"<span class=\"num\">{s['slot']}</span>"
            f"<span class=\"holder\">{who}</span>"
            f"<span>pending <b class=\"pending\">{fmt_int(s['pending'])}</b></span>"
            f"<span>oldest <b class=\"oldest\">{fmt_age(s['oldest_age'])}</b></span>"
            f"<span class=\"wide\">token <b class=\"token\">{esc(s['token']) if s['token'] is not None else '-'}</b></span>"
            f"<span>expires <b class=\"expires\">{expires}</b></span>"
            f"<span><b class=\"rate\">{fmt_rate(rate)}</b>/s</span>"
            f"<span class=\"wide\">failing / dead <b class=\"fd\">{fmt_int(s['failing'])} / {fmt_int(s['dead'])}</b>"
            "</span>"
            f"{release}</div>")


def holders_table(slots: List[Row]) -> str:
    by: Dict[str, List[int]] = {}
    for s in slots:
        if s["mode"] is not None:
            by.setdefault(s["holder"] if s["holder"] is not None else "\0", []).append(s["slot"])
    if not by:
        return "<p class=\"empty\">no holders</p>"
    rows = [[esc(h) if h != "\0" else "(not visible)", str(len(v)), ", ".join(map(str, v))]
            for h, v in sorted(by.items())]
    return table(["holder", "slots", "which"], rows, "holders")


def rate_svg(series: List[Tuple[float, float]], most_s: float = 300.0) -> str:
    """The fleet's items/s over the samples of the last minutes (at most
    most_s seconds, at least 30) as an SVG line: numbers only, nothing from
    the database but counts."""
    w, h, pad = 600, 120, 4
    if len(series) < 2:
        return "<p class=\"empty\" id=\"rate-empty\">the plot starts with the page's third reading</p>"
    window_s = max(30.0, min(most_s, max(a for a, _ in series)))
    top = max([r for _, r in series] + [1.0])
    low = min([r for _, r in series] + [0.0])
    span = top - low

    def xy(ago: float, r: float) -> str:
        x = pad + (w - 2 * pad) * (1 - min(ago, window_s) / window_s)
        y = pad + (h - 2 * pad) * (top - r) / span
        return f"{x:.1f},{y:.1f}"
    points = " ".join(xy(a, r) for a, r in reversed(series))
    zero = pad + (h - 2 * pad) * top / span
    return (f"<svg id=\"rate-plot\" class=\"plot\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" "
            f"role=\"img\" aria-label=\"items per second, last {fmt_age(datetime.timedelta(seconds=window_s))}\">"
            f"<line class=\"axis\" x1=\"{pad}\" y1=\"{zero:.1f}\" x2=\"{w - pad}\" y2=\"{zero:.1f}\"/>"
            f"<polyline class=\"line\" points=\"{points}\"/>"
            f"<text x=\"{pad + 2}\" y=\"14\">{fmt_rate(top)}/s</text>"
            f"<text x=\"{pad + 2}\" y=\"{h - 6}\">{fmt_age(datetime.timedelta(seconds=window_s))} ago</text>"
            f"<text x=\"{w - 30}\" y=\"{h - 6}\">now</text></svg>")


def failures_table(fleet: str, total: int, rows: List[Row], page: int, csrf: Optional[str]) -> str:
    if not total:
        return "<p class=\"empty\">no failure records</p>"
    if not rows:
        return (f"<p class=\"empty\">{total} failure records, none on page {page}: "
                f"<a href=\"{esc(fleet_href(fleet))}\">the first page</a></p>")
    body = []
    for r in rows:
        nxt = "never (dead)" if r["state"] == "dead" else fmt_in(r["retry_in"])
        acts = ""
        if csrf is not None:
            if r["state"] == "dead":
                acts += action_form(csrf, fleet, "retry", "retry", {"item": r["item"]})
            acts += action_form(csrf, fleet, "clear", "clear", {"item": r["item"]})
        body.append([f"<span class=\"item\">{esc(r['item'])}</span>", esc(r["state"]), str(r["attempts"]),
                     f"<span class=\"error\">{esc(r['last_error'])}</span>", nxt] + ([acts] if csrf else []))
    pages = max(1, -(-total // PAGE_SIZE))
    nav = [f"records {page * PAGE_SIZE + 1}-{page * PAGE_SIZE + len(rows)} of {total}"]
    if page > 0:
        nav.append(f"<a rel=\"prev\" href=\"{esc(fleet_href(fleet, page - 1))}\">previous</a>")
    if page + 1 < pages:
        nav.append(f"<a rel=\"next\" href=\"{esc(fleet_href(fleet, page + 1))}\">next</a>")
    heads = ["item", "state", "attempts", "last error", "next try"] + (["actions"] if csrf else [])
    return table(heads, body, "failures") + f"<p class=\"paging\">{' · '.join(nav)}</p>"


def fleet_main(f: Row, slots: List[Row], leases: Dict[int, Row], rate: Dict[int, Optional[float]],
               series: List[Tuple[float, float]], failures: Tuple[int, List[Row]], page: int,
               csrf: Optional[str]) -> str:
    name = f["fleet"]
    most = max([s["pending"] or 0 for s in slots] + [1])
    held = [s for s in slots if s["mode"] is not None]
    holders = len({s["holder"] for s in held if s["holder"] is not None})
    pending = None if any(s["pending"] is None for s in slots) else sum(s["pending"] for s in slots)
    known = [r for r in rate.values() if r is not None]
    total_rate = sum(known) if known and len(known) == len(rate) else None
    summary = (f"<p class=\"summary\">table <b>{esc(f['tbl'])}</b>, n <b>{f['n']}</b>, "
               f"<b id=\"sum-holders\">{holders}</b> holder(s), "
               f"<b id=\"sum-unserved\">{len(slots) - len(held)}</b> unserved, "
               f"<b id=\"sum-pending\">{fmt_int(pending)}</b> pending, "
               f"<b id=\"sum-rate\">{fmt_rate(total_rate)}</b> items/s</p>")
    grid = "".join(slot_cell(s, leases.get(s["slot"]), rate.get(s["slot"]), most, csrf, name) for s in slots)
    now = slots[0]["now"] if slots else 0.0
    return (f"<h1>fleet <span id=\"fleet-name\">{esc(name)}</span></h1>{summary}"
            f"<section><h2>Slots</h2><div class=\"grid\" id=\"grid\">{grid}</div>"
            "<p class=\"legend\">colour: pending rows, from none (grey) to the most of any slot (red); "
            "a dashed red border: unserved; rate: the fall of pending per second since the previous reading</p></section>"
            f"<section><h2>Holders</h2>{holders_table(slots)}</section>"
            f"<section><h2>Rate (items/s, fall of pending)</h2>{rate_svg(series)}</section>"
            f"<section><h2>Failure records</h2>{failures_table(name, failures[0], failures[1], page, csrf)}"
            "</section>" + (stamp(now) if now else ""))


def message_main(title: str, text: str, back: Optional[str]) -> str:
    """An error or an action's outcome; title and text already HTML."""
    link = f"<p><a id=\"back\" href=\"{esc(back)}\">back</a></p>" if back else ""
    return f"<h1>{title}</h1><p class=\"message\">{text}</p>{link}"
