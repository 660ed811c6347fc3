"""Worker processes of the fleet tests: each reports its events as JSON lines
on stdout, read by a thread; and what the drivers do with them."""
import json
import os
import signal
import subprocess
import threading
import time

from .core import Failure, check


def failure_state(conn, name, item):
    """The state of item's failure record of name (retry, due or dead); None
    when it has none."""
    row = conn.execute("SELECT state FROM item_failures(%s) WHERE item = %s", (name, str(item))).fetchone()
    return row[0] if row else None


class WorkerProcess:
    """A worker process whose stdout is one JSON object per event ({"event":
    kind, ...}), read into `events` by a thread. The kernel kills it when the
    driver dies (setpriv --pdeathsig), even while it is stopped."""
    cond = threading.Condition()

    def __init__(self, cmd, env, err_path):
        self.err_path = err_path
        with open(err_path, "w") as err:
            self.proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--"] + cmd,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=err, env=env, text=True)
        self.pid = self.proc.pid
        self.events = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                ev = {"event": "garbage", "line": line}
            ev["seen"] = time.time()
            with WorkerProcess.cond:
                self.events.append(ev)
                WorkerProcess.cond.notify_all()

    def count(self, kind, since=0):
        with WorkerProcess.cond:
            return sum(1 for e in self.events[since:] if e["event"] == kind)

    def last(self, kinds, since=0):
        """The latest event of one of `kinds` from event `since` on, or None."""
        with WorkerProcess.cond:
            for e in reversed(self.events[since:]):
                if e["event"] in kinds:
                    return e
        return None

    def wait_event(self, kind, since, timeout):
        """The first event of `kind` (a string, or a tuple of them) from event `since` on."""
        kinds = (kind,) if isinstance(kind, str) else kind
        return self.wait_for(lambda e: e["event"] in kinds, since, timeout, f"'{kind}'")

    def wait_for(self, pred, since, timeout, what):
        """The first event from event `since` on for which pred(event) is true."""
        deadline = time.monotonic() + timeout
        with WorkerProcess.cond:
            while True:
                for e in self.events[since:]:
                    if pred(e):
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Failure(f"timed out after {timeout:g} s waiting for {self} to report {what}")
                WorkerProcess.cond.wait(min(left, 0.1))

    def state(self):
        """The process state letter of /proc (T: stopped), or None when it is gone."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None


def stop_all(workers, within=5, kill=False):
    """Every worker still running resumed (a stopped one would not act on
    SIGTERM) and sent SIGTERM (SIGKILL with kill=True); those not gone within
    `within` seconds killed."""
    for w in workers:
        if w.proc.poll() is None:
            os.kill(w.pid, signal.SIGCONT)
            w.proc.kill() if kill else w.proc.terminate()
    deadline = time.monotonic() + within
    for w in workers:
        try:
            w.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()


class Producer:
    """New rows while a fleet test runs: `statement` (its one parameter: how
    many) executed every 0.1 s for `per_s` rows a second, on a connection of
    `connect()`, opened again after an error (the server restarting), until
    stop(). `produced`: the rows inserted."""

    def __init__(self, connect, statement, per_s):
        import psycopg  # only the fleet tests that produce need the driver
        self._errors = psycopg.Error
        self.connect, self.statement, self.per_tick = connect, statement, max(1, per_s // 10)
        self.produced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        conn = None
        while not self._stop.wait(0.1):
            try:
                conn = conn or self.connect()
                conn.execute(self.statement, (self.per_tick,))
                self.produced += self.per_tick
            except self._errors:
                if conn is not None:
                    conn.close()
                conn = None

    def stop(self):
        self._stop.set()
        self._thread.join(5)


def check_processing_log(d, n, skip=None):
    """A fleet test's processing log (item, slot, token, in seq order: one
    row written in each item's handler transaction) against its items table
    (id): every item but `skip` (a poison item, never logged) logged exactly
    once, each by a holder of its slot (slot_of(item, n)), and no write with
    a token older than one already written for its slot. The number of items."""
    (items,) = d.execute("SELECT count(*) FROM items WHERE id IS DISTINCT FROM %s", (skip,)).fetchone()
    (logged, distinct, skipped) = d.execute(
        "SELECT count(*), count(DISTINCT item), count(*) FILTER (WHERE item = %s) FROM processing_log",
        (skip,)).fetchone()
    (missing,) = d.execute("SELECT count(*) FROM items i WHERE id IS DISTINCT FROM %s AND NOT EXISTS"
                           " (SELECT 1 FROM processing_log l WHERE l.item = i.id)", (skip,)).fetchone()
    check(logged == distinct == items and missing == 0 and skipped == 0,
          f"exactly once: {items} items, {logged} log rows of {distinct} items, {missing} missing,"
          f" the skipped item logged {skipped} times")
    (foreign,) = d.execute("SELECT count(*) FROM processing_log WHERE slot_of(item, %s) <> slot", (n,)).fetchone()
    check(foreign == 0, f"{foreign} items written by a holder of another slot")
    (older,) = d.execute(
        "SELECT count(*) FROM (SELECT token, max(token) OVER (PARTITION BY slot ORDER BY seq"
        " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS newest_before FROM processing_log) x"
        " WHERE token < newest_before").fetchone()
    check(older == 0, f"{older} writes with a token older than one already written for their slot")
    return items
