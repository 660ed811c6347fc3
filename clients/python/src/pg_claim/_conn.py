"""The Worker's connections: what is transient, the back-off, and the bounds
on every wait (TCP keepalives and tcp_user_timeout, connect_timeout, and a
deadline on each reply), so that a network path that drops packets without
a FIN or RST never wedges a worker."""
from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from typing import Any, Dict, Optional, Tuple, Union

import psycopg

Interval = Union[str, int, float, datetime.timedelta]

# The back-off after a transient failure (a lost connection, a batch that
# failed with an error of class 08, 40, 53, 57 or 58): PAUSE_FIRST seconds,
# doubled at each failure in a row up to PAUSE_MAX (and never over ttl/3 in
# lease mode). After TRANSIENT_LIMIT transient failures in a row of a batch
# with the same first item, the batch goes through the failure path item by
# item (record_failure). The Node.js library has the same constants.
PAUSE_FIRST = 0.1
PAUSE_MAX = 5.0
TRANSIENT_LIMIT = 5


def next_pause(pause: Optional[float], cap: float = PAUSE_MAX) -> float:
    """The pause after `pause` (None: the first failure in a row)."""
    return min(cap, PAUSE_FIRST if pause is None else pause * 2)


def transient(e: BaseException, conn: Optional[psycopg.Connection] = None,
              own: bool = False) -> bool:
    """Whether an error is the connection's or the server's state, not the
    work's: a lost connection, a server shutting down or restarting, a
    serialization failure or deadlock, resources exhausted. `own`: the
    error came from one of the Worker's own statements (claim, fetch,
    fence, commit), never from the handler, so a cancel (57014) and a lock
    wait given up (55P03) are transient too."""
    if not isinstance(e, psycopg.Error):
        return False
    if conn is not None and (conn.broken or conn.closed):
        return True
    state = e.sqlstate
    if state is None:
        return isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError))
    if state in ("57014", "55P03"):
        # query_canceled, lock_not_available: a statement_timeout or
        # lock_timeout in the handler is the item's; in the Worker's own
        # statement it is the server's state (a claim gives up waiting for
        # its fleet's claim mutex after ttl / 3)
        return own
    return state[:2] in ("08", "40", "53", "57", "58")


def seconds(v: Interval) -> Optional[float]:
    """An interval given as a number of seconds or a timedelta, in seconds;
    None for text (the server reads it)."""
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        return None
    raise TypeError(f"an interval must be text ('5 seconds'), seconds or a timedelta, got {v!r}")


def interval_param(v: Interval) -> Union[str, datetime.timedelta]:
    s = seconds(v)
    return datetime.timedelta(seconds=s) if s is not None else str(v)


def tcp_params(params: Dict[str, Any], ttl_s: float) -> Dict[str, Any]:
    """libpq parameters that bound a dead network path by the ttl, those the
    connection string does not set: keepalive probes after ttl/3 idle, every
    ttl/9, 3 of them; unacknowledged data given up after 2/3 of the ttl; a
    connection attempt given up after ttl/3 (libpq's least: 2 s). libpq
    ignores the TCP ones on a Unix-domain socket."""
    third = max(1, int(ttl_s / 3))
    want = {"keepalives": 1, "keepalives_idle": third, "keepalives_interval": max(1, int(ttl_s / 9)),
            "keepalives_count": 3, "tcp_user_timeout": max(1000, int(ttl_s * 2000 / 3))}
    if not os.environ.get("PGCONNECT_TIMEOUT"):
        want["connect_timeout"] = max(2, third)
    return {k: v for k, v in want.items() if k not in params}


class NoReply(psycopg.OperationalError):
    """The server did not answer within the connection's deadline: the
    connection is taken for lost (closed under the waiting statement)."""


class Conn(psycopg.Connection):  # type: ignore[type-arg]
    """A psycopg connection whose every wait for the server (each statement,
    COMMIT, ROLLBACK) is bounded by `deadline_s` (inf: none): past it the
    socket is shut down, the wait ends with NoReply and the connection is
    broken. After `stop` is set, a wait has at most `stop_grace_s` more."""

    deadline_s: Optional[float] = None
    stop: Optional[threading.Event] = None
    stop_grace_s: float = 0.0
    timed_out: Optional[float] = None

    def wait(self, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
        if self.deadline_s is None:
            return super().wait(*args, **kw)
        key = WATCHDOG.guard(self)
        try:
            return super().wait(*args, **kw)
        except psycopg.OperationalError as e:
            if self.timed_out is not None:
                raise NoReply(f"no reply from the server within {self.timed_out:g} s: the connection"
                              " is taken for lost") from e
            raise
        finally:
            WATCHDOG.release(key)


class _Watchdog:
    """One thread for the process: shuts down the socket of a Conn whose
    wait outlived its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waits: Dict[int, Tuple[Conn, float, float, int]] = {}  # key -> conn, start, end, fd
        self._next = 0
        self._thread: Optional[threading.Thread] = None
        # the thread waits without a timeout (no wait to watch): a new one must wake it
        self._asleep = False

    def guard(self, conn: Conn) -> int:
        """Registers a wait of `conn` (0: none, the connection has no socket)."""
        now = time.monotonic()
        try:
            fd = conn.pgconn.socket
        except psycopg.Error:
            return 0
        with self._cond:
            self._next += 1
            key = self._next
            assert conn.deadline_s is not None
            self._waits[key] = (conn, now, now + conn.deadline_s, fd)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True, name="pg_claim watchdog")
                self._thread.start()
            elif self._asleep:
                # only then: a thread that looks every 0.2 s sees the wait by
                # itself (a deadline is at least 1.5 s), and a wake-up per
                # statement costs the workers' threads the GIL
                self._asleep = False
                self._cond.notify()
        return key

    def release(self, key: int) -> None:
        with self._cond:
            self._waits.pop(key, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for key, (conn, start, end, fd) in list(self._waits.items()):
                    if conn.stop is not None and conn.stop.is_set() and end > now + conn.stop_grace_s:
                        end = now + conn.stop_grace_s
                        self._waits[key] = (conn, start, end, fd)
                    if now >= end:
                        del self._waits[key]
                        conn.timed_out = round(now - start, 1)
                        try:
                            s = socket.socket(fileno=os.dup(fd))
                            try:
                                s.shutdown(socket.SHUT_RDWR)
                            finally:
                                s.close()
                        except OSError:
                            pass
                # the stop events are looked at every 0.2 s
                self._asleep = not self._waits
                self._cond.wait(None if self._asleep else 0.2)
                self._asleep = False


WATCHDOG = _Watchdog()
