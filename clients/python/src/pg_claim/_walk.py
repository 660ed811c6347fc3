"""The walk of a Worker: the work loop over the held slots' shares, one
batch at a time, each in a transaction that first passes the slot's fence."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg
from psycopg.rows import dict_row

from ._conn import next_pause, transient
from ._types import _IDLE, _INTRANS, _KEY, _RETRY, _STATE, Batch, Error, Keys, Row, _Ended, _SlotLost

log = logging.getLogger("pg_claim")

# slot -> cursor of the batch a held-back item was in -> when its retry is due
Due = Dict[int, Dict[Optional[str], float]]


class Walker:
    """The walk and the fence of a Worker (mixed into Worker)."""

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
                                           if until > now and held.get(s) == t},
                                     self._backlog.pick if self.balance and not session else None)
        if nxt is None:
            if not session:  # no good claim for a ttl: drop the slots, whatever the claimer does
                lost = self._held.failed(now)
                if lost:
                    self._changed([], lost, "expired")
            return False
        slot, token, after = nxt
        try:
            done, end, retry_in, cursor = self._step(conn, slot, None if session else token, after)
        except _SlotLost:
            self.stats.add("rejected")
            self._emit("rejected", slot=slot, token=None if session else token)
            if not session and self._refused(conn):  # the fleet was resized: every slot dropped
                return True
            if self._held.drop(slot, token):
                self.stats.slots(0, 1, len(self._held.snapshot()))
                self._tell_lost([(slot, token)], "taken")
            return True
        if not session and self.balance:
            before = self._backlog.weight(slot)
            self._backlog.batch_done(slot, *self._last_fetch, end=end, now=time.monotonic())
            held = self._held.snapshot()
            census = [] if self._count is None else self._backlog.census(slot, before, list(held), time.monotonic())
            if census:
                self._census(conn, {s: held[s] for s in census}, (slot, token))
            if self._wanted:  # this slot or others: none is in a batch now
                held = self._held.snapshot()
                self._hand_over(conn, {s: held.get(s) for s in sorted(self._wanted)})
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

    def _census(self, conn: psycopg.Connection, slots: Dict[int, int], own: Tuple[int, int]) -> None:
        """Counts the slots (slot -> token) from their shares' start, one
        first window each in one message, and reports their weights in one
        statement (docs/leases.md, "Balancing"), with the weight of `own`,
        the slot whose batch started the census (else its next batch, a
        turn of every held slot later, would). A failure is left to the
        slots' own next batches."""
        bound = self._backlog.census_bound()
        cur = psycopg.ClientCursor(conn)
        try:
            cur.execute("; ".join(cur.mogrify(self._count, {**self._params(s, None), "count_after": None,
                                                            "bound": bound}) for s in slots))
            counts = []
            for s in slots:
                pending, last = cur.fetchone()  # type: ignore[misc]
                counts.append((s, pending, last))
                cur.nextset()
            now = time.monotonic()
            weights = [self._backlog.counted(s, pending, last, now) for s, pending, last in counts]
            mine = None if own[0] in slots else self._backlog.to_send(own[0], now)
            if mine is not None:
                slots, weights = {**slots, own[0]: own[1]}, weights + [mine]
            cur.execute("SELECT count(report_backlog(%s, u.s, u.t, u.w, fenced_batches => true))"
                        " FROM unnest(%s::int[], %s::bigint[], %s::bigint[]) u(s, t, w)",
                        (self.name, list(slots), list(slots.values()), weights))
        except psycopg.Error as e:
            if conn.closed or conn.broken:
                raise
            log.debug("a census of slots %s failed: %s", sorted(slots), e)
        finally:
            cur.close()

    def _hand_over(self, conn: psycopg.Connection, wanted: Dict[int, Optional[int]]) -> None:
        """The slots (slot -> token; None: no longer held) another holder
        wants (a batch's report said so, of this slot or another): given
        back now that the batch committed, in one statement (one round trip
        however many, each waiting through a pooler), so that holder takes
        them at its next call (the fenced hand-over: the tokens are dead
        from now on)."""
        for s in wanted:
            self._wanted.discard(s)
            self._backlog.forget(s)
        held = sorted((s, t) for s, t in wanted.items() if t is not None)
        if not held:
            return
        conn.execute("SELECT count(release_lease(%s, u.s, u.t)) FROM unnest(%s::int[], %s::bigint[]) u(s, t)",
                     (self.name, [s for s, _ in held], [t for _, t in held]))
        given = [(s, t) for s, t in held if self._held.drop(s, t)]
        if given:
            self._changed([], given, "given back")

    def _hungry(self) -> bool:
        """Lease mode's balance: no slot held, or every held slot walked (its
        last batch came back short): the claimer asks again soon."""
        held = self._held.snapshot()
        return self.balance and all(self._backlog.weight(s) == 0 for s in held)

    def _all_quiet(self, quiet: Dict[Tuple[int, int], bool]) -> bool:
        held = self._held.snapshot()
        return bool(held) and all(quiet.get(st, False) for st in held.items())

    def _work_loop(self, session: bool, conn: Optional[psycopg.Connection] = None,
                   claim: Optional[Callable[..., None]] = None) -> None:
        quiet: Dict[Tuple[int, int], bool] = {}
        busy: Dict[int, bool] = {}
        due: Due = {}
        # the back-off after transient failures in a row (reconnects and
        # batches alike): none after a batch that went through
        pause: Optional[float] = None
        lost_conn = False
        try:
            while not self._stop.is_set():
                try:
                    if conn is None:
                        conn = self._connect(self.conninfo)
                        if lost_conn:
                            self._emit("reconnected")
                        lost_conn = False
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
                    conn, lost_conn = None, True
                    if session:  # the claims died with the session
                        self._tell_lost(self._held.replace([], time.monotonic())[1], "connection lost")
                    self._reconnecting(e, pause)
                if self._fatal is not None:
                    break
        finally:
            if session and conn is not None and not conn.broken:
                try:
                    conn.execute("SELECT release_slot(%s)", (self.name,))
                    gave = sorted(self._held.snapshot())
                    self.stats.slots(0, len(gave), 0)
                    self._tell_lost(sorted(self._held.snapshot().items()), "released")
                    self._emit("left", slots=gave)
                except psycopg.Error:
                    pass
            if conn is not None:
                conn.close()

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
            # my_items_fair (fair, spread) has no cursor: each batch reads the
            # slot's first pending rows again
            cursor = None if end or self._tenants else rows[-1][_KEY]
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
                # with fair: the same rows again next time, so the pass is over
                return 0, end or self._tenants, retry_in, cursor
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
        params = {"slot": slot, "name": self.name, "token": token,
                  "idle": str(max(1, int(self._idle_s * 1000))), "query": str(max(1, int(self._query_s * 1000)))}
        if token is None:
            q = "BEGIN; SELECT %(slot)s = ANY (my_slots(%(name)s)) AS mine"
        else:
            q = "BEGIN; SELECT fence(%(name)s, %(slot)s, %(token)s::bigint)"
            report, params["weight"] = self._backlog.report(slot, time.monotonic()) if self.balance else (False, None)
            if report:
                # the slot's weight as its batches count it, and the slots of
                # this holder another holder wants (given back after this batch)
                q += (", report_backlog(%(name)s, %(slot)s, %(token)s::bigint, %(weight)s::bigint,"
                      " fenced_batches => true) AS wanted")
        # 0: no limit (the server's own setting)
        if self._idle_s > 0:
            q += ", set_config('idle_in_transaction_session_timeout', %(idle)s, true)"
        if self._query_s > 0:
            q += ", set_config('statement_timeout', %(query)s, true)"
        window = None
        ask, join, gen = self._records.plan(slot, token, time.monotonic()) if fetch is not None else (False, True, 0)
        if ask:  # whether the fetch may leave the failure records out, from the next batch on
            q += ", has_failures(%(name)s) AS failing"
        if fetch is not None:
            q += "; " + (self._fetch if join else self._fetch_plain)
            params.update(fetch)
            if token is not None and self.balance and self._count is not None:
                # balance: a window of the slot's pending rows counted in the same message
                window = self._backlog.window(slot, fetch["after"], time.monotonic())
                if window is not None:
                    q += "; " + self._count
                    params["count_after"], params["bound"] = window
        cur = psycopg.ClientCursor(conn, row_factory=dict_row)
        try:
            cur.execute(q, params)
            cur.nextset()
            mine = cur.fetchone()
            if token is None and not (mine and mine["mine"]):
                raise _SlotLost()
            if mine and mine.get("wanted"):  # the worker's slots wanted elsewhere
                self._wanted.update(mine["wanted"])
            if ask and mine:
                self._records.answered(slot, token, mine["failing"], time.monotonic(), gen)
            rows: List[Row] = []
            if fetch is not None:
                cur.nextset()
                rows = cur.fetchall()
                counted = None
                if window is not None:
                    cur.nextset()
                    c = cur.fetchone()
                    counted = (c["pending"], c["last"])
                self._last_fetch = (len(rows), counted)
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
