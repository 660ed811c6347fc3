"""What the scripts that are not pytest modules (tests/shards/shards.py, the
benchmark's and the fleets' program; bench/balance.py) import: a main that reports a failure in one line, and tests/harness's
connections, checks and polling, re-exported."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import Failure, WorkerProcess, check, connect, failure_state, fresh_database, log, poll  # noqa: E402,F401


def run_main(name, main):
    """main(); a Failure ends the process with exit 1 and the line 'name: why'."""
    try:
        main()
    except Failure as e:
        sys.exit(f"{name}: {e}")
