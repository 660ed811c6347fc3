"""Worker processes of the fleet tests: each reports its events as JSON lines
on stdout, read by a thread; and what the drivers do with them."""
import json
import os
import signal
import subprocess
import threading
import time

from .core import Failure


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
