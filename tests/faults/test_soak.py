"""The fault fleet under random faults for --soak MINUTES (scripts/soak, the
layer `soak`): every kind of fault once per round in a random order
(--seed N), the checker after each, then the drain; one summary line:
faults by kind, items processed, duplicates, lost, overlapping holds, the
slowest takeover. Without --soak the test is skipped. The servers, fleet
and checker are test_faults.py's (cluster.py, fleet.py, faults.py)."""
import collections
import random
import signal
import sys
import time

import pytest

from harness import Failure, check

from .faults import fault_backend_kill, fault_cancel, fault_failover, fault_restart, fault_sigstop, fault_worker_kill
from .fleet import Fleet, check_log, drain

SOAK_FAULTS = {
    "restart": fault_restart,
    "backend_kill": fault_backend_kill,
    "failover": fault_failover,
    "sigstop": fault_sigstop,
    "worker_kill": fault_worker_kill,
    "cancel": fault_cancel,
}


def run_soak(cluster, workdir, minutes, seed):
    # first, so that a failure inside a fault's own checks can be replayed (--seed)
    print(f"soak {minutes:g} min: seed {seed} (scripts/test soak --seed {seed})", flush=True)
    rng = random.Random(seed)
    fleet = Fleet(cluster, workdir, lifetime=minutes * 60 + 300)
    kinds = collections.Counter()
    slowest = (0.0, "-")
    violation = None
    end = time.monotonic() + minutes * 60
    try:
        fleet.start()
        fleet.wait_full()
        order = []
        while time.monotonic() < end:
            if not order:  # every kind once per round, in a random order
                order = rng.sample(sorted(SOAK_FAULTS), len(SOAK_FAULTS))
            kind = order.pop()
            _, moved = SOAK_FAULTS[kind](fleet, rng)
            kinds[kind] += 1
            if moved > slowest[0]:
                slowest = (moved, kind)
            with cluster.connect() as c:
                counts = check_log(c)
            if counts["duplicates"] or counts["lost"] or counts["overlapping"] or fleet.history_bad:
                violation = f"after {kind}: {counts}"
                break
            fleet.wait_full()
            time.sleep(rng.uniform(1, 4))  # let the fleet work between faults
        drain(fleet)
        errors = fleet.errors()
    finally:
        fleet.stop()
    with cluster.connect() as c:
        counts = check_log(c, final=True)
        (processed,) = c.execute("SELECT count(*) FROM processing_log").fetchone()
    ok = (not violation and not errors and not fleet.history_bad
          and counts["duplicates"] == counts["lost"] == counts["overlapping"] == 0)
    print(f"soak {minutes:g} min (seed {seed}): faults {sum(kinds.values())}"
          f" ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); items processed {processed};"
          f" duplicates {counts['duplicates']}; lost {counts['lost']}; overlapping holds {counts['overlapping']};"
          f" slowest takeover {slowest[0]:.2f} s ({slowest[1]}); {'ok' if ok else 'VIOLATION'}", flush=True)
    if violation or errors:
        print(f"soak: {violation or ''} {errors[:3]}", file=sys.stderr)
    return ok


@pytest.fixture
def minutes(request):
    m = request.config.getoption("--soak")
    if not m:
        pytest.skip("no --soak MINUTES")
    limit = int(m * 60 + 600)

    def on_alarm(*_):
        raise Failure(f"the soak did not finish within {limit} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    yield m
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_soak(servers, workdir, minutes, request):
    seed = request.config.getoption("--seed")
    seed = seed if seed is not None else random.randrange(1 << 30)
    check(run_soak(servers, workdir, minutes, seed), "the soak found a violation (its summary line says which)")
