"""What `pg-claim` shows: names and holders fit for a terminal, the rates
from the previous reading (kept in a state file), the tables of `fleets`,
`status` and `top`."""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
import unicodedata
from typing import Any, Dict, List, Optional, Sequence

import psycopg

Row = Dict[str, Any]


def _literal(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def shown(s: Optional[str]) -> str:
    """A text from the database (a fleet's name, which any role may define,
    a table's, a holder's) fit for a terminal: control characters (C0, DEL,
    C1) and Unicode format and separator characters (bidirectional
    overrides, U+2028) shown escaped, as \\x1b, \\n, \\t, \\u202e, so that
    none moves the cursor, clears the screen or recolours a line."""
    if s is None:
        return ""
    out = []
    for ch in s:
        o = ord(ch)
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif o < 0x20 or 0x7f <= o < 0xa0:
            out.append(f"\\x{o:02x}")
        elif unicodedata.category(ch) in ("Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            out.append(f"\\u{o:04x}" if o <= 0xffff else f"\\U{o:08x}")
        else:
            out.append(ch)
    return "".join(out)


# --- the previous reading (rates) ---------------------------------------------

def state_path() -> str:
    """Where the previous readings are kept: $XDG_STATE_HOME/pg-claim/readings.json,
    else ~/.local/state/pg-claim/readings.json."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "pg-claim", "readings.json")


def reading_key(conn: psycopg.Connection, fleet: str) -> str:
    """The server, database and fleet of a reading (never a password)."""
    i = conn.info
    return f"{i.host}:{i.port}/{i.dbname}/{fleet}"


class Readings:
    """The last reading of each fleet: the server's time and each slot's
    pending count. Kept across calls in state_path(); a file that cannot be
    read or written only costs the rates."""

    MAX_KEYS = 200

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path or state_path()
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            self.data: Dict[str, Any] = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            self.data = {}

    def previous(self, key: str) -> Optional[Dict[str, Any]]:
        r = self.data.get(key)
        return r if isinstance(r, dict) and isinstance(r.get("pending"), dict) else None

    def record(self, key: str, slots: List[Row]) -> None:
        if not slots:
            return
        self.data.pop(key, None)
        self.data[key] = {"at": slots[0]["now"],
                          "pending": {str(s["slot"]): s["pending"] for s in slots}}
        while len(self.data) > self.MAX_KEYS:  # the oldest first (insertion order)
            self.data.pop(next(iter(self.data)))
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".readings.")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.data, f)
            os.replace(tmp, self.path)
        except OSError:
            pass


def rates(slots: List[Row], prev: Optional[Dict[str, Any]]) -> Dict[int, Optional[float]]:
    """Items/s each slot's pending count fell since the previous reading
    (negative: it grew); None without a previous reading of the slot."""
    out: Dict[int, Optional[float]] = {s["slot"]: None for s in slots}
    if not prev or not slots:
        return out
    dt = slots[0]["now"] - float(prev.get("at") or 0)
    if dt <= 0:
        return out
    for s in slots:
        before = prev["pending"].get(str(s["slot"]))
        if before is not None and s["pending"] is not None:
            out[s["slot"]] = (before - s["pending"]) / dt
    return out


# --- formatting ----------------------------------------------------------------

def fmt_age(d: Optional[datetime.timedelta]) -> str:
    if d is None:
        return "-"
    s = max(0, int(d.total_seconds()))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def fmt_int(v: Optional[int]) -> str:
    return "?" if v is None else f"{v:,}"


def fmt_rate(r: Optional[float]) -> str:
    if r is None:
        return "-"
    return f"{r:,.0f}" if abs(r) >= 100 else f"{r:,.1f}"


def holder_text(s: Row) -> str:
    if s["mode"] is None:
        return "unserved " + fmt_age(s["unserved_for"]) if s["unserved_for"] is not None else "unserved"
    # a lease of a role whose privileges the caller lacks: held, holder hidden
    return shown(s["holder"]) or "(not visible)"


def table(headers: Sequence[str], rows: List[Sequence[str]], right: Sequence[bool]) -> List[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(cells, widths, right)).rstrip()
    return [line(headers)] + [line(r) for r in rows]


def _total(slots: List[Row], col: str) -> Optional[int]:
    vals = [s[col] for s in slots]
    return None if any(v is None for v in vals) else sum(vals)


def summary(f: Row, slots: List[Row]) -> str:
    """The fleet's line: its definition, and the totals of its slots (as the
    view fleets has them)."""
    holders = len({s["holder"] for s in slots if s["mode"] is not None and s["holder"] is not None})
    unserved = sum(1 for s in slots if s["mode"] is None)
    ages = [s["oldest_age"] for s in slots if s["oldest_age"] is not None]
    return (f"fleet {shown(f['fleet'])}: table {shown(f['tbl'])}, n {f['n']}, {holders} holder(s), "
            f"{unserved} unserved, {fmt_int(_total(slots, 'pending'))} pending, "
            f"oldest {fmt_age(max(ages) if ages else None)}, "
            f"{fmt_int(_total(slots, 'failing'))} failing, {fmt_int(_total(slots, 'dead'))} dead")


def status_lines(f: Row, slots: List[Row], rate: Dict[int, Optional[float]]) -> List[str]:
    rows = [[str(s["slot"]), holder_text(s), s["mode"] or "-", fmt_int(s["pending"]),
             fmt_age(s["oldest_age"]), fmt_rate(rate.get(s["slot"])),
             fmt_int(s["failing"]), fmt_int(s["dead"])] for s in slots]
    return [summary(f, slots)] + table(["slot", "holder", "mode", "pending", "oldest", "rate/s", "failing", "dead"],
                                rows, [True, False, False, True, True, True, True, True])


def status_json(slots: List[Row]) -> List[Dict[str, Any]]:
    return [{"slot": s["slot"], "holder": s["holder"], "mode": s["mode"], "pending": s["pending"],
             "oldest": s["oldest"].isoformat() if s["oldest"] is not None else None,
             "failing": s["failing"], "dead": s["dead"]} for s in slots]


def top_lines(f: Row, slots: List[Row], rate: Dict[int, Optional[float]], width: int) -> List[str]:
    """A frame of `top`: the fleet, its items/s, a backlog bar per slot."""
    known = [r for r in rate.values() if r is not None]
    total = sum(known) if known and len(known) == len(rate) else None
    stamp = datetime.datetime.fromtimestamp(slots[0]["now"] if slots else time.time(),
                                            datetime.timezone.utc).strftime("%H:%M:%S")
    out = [summary(f, slots), f"{stamp} UTC  fleet rate {fmt_rate(total)} items/s (fall of pending)"]
    most = max([s["pending"] or 0 for s in slots] + [1])
    cells = [(str(s["slot"]), fmt_int(s["pending"]), fmt_age(s["oldest_age"]), fmt_rate(rate.get(s["slot"])),
              holder_text(s) + (f" ({s['mode']})" if s["mode"] else "")) for s in slots]
    w = [max([len(c[i]) for c in cells] + [1]) for i in range(4)]
    fixed = 5 + w[0] + w[1] + w[2] + w[3] + 30
    bar = max(10, min(40, width - fixed - 12))
    for s, c in zip(slots, cells):
        filled = 0 if s["pending"] is None else round(bar * s["pending"] / most)
        out.append(f"slot {c[0].rjust(w[0])} [{'#' * filled}{'.' * (bar - filled)}] {c[1].rjust(w[1])} "
                   f"oldest {c[2].rjust(w[2])}  {c[3].rjust(w[3])}/s  {c[4]}")
    return out
