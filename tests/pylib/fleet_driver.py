"""What the Python tests share (tests/pooler, tests/faults, tests/ordered,
tests/loops, tests/shards, tests/citus, tests/security): connections, failures
and checks, polling with a deadline, a main that reports a failure in one line,
and worker processes that report events as JSON lines on stdout."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import psycopg


class Failure(Exception):
    pass


def connect(dbname="postgres", **kw):
    """An autocommit connection to the test server (PGHOST, PGPORT and PGUSER
    as scripts/lib.sh sets them; keyword arguments override)."""
    return psycopg.connect(dbname=dbname, autocommit=True, **kw)


def run_main(name, main):
    """main(); a Failure ends the process with exit 1 and the line 'name: why'."""
    try:
        main()
    except Failure as e:
        sys.exit(f"{name}: {e}")


def run_fleet_test(title, body, time_limit_s, databases=(), stderr_name=lambda f: f[:-4]):
    """The main of a fleet test: body(workdir) in a fresh work directory,
    ended by a Failure after time_limit_s (an alarm) or at SIGTERM/SIGINT. On
    a failure: 'title FAILED: why', and the tail of every non-empty stderr
    file the workers left in the work directory (named by stderr_name(file
    name)); on success: the databases dropped and 'title: passed'. Returns
    the exit status."""
    def on_alarm(*_):
        raise Failure(f"the {title} did not finish within {time_limit_s} s")

    def on_term(signum, _):
        raise Failure(f"stopped by signal {signum}")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.alarm(time_limit_s)
    workdir = tempfile.mkdtemp(prefix="pg_claim-fleet-")
    ok = False
    try:
        body(workdir)
        ok = True
    except Exception as e:  # noqa: BLE001 - any failure: report it with the workers' stderr
        if not isinstance(e, Failure):
            traceback.print_exc()
        print(f"{title} FAILED: {e}", file=sys.stderr)
        for f in sorted(os.listdir(workdir)):
            err = open(os.path.join(workdir, f), errors="replace").read()
            if err:
                print(f"--- stderr of {stderr_name(f)}:\n{err[-3000:]}", file=sys.stderr)
    finally:
        signal.alarm(0)
        shutil.rmtree(workdir, ignore_errors=True)
    if ok:
        with connect("postgres") as d:
            for db in databases:
                d.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        log(f"{title}: passed")
    return 0 if ok else 1


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def log(msg):
    print(msg, flush=True)


def poll(fn, timeout, what, interval=0.05):
    """fn() until it returns something true; Failure after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        r = fn()
        if r:
            return r
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


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
