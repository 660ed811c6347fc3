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
import json
import os
import shutil
import signal
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, TextIO

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from . import __version__
from ._show import (Readings, _literal, fmt_age, fmt_int, fmt_rate, rates, reading_key, shown,  # noqa: F401
                    state_path, status_json, status_lines, table, top_lines)

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
