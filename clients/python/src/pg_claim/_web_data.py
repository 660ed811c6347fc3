"""What `pg-claim web` reads and does in the database, and the samples of its
rate plot.

Reads only through the views `fleets` and `fleet_slots` (security_invoker:
with the rights of the connection's role) and the functions
`lease_holders` and `item_failures`; acts only through `clear_failure` and
`release_lease`, whose own privilege checks decide. Every query is fixed
text with the fleet's schema as an identifier; the request's values are
bind parameters."""
from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Dict, List, Optional, Tuple

from psycopg import sql
from psycopg.rows import dict_row

from .cli import Fleets, Row, rates

PAGE_SIZE = 25


class Views(Fleets):
    """The fleet views of Fleets, and the lease and failure functions of the
    same schema (the extension's, or the portable edition's)."""

    def _fn(self, name: str) -> sql.Composable:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(name))

    def _rows(self, q: sql.Composable, params: Tuple[Any, ...]) -> List[Row]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(q, params).fetchall()

    def leases(self, fleet: str) -> Dict[int, Row]:
        """slot -> its lease_holders row (the latest when a slot has several),
        with expires_in (NULL for a session record)."""
        q = sql.SQL("SELECT l.slot, l.holder, l.token, l.acquired_at, l.expires_at, l.expired,"
                    " l.expires_at - now() AS expires_in FROM {}(%s) l"
                    " ORDER BY l.slot, l.acquired_at").format(self._fn("lease_holders"))
        return {r["slot"]: r for r in self._rows(q, (fleet,))}

    def failures(self, fleet: str, page: int) -> Tuple[int, List[Row]]:
        """The number of failure records of the fleet, and those of page
        `page` (0-based), by item."""
        q = sql.SQL("SELECT f.item, f.state, f.attempts, f.last_error, f.last_failed_at, f.retry_at,"
                    " f.retry_at - now() AS retry_in, count(*) OVER () AS total"
                    " FROM {}(%s) f ORDER BY f.item LIMIT %s OFFSET %s").format(self._fn("item_failures"))
        rows = self._rows(q, (fleet, PAGE_SIZE, page * PAGE_SIZE))
        if rows:
            return int(rows[0]["total"]), rows
        total = self._rows(sql.SQL("SELECT count(*) AS n FROM {}(%s)").format(self._fn("item_failures")),
                           (fleet,))[0]["n"]
        return int(total), []

    def item_state(self, fleet: str, item: str) -> Optional[str]:
        q = sql.SQL("SELECT f.state FROM {}(%s, VARIADIC ARRAY[%s::text]) f").format(self._fn("item_failures"))
        rows = self._rows(q, (fleet, item))
        return rows[0]["state"] if rows else None

    def clear(self, fleet: str, item: str) -> int:
        """clear_failure(fleet, item): how many records it removed."""
        q = sql.SQL("SELECT {}(%s, VARIADIC ARRAY[%s::text]) AS n").format(self._fn("clear_failure"))
        return int(self._rows(q, (fleet, item))[0]["n"])

    def release(self, fleet: str, slot: int, token: int) -> bool:
        """release_lease(fleet, slot, token): false when the token does not
        hold the lease, or the role lacks the privileges of its owner."""
        q = sql.SQL("SELECT {}(%s, %s::integer, %s::bigint) AS ok").format(self._fn("release_lease"))
        return bool(self._rows(q, (fleet, slot, token))[0]["ok"])


class Samples:
    """The pending counts the pages read, per fleet and database: each slot's
    rate (the fall of its pending count per second since the previous
    sample) and the fleet's rate over the last minutes, for the plot."""

    KEEP_S = 600.0
    MIN_GAP_S = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: Dict[str, Deque[Tuple[float, Dict[int, Optional[int]]]]] = {}

    def add(self, key: str, slots: List[Row]) -> Dict[int, Optional[float]]:
        """Records the slots' pending counts (at most one sample a second)
        and returns each slot's rate since the sample before."""
        if not slots:
            return {}
        now = float(slots[0]["now"])
        with self._lock:
            q = self._data.setdefault(key, collections.deque())
            if not q or now - q[-1][0] >= self.MIN_GAP_S:
                prev = q[-1] if q else None
                q.append((now, {s["slot"]: s["pending"] for s in slots}))
            else:  # a read within a second of the last sample: the rate since the one before
                prev = q[-2] if len(q) > 1 else None
            while q and now - q[0][0] > self.KEEP_S:
                q.popleft()
        if prev is None:
            return {s["slot"]: None for s in slots}
        return rates(slots, {"at": prev[0], "pending": {str(k): v for k, v in prev[1].items()}})

    def series(self, key: str, window_s: float = 300.0) -> List[Tuple[float, float]]:
        """(seconds before the last sample, items/s of the fleet) between
        consecutive samples of the last window_s seconds."""
        with self._lock:
            q = list(self._data.get(key, ()))
        if len(q) < 2:
            return []
        last = q[-1][0]
        out = []
        for (t0, p0), (t1, p1) in zip(q, q[1:]):
            if last - t1 > window_s or t1 <= t0 or None in p0.values() or None in p1.values():
                continue
            out.append((last - t1, (sum(v or 0 for v in p0.values()) - sum(v or 0 for v in p1.values())) / (t1 - t0)))
        return out

