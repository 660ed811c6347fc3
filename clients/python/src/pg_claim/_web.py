"""`pg-claim web DSN`: the fleets of a database in a web browser.

A standard-library HTTP server (ThreadingHTTPServer) with a few connections
of the DSN's role kept open. GET / lists the fleets, GET /fleet?name=NAME
shows one (page=N pages its failure records); part=main returns only the
page's main part, which the page's script fetches every few seconds. With
--allow-actions, POST /action (a form with the page's CSRF token) retries a
dead item or clears a failure record (clear_failure) or releases a lease
(release_lease), as the DSN's role: the extension's privilege checks decide;
each action is logged on stderr.

Safe by default: binds 127.0.0.1 and then answers only requests whose Host
is a loopback name (no DNS rebinding); any other --bind needs a token
(--token or PG_CLAIM_WEB_TOKEN), which every request must then carry (a
cookie set by opening any page with ?token=TOKEN, or Authorization: Bearer).
Every response forbids inline scripts and framing (Content-Security-Policy)."""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import hmac
import ipaddress
import os
import secrets
import signal
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Iterator, List, Optional, TextIO, Tuple, TypeVar

import psycopg
from psycopg import pq

from . import _web_pages as pages
from ._web_data import Samples, Views
from .cli import CliError, _first_line, connect, reading_key, shown

TOKEN_ENV = "PG_CLAIM_WEB_TOKEN"
COOKIE = "pg_claim_web_token"
STATIC = {"web.js": "text/javascript; charset=utf-8", "web.css": "text/css; charset=utf-8"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
MAX_BODY = 65536
T = TypeVar("T")


class Pool:
    """Connections of the DSN (a Views each), kept open between requests;
    one that failed is closed, not kept."""

    KEEP = 4

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._idle: List[Views] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def views(self) -> Iterator[Views]:
        with self._lock:
            v = self._idle.pop() if self._idle else None
        if v is None:
            v = Views(connect(self.dsn))
        try:
            yield v
        finally:
            c, kept = v.conn, False
            if not c.closed and not c.broken and c.info.transaction_status == pq.TransactionStatus.IDLE:
                with self._lock:
                    if len(self._idle) < self.KEEP:
                        self._idle.append(v)
                        kept = True
            if not kept:
                c.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for v in idle:
            v.conn.close()


class Reply(Exception):
    """An error page: its HTTP status, title and text (HTML)."""

    def __init__(self, status: int, title: str, text: str, back: Optional[str] = None) -> None:
        super().__init__(title)
        self.status, self.title, self.text, self.back = status, title, text, back


class App:
    def __init__(self, dsn: str, token: Optional[str], allow_actions: bool, refresh_s: float,
                 hosts: Optional[set], about: str, log: TextIO) -> None:
        self.pool = Pool(dsn)
        self.samples = Samples()
        self.token = token
        self.allow_actions = allow_actions
        self.refresh_s = refresh_s
        self.hosts = hosts  # the Host headers answered; None: any (a token is required)
        self.csrf = secrets.token_urlsafe(32)
        self.about = about
        self._log, self._log_lock = log, threading.Lock()

    def log(self, client: str, text: str) -> None:
        at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._log_lock:
            self._log.write(f"pg-claim web: {at} {client} {text}\n")
            self._log.flush()

    def status_line(self) -> str:
        return f"{pages.esc(self.about)} · actions {'on' if self.allow_actions else 'off'}"

    def read(self, fn: Callable[[Views], T], again: bool = True) -> T:
        """fn(views) on a pooled connection; when the connection was lost (a
        server restart, a pooler's timeout) the kept ones are dropped, and
        with `again` fn runs once more on a new one (not for an action,
        which may have been done)."""
        for attempt in (1, 2):
            try:
                with self.pool.views() as v:
                    return fn(v)
            except psycopg.OperationalError as e:
                self.pool.close()
                if attempt == 2 or not again:
                    raise Reply(503, "cannot read the database", pages.esc(_first_line(e))) from None
            except CliError as e:
                status = 404 if e.status == 2 else 503
                raise Reply(status, "not found" if status == 404 else "cannot read the database",
                            pages.esc(e.message) + (f"<br>hint: {pages.esc(e.hint)}" if e.hint else "")) from None
            except psycopg.Error as e:
                status = 403 if e.sqlstate == "42501" else 400 if (e.sqlstate or "").startswith("22") else 500
                raise Reply(status, "the server refused", pages.esc(_first_line(e))) from None
        raise AssertionError("unreachable")

    # --- the pages ---------------------------------------------------------

    def fleets_page(self) -> Tuple[str, str]:
        def get(v: Views) -> str:
            rows = v.fleets()
            (now,) = v.conn.execute("SELECT extract(epoch FROM now())::float8").fetchone() or (0.0,)
            return pages.fleets_main(rows, now)
        return "pg-claim web: fleets", self.read(get)

    def fleet_page(self, name: str, page: int) -> Tuple[str, str]:
        def get(v: Views) -> str:
            f = v.fleet(name)
            slots = v.slots(name)
            key = reading_key(v.conn, name)
            rate = self.samples.add(key, slots)
            return pages.fleet_main(f, slots, v.leases(name), rate, self.samples.series(key),
                                    v.failures(name, page), page, self.csrf if self.allow_actions else None)
        return f"pg-claim web: fleet {shown(name)}", self.read(get)

    # --- the actions -----------------------------------------------------------

    def act(self, client: str, form: Dict[str, str]) -> str:
        """One action of a POST /action form; its outcome (HTML), or a Reply."""
        fleet, action = form.get("fleet", ""), form.get("action", "")
        back = pages.fleet_href(fleet) if fleet else "/"
        what = f"{action or '(no action)'} fleet \"{shown(fleet)}\""
        if not self.allow_actions:
            self.log(client, f"refused {what}: actions are off")
            raise Reply(403, "actions are off", "this server was started without --allow-actions: "
                        "it only shows the fleets", back)
        if not hmac.compare_digest(form.get("csrf", "").encode(), self.csrf.encode()):
            self.log(client, f"refused {what}: missing or wrong CSRF token")
            raise Reply(403, "refused", "the form's CSRF token is missing or wrong: reload the page and try again",
                        back)
        if action not in ("retry", "clear", "release"):
            raise Reply(400, "bad request", f"no action {pages.esc(action)!s}: retry, clear or release", back)
        if action == "release":
            try:
                slot, token = int(form.get("slot", "")), int(form.get("token", ""))
            except ValueError:
                raise Reply(400, "bad request", "release needs an integer slot and token", back) from None
            what += f" slot {slot} token {token}"
        else:
            item = form.get("item", "")
            what += f" item \"{shown(item)}\""

        def run(v: Views) -> Tuple[bool, str]:
            v.fleet(fleet)
            if action == "release":
                if v.release(fleet, slot, token):
                    return True, f"released the lease of slot {slot} of fleet {pages.esc(fleet)}"
                return False, (f"not released: token {token} does not hold slot {slot} of fleet {pages.esc(fleet)}, "
                               "or the lease belongs to a role whose privileges this role lacks")
            if action == "retry":
                state = v.item_state(fleet, item)
                if state != "dead":
                    return False, (f"item {pages.esc(item)} of fleet {pages.esc(fleet)} is not dead "
                                   f"({pages.esc(state or 'no failure record')}): nothing to retry")
            n = v.clear(fleet, item)
            if not n:
                return False, f"item {pages.esc(item)} of fleet {pages.esc(fleet)} has no failure record"
            return True, (f"item {pages.esc(item)} of fleet {pages.esc(fleet)} given back to its workers"
                          if action == "retry" else
                          f"cleared the failure record of item {pages.esc(item)} of fleet {pages.esc(fleet)}")
        try:
            ok, text = self.read(run, again=False)
        except Reply as r:
            self.log(client, f"failed {what}: HTTP {r.status} {r.title}")
            r.back = back
            raise
        self.log(client, f"{'done' if ok else 'not done'} {what}")
        if not ok:
            raise Reply(409, "not done", text, back)
        return pages.message_main("done", text, back)


class Handler(BaseHTTPRequestHandler):
    server_version = "pg-claim-web"
    app: App  # set on the subclass serve() makes

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # requests are not logged; actions are (App.log)

    def send(self, status: int, body: bytes, ctype: str, extra: Optional[Dict[str, str]] = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": ctype, "Content-Length": str(len(body)), "Cache-Control": "no-store",
                   "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                   "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}
        headers.update(extra or {})
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def page(self, status: int, title: str, main: str, part: bool) -> None:
        html = main if part else pages.document(title, main, self.app.refresh_s, self.app.status_line())
        self.send(status, html.encode("utf-8"), "text/html; charset=utf-8")

    def allowed(self, url: urllib.parse.SplitResult, query: Dict[str, str]) -> bool:
        """The Host and token checks; False when a reply was sent."""
        app = self.app
        if app.hosts is not None and (self.headers.get("Host") or "").lower() not in app.hosts:
            self.page(421, "refused", pages.message_main(
                "refused", "this server answers only requests to its loopback address", None), False)
            return False
        if app.token is None:
            return True
        given = query.get("token")
        if given is not None and self.command == "GET" and hmac.compare_digest(given.encode(), app.token.encode()):
            rest = urllib.parse.urlencode([(k, v) for k, v in query.items() if k != "token"])
            self.send(303, b"", "text/plain", {
                "Location": url.path + ("?" + rest if rest else ""),
                "Set-Cookie": f"{COOKIE}={cookie_value(app.token)}; Path=/; HttpOnly; SameSite=Strict"})
            return False
        cookies = dict(c.strip().split("=", 1) for c in (self.headers.get("Cookie") or "").split(";") if "=" in c)
        auth = self.headers.get("Authorization") or ""
        for cand, want in ((cookies.get(COOKIE), cookie_value(app.token)),
                           (auth[7:] if auth.startswith("Bearer ") else None, app.token)):
            if cand is not None and hmac.compare_digest(cand.encode(), want.encode()):
                return True
        self.page(401, "token required", pages.message_main(
            "token required", "open this page with ?token=TOKEN (the --token of pg-claim web) once", None), False)
        return False

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        if not self.allowed(url, query):
            return
        part = query.get("part") == "main"
        try:
            if url.path.startswith("/static/") and url.path[8:] in STATIC:
                path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static", url.path[8:])
                with open(path, "rb") as f:
                    self.send(200, f.read(), STATIC[url.path[8:]])
                return
            if url.path == "/":
                title, main = self.app.fleets_page()
            elif url.path == "/fleet" and "name" in query:
                try:
                    page = int(query.get("page", "0"))
                    if not 0 <= page <= 1_000_000:
                        raise ValueError
                except ValueError:
                    raise Reply(400, "bad request", f"page must be an integer from 0, got "
                                f"{pages.esc(query.get('page'))}", "/") from None
                title, main = self.app.fleet_page(query["name"], page)
            else:
                raise Reply(404, "not found", f"no page {pages.esc(url.path)}: the fleets are at /", "/")
            self.page(200, title, main, part)
        except Reply as r:
            self.page(r.status, r.title, pages.message_main(pages.esc(r.title), r.text, r.back), part)

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        if not self.allowed(url, {}):
            return
        client = self.client_address[0]
        try:
            if url.path != "/action":
                raise Reply(404, "not found", f"no action at {pages.esc(url.path)}", "/")
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_BODY:
                raise Reply(413, "too large", "a form is at most 64 KiB", "/")
            body = self.rfile.read(length).decode("utf-8", "replace")
            form = {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True,
                                                                max_num_fields=20).items()}
            self.page(200, "pg-claim web: done", self.app.act(client, form), False)
        except ValueError:
            self.page(400, "bad request", pages.message_main("bad request", "a malformed form", "/"), False)
        except Reply as r:
            self.page(r.status, r.title, pages.message_main(pages.esc(r.title), r.text, r.back), False)


def cookie_value(token: str) -> str:
    """The cookie that stands for the token (any token's text fits in it)."""
    return hashlib.sha256(b"pg-claim web\0" + token.encode()).hexdigest()


def is_loopback(addr: str) -> bool:
    if addr.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def serve(args: argparse.Namespace, out: TextIO) -> int:
    """Runs the server until SIGINT or SIGTERM."""
    token = args.token if args.token is not None else (os.environ.get(TOKEN_ENV) or None)
    if not is_loopback(args.bind) and not token:
        raise CliError(f"--bind {shown(args.bind)} is not a loopback address: a token is required there",
                       f"pass --token TOKEN (or set {TOKEN_ENV}); every request must then carry it", status=2)
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be from 0 to 65535, got {args.port}", "8377 is the default", status=2)
    with connect(args.dsn) as conn:  # fails early: cannot connect, pg_claim missing
        v = Views(conn)
        about = f"{v.edition} {v.version} · database {v.database}"

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in args.bind else socket.AF_INET
        daemon_threads = True

    class Bound(Handler):
        pass
    try:
        httpd = Server((args.bind, args.port), Bound)
    except OSError as e:
        raise CliError(f"cannot listen on {shown(args.bind)} port {args.port}: {e.strerror}",
                       "choose another --port (0: any free port)") from None
    port = httpd.server_address[1]
    host = f"[{args.bind}]" if ":" in args.bind else args.bind
    hosts = None if token else {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]", host.lower())}
    Bound.app = App(args.dsn, token, args.allow_actions, args.refresh, hosts, about, sys.stderr)
    out.write(f"pg-claim web: http://{host}:{port}/ ({about}; actions {'on' if args.allow_actions else 'off'})\n")
    out.flush()
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if not stop.is_set():
            stop.set()
            threading.Thread(target=httpd.shutdown, daemon=True).start()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, on_signal)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        httpd.server_close()
        Bound.app.pool.close()
    return 0
