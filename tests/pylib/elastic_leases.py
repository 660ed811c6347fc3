"""The worker side of claim_leases (elastic lease fleets) for the Python fleet
worker of tests/pooler/elastic_worker.py.

The slots a holder holds are the worker library's `pg_claim.Held` (slot ->
token, as the last call of claim_leases returned them, with the worker's
cursor into each slot's share and a round-robin turn over the slots).
`Claimer` calls claim_leases every period on a connection of its own (a
thread), and gives every slot back when the worker stops (max => 0).
"""
import datetime
import os
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "clients", "python", "src"))
from pg_claim import Held  # noqa: E402,F401

# every slot the holder holds after the call, ordered by slot
CLAIM = "SELECT slot, token FROM claim_leases(%s, %s, %s, ttl => %s)"
# give every slot back and leave the live set: no row
LEAVE = "SELECT count(*) FROM claim_leases(%s, %s, %s, max => 0)"


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
