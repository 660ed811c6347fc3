"""A Worker's configuration: its options, checked, and what it reads once
from the server (the mode, the table, its key and pending column, the
intervals, whether the table is hash-partitioned with modulus n)."""
from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

import psycopg
from psycopg import sql

from ._backlog import Backlog
from ._conn import Interval
from ._conn import interval_param as _interval_param
from ._conn import seconds as _seconds
from ._failures import Records
from ._held import Held
from ._metrics import Stats
from ._types import _KEY, _RETRY, _STATE, Error, Handler, PoolerError

log = logging.getLogger("pg_claim")

EventHook = Callable[[str, Dict[str, Any]], None]

MODES = ("lease", "session", "auto")
# The most slots claim_leases serves (its error 22023 above that).
MAX_LEASE_SLOTS = 1024
# Statement texts both libraries send, kept alike in clients/node/lib/config.js
# (test_parity compares them): {k} is the key column, {items} the slot's share
# (my_items, or the Citus share of scale-out.md), {name} the fleet.
# A window of the slot's pending rows, counted (one bounded index walk), and
# the key of its last row: a top-1 over the window's keys (a sorted array of
# them doubled the count's cost, 30 ms against 15 for 16,000 rows).
COUNT_SQL = ("WITH w AS MATERIALIZED (SELECT c.{k} FROM {items} c)"
             " SELECT count(*) AS pending, (SELECT w.{k}::text FROM w ORDER BY w.{k} DESC LIMIT 1) AS last FROM w")
# The end of the fetch: the batch's rows with their own failure records
# (item_failures with the batch's keys reads those records only, by the
# primary key; a key over 1024 bytes has none, record_failure refuses it).
FAILURES_SQL = (" FROM t LEFT JOIN item_failures({name}, VARIADIC ARRAY(SELECT t.{k}::text FROM t"
                " WHERE octet_length(t.{k}::text) <= 1024)) f ON f.item = t.{k}::text ORDER BY t.{k}")
# The same end while the name has no failure record (has_failures: see
# _failures.Records): the same columns, no record read.
NO_FAILURES_SQL = (" FROM t LEFT JOIN (SELECT NULL::text AS item, NULL::text AS state,"
                   " NULL::timestamptz AS retry_at) f ON false ORDER BY t.{k}")


def make_holder() -> str:
    """A holder text unique to this process: host:pid:random (8 random bytes in hex)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"


def _shard_keys(column: Optional[str], keys: Any, n: int, method: Optional[str],
                tenants: bool) -> Optional[Dict[int, Any]]:
    """The options shard_column and shard_keys, checked: both or neither; a
    key for every slot of n (slot -> the value of the shard column that
    every row of the slot has)."""
    if column is None and keys is None:
        return None
    if not isinstance(column, str) or not column or keys is None:
        raise ValueError("shard_column and shard_keys go together: the column Citus distributes the table by,"
                         " and each slot's value of it (docs/scale-out.md, \"The worker library on Citus\")")
    if isinstance(keys, (list, tuple)):
        keys = dict(enumerate(keys))
    if not isinstance(keys, Mapping):
        raise TypeError(f"shard_keys must map each slot to its shard key (a dict, or a list by slot), got {keys!r}")
    if method not in (None, "auto") or tenants:
        raise ValueError("shard_column reads each slot's share as slot_of(route, n): it does not go with"
                         f" method {method!r}, fair or spread")
    missing = [s for s in range(n) if keys.get(s) is None]
    if missing:
        raise ValueError(f"shard_keys has no key for slot {missing[0]} of n = {n}: give every slot its shard key")
    return dict(keys)


class Config:
    """The options of a Worker (see Worker) and what it reads once."""

    def __init__(self, conninfo: str = "", *, connection: Optional[Dict[str, Any]] = None, name: str,
                 table: str, n: int, pending: str, handler: Handler, batch: int = 50, mode: str = "lease",
                 ttl: Interval = "30 seconds", renew_interval: Optional[Interval] = None,
                 idle_in_transaction_timeout: Optional[Interval] = None,
                 query_timeout: Optional[Interval] = None,
                 key: Optional[str] = None, route: Optional[str] = None, method: Optional[str] = None,
                 fair: Optional[str] = None, spread: Optional[int] = None,
                 shard_column: Optional[str] = None, shard_keys: Optional[Any] = None,
                 max_slots: Optional[int] = None, holder: Optional[str] = None,
                 notify_conninfo: Optional[str] = None, poll_interval: Optional[float] = None,
                 max_attempts: int = 5, backoff: Interval = "10 seconds", session_pool: bool = False,
                 balance: bool = True,
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
        for what, v in (("renew_interval", renew_interval), ("idle_in_transaction_timeout",
                        idle_in_transaction_timeout), ("query_timeout", query_timeout)):
            s = None if v is None else _seconds(v)
            if s is not None and (s < 0 or (what == "renew_interval" and s == 0)):
                raise ValueError(f"{what} must be {'positive' if what == 'renew_interval' else 'at least 0'},"
                                 f" got {v!r}")
        if fair is not None and (not isinstance(fair, str) or not fair):
            raise ValueError(f"fair must name the tenant column (a non-empty text), got {fair!r}")
        if spread is not None:
            if isinstance(spread, bool) or not isinstance(spread, int) or not 1 <= spread <= n:
                raise ValueError(f"spread must be an integer between 1 and n = {n}, got {spread!r}")
            if route is None:
                raise ValueError("spread needs route: the tenant column, whose rows spread over at most"
                                 f" {spread} slots (slot_of_spread(route, key, n, spread))")
        if method is not None and (fair is not None or spread is not None):
            raise ValueError(f"method {method!r} does not go with fair or spread: their batches are read by"
                             " my_items_fair, with slot_of (or slot_of_spread) of the route column")
        shard_keys = _shard_keys(shard_column, shard_keys, n, method, fair is not None or spread is not None)
        if not isinstance(balance, bool):
            raise TypeError(f"balance must be True or False, got {balance!r}")
        if connection is not None and not isinstance(connection, dict):
            raise TypeError(f"connection must be a dict of psycopg.connect() parameters, got {connection!r}")
        self.conninfo, self.name, self.table, self.n = conninfo, name, table, n
        self.pending, self.handler, self.batch, self.mode = pending, handler, batch, mode
        self.ttl, self.key, self.route, self.method = ttl, key, route, method
        self.fair, self.spread = fair, spread
        self.shard_column, self.shard_keys = shard_column, shard_keys
        self.max_slots = max_slots or n
        self._max_slots_given = max_slots  # a resize keeps it (at most the new n)
        self.holder = holder or make_holder()
        self.notify_conninfo, self.poll_interval = notify_conninfo, poll_interval
        self.max_attempts, self.backoff = max_attempts, backoff
        self.connection, self.session_pool = dict(connection or {}), bool(session_pool)
        self.renew_interval, self.idle_in_transaction_timeout = renew_interval, idle_in_transaction_timeout
        self.query_timeout, self.balance = query_timeout, balance
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
        # read with the ttl (_read_table): the claimer's period, the idle and statement limits (s)
        self._renew_s = self._idle_s = self._query_s = 0.0
        self._ready = False
        self._partitions: Dict[int, sql.Composable] = {}
        self._strikes: Dict[int, Tuple[str, int]] = {}
        self._forced: Dict[int, bool] = {}
        self._owed: Dict[int, Dict[str, str]] = {}
        # whether the name has failure records (has_failures), to fetch without them while not
        self._records = Records()
        # lease mode's balance (docs/leases.md, "Balancing"): each held slot's
        # weight as its batches count it (_backlog.py), the last batch's rows
        # and window count, and the slots the last report said another holder
        # wants
        self._backlog = Backlog(batch)
        self._last_fetch: Tuple[int, Optional[Tuple[int, Optional[str]]]] = (0, None)
        self._wanted: Set[int] = set()
        self._claim_failing = False
        # a resize (_resize): followed by one thread at a time; the claimer calls again at once
        self._resize_lock = threading.Lock()
        self._claim_now = threading.Event()
        self._threads: List[threading.Thread] = []
        self.running_mode: Optional[str] = None

    def _setup(self) -> None:
        """What the worker reads once: the mode, the table, its key, the
        intervals, whether the table is hash-partitioned with modulus n."""
        def probe() -> None:
            with self._connect(self.conninfo) as conn:
                if self.mode == "auto":
                    try:
                        self.session_check(conn)
                        self.running_mode = "session"
                        why = "a session pool" if self.session_pool else "a direct connection"
                    except PoolerError:
                        self.running_mode, why = "lease", "a pooler answered the start-up"
                    self._emit("mode", mode=self.running_mode, why=why)
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
            " extract(epoch FROM %s::interval)::float8, extract(epoch FROM %s::interval)::float8,"
            " extract(epoch FROM %s::interval)::float8, extract(epoch FROM %s::interval)::float8,"
            " extract(epoch FROM %s::interval)::float8"
            " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.oid = %s::regclass",
            tuple(None if v is None else _interval_param(v) for v in (
                self.ttl, self.backoff, self.renew_interval, self.idle_in_transaction_timeout,
                self.query_timeout)) + (self.table,))
        oid, self._table_text, rowtype, ttl_s, backoff_s, renew_s, idle_s, query_s = \
            cur.fetchone()  # type: ignore[misc]
        if ttl_s <= 0 or backoff_s < 0:
            raise Error(f"ttl must be positive and backoff not negative, got {self.ttl!r}, {self.backoff!r}")
        if renew_s is not None and not 0 < renew_s < ttl_s:
            raise Error(f"renew_interval must be above 0 and below the ttl ({ttl_s:g} s), got {self.renew_interval!r}")
        if (idle_s is not None and idle_s < 0) or (query_s is not None and query_s < 0):
            raise Error("idle_in_transaction_timeout and query_timeout must not be negative, got"
                        f" {self.idle_in_transaction_timeout!r}, {self.query_timeout!r}")
        self._ttl_s = ttl_s
        self._renew_s = ttl_s / 3 if renew_s is None else renew_s
        self._idle_s = ttl_s if idle_s is None else idle_s
        self._query_s = ttl_s if query_s is None else query_s
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
                and self.method in (None, "pg_hash") and not self._tenants and self.shard_keys is None:
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
        items = "my_items({args})"
        if self._tenants:
            # tenants (docs/tenants.md): my_items_fair takes the slot's tenants
            # in turn; it has no cursor, so each batch reads the slot's first
            # pending rows again (the handler's done rows are no longer among
            # them). The slot is slot_of(route, n), route defaulting to the
            # key as for my_items, or slot_of_spread(route, key, n, spread).
            items = "my_items_fair({args})"
            args += [sql.SQL("fair => %(fair)s"), sql.SQL("route => %(route)s")]
            if self.spread is not None:
                args.append(sql.SQL("spread => %(spread)s"))
        else:
            if self._method is not None:
                args.append(sql.SQL("method => %(method)s"))
            if self.route is not None:
                args.append(sql.SQL("route => %(route)s"))
            args.append(sql.SQL("after => %(after)s::text"))
        counted = args[:-1] + [sql.SQL("after => %(count_after)s::text"), sql.SQL("batch => %(bound)s"),
                               sql.SQL("pending => %(pending)s")]
        args += [sql.SQL("batch => %(batch)s"), sql.SQL("pending => %(pending)s")]
        k = sql.Identifier(key)
        if self.shard_keys is not None:
            share = self._shard_share(conn, oid, key)
            fetched, windowed = share("%(after)s", "%(batch)s"), share("%(count_after)s", "%(bound)s")
        else:
            fetched = sql.SQL(items).format(args=sql.SQL(", ").join(args))
            windowed = sql.SQL(items).format(args=sql.SQL(", ").join(counted))
        # balance: COUNT_SQL; my_items_fair has no cursor: no count
        self._count = None if self._tenants else sql.SQL(COUNT_SQL).format(items=windowed, k=k).as_string(conn)
        # the fetch with the batch's failure records, and without them (while
        # the name has none)
        self._fetch, self._fetch_plain = (sql.SQL(
            "WITH t AS (SELECT * FROM {items} s)"
            " SELECT t.*, t.{k}::text AS {kc}, f.state AS {sc},"
            " extract(epoch FROM f.retry_at - clock_timestamp())::float8 AS {rc}" + end).format(
                items=fetched, k=k, kc=sql.Identifier(_KEY), name=sql.SQL("%(name)s"),
                sc=sql.Identifier(_STATE), rc=sql.Identifier(_RETRY)).as_string(conn)
            for end in (FAILURES_SQL, NO_FAILURES_SQL))

    def _shard_share(self, conn: psycopg.Connection, oid: int, key: str) -> Callable[[str, str], sql.Composable]:
        """Citus (docs/scale-out.md, "The worker library on Citus"): the
        slot's share read with the slot's shard key as well, so that Citus
        sends it to the one shard holding it. The rows of the slot by the
        mapping (slot_of(route, n), as my_items with method auto) that have
        the slot's shard key, after the cursor, in key order."""
        types = dict(conn.execute(
            "SELECT attname, pg_catalog.format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute"
            " WHERE attrelid = %s AND attname IN (%s, %s) AND attnum > 0 AND NOT attisdropped",
            (oid, key, self.shard_column)).fetchall())
        for column, option in ((self.shard_column, "shard_column"), (key, "key")):
            if column not in types:
                raise Error(f"{self._table_text} has no column {column!r} (option {option})")

        def share(after: str, batch: str) -> sql.Composable:
            return sql.SQL(
                "(SELECT * FROM {t} WHERE {s} = %(shard)s AND slot_of({r}, %(n)s) = %(slot)s AND {p}"
                " AND ({a}::text IS NULL OR {k} > {a}::text::{kt}) ORDER BY {k} LIMIT {b})").format(
                t=sql.SQL(self._table_text), s=sql.Identifier(self.shard_column),
                r=sql.Identifier(self.route or key), p=self._pending_sql, a=sql.SQL(after), k=sql.Identifier(key),
                kt=sql.SQL(types[key]), b=sql.SQL(batch))
        return share

    def _table_for(self, conn: psycopg.Connection, slot: int) -> sql.Composable:
        if not self._partitioned:
            return sql.SQL(self._table_text)
        if slot not in self._partitions:
            (p,) = conn.execute("SELECT slot_partition(%s::regclass, %s, %s)::text",
                                (self._table_text, slot, self.n)).fetchone()  # type: ignore[misc]
            self._partitions[slot] = sql.SQL(p)
        return self._partitions[slot]

    def _params(self, slot: int, after: Optional[str]) -> Dict[str, Any]:
        return {"slot": slot, "n": self.n, "key": self._key, "method": self._method,
                "route": (self.route or self._key) if self._tenants else self.route, "fair": self.fair or self.route,
                "spread": self.spread, "after": after, "batch": self.batch, "pending": self.pending,
                "name": self.name, "shard": None if self.shard_keys is None else self._shard_key(slot)}

    def _shard_key(self, slot: int) -> Any:
        key = self.shard_keys.get(slot) if self.shard_keys is not None else None
        if key is None:
            raise Error(f"shard_keys has no key for slot {slot} of n = {self.n}: give every slot its shard key")
        return key

    @property
    def _tenants(self) -> bool:
        """The batches are my_items_fair's (options fair or spread)."""
        return self.fair is not None or self.spread is not None
