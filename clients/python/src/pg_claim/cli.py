"""pg-claim: a pg_claim fleet from a terminal.

    pg-claim fleets [--json] DSN             the fleets defined in the database
    pg-claim status [--json] DSN FLEET       one line per slot
    pg-claim top [--interval S] [--once] [--count N] DSN FLEET
                                             the same, live, with a bar per slot
    pg-claim web [--bind ADDR] [--port PORT] [--token TOKEN] [--allow-actions] DSN
                                             the fleets in a web browser (port 8377)

DSN is a libpq connection string or URI ("" for libpq's environment:
PGHOST, PGDATABASE, ...). The command reads the views `fleets` and
`fleet_slots` of the extension, or of the portable edition (found by its
function pg_claim_portable_version(), on the search_path first); a fleet is
defined once with `define_fleet`. It writes nothing to the database (but
`web --allow-actions` on a user's request), and shows the control
characters of names and holders escaped (\x1b, \n).

`status` shows each slot's rate: the fall of its pending count per second
since the previous `status` or `top` of the same fleet and database, kept in
a small state file (`$XDG_STATE_HOME/pg-claim/readings.json`, by default
`~/.local/state/pg-claim/readings.json`); the first call shows '-'.

Exit status: 0, 1 (cannot connect, pg_claim missing, a server error), 2 (a
usage error, or the fleet is not defined).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import unicodedata
from typing import Any, Dict, List, Optional, Sequence, TextIO

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from . import __version__

Row = Dict[str, Any]


class CliError(Exception):
    """An error to print as `pg-claim: message` (and a hint), with an exit status."""

    def __init__(self, message: str, hint: Optional[str] = None, status: int = 1) -> None:
        super().__init__(message)
        self.message, self.hint, self.status = message, hint, status


# --- the database ------------------------------------------------------------

def connect(dsn: str) -> psycopg.Connection:
    try:
        extra: Dict[str, Any] = {}
        # a host that does not answer: give up after 10 s unless told otherwise
        if "connect_timeout" not in conninfo_to_dict(dsn) and not os.environ.get("PGCONNECT_TIMEOUT"):
            extra["connect_timeout"] = 10
        # no server-side prepared statements: works through PgBouncer in
        # transaction mode too
        return psycopg.connect(dsn, autocommit=True, prepare_threshold=None,
                               application_name="pg-claim", **extra)
    except psycopg.OperationalError as e:
        raise CliError(f"cannot connect: {_first_line(e)}",
                       "check the DSN (a libpq connection string or URI) and that the server is running") from None
    except psycopg.ProgrammingError as e:  # a malformed connection string
        raise CliError(f"cannot connect: {_first_line(e)}",
                       "the DSN is a libpq connection string ('host=db dbname=app') or URI "
                       "('postgresql://user@db/app')", status=2) from None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


# The schemas holding the portable edition (docs/portable.md): those with its
# pg_claim_portable_version(), the caller's search_path first. A schema off
# the search_path counts only when its owner is the database's owner or a
# superuser, as is the function's: reading a look-alike's views would run
# its owner's code with the caller's privileges.
_PORTABLE = """
SELECT n.nspname FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
JOIN pg_catalog.pg_database d ON d.datname = pg_catalog.current_database()
WHERE p.proname = 'pg_claim_portable_version' AND p.pronargs = 0
  AND (n.nspname = ANY (pg_catalog.current_schemas(false))
       OR (p.proowner = n.nspowner AND (n.nspowner = d.datdba OR r.rolsuper)))
ORDER BY pg_catalog.array_position(pg_catalog.current_schemas(false), n.nspname::text) NULLS LAST,
         n.nspname LIMIT 1"""


class Fleets:
    """The fleet views in one database, schema-qualified (so the caller's
    search_path does not matter): the extension's, else the portable
    edition's (see _PORTABLE)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        row = conn.execute(
            "SELECT n.nspname, e.extversion, current_database()"
            " FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace"
            " WHERE e.extname = 'pg_claim'").fetchone()
        db = row[2] if row else conn.execute("SELECT current_database()").fetchone()[0]
        self.database = db
        self.edition = "pg_claim"
        if row is None:
            portable = conn.execute(_PORTABLE).fetchone()
            if portable is not None:
                (version,) = conn.execute(sql.SQL("SELECT {}.pg_claim_portable_version()").format(
                    sql.Identifier(portable[0]))).fetchone()  # type: ignore[misc]
                row = (portable[0], version, db)
                self.edition = "pg_claim (portable edition)"
        if row is None:
            raise CliError(f'pg_claim is not installed in database "{shown(db)}"',
                           "CREATE EXTENSION pg_claim, or install the portable edition (docs/portable.md) in a "
                           "schema of the search_path, in the database the workers use; or connect to that database")
        self.schema, self.version = row[0], row[1]
        missing = conn.execute(
            "SELECT v FROM unnest(ARRAY['fleets', 'fleet_slots']) v"
            " WHERE pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', %s::text, v)) IS NULL",
            (self.schema,)).fetchall()
        if missing:
            raise CliError(f'{self.edition} {self.version} in database "{shown(db)}" has no view '
                           f'{shown(self.schema)}.{missing[0][0]} (fleet views came with 0.5.0)',
                           "ALTER EXTENSION pg_claim UPDATE" if self.edition == "pg_claim"
                           else "run the portable edition's file of this version over it (docs/portable.md)")

    def _view(self, name: str) -> sql.Composable:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(name))

    def fleets(self) -> List[Row]:
        q = sql.SQL("SELECT f.fleet, f.tbl::text AS tbl, f.n, f.pending_column, f.key, f.route,"
                    " f.method, f.age, f.holders, f.unserved, f.pending, f.oldest,"
                    " now() - f.oldest AS oldest_age, f.failing, f.dead"
                    " FROM {} f ORDER BY f.fleet").format(self._view("fleets"))
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(q).fetchall()

    def fleet(self, name: str) -> Row:
        """The fleet's definition (only its columns: the view then reads no table)."""
        q = sql.SQL("SELECT f.fleet, f.tbl::text AS tbl, f.n, f.pending_column"
                    " FROM {} f WHERE f.fleet = %s").format(self._view("fleets"))
        with self.conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(q, (name,)).fetchone()
        if row is None:
            raise CliError(
                f'fleet "{shown(name)}" is not defined in database "{shown(self.database)}"',
                f"define it once with SELECT define_fleet({shown(_literal(name))}, 'table', n, pending => 'column'), "
                "the table, n and pending column its workers use; pg-claim fleets DSN lists the defined fleets",
                status=2)
        return row

    def slots(self, name: str) -> List[Row]:
        """The fleet's slots, with the server's clock as `now`."""
        q = sql.SQL("SELECT s.slot, s.holder, s.mode, s.pending, s.oldest, now() - s.oldest AS oldest_age,"
                    " s.token, s.since, s.unserved_since, now() - s.unserved_since AS unserved_for,"
                    " s.failing, s.dead, extract(epoch FROM now())::float8 AS now"
                    " FROM {} s WHERE s.fleet = %s ORDER BY s.slot").format(self._view("fleet_slots"))
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(q, (name,)).fetchall()


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


# --- the commands ---------------------------------------------------------------

def cmd_fleets(args: argparse.Namespace, out: TextIO) -> int:
    with connect(args.dsn) as conn:
        rows = Fleets(conn).fleets()
    if args.json:
        json.dump([{"fleet": r["fleet"], "table": r["tbl"], "n": r["n"], "pending_column": r["pending_column"],
                    "key": r["key"], "route": r["route"], "method": r["method"], "age": r["age"],
                    "holders": r["holders"], "unserved": r["unserved"], "pending": r["pending"],
                    "oldest": r["oldest"].isoformat() if r["oldest"] is not None else None,
                    "failing": r["failing"], "dead": r["dead"]} for r in rows], out, indent=2)
        out.write("\n")
        return 0
    if not rows:
        out.write("no fleets defined (SELECT define_fleet(name, table, n, pending => column))\n")
        return 0
    body = [[shown(r["fleet"]), shown(r["tbl"]), str(r["n"]), str(r["holders"]), str(r["unserved"]), fmt_int(r["pending"]),
             fmt_age(r["oldest_age"]), fmt_int(r["failing"]), fmt_int(r["dead"])] for r in rows]
    for line in table(["fleet", "table", "n", "holders", "unserved", "pending", "oldest", "failing", "dead"],
                      body, [False, False, True, True, True, True, True, True, True]):
        out.write(line + "\n")
    return 0


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    with connect(args.dsn) as conn:
        views = Fleets(conn)
        f = views.fleet(args.fleet)
        slots = views.slots(args.fleet)
        key = reading_key(conn, args.fleet)
    if args.json:
        json.dump(status_json(slots), out, indent=2)
        out.write("\n")
        return 0
    readings = Readings()
    rate = rates(slots, readings.previous(key))
    readings.record(key, slots)
    for line in status_lines(f, slots, rate):
        out.write(line + "\n")
    return 0


def cmd_top(args: argparse.Namespace, out: TextIO) -> int:
    tty = out.isatty()
    readings = Readings()
    drawn = 0
    frames = 0
    # Ctrl-C ends top between frames: a KeyboardInterrupt raised inside a
    # query could leave the connection busy while it closes
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        with connect(args.dsn) as conn:
            views = Fleets(conn)
            key = reading_key(conn, args.fleet)
            f = views.fleet(args.fleet)
            prev = readings.previous(key)
            while True:
                slots = views.slots(args.fleet)
                if not slots:  # dropped meanwhile
                    f = views.fleet(args.fleet)
                rate = rates(slots, prev)
                readings.record(key, slots)
                prev = readings.previous(key)
                size = shutil.get_terminal_size((100, 24))
                lines = top_lines(f, slots, rate, size.columns)
                if tty:
                    # redrawn in place: up over the last frame, clear below
                    # (a frame taller than the terminal: from its top)
                    if drawn >= size.lines:
                        out.write("\x1b[H\x1b[2J")
                    elif drawn:
                        out.write(f"\x1b[{drawn}A\x1b[J")
                    out.write("\n".join(lines) + "\n")
                    drawn = len(lines)
                else:
                    out.write(("\n" if frames else "") + "\n".join(lines) + "\n")
                out.flush()
                frames += 1
                if args.once or (args.count and frames >= args.count):
                    return 0
                if stop.wait(args.interval):
                    break
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    # Ctrl-C is how top ends
    out.write("\n")
    out.flush()
    return 0


def cmd_web(args: argparse.Namespace, out: TextIO) -> int:
    from ._web import serve  # the web server's modules load for this command only
    return serve(args, out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pg-claim", description="Look at pg_claim fleets (defined with define_fleet) in a database.",
        epilog="DSN: a libpq connection string or URI ('' for libpq's environment variables).")
    p.add_argument("--version", action="version", version=f"pg-claim {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    s = sub.add_parser("fleets", help="the fleets defined in the database")
    s.add_argument("--json", action="store_true", help="a JSON list of objects, one per fleet")
    s.add_argument("dsn", metavar="DSN")
    s.set_defaults(run=cmd_fleets)
    s = sub.add_parser("status", help="one line per slot of a fleet",
                       description="One line per slot: holder, mode, pending rows, age of the oldest, "
                                   "rate since the previous call (items/s), failing and dead items.")
    s.add_argument("--json", action="store_true",
                   help="a JSON list of objects keyed slot, holder, mode, pending, oldest, failing, dead")
    s.add_argument("dsn", metavar="DSN")
    s.add_argument("fleet", metavar="FLEET")
    s.set_defaults(run=cmd_status)
    s = sub.add_parser("top", help="a fleet's slots, live",
                       description="The fleet's slots refreshed every --interval seconds, with a backlog bar "
                                   "per slot and the fleet's items/s; Ctrl-C ends it. Not on a terminal, "
                                   "each frame is printed after the previous one.")
    s.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between frames (2)")
    s.add_argument("--once", action="store_true", help="print one frame and exit")
    s.add_argument("--count", type=int, default=0, metavar="N", help="exit after N frames")
    s.add_argument("dsn", metavar="DSN")
    s.add_argument("fleet", metavar="FLEET")
    s.set_defaults(run=cmd_top)
    s = sub.add_parser("web", help="the fleets in a web browser",
                       description="A web view of the fleets on http://ADDR:PORT/: each fleet's slots, holders, "
                                   "rate and failure records, updated every --refresh seconds. Binds 127.0.0.1 "
                                   "unless --bind is given; any other address needs a token.")
    s.add_argument("--bind", default="127.0.0.1", metavar="ADDR", help="the address to listen on (127.0.0.1)")
    s.add_argument("--port", type=int, default=8377, metavar="PORT", help="the port (8377; 0: any free one)")
    s.add_argument("--token", metavar="TOKEN", help="a token every request must carry (or PG_CLAIM_WEB_TOKEN); "
                   "required with a --bind other than loopback")
    s.add_argument("--allow-actions", action="store_true",
                   help="offer retry, clear (failure records) and release (leases), as the DSN's role")
    s.add_argument("--refresh", type=float, default=3.0, metavar="S", help="seconds between updates (3)")
    s.add_argument("dsn", metavar="DSN")
    s.set_defaults(run=cmd_web)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "interval", 1.0) <= 0:
        parser().error("--interval must be more than 0")
    if getattr(args, "refresh", 1.0) < 1:
        parser().error("--refresh must be 1 or more")
    if getattr(args, "count", 0) < 0:
        parser().error("--count must be 0 or more")
    try:
        return int(args.run(args, sys.stdout))
    except CliError as e:
        print(f"pg-claim: {shown(e.message)}", file=sys.stderr)
        if e.hint:
            print(f"hint: {shown(e.hint)}", file=sys.stderr)
        return e.status
    except psycopg.Error as e:
        print(f"pg-claim: {shown(_first_line(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (pg-claim top | head): nothing more to say,
        # and nothing for the interpreter to flush at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
