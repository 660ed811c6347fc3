"""pg_claim.Worker: the worker of a pg_claim fleet, made of its parts (one
file each): the configuration (_config), the claims (_claimer), an online
resize of the fleet (_resize), the walk and the fence (_walk), the failure path (_failures), the wake-ups (_wake),
the signals (_signals) and the metrics (_metrics)."""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, Optional

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ._claimer import Claimer
from ._config import MAX_LEASE_SLOTS, MODES, Config, EventHook, make_holder
from ._conn import PAUSE_MAX, Conn, next_pause, tcp_params, transient
from ._failures import Failures
from ._metrics import serve
from ._resize import Resizer
from ._signals import install_signals
from ._types import Batch, Error, Handler, PoolerError
from ._vocabulary import EVENTS
from ._walk import Walker
from ._wake import Waker

log = logging.getLogger("pg_claim")

__all__ = ["Batch", "Error", "EventHook", "Handler", "MAX_LEASE_SLOTS", "MODES", "PoolerError", "Worker",
           "make_holder", "transient"]


class Worker(Config, Claimer, Resizer, Walker, Failures, Waker):
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
    connection
        a dict of further psycopg.connect() parameters of every connection
        (sslmode, options, ...): they win over the worker's own.
    name, n
        the fleet's name and its number of slots to start with. In lease
        mode the worker follows resize_fleet(name, n) by itself: it drops
        its slots (lost, reason "resized"), tells "resized" and claims
        again with the new n. Session fleets are not resized online.
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
    renew_interval
        lease mode: the period of claim_leases (default ttl/3; above 0, below ttl).
    idle_in_transaction_timeout, query_timeout
        the longest a batch's transaction may stay idle at a time, and the
        longest each of its statements may run, the handler's included
        (SET LOCAL idle_in_transaction_session_timeout, statement_timeout):
        default the ttl, 0 for no limit.
    key, route, method
        as in my_items: the key column (default: the primary key), the column
        mapped to the slot (default: the key), the mapping (default 'auto';
        'pg_hash' when the table is hash-partitioned with modulus n by the
        route or key column: then each slot's share is one partition).
    fair
        the tenant column (docs/tenants.md): each batch takes the slot's
        tenants in turn (my_items_fair), each tenant's rows in key order, so
        that a small tenant's rows are not stuck behind a large tenant's
        backlog in the same slot. The slot is slot_of(route, n) as without it
        (route default: the key). Needs an index on (slot expression, fair
        column, key), partial on the pending predicate.
    spread
        k: the slot is slot_of_spread(route, key, n, k), so the rows of one
        tenant (the route column, required) are on at most k slots, and so
        with at most k workers at once. The batches are my_items_fair's,
        taking the slot's tenants (fair, default: route) in turn.
    shard_column, shard_keys
        Citus (docs/scale-out.md): the column the table is distributed by,
        and a dict of each slot's value of it (every row of a slot has its
        slot's value, so each slot's share is one shard). Each batch and
        count window then reads its slot's rows with that value as well,
        one task on the one shard; method auto only, not with fair or spread.
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
    session_pool
        session mode through a pool in session mode (PgBouncer's
        pool_mode = session): each client has its own server connection, so
        the start-up reply's process is not compared with the server's.
    metrics_port
        serve Prometheus metrics on this port (/metrics): needs
        prometheus_client (pip install 'pg-claim[metrics]').
    metrics_host
        the address the metrics server listens on ("127.0.0.1": this
        machine only; "0.0.0.0" or "::" for every interface).
    on_event
        on_event(event, fields) for logging and metrics, called from the
        worker's threads; the events are those of docs/libraries.md
        (pg_claim.describe() lists them).

    The options, their defaults and the events are the Node.js library's
    too, in camelCase: docs/libraries.md.
    """

    def run(self) -> None:
        """Work until stop() is called or SIGTERM/SIGINT arrives (handled when
        run() is called from the main thread): finish the batch at hand, give
        the slots back (lease mode: claim_leases(..., max => 0); session
        mode: release_slot), and return. Reconnects after a lost connection or
        a server restart. Raises Error (PoolerError) for a set-up that cannot
        work, and the server's error for one that is not the connection's
        (a wrong column, missing privileges, another mode on the name)."""
        restore = install_signals(self.stop)
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
        self._claim_now.set()

    @property
    def slots(self) -> Dict[int, Optional[int]]:
        """slot -> token of the slots held now (token None in session mode)."""
        snap = self._held.snapshot()
        return {s: (t if self.running_mode == "lease" else None) for s, t in snap.items()}

    def _emit(self, event: str, **fields: Any) -> None:
        if event not in EVENTS:  # the vocabulary of docs/libraries.md, shared with pg-claim
            raise ValueError(f"pg_claim: {event!r} is not an event of the vocabulary")
        log.debug("%s %s", event, fields)
        if self.on_event is not None:
            try:
                self.on_event(event, fields)
            except Exception:  # a hook never stops the worker
                log.exception("on_event(%r) raised", event)

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
        extra.update(self.connection)  # the caller's driver settings win
        conn = Conn.connect(conninfo, autocommit=True, prepare_threshold=None, **extra)
        conn.deadline_s = float("inf") if session else max(1.5, deadline * ttl_s)
        conn.stop, conn.stop_grace_s = self._stop, self._grace()
        return conn

    def _pause_cap(self) -> float:
        """The longest back-off: PAUSE_MAX, at most ttl/3 in lease mode."""
        if self.running_mode == "lease" and self._ttl_s:
            return max(0.1, min(PAUSE_MAX, self._ttl_s / 3))
        return PAUSE_MAX

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
