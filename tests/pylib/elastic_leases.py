"""The worker side of claim_leases (elastic lease fleets) for the Python fleet
worker of tests/pooler/elastic_worker.py.

`Held` is the slots a holder holds, slot -> token, as the last call of
claim_leases returned them, with the worker's cursor into each slot's share
and a round-robin turn over the slots. `Claimer` calls claim_leases every
period on a connection of its own (a thread), and gives every slot back when
the worker stops (max => 0).
"""
import datetime
import threading
import time

import psycopg

# every slot the holder holds after the call, ordered by slot
CLAIM = "SELECT slot, token FROM claim_leases(%s, %s, %s, ttl => %s)"
# give every slot back and leave the live set: no row
LEAVE = "SELECT count(*) FROM claim_leases(%s, %s, %s, max => 0)"


class Held:
    """slot -> token of the held slots, shared by the code that calls
    claim_leases and the loop that works on the slots. A slot that is not in
    a call's result is given back (or lost): the loop stops working on it at
    once. Each slot has the loop's cursor into its share (the last key done),
    reset when the slot's token changes: a slot taken anew is walked from its
    beginning, since the previous holder may have left items behind."""

    def __init__(self, ttl_s):
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._tokens = {}
        self._cursor = {}
        self._valid_until = 0.0
        self._last = -1

    def replace(self, rows, asked):
        """The result (slot, token rows) of a call made at `asked` (time.monotonic()).
        Returns (gained, lost), lists of (slot, token): a slot whose token
        changed is in both."""
        new = {slot: token for slot, token in rows}
        with self._lock:
            old = self._tokens
            lost = [(s, t) for s, t in sorted(old.items()) if new.get(s) != t]
            gained = [(s, t) for s, t in sorted(new.items()) if old.get(s) != t]
            for s, _ in lost:
                self._cursor.pop(s, None)
            self._tokens = new
            self._valid_until = asked + self.ttl_s
        return gained, lost

    def failed(self, now):
        """A call failed at `now`: the slots are kept until a ttl after the
        last successful call was made, then dropped. Returns the dropped ones."""
        with self._lock:
            if now < self._valid_until or not self._tokens:
                return []
            lost = sorted(self._tokens.items())
            self._tokens, self._cursor = {}, {}
        return lost

    def drop(self, slot, token):
        """A fence refused `token` (PC001): no more work on the slot until a
        call returns it again (with a new token)."""
        with self._lock:
            if self._tokens.get(slot) == token:
                del self._tokens[slot]
                self._cursor.pop(slot, None)

    def snapshot(self):
        with self._lock:
            return dict(self._tokens)

    def next(self):
        """The next slot to work on, round robin: (slot, token, cursor), or None
        when no slot is held."""
        with self._lock:
            if not self._tokens:
                return None
            later = [s for s in self._tokens if s > self._last]
            slot = min(later) if later else min(self._tokens)
            self._last = slot
            return slot, self._tokens[slot], self._cursor.get(slot)

    def advance(self, slot, token, cursor):
        """The batch of `slot` up to key `cursor` is done (with `token`)."""
        with self._lock:
            if self._tokens.get(slot) == token:
                self._cursor[slot] = cursor


class Claimer:
    """claim_leases(name, n, holder, ttl) every period_s on a connection of its
    own (connect() makes one), whatever the worker's batches do; the result
    replaces `held`, and on_change(gained, lost) is called after a change.
    A failed call is tried again at the next period on a new connection; the
    slots are dropped once no call succeeded for a ttl."""

    def __init__(self, connect, name, n, holder, ttl_s, period_s, held, on_change):
        self.connect, self.name, self.n, self.holder = connect, name, n, holder
        self.ttl_s, self.period_s, self.held, self.on_change = ttl_s, period_s, held, on_change
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()

    def _run(self):
        conn = None
        while not self._stop.is_set():
            asked = time.monotonic()
            try:
                conn = conn or self.connect()
                rows = conn.execute(CLAIM, (self.name, self.n, self.holder,
                                            datetime.timedelta(seconds=self.ttl_s))).fetchall()
                gained, lost = self.held.replace(rows, asked)
            except psycopg.Error:
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                gained, lost = [], self.held.failed(time.monotonic())
            if gained or lost:
                self.on_change(gained, lost)
            self._stop.wait(max(0.0, asked + self.period_s - time.monotonic()))
        if conn is not None:
            conn.close()

    def leave(self, tries=3):
        """Stop calling, then give every slot back and leave the live set
        (claim_leases(..., max => 0)). Returns the slots given back."""
        self._stop.set()
        self._thread.join()
        for attempt in range(tries):
            try:
                with self.connect() as conn:
                    conn.execute(LEAVE, (self.name, self.n, self.holder))
                break
            except psycopg.Error:
                if attempt == tries - 1:
                    raise
                time.sleep(0.2)
        return self.held.replace([], time.monotonic())[1]
