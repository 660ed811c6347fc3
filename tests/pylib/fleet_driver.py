"""The mains of the fleet tests that are not pytest modules yet (tests/pooler/
elastic.py, tests/libs/node_fleet.py, tests/loops, tests/ordered, tests/shards,
tests/citus): a main that reports a failure in one line, and one that runs a
fleet in a work directory. Connections, checks, polling and worker processes
are tests/harness's, re-exported here."""
import os
import shutil
import signal
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import Failure, WorkerProcess, check, connect, failure_state, log, poll  # noqa: E402,F401


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
