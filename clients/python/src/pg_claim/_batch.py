"""One batch of a Worker: its fenced transaction, the handler, and the
failure path item by item (record_failure)."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from ._conn import TRANSIENT_LIMIT, interval_param, transient

log = logging.getLogger("pg_claim")

Row = Dict[str, Any]
# the columns the fetch adds to the table's own (taken off before the handler sees a row)
_KEY, _STATE, _RETRY = "__pg_claim_key", "__pg_claim_state", "__pg_claim_retry_in"
_IDLE, _INTRANS = psycopg.pq.TransactionStatus.IDLE, psycopg.pq.TransactionStatus.INTRANS


class Error(Exception):
    """An error of the worker's set-up or configuration (not of an item)."""


class PoolerError(Error):
    """Session mode on a connection that is not one server session: a
    transaction-mode pooler is in between."""


class Batch(List[Row]):
    """The rows of one batch (a list of dicts, one per row, the table's
    columns), with where they come from:

    - `name`, `slot`, `token`: the fleet, the slot whose share they are, and
      the fencing token that passed in this transaction (None in session
      mode, where the session's own lock holds the slot);
    - `table`: an SQL fragment (psycopg.sql.Composable) naming the table to
      write them in: the slot's own partition (slot_partition) when the table
      is hash-partitioned with modulus n by the key (or route) column, else
      the table itself. `sql.SQL("UPDATE {} SET ...").format(rows.table)`.
    """

    name: str
    slot: int
    token: Optional[int]
    table: sql.Composable

    def __init__(self, rows: Sequence[Row], name: str, slot: int, token: Optional[int],
                 table: sql.Composable) -> None:
        super().__init__(rows)
        self.name, self.slot, self.token, self.table = name, slot, token, table


Handler = Callable[[psycopg.Connection, Batch], Any]


class _SlotLost(Exception):
    """The fence refused the slot's token (PC001), or session mode lost it."""


class _Ended(Exception):
    """The handler ended the batch's transaction (or left it aborted)."""


Keys = Dict[int, Tuple[str, Optional[str]]]  # id(row) -> (item, state of its failure record)


class Batches:
    """The batch machinery of Worker (which sets what it reads: name, n,
    handler, the fetch, the table's key and pending predicate, the
    intervals, stats and events)."""

    name: str
    batch: int
    handler: Handler
    max_attempts: int
    backoff: Any
    stats: Any
    _ttl_s: float
    _fetch: str
    _key: str
    _pending_sql: sql.Composable
    # slot -> (first item of its last batch, transient failures of it in a row)
    _strikes: Dict[int, Tuple[str, int]]
    # slots whose next batch goes item by item (TRANSIENT_LIMIT reached)
    _forced: Dict[int, bool]
    # slot -> item -> error: failures to record once connected again
    _owed: Dict[int, Dict[str, str]]

    def _emit(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def _table_for(self, conn: psycopg.Connection, slot: int) -> sql.Composable:
        raise NotImplementedError

    def _params(self, slot: int, after: Optional[str]) -> Dict[str, Any]:
        raise NotImplementedError

    def _begin(self, conn: psycopg.Connection, slot: int, token: Optional[int],
               fetch: Optional[Dict[str, Any]] = None) -> List[Row]:
        """Opens the batch's transaction in one message (one round trip):
        BEGIN; the guard, its first statement (lease: fence, which keeps the
        slot until the transaction ends; session: the session's own lock),
        which also lets the transaction stay idle at most ttl at a time and
        each of its statements run at most ttl (SET LOCAL
        idle_in_transaction_session_timeout, statement_timeout); then, with
        `fetch` (the fetch's parameters), the slot's next rows, returned.
        One simple-protocol message, not a pipeline: a worker stopped while
        sending it leaves no transaction open, and one stopped after it
        leaves one that the server ends after ttl. Raises _SlotLost (rolled
        back) when the slot is no longer this worker's; on success the
        transaction is open: end it with _commit or _rollback."""
        ms = str(max(1, int(self._ttl_s * 1000)))
        params = {"slot": slot, "name": self.name, "token": token, "idle": ms}
        if token is None:
            q = "BEGIN; SELECT %(slot)s = ANY (my_slots(%(name)s)) AS mine"
        else:
            q = "BEGIN; SELECT fence(%(name)s, %(slot)s, %(token)s::bigint)"
        q += (", set_config('idle_in_transaction_session_timeout', %(idle)s, true),"
              " set_config('statement_timeout', %(idle)s, true)")
        if fetch is not None:
            q += "; " + self._fetch
            params.update(fetch)
        cur = psycopg.ClientCursor(conn, row_factory=dict_row)
        try:
            cur.execute(q, params)
            cur.nextset()
            mine = cur.fetchone()
            if token is None and not (mine and mine["mine"]):
                raise _SlotLost()
            rows: List[Row] = []
            if fetch is not None:
                cur.nextset()
                rows = cur.fetchall()
            return rows
        except BaseException as e:
            self._rollback(conn)
            if isinstance(e, psycopg.Error) and e.sqlstate == "PC001":
                raise _SlotLost() from None
            raise
        finally:
            cur.close()

    @staticmethod
    def _rollback(conn: psycopg.Connection) -> None:
        """Ends the batch's transaction without its work, if the connection
        still has one (a lost connection: nothing to do)."""
        if conn.closed or conn.broken or conn.info.transaction_status == _IDLE:
            return
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            if not (conn.closed or conn.broken):
                raise

    @staticmethod
    def _ended(conn: psycopg.Connection) -> Optional[str]:
        """Right after the handler, before any other statement: why the
        batch's transaction is no longer open for the worker to commit (the
        handler ran COMMIT or ROLLBACK, or caught a statement's error and
        went on), or None. A lost connection is not this (transient)."""
        if conn.closed or conn.broken:
            return None
        status = conn.info.transaction_status
        if status == _IDLE:
            return ("the batch's transaction was ended inside the handler (COMMIT or ROLLBACK on tx):"
                    " leave that to the worker, which commits after the handler returns")
        if status != _INTRANS:
            return ("an error of a statement inside the handler was caught and ignored: the transaction"
                    " is aborted, so nothing of the batch can commit")
        return None

    @staticmethod
    def _commit(conn: psycopg.Connection) -> None:
        if conn.execute("COMMIT").statusmessage == "ROLLBACK":
            raise Error("the batch's transaction was aborted, so COMMIT rolled it back")

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

    def _step(self, conn: psycopg.Connection, slot: int, token: Optional[int],
              after: Optional[str]) -> Tuple[int, bool, Optional[float], Optional[str]]:
        """One batch of the slot's share after `after`: (items handled,
        whether the share was walked to its end, seconds until the first
        held-back item of the batch is due, the cursor to go on from)."""
        table = self._table_for(conn, slot)
        if self._owed.get(slot):
            self._pay_owed(conn, slot, token, table)
        t0 = time.monotonic()
        rows = self._begin(conn, slot, token, self._params(slot, after))
        todo: List[Row] = []
        recheck = False
        try:
            end = len(rows) < self.batch
            cursor = None if end else rows[-1][_KEY]
            retry_in = None
            keys: Keys = {}
            for r in rows:
                k, state, due_in = r.pop(_KEY), r.pop(_STATE), r.pop(_RETRY)
                if state in (None, "due"):
                    keys[id(r)] = (k, state)
                    todo.append(r)
                elif state == "retry" and due_in is not None:
                    retry_in = due_in if retry_in is None else min(retry_in, due_in)
            if not todo:  # nothing to do here: the transaction ends
                self._commit(conn)
                return 0, end, retry_in, cursor
            if self._forced.pop(slot, False):
                raise _Ended("item by item")  # TRANSIENT_LIMIT reached: the failure path
            try:
                self.handler(conn, Batch(todo, self.name, slot, token, table))
            finally:
                ended = self._ended(conn)  # before any other statement
                # ended by the handler: its COMMIT may have done rows
                recheck = ended is not None and conn.info.transaction_status == _IDLE
            if ended is not None:
                raise _Ended(ended)
            cleared = [keys[id(r)][0] for r in todo if keys[id(r)][1] is not None]
            if cleared:
                conn.execute("SELECT clear_failure(%s, VARIADIC %s::text[])", (self.name, cleared))
            self._commit(conn)
            self._strikes.pop(slot, None)
            done, failed = len(todo), 0
        except BaseException as e:
            self._rollback(conn)
            if not isinstance(e, Exception) or not todo:
                raise
            forced = False
            if transient(e, conn):
                if not self._strike(slot, keys[id(todo[0])][0]):
                    raise
                # TRANSIENT_LIMIT in a row: the failure path, on this
                # connection if it still works, else on the next one
                if conn.broken or conn.closed:
                    self._forced[slot] = True
                    raise
                forced = True
            elif isinstance(e, _Ended):
                forced = e.args[0] == "item by item"
            log.debug("batch of slot %d failed (%s): retrying item by item", slot, e)
            done, failed, retry = self._one_by_one(conn, slot, token, todo, keys, table, forced, recheck)
            if retry is not None:
                retry_in = retry if retry_in is None else min(retry_in, retry)
        seconds = time.monotonic() - t0
        if done:
            self.stats.batch(slot, done, seconds)
        self._emit("batch", slot=slot, token=token, items=done, failed=failed, seconds=seconds)
        return done, end, retry_in, cursor

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
        self._emit("dead" if dead else "failed", slot=slot, item=item, error=error, attempts=attempts)
        return None if dead else due_in

    def _pay_owed(self, conn: psycopg.Connection, slot: int, token: Optional[int],
                  table: sql.Composable) -> None:
        """Records the failures of items whose handler lost the connection
        (after TRANSIENT_LIMIT transient failures in a row)."""
        owed = self._owed.get(slot, {})
        for item in sorted(owed):
            self._record(conn, slot, token, table, item, owed[item])
            owed.pop(item)
