"""The parts of pg_claim that need no server."""
import datetime
import re

import psycopg
import pytest

import pg_claim
from pg_claim._metrics import Collector
from pg_claim._conn import seconds as _seconds


def test_holder_is_host_pid_random():
    a, b = pg_claim.make_holder(), pg_claim.make_holder()
    assert re.fullmatch(r"[^:]+:\d+:[0-9a-f]{16}", a)
    assert a != b


def test_held_replace_reports_gained_and_lost():
    h = pg_claim.Held(valid_s=3, margin_s=1)
    assert h.replace([(0, 10), (1, 11)], 100.0) == ([(0, 10), (1, 11)], [])
    h.advance(0, 10, "42")
    assert h.replace([(0, 10), (1, 12), (2, 13)], 101.0) == ([(1, 12), (2, 13)], [(1, 11)])
    assert h.snapshot() == {0: 10, 1: 12, 2: 13}
    # the kept slot keeps its cursor; the one taken anew starts from the start
    assert h.next(101.5) == (0, 10, "42")
    assert h.next(101.5) == (1, 12, None)
    assert h.next(101.5) == (2, 13, None)
    assert h.next(101.5) == (0, 10, "42")


def test_held_stops_work_before_the_ttl_and_drops_after_it():
    h = pg_claim.Held(valid_s=3, margin_s=1)
    h.replace([(5, 1)], 100.0)
    assert h.workable(101.9) and h.next(101.9) is not None
    assert not h.workable(102.0) and h.next(102.0) is None   # 2/3 of the ttl without a good claim
    assert h.failed(102.5) == []                              # kept until the ttl
    assert h.failed(103.0) == [(5, 1)]
    assert h.snapshot() == {}


def test_held_drop_and_advance_need_the_token():
    h = pg_claim.Held()
    h.replace([(3, 7)], 0.0)
    h.advance(3, 6, "x")          # a stale token changes nothing
    assert h.next() == (3, 7, None)
    assert not h.drop(3, 6)
    assert h.drop(3, 7)
    assert h.next() is None


def test_held_next_passes_over_resting_slots_unless_all_rest():
    h = pg_claim.Held()
    h.replace([(1, 10), (2, 20), (3, 30)], 0.0)
    assert [h.next(resting={2})[0] for _ in range(4)] == [1, 3, 1, 3]
    assert [h.next(resting={1, 2, 3})[0] for _ in range(3)] == [1, 2, 3]  # all rest: the turn as before
    assert h.next(resting={9})[0] == 1  # a slot not held changes nothing


def test_transient_errors():
    assert pg_claim.transient(psycopg.OperationalError("connection lost"))
    for state, expected in (("08006", True), ("40001", True), ("40P01", True), ("57P01", True),
                            ("53300", True), ("57014", False), ("55P03", False), ("23505", False),
                            ("22P02", False)):
        e = psycopg.errors.lookup(state)("x")
        assert pg_claim.transient(e) is expected, state
    # a cancel of the Worker's own statement (its fetch waiting on a lock)
    # is not the item's: the Worker goes on
    assert pg_claim.transient(psycopg.errors.lookup("57014")("x"), own=True)
    # a claim that gave up waiting for its fleet's claim mutex
    assert pg_claim.transient(psycopg.errors.lookup("55P03")("x"), own=True)
    assert not pg_claim.transient(psycopg.errors.lookup("23505")("x"), own=True)
    assert not pg_claim.transient(RuntimeError("550 no such mailbox"))


def test_intervals():
    assert _seconds(5) == 5.0
    assert _seconds(datetime.timedelta(milliseconds=1500)) == 1.5
    assert _seconds("5 seconds") is None
    with pytest.raises(TypeError):
        _seconds([5])


@pytest.mark.parametrize("kw, word", [
    (dict(n=0), "n must"), (dict(batch=0), "batch must"), (dict(mode="pool"), "mode must"),
    (dict(pending=""), "pending must"), (dict(max_slots=9), "max_slots"),
    (dict(max_attempts=0), "max_attempts"), (dict(ttl=0), "ttl must"), (dict(name=""), "name must"),
    (dict(poll_interval=0), "poll_interval"), (dict(n=1025), "at most 1024 in lease mode")])
def test_options_are_checked(kw, word):
    args = dict(name="m", table="t", n=8, pending="done", handler=lambda tx, rows: None)
    args.update(kw)
    with pytest.raises(ValueError, match=word):
        pg_claim.Worker("", **args)


def test_session_mode_takes_more_slots_than_lease_mode():
    args = dict(name="m", table="t", pending="done", handler=lambda tx, rows: None)
    assert pg_claim.Worker("", n=1048576, mode="session", **args).n == 1048576
    assert pg_claim.Worker("", n=1024, mode="lease", **args).n == 1024


def test_handler_must_be_callable():
    with pytest.raises(TypeError):
        pg_claim.Worker("", name="m", table="t", n=8, pending="done", handler=None)


def test_stats_and_prometheus_names():
    s = pg_claim.Stats()
    s.batch(3, 50, 0.02)
    s.batch(3, 10, 0.2)
    s.failure(3, dead=False)
    s.failure(3, dead=True)
    s.slots(2, 1, 1)
    snap = s.snapshot()
    assert (snap["items"], snap["batches"], snap["failures"], snap["dead"], snap["gained"], snap["lost"]) \
        == (60, 2, 2, 1, 2, 1)
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    registry.register(Collector("mailer", s))
    text = prometheus_client.generate_latest(registry).decode()
    # the metric set and labels of the Node.js library (the fleet: `fleet`, as the exporter's)
    assert sorted(re.findall(r"^# TYPE (\S+ \S+)$", text, re.M)) == [
        "pg_claim_batch_duration_seconds histogram", "pg_claim_batches_total counter",
        "pg_claim_dead_items_total counter", "pg_claim_failures_total counter",
        "pg_claim_fence_rejections_total counter", "pg_claim_handovers_total counter",
        "pg_claim_items_total counter", "pg_claim_reconnects_total counter", "pg_claim_slots_held gauge"]
    assert not re.search(r'[{,]name="', text)
    assert 'pg_claim_items_total{fleet="mailer",slot="3"} 60.0' in text
    assert 'pg_claim_batches_total{fleet="mailer",slot="3"} 2.0' in text
    assert 'pg_claim_failures_total{fleet="mailer",slot="3"} 2.0' in text
    assert 'pg_claim_dead_items_total{fleet="mailer",slot="3"} 1.0' in text
    assert 'pg_claim_handovers_total{direction="gained",fleet="mailer"} 2.0' in text
    assert 'pg_claim_handovers_total{direction="lost",fleet="mailer"} 1.0' in text
    assert 'pg_claim_fence_rejections_total{fleet="mailer"} 0.0' in text
    assert 'pg_claim_reconnects_total{fleet="mailer"} 0.0' in text
    assert 'pg_claim_slots_held{fleet="mailer"} 1.0' in text
    assert 'pg_claim_batch_duration_seconds_bucket{fleet="mailer",le="0.025"} 1.0' in text
    assert 'pg_claim_batch_duration_seconds_count{fleet="mailer"} 2.0' in text


def test_batch_carries_its_slot():
    b = pg_claim.Batch([{"id": 1}], "mailer", 3, 99, psycopg.sql.SQL("outbox"))
    assert b == [{"id": 1}] and (b.name, b.slot, b.token) == ("mailer", 3, 99)


def test_version():
    assert pg_claim.__version__ == "0.6.0"


def test_claimer_asks_again_quickly_after_a_gain():
    from pg_claim._claimer import HUNGRY_CALLS, next_burst, quick
    # a joiner: a call gains slots, the next ones gain nothing (the givers
    # are still in their batches): quick calls go on HUNGRY_CALLS times
    # after the last gain, then the period
    burst, quicks = 0, []
    for gained in [True, False, False, True] + [False] * (HUNGRY_CALLS + 2):
        burst = next_burst(burst, gained, hungry=False)
        quicks.append(quick(burst))
    assert quicks == [True] * (4 + HUNGRY_CALLS - 1) + [False] * 3
    # a stable fleet's member that gains nothing and has work: the period
    assert next_burst(0, False, False) == 0
    # nothing to do: quick up to HUNGRY_CALLS calls in a row, then the period
    burst, quicks = 0, []
    for _ in range(HUNGRY_CALLS + 2):
        burst = next_burst(burst, False, hungry=True)
        quicks.append(quick(burst))
    assert quicks == [True] * HUNGRY_CALLS + [False, False]
