"""A worker's counters, and their Prometheus exposition."""
from __future__ import annotations

import bisect
import threading
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ._vocabulary import BUCKETS


class Stats:
    """Counters of one Worker, safe to read from any thread: items handled,
    batches committed, failed attempts, dead items (per slot), slots gained
    and lost (lease hand-overs), batches refused by the fence, reconnections,
    and the batch latency (a histogram: from the start of the batch's
    transaction to its commit)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: Counter = Counter()
        self.batches: Counter = Counter()
        self.failures: Counter = Counter()
        self.dead: Counter = Counter()
        self.gained = 0
        self.lost = 0
        self.rejected = 0
        self.reconnects = 0
        self.held = 0
        self.latency_count = 0
        self.latency_sum = 0.0
        self.latency_buckets = [0] * (len(BUCKETS) + 1)

    def batch(self, slot: int, items: int, seconds: float) -> None:
        with self._lock:
            self.batches[slot] += 1
            self.items[slot] += items
            self.latency_count += 1
            self.latency_sum += seconds
            self.latency_buckets[bisect.bisect_left(BUCKETS, seconds)] += 1

    def failure(self, slot: int, dead: bool) -> None:
        with self._lock:
            self.failures[slot] += 1
            if dead:
                self.dead[slot] += 1

    def slots(self, gained: int, lost: int, held: int) -> None:
        with self._lock:
            self.gained += gained
            self.lost += lost
            self.held = held

    def add(self, field: str, k: int = 1) -> None:
        with self._lock:
            setattr(self, field, getattr(self, field) + k)

    def snapshot(self) -> Dict[str, Any]:
        """The totals as a dict: items, batches, failures, dead, gained, lost,
        rejected, reconnects, held, latency_count, latency_sum_s."""
        with self._lock:
            return {
                "items": sum(self.items.values()),
                "batches": sum(self.batches.values()),
                "failures": sum(self.failures.values()),
                "dead": sum(self.dead.values()),
                "gained": self.gained,
                "lost": self.lost,
                "rejected": self.rejected,
                "reconnects": self.reconnects,
                "held": self.held,
                "latency_count": self.latency_count,
                "latency_sum_s": self.latency_sum,
            }

    def per_slot(self) -> Dict[str, Dict[int, int]]:
        with self._lock:
            return {"items": dict(self.items), "batches": dict(self.batches),
                    "failures": dict(self.failures), "dead": dict(self.dead)}

    def histogram(self) -> Tuple[List[Tuple[str, int]], float]:
        """Cumulative buckets [(upper bound, count)] ending with +Inf, and the sum."""
        with self._lock:
            out, total = [], 0
            for bound, k in zip([repr(b) for b in BUCKETS] + ["+Inf"], self.latency_buckets):
                total += k
                out.append((bound, total))
            return out, self.latency_sum


class Collector:
    """A prometheus_client collector of a Worker's Stats: the metric set the
    Node.js library exposes too, names ending in _total for counters and
    _seconds for durations. The fleet's name is the label `fleet` (as in the
    exporter's queries of contrib/prometheus/), the slot the label `slot`:

    - pg_claim_items_total, pg_claim_batches_total, pg_claim_failures_total,
      pg_claim_dead_items_total {fleet, slot}
    - pg_claim_handovers_total {fleet, direction: gained or lost}
    - pg_claim_fence_rejections_total, pg_claim_reconnects_total {fleet}
    - the gauge pg_claim_slots_held {fleet}
    - the histogram pg_claim_batch_duration_seconds {fleet}
    """

    def __init__(self, name: str, stats: Stats) -> None:
        """`name`: the fleet's name, the value of the label `fleet`."""
        self.name, self.stats = name, stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)
        per = self.stats.per_slot()
        for metric, key, text in (
                ("pg_claim_items", "items", "items handled (committed)"),
                ("pg_claim_batches", "batches", "batches committed"),
                ("pg_claim_failures", "failures", "failed attempts recorded with record_failure"),
                ("pg_claim_dead_items", "dead", "items set aside (dead) after max_attempts")):
            c = CounterMetricFamily(metric, text, labels=["fleet", "slot"])
            for slot, v in sorted(per[key].items()):
                c.add_metric([self.name, str(slot)], v)
            yield c
        s = self.stats.snapshot()
        c = CounterMetricFamily("pg_claim_handovers",
                                "lease hand-overs: slots gained by this worker or lost by it",
                                labels=["fleet", "direction"])
        c.add_metric([self.name, "gained"], s["gained"])
        c.add_metric([self.name, "lost"], s["lost"])
        yield c
        for metric, key, text in (
                ("pg_claim_fence_rejections", "rejected", "batches refused by the fence (PC001: slot lost)"),
                ("pg_claim_reconnects", "reconnects", "reconnections after a lost connection")):
            c = CounterMetricFamily(metric, text, labels=["fleet"])
            c.add_metric([self.name], s[key])
            yield c
        g = GaugeMetricFamily("pg_claim_slots_held", "slots held now", labels=["fleet"])
        g.add_metric([self.name], s["held"])
        yield g
        buckets, total = self.stats.histogram()
        h = HistogramMetricFamily(
            "pg_claim_batch_duration_seconds",
            "batch latency: seconds from the batch's BEGIN (with its fence and fetch) to its COMMIT,"
            " item-by-item retries included (the batches that committed items)",
            labels=["fleet"])
        h.add_metric([self.name], buckets, total)
        yield h


def serve(port: int, name: str, stats: Stats, addr: str = "127.0.0.1") -> Optional[Any]:
    """Serve /metrics on `addr`:`port` from a registry of its own; returns the
    server (with shutdown()) where prometheus_client returns it."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise ImportError("metrics_port needs prometheus_client: pip install 'pg-claim[metrics]'") from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(name, stats))  # type: ignore[arg-type]
    started = start_http_server(port, addr=addr, registry=registry)
    return started[0] if isinstance(started, tuple) else None
