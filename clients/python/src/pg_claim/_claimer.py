"""The claims of a Worker: lease mode's claimer thread (claim_leases every
ttl/3 on a connection of its own) and its leave; session mode's
claim_slots between batches on the work connection."""
from __future__ import annotations

import datetime
import logging
import select
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg
from psycopg import sql

from ._conn import transient
from ._held import Held
from ._resize import RESIZED, SESSION_STATES
from ._types import Error, PoolerError

log = logging.getLogger("pg_claim")

# Balance: the pause of a worker with nothing to do, or whose last calls
# gained slots, before it calls claim_leases again (a slot wanted for it is
# given back after the giver's batch), and how many such calls in a row
# before the period applies again.
HUNGRY_S = 0.2
HUNGRY_CALLS = 10
# session mode: the least time between two claim_slots calls of a worker
# that holds slots (between batches and while idle; a notification is read
# at once, by a call then). The Node.js library has the same constant.
SESSION_CLAIM_S = 1.0
# lease mode: how long the claimer waits for the reply to its claim_leases,
# as a part of the ttl. A reply later than that grants nothing a batch could
# use (none starts once 2/3 of the ttl passed since the last good call was
# sent), and a shorter wait gives up on a call that a busy server or pool
# answers late but in time. The Node.js library has the same rule.
CLAIM_DEADLINE = 2 / 3


def quick(burst: int) -> bool:
    """Whether the claimer's next call comes after HUNGRY_S (not the period)."""
    return 0 < burst <= HUNGRY_CALLS


def next_burst(burst: int, gained: bool, hungry: bool) -> int:
    """Balance: the claimer's count of quick calls after a call that
    `gained` slots or not, the worker `hungry` (nothing to do) or not; the
    next call comes after HUNGRY_S while it is 1 .. HUNGRY_CALLS, else after
    the period. A worker whose call gained slots (a joiner taking its share
    as the givers release it after their batches) asks again quickly
    HUNGRY_CALLS times after its last gain, as a call between two givers'
    batches may gain nothing; one with nothing to do, up to HUNGRY_CALLS
    times in a row."""
    if gained:
        return 1
    return burst + 1 if quick(burst) or hungry else 0


class Claimer:
    """Claims of a Worker (mixed into Worker)."""

    def _claim(self, conn: psycopg.Connection, max_: Optional[int] = None,
               n: Optional[int] = None) -> List[Tuple[int, int]]:
        return conn.execute("SELECT slot, token FROM claim_leases(%s, %s, %s, max => %s, ttl => %s)",
                            (self.name, self.n if n is None else n, self.holder,
                             self.max_slots if max_ is None else max_,
                             datetime.timedelta(seconds=self._ttl_s))).fetchall()

    def _changed(self, gained: List[Tuple[int, int]], lost: List[Tuple[int, int]],
                 reason: Any = "given back") -> None:
        """The held slots changed: counted and told (a `lost` and a `gained`
        event per slot, then `slots`). `reason`: of every lost slot, or a
        function (slot, token) -> reason."""
        held = sorted(self._held.snapshot())
        self.stats.slots(len(gained), len(lost), len(held))
        self._tell_lost(lost, reason)
        for s, t in gained:
            self._emit("gained", slot=s, token=t if self.running_mode == "lease" else None)
        self._emit("slots", held=held, gained=[s for s, _ in gained], lost=[s for s, _ in lost])
        self._wake.set()

    def _tell_lost(self, lost: List[Tuple[int, int]], reason: Any) -> None:
        for s, t in lost:
            self._emit("lost", slot=s, token=t if self.running_mode == "lease" else None,
                       reason=reason(s, t) if callable(reason) else reason)

    def _claimer(self, conn: Optional[psycopg.Connection]) -> None:
        """claim_leases every ttl/3 on a connection of its own, whatever the
        batches do, each reply awaited for 2/3 of the ttl (CLAIM_DEADLINE).
        A failed call is tried again at the next period on a new
        connection; the slots are dropped once no call succeeded for a ttl.
        An error that is not the connection's stops the worker. A call
        refused as resized (PC002) follows the new n and calls again at once
        (_resize)."""
        period = self._renew_s or self._ttl_s / 3
        failing = False
        burst = 0
        while not self._stop.is_set():
            asked = time.monotonic()
            used = self.n
            try:
                conn = conn or self._connect(self.conninfo, deadline=CLAIM_DEADLINE)
                rows = self._claim(conn, n=used)
                again = {s for s, _ in rows}
                with self._resize_lock:
                    if self.n != used:  # the work loop followed a resize meanwhile: old tokens
                        continue
                    gained, lost = self._held.replace(rows, asked)
                # a slot back with a new token: the lease ran out in between; one
                # missing: given back for balance (no second statement through a
                # busy pool to tell it from one taken after an expiry)
                reason: Any = lambda s, _t: "expired" if s in again else "given back"  # noqa: E731
                if failing:
                    failing = self._claim_failing = False
                    self._wake.set()
            except psycopg.Error as e:
                resized = e.sqlstate == RESIZED
                if resized and conn is not None and self._followed(conn, e, used):
                    continue
                if conn is not None:
                    conn.close()
                conn = None
                if self._fatal is not None:
                    self.stop()
                    return
                if not resized and not transient(e, own=True):  # resized: fleet_n failed, again
                    self._fatal = e
                    self.stop()
                    return
                failing = self._claim_failing = True
                gained, lost, reason = [], self._held.failed(time.monotonic()), "expired"
                self._emit("claim_failed", error=(str(e).strip().splitlines() or [type(e).__name__])[0])
                self._wake.set()  # an idle work loop waits at most until the slots are to be dropped
            if gained or lost:
                self._changed(gained, lost, reason)
            for s, _ in gained + lost:
                self._backlog.forget(s)
                self._wanted.discard(s)
            burst = next_burst(burst, self.balance and bool(gained), self._hungry())
            if self._waits(asked, period, burst):
                break
        if conn is not None:
            conn.close()

    def _followed(self, conn: psycopg.Connection, e: psycopg.Error, used: int) -> bool:
        """The claimer's call with n = `used` raised PC002: True once the
        worker follows the new n (claim again at once). False when reading
        it failed (tried again at the next period); a resize that cannot
        be followed is fatal (_fatal)."""
        try:
            self._follow(conn, e, used)
            return True
        except Error as fatal:
            self._fatal = fatal
        except psycopg.Error as e2:
            log.debug("fleet_n(%r) failed after PC002: %s", self.name, e2)
        return False

    def _waits(self, asked: float, period: float, burst: int) -> bool:
        """The claimer's pause after the call sent at `asked`: the period, or
        HUNGRY_S while the worker has nothing to do (at most HUNGRY_CALLS
        calls in a row), none after a resize. True when the worker stops."""
        end = asked + (HUNGRY_S if quick(burst) else period)
        while True:
            left = end - time.monotonic()
            if left <= 0 or self._claim_now.is_set():
                self._claim_now.clear()
                return self._stop.is_set()
            if burst < HUNGRY_CALLS and time.monotonic() >= asked + HUNGRY_S and self._hungry():
                return self._stop.is_set()
            self._claim_now.wait(min(left, HUNGRY_S))  # stop() sets it too
            if self._stop.is_set():
                return True

    def _run_lease(self) -> None:
        self._held = Held(valid_s=self._ttl_s, margin_s=self._ttl_s / 3)
        first: Optional[psycopg.Connection] = None

        def claim_first() -> None:
            nonlocal first
            first = self._connect(self.conninfo, deadline=CLAIM_DEADLINE)
            asked = time.monotonic()
            try:
                used = self.n
                try:
                    rows = self._claim(first, n=used)
                except psycopg.Error as e:
                    if e.sqlstate != RESIZED:
                        raise
                    self._follow(first, e, used)  # started with n before a resize: the new n
                    rows = self._claim(first)
                gained, lost = self._held.replace(rows, asked)
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
                        try:
                            self._claim(conn, max_=0)
                        except psycopg.Error as e:
                            new_n = self._fleet_n(conn) if e.sqlstate == RESIZED else None
                            if new_n is None:
                                raise
                            self._claim(conn, max_=0, n=new_n)  # resized since the last call
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
        _, lost = self._held.replace([], time.monotonic())
        self.stats.slots(0, len(gave), 0)
        self._tell_lost(lost, "released")
        self._emit("left", slots=gave)

    def _grace(self) -> float:
        """How long after stop() a wait for the server may go on, and how
        long the slots are given back for: ttl/4 (at least 0.5 s)."""
        return max(0.5, (self._ttl_s or 30.0) / 4)

    def session_check(self, conn: psycopg.Connection) -> int:
        """The server process of `conn` if the connection is one server
        session (or session_pool is set); raises PoolerError otherwise. It compares the server
        process that runs a statement (pg_backend_pid()) with the one the
        connection was opened with (the server's start-up reply): a pooler
        answers the start-up itself, with a number of its own (PgBouncer in
        any pool mode, and other poolers that do not pass the server's
        through)."""
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        if pid != conn.info.backend_pid and not self.session_pool:
            raise PoolerError(
                f"the server process (pid {pid}) is not the one the connection was opened with"
                f" (pid {conn.info.backend_pid}): a connection pooler is in between. Session mode holds"
                " its slots with session locks and LISTENs, which need one server session per"
                " connection: connect to PostgreSQL directly, use mode='lease' (works through"
                " transaction-mode poolers), or session_pool=True through a pool in session mode.")
        return pid

    def _run_session(self) -> None:
        self._held = Held()
        state: Dict[str, Any] = {"pid": None, "channels": {}}

        def claim(conn: psycopg.Connection, now: bool = False) -> None:
            """claim_slots: take unserved slots, give one back to a waiting
            worker, read the notifications. A worker that holds slots calls
            it at most every SESSION_CLAIM_S unless `now`."""
            if state.get("conn") is not conn:  # a new session: check it, LISTEN from scratch
                state["pid"] = self.session_check(conn)
                state["conn"] = conn
                state["channels"] = {}
                conn.add_notify_handler(lambda _n: self._notify())
                self._held.replace([], time.monotonic())
            elif not now and self._held.snapshot() and time.monotonic() - state["at"] < SESSION_CLAIM_S:
                return
            state["at"] = time.monotonic()
            held_before = self._held.snapshot()
            args: Tuple[Any, ...] = (self.name, self.n, self.max_slots)
            q = "SELECT claim_slots(%s, %s, %s), pg_backend_pid()"
            if not held_before:  # a standby: the wait form, which holders see
                q = "SELECT claim_slots(%s, %s, %s, '1 second'), pg_backend_pid()"
            try:
                slots, pid = conn.execute(q, args).fetchone()  # type: ignore[misc]
            except psycopg.Error as e:
                if e.sqlstate in SESSION_STATES:
                    raise self._session_resized(e) from e
                raise
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
                       claim: Optional[Callable[..., None]], left: float) -> bool:
        """Part of an idle wait in session mode: up to 0.5 s (or `left`) for the
        connection to have something to read (a notification), then a claim
        (it reads the notifications, takes free slots and gives one back to
        a waiting worker; at once when a notification came, else at most
        every SESSION_CLAIM_S). True when the slots changed."""
        assert conn is not None and claim is not None
        readable = select.select([conn.fileno()], [], [], min(0.5, left))[0]
        before = self._held.snapshot()
        claim(conn, bool(readable))
        return self._held.snapshot() != before
