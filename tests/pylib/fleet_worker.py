"""What the worker processes of the fleet tests share (tests/pooler/fleet.py,
tests/pooler/elastic_worker.py, tests/faults/worker.py, tests/ordered/worker.py):
how one runs its main loop under the driver, and its events on stdout."""
import json
import os
import sys
import threading
import time


def emitter(worker):
    """emit(event, **fields): one JSON line on stdout, {"event", "worker", "t", ...},
    whole even when several threads emit."""
    lock = threading.Lock()

    def emit(event, **fields):
        line = json.dumps({"event": event, "worker": worker, "t": time.time(), **fields}) + "\n"
        with lock:
            sys.stdout.write(line)
            sys.stdout.flush()
    return emit


def watchdog(lifetime_s):
    """Exit when the driver is gone or the lifetime is over, whatever the loop does."""
    parent, end = os.getppid(), time.monotonic() + lifetime_s
    while os.getppid() == parent and time.monotonic() < end:
        time.sleep(0.5)
    os._exit(3)


def run(main, emit, lifetime_s):
    """main() with the watchdog; an exception is reported with
    emit("error", error=...) and ends the process with status 1."""
    threading.Thread(target=watchdog, args=(lifetime_s,), daemon=True).start()
    try:
        main()
    except BrokenPipeError:
        os._exit(3)
    except Exception as e:  # noqa: BLE001 - reported to the driver, then fatal
        emit("error", error=f"{type(e).__name__}: {e}")
        sys.exit(1)
