"""pg_claim.Worker: the worker loop of a pg_claim fleet."""
from __future__ import annotations

import datetime
import logging
import os
import secrets
import select
import signal
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from ._batch import _KEY, _RETRY, _STATE, Batch, Batches, Error, Handler, PoolerError, Row, _SlotLost
from ._conn import PAUSE_MAX, Conn, Interval, next_pause, tcp_params, transient
from ._conn import interval_param as _interval_param
from ._conn import seconds as _seconds
from ._held import Held
from ._metrics import Stats, serve

log = logging.getLogger("pg_claim")

EventHook = Callable[[str, Dict[str, Any]], None]

MODES = ("lease", "session", "auto")
# slot -> cursor of the batch a held-back item was in -> when its retry is due
Due = Dict[int, Dict[Optional[str], float]]
# The most slots claim_leases serves (its error 22023 above that).
MAX_LEASE_SLOTS = 1024


def make_holder() -> str:
    """A holder text unique to this process: host:pid:random (8 random bytes in hex)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"


class Worker(Batches):
    """A worker of the fleet `name`: it serves slots of `n`, walks each slot's
    share of `table` in batches of `batch` rows still to do (`pending`), and
    calls `handler(tx, rows)` once per batch inside one transaction that has
    first passed the slot's fence, then commits.

    Parameters (all but `conninfo` by keyword):

    conninfo
        libpq connection string or URI of the work connections ("" for
        libpq's environment: PGHOST, PGDATABASE, ...). May point at a
        transaction-mode pooler (PgBouncer) in lease mode. No server-side
        prepared statements are used (prepare_threshold=None).
    name, n
        the fleet's name and its number of slots (fixed for the life of a name).
    table
        the table (optionally schema-qualified, as in SQL: 'outbox',
        'app."Mail Out"').
    pending
        the column that marks the rows still to do: a boolean column means
        pending while false (`done`), any other nullable column pending while
        NULL (`sent_at`). The handler marks the rows it handled (sets it),
        in the transaction it is given.
    handler
        handler(tx, rows): tx is the batch's psycopg connection inside its
        transaction, rows a Batch (a list of dicts). What it writes commits
        with the batch; what it raises makes the worker retry the batch
        item by item (below).
    batch
        rows per batch (50).
    mode
        "lease" (default; works through transaction poolers: claim_leases,
        any number of workers shares the n slots, the fleet grows and shrinks),
        "session" (claim_slots on a direct connection: refuses at start, with
        PoolerError, when the connection is not one server session), or
        "auto": session on a direct connection, lease behind a pooler. Every
        worker of one name must end up in the same mode: use "auto" only when
        all of them connect the same way.
    ttl
        the lease's time to live ('30 seconds'; text, seconds or a
        timedelta). Lease mode claims every ttl/3 on a thread and a connection
        of its own. In both modes a batch's transaction may stay idle at most
        ttl at a time (SET LOCAL idle_in_transaction_session_timeout), so a
        worker paused in a batch loses its session and its slots, and each
        of its statements runs at most ttl (SET LOCAL statement_timeout).
        In lease mode every wait for the server is bounded by the ttl (TCP
        keepalives, tcp_user_timeout, connect_timeout, a deadline on each
        reply; see README.md), so that a half-open connection never wedges
        a worker; in both modes stop() cuts a wait after ttl/4.
    key, route, method
        as in my_items: the key column (default: the primary key), the column
        mapped to the slot (default: the key), the mapping (default 'auto';
        'pg_hash' when the table is hash-partitioned with modulus n by the
        route or key column: then each slot's share is one partition).
    max_slots
        at most this many slots per worker (default n).
    holder
        the lease holder (default host:pid:random, made once per Worker).
    notify_conninfo
        a direct connection (or a session-mode pool) on which lease mode
        LISTENs on slot_channel(name, slot) of its slots: new rows wake it
        (the table needs a notify_slot trigger). Session mode LISTENs on its
        work connection.
    poll_interval
        seconds between looks at an idle share: 1 without LISTEN, 30 with it
        (the fallback poll).
    max_attempts, backoff
        record_failure's: a failing item is retried after backoff (doubled at
        each attempt), at its time, and set aside (dead) after max_attempts
        attempts. The handler must leave the batch's transaction open (no
        COMMIT or ROLLBACK): one that ends it fails the batch. A batch that
        fails with a transient error is tried again after a back-off
        (_conn.PAUSE_FIRST doubled up to PAUSE_MAX, ttl/3 in lease mode),
        and goes item by item through record_failure after TRANSIENT_LIMIT
        such failures in a row with the same first item.
    metrics_port
        serve Prometheus metrics on this port (/metrics): needs
        prometheus_client (pip install 'pg-claim[metrics]').
    metrics_host
        the address the metrics server listens on ("127.0.0.1": this
        machine only; "0.0.0.0" or "::" for every interface).
    on_event
        on_event(event, fields) for logging and metrics, called from the
        worker's threads; see README.md for the events.
    """

    def __init__(self, conninfo: str = "", *, name: str, table: str, n: int, pending: str,
                 handler: Handler, batch: int = 50, mode: str = "lease", ttl: Interval = "30 seconds",
                 key: Optional[str] = None, route: Optional[str] = None, method: Optional[str] = None,
                 max_slots: Optional[int] = None, holder: Optional[str] = None,
                 notify_conninfo: Optional[str] = None, poll_interval: Optional[float] = None,
                 max_attempts: int = 5, backoff: Interval = "10 seconds",
                 metrics_port: Optional[int] = None, metrics_host: str = "127.0.0.1",
                 on_event: Optional[EventHook] = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty text")
        if not isinstance(n, int) or not 1 <= n <= 1048576:
            raise ValueError(f"n must be an integer between 1 and 1048576, got {n!r}")
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an integer of at least 1, got {batch!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "lease" and n > MAX_LEASE_SLOTS:
            raise ValueError(f"n must be at most {MAX_LEASE_SLOTS} in lease mode (claim_leases serves up to"
                             f" {MAX_LEASE_SLOTS} slots), got {n}: use fewer slots, or mode=\"session\" on a"
                             " direct connection")
        if not callable(handler):
            raise TypeError("handler must be callable: handler(tx, rows)")
        if not isinstance(pending, str) or not pending:
            raise ValueError("pending must name the column that marks the rows still to do"
                             " (a boolean done flag, or a nullable column such as sent_at)")
        if max_slots is not None and not 1 <= max_slots <= n:
            raise ValueError(f"max_slots must be between 1 and n = {n}, got {max_slots!r}")
        if not isinstance(max_attempts, int) or not 1 <= max_attempts <= 1000:
            raise ValueError(f"max_attempts must be between 1 and 1000, got {max_attempts!r}")
        if poll_interval is not None and poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval!r}")
        ttl_s = _seconds(ttl)
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl must be positive, got {ttl!r}")
        _seconds(backoff)
        self.conninfo, self.name, self.table, self.n = conninfo, name, table, n
        self.pending, self.handler, self.batch, self.mode = pending, handler, batch, mode
        self.ttl, self.key, self.route, self.method = ttl, key, route, method
        self.max_slots = max_slots or n
        self.holder = holder or make_holder()
        self.notify_conninfo, self.poll_interval = notify_conninfo, poll_interval
        self.max_attempts, self.backoff = max_attempts, backoff
        self.metrics_port, self.metrics_host, self.on_event = metrics_port, metrics_host, on_event
        self.stats = Stats()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._notified = False
        self._notices = 0  # notifications so far (a resting slot is looked at again after one)
        # (slot, token) -> when a slot whose last pass handled nothing is looked at again
        # (other slots still busy): poll_interval later, or after a notification
        self._resting: Dict[Tuple[int, int], float] = {}
        self._rest_notices = 0
        self._fatal: Optional[BaseException] = None
        self._held = Held()
        self._ttl_s = ttl_s or 0.0
        self._ready = False
        self._partitions: Dict[int, sql.Composable] = {}
        self._strikes: Dict[int, Tuple[str, int]] = {}
        self._forced: Dict[int, bool] = {}
        self._owed: Dict[int, Dict[str, str]] = {}
        self._claim_failing = False
        self._threads: List[threading.Thread] = []
        self.running_mode: Optional[str] = None

    # ------------------------------------------------------------------ API

    def run(self) -> None:
        """Work until stop() is called or SIGTERM/SIGINT arrives (handled when
        run() is called from the main thread): finish the batch at hand, give
        the slots back (lease mode: claim_leases(..., max => 0); session
        mode: release_slot), and return. Reconnects after a lost connection or
        a server restart. Raises Error (PoolerError) for a set-up that cannot
        work, and the server's error for one that is not the connection's
        (a wrong column, missing privileges, another mode on the name)."""
        restore = self._install_signals()
        server = None
        try:
            if self.metrics_port is not None:
                server = serve(self.metrics_port, self.name, self.stats, self.metrics_host)
            self._setup()
            self._emit("started", mode=self.running_mode, holder=self.holder, n=self.n,
                       table=self._table_text, method=self._method, partitioned=self._partitioned)
            if self.running_mode == "lease":
                self._run_lease()
            else:
                self._run_session()
        finally:
            self._stop.set()
            self._wake.set()
            for t in self._threads:
                t.join(10)
            self._threads = []
            if server is not None:
                server.shutdown()
            restore()
        self._emit("stopped", **self.stats.snapshot())

    def stop(self) -> None:
        """Ask the worker to stop: run() finishes the batch at hand, gives
        the slots back and returns. Safe from any thread and from a signal
        handler."""
        self._stop.set()
        self._wake.set()

    @property
    def slots(self) -> Dict[int, Optional[int]]:
        """slot -> token of the slots held now (token None in session mode)."""
        snap = self._held.snapshot()
        return {s: (t if self.running_mode == "lease" else None) for s, t in snap.items()}

    # ------------------------------------------------------------ internals

    def _emit(self, event: str, **fields: Any) -> None:
        log.debug("%s %s", event, fields)
        if self.on_event is not None:
            try:
                self.on_event(event, fields)
            except Exception:  # a hook never stops the worker
                log.exception("on_event(%r) raised", event)

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        saved = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            saved[sig] = signal.signal(sig, lambda *_: self.stop())

        def restore() -> None:
            for sig, h in saved.items():
                signal.signal(sig, h)
        return restore

    def _connect(self, conninfo: str, deadline: float = 4 / 3) -> Conn:
        """A connection in autocommit, without server-side prepared
        statements (PgBouncer in transaction mode has none before 1.21).
        In lease mode its waits are bounded by the ttl (_conn.tcp_params;
        each reply within `deadline` x ttl, at least 1.5 s). In session mode
        the slots are the server session's, which a path that comes back
        finds again: libpq's TCP settings (the connection string's) and no
        deadline. In both, after stop() a wait has at most _grace() more."""
        params = conninfo_to_dict(conninfo)
        ttl_s = self._ttl_s or 30.0
        session = self.running_mode == "session"
        extra = {} if session else tcp_params(params, ttl_s)
        if session and "connect_timeout" not in params and not os.environ.get("PGCONNECT_TIMEOUT"):
            extra["connect_timeout"] = 10
        if "application_name" not in params and "PGAPPNAME" not in os.environ:
            extra["application_name"] = f"pg_claim {self.name}"[:63]
        conn = Conn.connect(conninfo, autocommit=True, prepare_threshold=None, **extra)
        conn.deadline_s = float("inf") if session else max(1.5, deadline * ttl_s)
        conn.stop, conn.stop_grace_s = self._stop, self._grace()
        return conn

    def _pause_cap(self) -> float:
        """The longest back-off: PAUSE_MAX, at most ttl/3 in lease mode."""
        if self.running_mode == "lease" and self._ttl_s:
            return max(0.1, min(PAUSE_MAX, self._ttl_s / 3))
        return PAUSE_MAX

    @staticmethod
    def session_check(conn: psycopg.Connection) -> int:
        """The server process of `conn` if the connection is one server
        session; raises PoolerError otherwise. It compares the server
        process that runs a statement (pg_backend_pid()) with the one the
        connection was opened with (the server's start-up reply): a pooler
        answers the start-up itself, with a number of its own (PgBouncer in
        any pool mode, and other poolers that do not pass the server's
        through)."""
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        if pid != conn.info.backend_pid:
            raise PoolerError(
                f"the server process (pid {pid}) is not the one the connection was opened with"
                f" (pid {conn.info.backend_pid}): a connection pooler is in between. Session mode holds"
                " its slots with session locks and LISTENs, which need one server session per"
                " connection: connect to PostgreSQL directly, or use mode='lease' (works through"
                " transaction-mode poolers).")
        return pid

    def _retrying(self, what: Callable[[], Any]) -> Any:
        """what(), tried again after transient errors (with back-off) until
        it succeeds or the worker is stopped (None)."""
        pause = None
        while not self._stop.is_set():
            try:
                return what()
            except psycopg.Error as e:
                if not transient(e):
                    raise
                pause = next_pause(pause, self._pause_cap())
                self._reconnecting(e, pause)
        return None

    def _reconnecting(self, e: BaseException, pause: float) -> None:
        self.stats.add("reconnects")
        text = str(e).strip().splitlines()
        self._emit("reconnecting", error=text[0] if text else type(e).__name__, pause=pause)
        self._stop.wait(pause)

    def _setup(self) -> None:
        """What the worker reads once: the mode, the table, its key, the
        intervals, whether the table is hash-partitioned with modulus n."""
        def probe() -> None:
            with self._connect(self.conninfo) as conn:
                if self.mode == "auto":
                    try:
                        self.session_check(conn)
                        self.running_mode = "session"
                    except PoolerError:
                        self.running_mode = "lease"
                else:
                    self.running_mode = self.mode
                self._read_table(conn)
        if not self._ready:
            self._retrying(probe)
            if self.running_mode is None:
                raise Error("stopped before the worker could connect")
            self._ready = True

    def _read_table(self, conn: psycopg.Connection) -> None:
        # the row type by the table's schema-qualified name: a table named like a
        # built-in type (box, point, ...) is not that type in NULL::box
        cur = conn.execute(
            "SELECT c.oid, c.oid::regclass::text, pg_catalog.format('%%I.%%I', n.nspname, c.relname),"
            " extract(epoch FROM %s::interval)::float8, extract(epoch FROM %s::interval)::float8"
            " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.oid = %s::regclass",
            (_interval_param(self.ttl), _interval_param(self.backoff), self.table))
        oid, self._table_text, rowtype, ttl_s, backoff_s = cur.fetchone()  # type: ignore[misc]
        if ttl_s <= 0 or backoff_s < 0:
            raise Error(f"ttl must be positive and backoff not negative, got {self.ttl!r}, {self.backoff!r}")
        self._ttl_s = ttl_s
        key = self.key
        if key is None:
            cols = [r[0] for r in conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
                " AND a.attnum = ANY (i.indkey) WHERE i.indrelid = %s AND i.indisprimary", (oid,))]
            if len(cols) != 1:
                raise Error(f"{self._table_text} has {'no primary key' if not cols else 'a primary key of'}"
                            f"{'' if not cols else ' %d columns' % len(cols)}: pass key= (a unique, not"
                            " null column)")
            key = cols[0]
        self._key = key
        boolean = conn.execute("SELECT atttypid = 'boolean'::regtype FROM pg_attribute WHERE attrelid = %s"
                               " AND attname = %s AND NOT attisdropped", (oid, self.pending)).fetchone()
        p = sql.Identifier(self.pending)
        self._pending_sql = sql.SQL("NOT {}").format(p) if boolean and boolean[0] else sql.SQL("{} IS NULL").format(p)
        self._method = self.method
        self._partitioned = False
        mapped = self.route or key
        part = conn.execute(
            "SELECT pt.partstrat::text, pt.partnatts, a.attname FROM pg_partitioned_table pt"
            " LEFT JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]"
            " WHERE pt.partrelid = %s", (oid,)).fetchone()
        if part is not None and part[0] == "h" and part[1] == 1 and part[2] == mapped \
                and self.method in (None, "pg_hash"):
            try:
                conn.execute("SELECT slot_partition(%s::regclass, 0, %s)", (oid, self.n))
                self._partitioned, self._method = True, "pg_hash"
            except psycopg.Error as e:
                if e.sqlstate not in ("22023", "42501"):
                    raise
                log.info("%s is hash-partitioned but not with modulus %d: reading and writing it"
                         " through the table (%s)", self._table_text, self.n, e)
        args = [sql.SQL("NULL::{}").format(sql.SQL(rowtype)), sql.SQL("%(slot)s"), sql.SQL("%(n)s")]
        args.append(sql.SQL("key => %(key)s"))
        if self._method is not None:
            args.append(sql.SQL("method => %(method)s"))
        if self.route is not None:
            args.append(sql.SQL("route => %(route)s"))
        args += [sql.SQL("after => %(after)s::text"), sql.SQL("batch => %(batch)s"),
                 sql.SQL("pending => %(pending)s")]
        k = sql.Identifier(key)
        # the batch's rows with their own failure records (item_failures with
        # the batch's keys reads those records only, by the primary key; a
        # key over 1024 bytes has none, record_failure refuses it)
        self._fetch = sql.SQL(
            "WITH t AS (SELECT * FROM my_items({args}))"
            " SELECT t.*, t.{k}::text AS {kc}, f.state AS {sc},"
            " extract(epoch FROM f.retry_at - clock_timestamp())::float8 AS {rc}"
            " FROM t LEFT JOIN item_failures(%(name)s, VARIADIC ARRAY(SELECT t.{k}::text FROM t"
            " WHERE octet_length(t.{k}::text) <= 1024)) f"
            " ON f.item = t.{k}::text ORDER BY t.{k}").format(
                k=k, kc=sql.Identifier(_KEY), sc=sql.Identifier(_STATE), rc=sql.Identifier(_RETRY),
                args=sql.SQL(", ").join(args)).as_string(conn)

    def _table_for(self, conn: psycopg.Connection, slot: int) -> sql.Composable:
        if not self._partitioned:
            return sql.SQL(self._table_text)
        if slot not in self._partitions:
            (p,) = conn.execute("SELECT slot_partition(%s::regclass, %s, %s)::text",
                                (self._table_text, slot, self.n)).fetchone()  # type: ignore[misc]
            self._partitions[slot] = sql.SQL(p)
        return self._partitions[slot]

    def _params(self, slot: int, after: Optional[str]) -> Dict[str, Any]:
        return {"slot": slot, "n": self.n, "key": self._key, "method": self._method, "route": self.route,
                "after": after, "batch": self.batch, "pending": self.pending, "name": self.name}

    # ------------------------------------------------------------ one batch

    # ---------------------------------------------------------- the loops

    def _walk(self, conn: psycopg.Connection, quiet: Dict[Tuple[int, int], bool], busy: Dict[int, bool],
              due: Due, session: bool) -> bool:
        """One batch of the next held slot: of a slot with a retry due, from
        where the batch of the retried item started (so the retry runs at
        its time, not when the walk comes round), else of the next slot in
        turn. Returns False when there is no slot to work on."""
        now = time.monotonic()
        held = self._held.snapshot()
        for s in [s for s in due if s not in held]:
            del due[s]
        ready = [(t, s, a) for s, d in due.items() for a, t in d.items() if t <= now]
        nxt = None
        if ready:
            _, s, a = min(ready, key=lambda x: x[0])
            del due[s][a]
            nxt = self._held.pick(s, a)
        if self._rest_notices != self._notices:
            self._rest_notices = self._notices
            self._resting.clear()
        nxt = nxt or self._held.next(now, {s for (s, t), until in self._resting.items()
                                           if until > now and held.get(s) == t})
        if nxt is None:
            if not session:  # no good claim for a ttl: drop the slots, whatever the claimer does
                lost = self._held.failed(now)
                if lost:
                    self._changed([], lost)
            return False
        slot, token, after = nxt
        try:
            done, end, retry_in, cursor = self._step(conn, slot, None if session else token, after)
        except _SlotLost:
            self.stats.add("rejected")
            if self._held.drop(slot, token):
                self.stats.slots(0, 1, len(self._held.snapshot()))
            self._emit("rejected", slot=slot, token=None if session else token)
            return True
        if retry_in is not None:
            d = due.setdefault(slot, {})
            d[after] = min(d.get(after, float("inf")), time.monotonic() + max(retry_in, 0.0))
        if done:
            busy[slot] = True
            quiet[(slot, token)] = False
        if end:  # the pass over the share is over: quiet when it handled nothing
            quiet[(slot, token)] = not busy.pop(slot, False)
            if quiet[(slot, token)]:  # not fetched again at each turn of the busy slots
                self._resting[(slot, token)] = now + (self.poll_interval or (30.0 if self._listening() else 1.0))
        self._held.advance(slot, token, cursor)
        return True

    def _all_quiet(self, quiet: Dict[Tuple[int, int], bool]) -> bool:
        held = self._held.snapshot()
        return bool(held) and all(quiet.get(st, False) for st in held.items())

    def _idle_timeout(self, due: Due) -> Tuple[float, Optional[float]]:
        """(seconds to wait, seconds until the first retry of a held slot's
        item or None). While the claims fail, at most until the slots are
        to be dropped."""
        default = self.poll_interval or (30.0 if self._listening() else 1.0)
        held = self._held.snapshot()
        now = time.monotonic()
        if held and self._claim_failing:
            default = min(default, max(0.05, self._held.valid_left(now)))
        nexts = [t for s, d in due.items() if s in held for t in d.values()]
        retry = max(min(nexts) - now, 0.0) if nexts else None
        # at least 0.1 s: an item due now is fetched by the next pass, never by a busy loop
        return (min(default, max(retry, 0.1)) if retry is not None else default), retry

    def _listening(self) -> bool:
        return self.running_mode == "session" or self.notify_conninfo is not None

    # lease mode

    def _claim(self, conn: psycopg.Connection, max_: Optional[int] = None) -> List[Tuple[int, int]]:
        return conn.execute("SELECT slot, token FROM claim_leases(%s, %s, %s, max => %s, ttl => %s)",
                            (self.name, self.n, self.holder, self.max_slots if max_ is None else max_,
                             datetime.timedelta(seconds=self._ttl_s))).fetchall()

    def _changed(self, gained: List[Tuple[int, int]], lost: List[Tuple[int, int]]) -> None:
        held = sorted(self._held.snapshot())
        self.stats.slots(len(gained), len(lost), len(held))
        self._emit("slots", held=held, gained=[s for s, _ in gained], lost=[s for s, _ in lost])
        self._wake.set()

    def _claimer(self, conn: Optional[psycopg.Connection]) -> None:
        """claim_leases every ttl/3 on a connection of its own, whatever the
        batches do. A failed call is tried again at the next period on a new
        connection; the slots are dropped once no call succeeded for a ttl.
        An error that is not the connection's stops the worker."""
        period = self._ttl_s / 3
        failing = False
        while True:
            asked = time.monotonic()
            try:
                conn = conn or self._connect(self.conninfo, deadline=1 / 3)
                rows = self._claim(conn)
                gained, lost = self._held.replace(rows, asked)
                if failing:
                    failing = self._claim_failing = False
                    self._wake.set()
            except psycopg.Error as e:
                if conn is not None:
                    conn.close()
                conn = None
                if not transient(e, own=True):
                    self._fatal = e
                    self.stop()
                    return
                failing = self._claim_failing = True
                gained, lost = [], self._held.failed(time.monotonic())
                self._emit("claim_failed", error=(str(e).strip().splitlines() or [type(e).__name__])[0])
                self._wake.set()  # an idle work loop waits at most until the slots are to be dropped
            if gained or lost:
                self._changed(gained, lost)
            if self._stop.wait(max(0.0, asked + period - time.monotonic())):
                break
        if conn is not None:
            conn.close()

    def _listener(self) -> None:
        """LISTEN on the channels of the held slots on a direct connection
        (notify_conninfo); a notification wakes the work loop."""
        assert self.notify_conninfo is not None
        conn: Optional[psycopg.Connection] = None
        channels: Dict[int, str] = {}
        pause: Optional[float] = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect(self.notify_conninfo, deadline=1 / 3)
                    self.session_check(conn)
                    conn.add_notify_handler(lambda _n: self._notify())
                    channels = {}
                want = set(self._held.snapshot())
                for s in sorted(want - set(channels)):
                    (ch,) = conn.execute("SELECT slot_channel(%s, %s)", (self.name, s)).fetchone()  # type: ignore[misc]
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ch)))
                    channels[s] = ch
                for s in sorted(set(channels) - want):
                    conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channels.pop(s))))
                pause = None
                if select.select([conn.fileno()], [], [], 0.5)[0]:
                    conn.execute("SELECT 1")  # reads the notifications: the handler runs
            except PoolerError as e:
                self._fatal = PoolerError(f"notify_conninfo: {e}")
                self.stop()
                break
            except psycopg.Error as e:
                if conn is not None:
                    conn.close()
                conn = None
                if not transient(e, own=True):
                    self._fatal = e
                    self.stop()
                    break
                pause = next_pause(pause, self._pause_cap())
                self._emit("listen_failed", error=(str(e).strip().splitlines() or [type(e).__name__])[0])
                self._stop.wait(pause)
        if conn is not None:
            conn.close()

    def _notify(self) -> None:
        self._notified = True
        self._notices += 1
        self._wake.set()

    def _idle(self, due: Due, on_slice: Optional[Callable[[float], bool]] = None,
              announce: bool = True) -> None:
        """Wait for a notification, a change of the held slots, the fallback
        poll or the first retry due, whichever comes first."""
        timeout, retry = self._idle_timeout(due)
        if announce:
            self._emit("idle", retry_in=retry, slots=sorted(self._held.snapshot()))
        if self._stop.is_set():
            return
        if on_slice is None:
            self._wake.wait(timeout)
        else:
            end = time.monotonic() + timeout
            while not self._stop.is_set() and not self._wake.is_set():
                left = end - time.monotonic()
                if left <= 0 or on_slice(left):
                    break
        self._wake.clear()
        if self._notified:
            self._notified = False
            self._emit("woken")

    def _run_lease(self) -> None:
        self._held = Held(valid_s=self._ttl_s, margin_s=self._ttl_s / 3)
        first: Optional[psycopg.Connection] = None

        def claim_first() -> None:
            nonlocal first
            first = self._connect(self.conninfo, deadline=1 / 3)
            asked = time.monotonic()
            try:
                gained, lost = self._held.replace(self._claim(first), asked)
            except BaseException:
                first.close()
                raise
            self._changed(gained, lost)
        self._retrying(claim_first)
        if self._stop.is_set():
            if first is not None:
                first.close()
            self._leave()
            return
        self._threads = [threading.Thread(target=self._claimer, args=(first,), daemon=True,
                                          name=f"pg_claim claimer {self.name}")]
        if self.notify_conninfo is not None:
            self._threads.append(threading.Thread(target=self._listener, daemon=True,
                                                  name=f"pg_claim listener {self.name}"))
        for t in self._threads:
            t.start()
        try:
            self._work_loop(session=False)
        finally:
            self._stop.set()
            for t in self._threads:
                t.join(10)
            self._threads = []
            self._leave()
        if self._fatal is not None:
            raise self._fatal

    def _leave(self) -> None:
        """Give every slot back and leave the live set: claim_leases(...,
        max => 0), for at most ttl/4 (then the leases expire by themselves:
        a path that does not answer never holds up stop())."""
        end = time.monotonic() + self._grace()
        failed: List[BaseException] = []

        def give_back() -> None:
            for attempt in range(3):
                try:
                    with self._connect(self.conninfo, deadline=1 / 4) as conn:
                        self._claim(conn, max_=0)
                    return
                except psycopg.Error as e:
                    if attempt == 2 or not transient(e, own=True) or time.monotonic() + 0.2 >= end:
                        failed.append(e)
                        return
                    time.sleep(0.2)
        t = threading.Thread(target=give_back, daemon=True, name=f"pg_claim leave {self.name}")
        t.start()
        t.join(max(0.0, end - time.monotonic()))
        if t.is_alive() or failed:
            e = failed[0] if failed else TimeoutError(f"no reply within {self._grace():g} s")
            log.warning("could not give the slots back (they expire after the ttl): %s", e)
            self._emit("leave_failed", error=str(e).strip())
            return
        gave = sorted(self._held.snapshot())
        self._held.replace([], time.monotonic())
        self.stats.slots(0, len(gave), 0)
        self._emit("left", slots=gave)

    def _grace(self) -> float:
        """How long after stop() a wait for the server may go on, and how
        long the slots are given back for: ttl/4 (at least 0.5 s)."""
        return max(0.5, (self._ttl_s or 30.0) / 4)

    def _work_loop(self, session: bool, conn: Optional[psycopg.Connection] = None,
                   claim: Optional[Callable[[psycopg.Connection], None]] = None) -> None:
        quiet: Dict[Tuple[int, int], bool] = {}
        busy: Dict[int, bool] = {}
        due: Due = {}
        # the back-off after transient failures in a row (reconnects and
        # batches alike): none after a batch that went through
        pause: Optional[float] = None
        try:
            while not self._stop.is_set():
                try:
                    if conn is None:
                        conn = self._connect(self.conninfo)
                    if claim is not None:
                        claim(conn)  # session mode: between batches (a new session: checked first)
                    walked = self._walk(conn, quiet, busy, due, session)
                    pause = None
                    if not walked:
                        if not session:  # no slot (yet): until the claimer's next change
                            self._idle({}, announce=False)
                        continue
                    if self._all_quiet(quiet):
                        c = conn
                        self._idle(due, (lambda left: self._session_slice(c, claim, left)) if session else None)
                        quiet.clear()
                        busy.clear()
                        self._resting.clear()
                except psycopg.Error as e:
                    if not transient(e, conn, own=True):
                        raise
                    pause = next_pause(pause, self._pause_cap())
                    quiet.clear()
                    self._resting.clear()
                    if conn is not None and not conn.broken and not conn.closed \
                            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                        # the connection works (a deadlock, a serialization failure,
                        # resources exhausted): the batch again after the pause
                        self._emit("retrying", error=(str(e).strip().splitlines() or [type(e).__name__])[0],
                                   pause=pause)
                        self._stop.wait(pause)
                        continue
                    if conn is not None:
                        conn.close()
                    conn = None
                    if session:
                        self._held.replace([], time.monotonic())  # the claims died with the session
                    self._reconnecting(e, pause)
                if self._fatal is not None:
                    break
        finally:
            if session and conn is not None and not conn.broken:
                try:
                    conn.execute("SELECT release_slot(%s)", (self.name,))
                    gave = sorted(self._held.snapshot())
                    self.stats.slots(0, len(gave), 0)
                    self._emit("left", slots=gave)
                except psycopg.Error:
                    pass
            if conn is not None:
                conn.close()

    # session mode

    def _run_session(self) -> None:
        self._held = Held()
        state: Dict[str, Any] = {"pid": None, "channels": {}}

        def claim(conn: psycopg.Connection) -> None:
            if state.get("conn") is not conn:  # a new session: check it, LISTEN from scratch
                state["pid"] = self.session_check(conn)
                state["conn"] = conn
                state["channels"] = {}
                conn.add_notify_handler(lambda _n: self._notify())
                self._held.replace([], time.monotonic())
            held_before = self._held.snapshot()
            args: Tuple[Any, ...] = (self.name, self.n, self.max_slots)
            q = "SELECT claim_slots(%s, %s, %s), pg_backend_pid()"
            if not held_before:  # a standby: the wait form, which holders see
                q = "SELECT claim_slots(%s, %s, %s, '1 second'), pg_backend_pid()"
            slots, pid = conn.execute(q, args).fetchone()  # type: ignore[misc]
            if pid != state["pid"]:
                raise PoolerError(f"claim_slots ran in server process {pid}, not {state['pid']}:"
                                  " a connection pooler is in between (the claim stays with the other"
                                  " server connection until it ends)")
            gained, lost = self._held.replace([(s, 0) for s in slots], time.monotonic())
            channels = state["channels"]
            for s, _ in lost:
                if s in channels:
                    conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channels.pop(s))))
            for s, _ in gained:
                (ch,) = conn.execute("SELECT slot_channel(%s, %s)", (self.name, s)).fetchone()  # type: ignore[misc]
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ch)))
                channels[s] = ch
            if gained or lost:
                self._changed(gained, lost)

        self._work_loop(session=True, claim=claim)
        if self._fatal is not None:
            raise self._fatal

    def _session_slice(self, conn: Optional[psycopg.Connection],
                       claim: Optional[Callable[[psycopg.Connection], None]], left: float) -> bool:
        """Part of an idle wait in session mode: up to 0.5 s (or `left`) for the
        connection to have something to read (a notification), then a claim
        (it reads the notifications, takes free slots and gives one back to
        a waiting worker). True when the slots changed."""
        assert conn is not None and claim is not None
        select.select([conn.fileno()], [], [], min(0.5, left))
        before = self._held.snapshot()
        claim(conn)
        return self._held.snapshot() != before
