"""The failure path of a Worker: a failed batch again item by item, each
item in a fenced transaction of its own, the failing ones recorded with
record_failure (retried after the back-off, dead after max_attempts)."""
from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional, Tuple

import psycopg
from psycopg import sql

from ._conn import TRANSIENT_LIMIT, interval_param, transient
from ._types import _IDLE, Batch, Keys, Row

log = logging.getLogger("pg_claim")

# How long a worker goes by an answer of has_failures (docs/failures.md).
CHECK_EVERY_S = 1.0


class Records:
    """Whether the fleet's name has failure records, as has_failures last
    answered: while it has none, a batch's fetch leaves the join with
    item_failures out. A lease-mode batch asks again in its first statement
    when the last answer is CHECK_EVERY_S old, or when it is the first batch
    of its slot with this token (the slot's former holders may have recorded
    failures; a holder's records are fenced, so none comes later); a
    failure this worker records counts at once. Session mode always joins.
    The same rule as clients/node/lib/failures.js."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._any: Optional[bool] = None  # None: not asked yet
        self._at = 0.0
        self._gen = 0  # counts this worker's records: an answer asked before one is stale
        self._checked: Dict[int, Optional[int]] = {}  # slot -> the token last checked with

    def plan(self, slot: int, token: Optional[int], now: float) -> Tuple[bool, bool, int]:
        """(ask has_failures in this batch, join the failure records, the
        generation to pass to answered)."""
        with self._lock:
            if token is None:
                return False, True, self._gen
            ask = self._any is None or now - self._at >= CHECK_EVERY_S or self._checked.get(slot) != token
            return ask, ask or bool(self._any), self._gen

    def answered(self, slot: int, token: Optional[int], any_: bool, now: float, gen: int) -> None:
        with self._lock:
            self._checked[slot] = token
            if gen == self._gen:
                self._any, self._at = bool(any_), now

    def recorded(self) -> None:
        """This worker records a failure (before the statement)."""
        with self._lock:
            self._gen += 1
            self._any = True


class Failures:
    """The failure path of a Worker (mixed into Worker)."""

    def _is_pending(self, conn: psycopg.Connection, table: sql.Composable, row: Row) -> bool:
        """Whether the row is still to do (a handler that committed itself
        may have done it already)."""
        q = sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE {} = %s AND {})").format(
            table, sql.Identifier(self._key), self._pending_sql)
        return bool(conn.execute(q, (row[self._key],)).fetchone()[0])  # type: ignore[index]

    def _strike(self, slot: int, first: str) -> bool:
        """A transient failure of the slot's batch whose first item is
        `first`: True when it is the TRANSIENT_LIMIT-th in a row."""
        item, count = self._strikes.get(slot, (first, 0))
        count = count + 1 if item == first else 1
        if count >= TRANSIENT_LIMIT:
            self._strikes.pop(slot, None)
            return True
        self._strikes[slot] = (first, count)
        return False

    def _one_by_one(self, conn: psycopg.Connection, slot: int, token: Optional[int], todo: List[Row],
                    keys: Keys, table: sql.Composable, forced: bool,
                    recheck: bool) -> Tuple[int, int, Optional[float]]:
        """The batch again, one item per fenced transaction: the failing
        items are recorded (record_failure), the others commit. `forced`:
        a transient error of the handler is the item's failure too;
        `recheck`: the handler committed the batch itself, so skip the rows
        no longer pending. (done, failed, seconds until the first recorded
        retry)."""
        done = failed = 0
        retry_in = None
        for r in todo:
            item, state = keys[id(r)]
            error: Optional[str] = None
            ended: Optional[str] = None
            idle = False
            self._begin(conn, slot, token)
            try:
                if recheck and not self._is_pending(conn, table, r):
                    self._commit(conn)  # done by the handler's own COMMIT: no record, not counted
                    self._emit("transaction_ended", slot=slot, item=item,
                               error="the handler ended the batch's transaction after its row was done")
                    continue
                try:
                    self.handler(conn, Batch([r], self.name, slot, token, table))
                except Exception as e:
                    if transient(e, conn) and not forced:
                        raise
                    error = str(e).strip() or type(e).__name__
                finally:
                    ended = self._ended(conn)  # before any other statement
                    idle = ended is not None and conn.info.transaction_status == _IDLE
                if error is None and (conn.closed or conn.broken):
                    if not forced:
                        raise psycopg.OperationalError(f"the connection was closed in the handler of item {item}")
                    error = "the connection was closed in the handler"
                if error is None and ended is None:
                    if state is not None:
                        conn.execute("SELECT clear_failure(%s, %s)", (self.name, item))
                    self._commit(conn)
                    done += 1
                    continue
            except BaseException:
                self._rollback(conn)
                raise
            self._rollback(conn)
            if conn.broken or conn.closed:  # forced, and the handler's error took the connection
                self._owed.setdefault(slot, {})[item] = error or "the connection was lost"
                raise psycopg.OperationalError(f"the connection was lost in the handler of item {item}: {error}")
            due = self._record(conn, slot, token, table, item, error or ended or "", r if idle else None)
            if due is not False:
                failed += 1
                if due is not None:
                    retry_in = due if retry_in is None else min(retry_in, due)
        return done, failed, retry_in

    def _record(self, conn: psycopg.Connection, slot: int, token: Optional[int], table: sql.Composable,
                item: str, error: str, check: Optional[Row] = None) -> Any:
        """record_failure of one item in a fenced transaction of its own,
        reported once committed. `check`: record only if the row is still
        pending. Returns the seconds until its retry (None: dead), or False
        when nothing was recorded."""
        self._begin(conn, slot, token)
        try:
            if check is not None and not self._is_pending(conn, table, check):
                self._commit(conn)
                return False
            self._records.recorded()
            (outcome,) = conn.execute(
                "SELECT record_failure(%s, %s, %s, %s, %s)",
                (self.name, item, error, self.max_attempts,
                 interval_param(self.backoff))).fetchone()  # type: ignore[misc]
            attempts, due_in = conn.execute(
                "SELECT f.attempts, extract(epoch FROM f.retry_at - clock_timestamp())::float8"
                " FROM item_failures(%s, %s) f", (self.name, item)).fetchone() or (None, None)  # type: ignore[misc]
            self._commit(conn)
        except BaseException:
            self._rollback(conn)
            raise
        dead = outcome == "dead"
        self.stats.failure(slot, dead)
        if dead:
            self._emit("dead", slot=slot, item=item, error=error, attempts=attempts, state="dead")
        else:
            self._emit("failed", slot=slot, item=item, error=error, attempts=attempts, state="retry")
        return None if dead else due_in

    def _pay_owed(self, conn: psycopg.Connection, slot: int, token: Optional[int],
                  table: sql.Composable) -> None:
        """Records the failures of items whose handler lost the connection
        (after TRANSIENT_LIMIT transient failures in a row)."""
        owed = self._owed.get(slot, {})
        for item in sorted(owed):
            self._record(conn, slot, token, table, item, owed[item])
            owed.pop(item)
