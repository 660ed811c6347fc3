"""A Worker following an online resize of its fleet (lease mode).

resize_fleet(name, n) waits for the fenced batches in flight, invalidates
every lease of the name and sets the fleet's new n; from then on
claim_leases with the old n raises PC002 and every old token fails its
fence with PC001. The worker learns it either way: the claimer's call
(PC002), or a batch whose fence refused its token while fleet_n(name)
says another n (without that look a refused fence would be told as
`taken`, which it is not). It then reads the new n, drops every held slot
(reason `resized`: the tokens are dead), rebuilds what depends on n (the
claim, the fetch's n, the partition of each slot) and claims again at
once. The n option stays the n a worker starts with.

Session fleets are not resized online (their slots are session locks of
claim_slots with a fixed n): a PC002 or 55000 from the server stops a
session-mode worker with Error."""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional

import psycopg

from ._config import MAX_LEASE_SLOTS
from ._types import Error

log = logging.getLogger("pg_claim")

# the SQLSTATE of claim_leases called with a fleet's old n after resize_fleet
RESIZED = "PC002"
# session mode: what a resized (or resizing) fleet answers claim_slots with
SESSION_STATES = (RESIZED, "55000")


class Resizer:
    """The resize path of a Worker (mixed into Worker)."""

    _resize_lock: threading.Lock
    _claim_now: threading.Event

    def _fleet_n(self, conn: psycopg.Connection) -> Optional[int]:
        """The fleet's n as the server has it now (the live fleet's, else its
        definition's), or None when the name has neither."""
        row = conn.execute("SELECT fleet_n(%s)", (self.name,)).fetchone()  # type: ignore[attr-defined]
        return None if row is None or row[0] is None else int(row[0])

    def _follow(self, conn: psycopg.Connection, e: psycopg.Error, used_n: int) -> None:
        """The claimer's call with `used_n` raised PC002: read the new n and
        follow it (a no-op when the work loop followed it meanwhile). Raises
        Error when the server has no n for the name (the fleet was dropped),
        or the same n as the call's (nothing to follow)."""
        new_n = self._fleet_n(conn)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if new_n is None or new_n == used_n:
            raise Error(f"claim_leases({self.name!r}, {used_n}) was refused as resized ({first}), but"
                        f" fleet_n({self.name!r}) is {new_n if new_n is not None else 'NULL'}: nothing to"
                        " follow; start the workers again with the fleet's n") from e
        self._resized(conn, new_n)

    def _refused(self, conn: psycopg.Connection) -> bool:
        """A fence refused a token (PC001), the transaction rolled back: True
        when that was a resize (fleet_n differs from the worker's n), now
        followed; False for a slot taken by another holder."""
        try:
            new_n = self._fleet_n(conn)
        except psycopg.Error as e:
            if e.sqlstate is None or e.sqlstate[:2] in ("08", "57"):
                raise
            log.debug("fleet_n(%r) failed after a refused fence: %s", self.name, e)
            return False
        return new_n is not None and self._resized(conn, new_n)

    def _resized(self, conn: psycopg.Connection, new_n: int) -> bool:
        """Follows the fleet to `new_n` (once, whichever thread sees it
        first): drops every held slot (`lost`, reason `resized`), sets n and
        what depends on it, and has the claimer call again at once. False
        when the worker's n already is `new_n`."""
        with self._resize_lock:
            old_n = self.n
            if new_n == old_n:
                return False
            if not 1 <= new_n <= MAX_LEASE_SLOTS:
                raise Error(f"fleet {self.name!r} was resized to n = {new_n}, which this worker cannot serve"
                            f" (at most {MAX_LEASE_SLOTS} slots in lease mode)")
            self.n = new_n
            self.max_slots = min(self._max_slots_given or new_n, new_n)
            self._partitions = {}
            self._repartition(conn)
            self._backlog.clear()
            self._wanted.clear()
            self._resting.clear()
            self._emit("resized", old_n=old_n, n=new_n)
            log.info("fleet %r resized from n = %d to n = %d: claiming again", self.name, old_n, new_n)
            _, lost = self._held.replace([], time.monotonic())
            if lost:
                self._changed([], lost, "resized")
            self._claim_now.set()
            return True

    def _repartition(self, conn: psycopg.Connection) -> None:
        """A table hash-partitioned with the old n as its modulus is read
        and written through the table with the new n (each slot's share is
        no longer one partition)."""
        if not self._partitioned:
            return
        try:
            conn.execute("SELECT slot_partition(%s::regclass, 0, %s)", (self._table_text, self.n))
        except psycopg.Error as e:
            if e.sqlstate not in ("22023", "42501"):
                raise
            self._partitioned = False
            log.info("%s is not hash-partitioned with modulus %d: reading and writing it through the table",
                     self._table_text, self.n)

    def _session_resized(self, e: psycopg.Error) -> Error:
        """Session mode: the server refused claim_slots because the fleet
        was resized (PC002) or is not in a state for it (55000: its name is
        leased)."""
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return Error(f"fleet {self.name!r} (session mode, n = {self.n}): claim_slots was refused with"
                     f" {e.sqlstate}: {first}. A session fleet keeps its n for the life of its sessions (it is"
                     " not resized online), and its name cannot be leased at the same time: stop every worker"
                     " of the name and start them again in one mode with the fleet's n")
