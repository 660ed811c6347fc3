"""pg_claim under faults: a fleet drains three tables while the server, the
network and the workers fail, and a checker reads what was written.

Every fault once, each a test and each checked (the scripts/test layer
"faults"; test_soak.py with --soak MINUTES: faults chosen at random, then one
summary line, scripts/soak). The tests before the fleet: cancels and
timeouts, the lock table exhausted; then the fleet starts and meets, in this
order, the partition, a restart, a backend kill, SIGSTOPs and a failover;
the last test drains it and checks the whole run (it runs whenever a fleet
test does).

Needs a running cluster with pg_claim available (PGHOST/PGPORT of
scripts/lib.sh pgc_faults_cluster_start, FAULTS_DATA its data directory,
PGC_BIN its binaries), run as root: the driver stops, starts, kills and fails the
server over (as the postgres user), and builds a network namespace for the
partition. The cluster must listen on every address (listen_addresses = '*');
the driver admits the namespace's subnet in pg_hba.conf.

The fleet (tests/faults/worker.py: pg_claim.Worker processes of the Python
worker library, on real TCP connections): session-mode workers (one slot
each, claim_slots; the token from my_token) on table items_session and
lease-mode workers (one slot each, claim_leases) on items_lease, each n = 4
with more workers than slots, and lease-mode workers with every slot of
their share (3 workers for 4 slots: "elastic") on items_elastic; each batch
is handled inside a transaction that passed the slot's fence (session mode:
the session's lock), writing a row per item in processing_log. A producer
adds items all along; at the end it stops and the fleet drains. Workers find
the server through a libpq service file, which the driver rewrites after a
failover.

The checker (check_log) counts, from processing_log and the tables:
- duplicates: items with more than one log row;
- lost: items not done, or done without a log row;
- overlapping holds: for a slot of a table, a write (log row) carrying a
  token smaller than a token already written for that slot by an earlier
  write: an older holder wrote after a newer one had taken over. Together
  with the holder history (lease_holders sampled all along: a slot's token
  never goes back), this is "never two live holders of a slot at once" as
  the writes can see it.

For each fault it logs the time from the fault until the share moves
again: until every affected slot has a new write (pytest -s shows it).
Every wait polls with a deadline; no timing is asserted.
"""
import random

import pytest

from harness import check

from .cluster import ELASTIC_WORKERS, LEASE_WORKERS, MODES, N, PRODUCE_PER_S, SESSION_WORKERS, TTL_S, log
from .conftest import selected
from .faults import (fault_backend_kill, fault_failover, fault_partition, fault_restart, fault_sigstop,
                     start_partition_workers)
from .fleet import Fleet, assert_clean, drain
from .sessions import cancels_and_timeouts, lock_table_exhausted

TIME_LIMIT_S = 420


@pytest.fixture(scope="module")
def running(servers, workdir, request):
    """The fleet, every slot held (with the partition test, three of its
    workers behind the proxy); its results by fault, and one rng for the
    faults' choices."""
    fleet = Fleet(servers, workdir, lifetime=400)
    fleet.results = {}
    fleet.rng = random.Random(1)
    try:
        fleet.start_monitors()
        partition = selected(request, "test_partition")
        fleet.partition_workers = start_partition_workers(fleet) if partition else None
        for _ in range(SESSION_WORKERS - (2 if partition else 0)):
            fleet.add("session")
        for _ in range(LEASE_WORKERS - (1 if partition else 0)):
            fleet.add("lease")
        for _ in range(ELASTIC_WORKERS):
            fleet.add("elastic")
        fleet.wait_full()
        log(f"fleet: {len(fleet.workers)} workers (session, lease and elastic lease mode, n = {N} each,"
            f" ttl {TTL_S:g} s, claims every ttl / 3), {PRODUCE_PER_S} new items per table and second")
        yield fleet
    finally:
        fleet.stop()


def clean(fleet, what):
    with fleet.cluster.connect() as c:
        return assert_clean(c, fleet, what)


def test_cancels_and_timeouts(servers):
    log("nothing half-made after cancels and timeouts:")
    for r in cancels_and_timeouts(servers):
        log(f"  {r}")


def test_lock_table_exhausted(servers):
    log("the lock table exhausted (max_locks_per_transaction small):")
    for r in lock_table_exhausted(servers):
        log(f"  {r}")


def test_partition(running):
    log("silent partition between three workers and the server (a proxy in its own network namespace):")
    fault_partition(running, running.partition_workers, running.results)
    log(f"  {clean(running, 'partition')}")


def test_restart(running):
    name = "server stop -m immediate + start"
    what, moved = fault_restart(running, running.rng)
    running.results[name] = (what, moved)
    log(f"  {name}: share moving again after {moved:.2f} s; {clean(running, name)}")


def test_backend_kill(running):
    name = "backend SIGKILL (postmaster reset)"
    what, moved = fault_backend_kill(running, running.rng)
    running.results[name] = (what, moved)
    log(f"  {name}: share moving again after {moved:.2f} s; {clean(running, name)}")


@pytest.mark.parametrize("where", ["idle", "idle in transaction"])
@pytest.mark.parametrize("mode", MODES)
def test_sigstop(running, mode, where):
    what, moved = fault_sigstop(running, running.rng, mode, where)
    running.results[f"SIGSTOP of {'an' if mode == 'elastic' else 'a'} {mode} holder, {where}"] = (what, moved)
    log(f"  SIGSTOP: {what}; {clean(running, f'SIGSTOP {mode} {where}')}")


def test_failover(running):
    what, moved = fault_failover(running, running.rng)
    running.results["failover to a promoted replica"] = (what, moved)
    log(f"  failover: {what}; share moving after {moved:.2f} s; {clean(running, 'failover')}")


def test_every_item_once(running):
    """The fleet drains after its last fault: no item twice or lost, no
    overlapping holds, no worker error over the whole run."""
    drained = drain(running)
    check(not running.errors(), f"worker errors: {running.errors()[:3]}")
    running.stop()
    with running.cluster.connect() as c:
        counts = assert_clean(c, running, "end", final=True)
    log(f"drained {drained:.1f} s after production stopped; checker: {counts['items']} items,"
        f" {counts['duplicates']} duplicates, {counts['lost']} lost, {counts['overlapping']} overlapping holds")
    log("fault | what happens | share moving again after")
    for name, (what, moved) in running.results.items():
        log(f"  {name} | {what} | {'-' if moved is None else f'{moved:.2f} s'}")
