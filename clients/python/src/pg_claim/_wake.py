"""The wake-ups of a Worker: LISTEN on the held slots' channels, and the
idle wait for a notification, a change of slots, the poll or a retry."""
from __future__ import annotations

import select
import time
from typing import Callable, Dict, Optional, Tuple

import psycopg
from psycopg import sql

from ._conn import next_pause, transient
from ._types import PoolerError

Due = Dict[int, Dict[Optional[str], float]]


class Waker:
    """The wake-ups of a Worker (mixed into Worker)."""

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
