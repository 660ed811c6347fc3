"""The vocabulary both worker libraries share (docs/libraries.md): the
options of Worker with their defaults, the events it tells on_event, and
the metrics it serves. The Node.js library (pg-claim) has the same table
in lib/vocabulary.js, in camelCase; describe() of each gives it in the
same shape, which the test suites of both compare."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

REQUIRED = "required"

# (name, default): a default in quotes is a text, a bare word a number, a
# boolean, "none", or what the default is made of (ttl, n).
OPTIONS: Tuple[Tuple[str, str], ...] = (
    ("conninfo", "''"),
    ("connection", "none"),
    ("name", REQUIRED),
    ("table", REQUIRED),
    ("n", REQUIRED),
    ("pending", REQUIRED),
    ("handler", REQUIRED),
    ("batch", "50"),
    ("mode", "'lease'"),
    ("ttl", "'30 seconds'"),
    ("renew_interval", "ttl / 3"),
    ("idle_in_transaction_timeout", "ttl"),
    ("query_timeout", "ttl"),
    ("key", "none"),
    ("route", "none"),
    ("method", "none"),
    ("fair", "none"),
    ("spread", "none"),
    ("shard_column", "none"),
    ("shard_keys", "none"),
    ("max_slots", "n"),
    ("holder", "host:pid:random"),
    ("notify_conninfo", "none"),
    ("poll_interval", "1 s, 30 s when listening"),
    ("max_attempts", "5"),
    ("backoff", "'10 seconds'"),
    ("session_pool", "false"),
    ("balance", "true"),
    ("metrics_port", "none"),
    ("metrics_host", "'127.0.0.1'"),
    ("on_event", "none"),
)

# The events, in the order a worker's life tells them.
EVENTS: Tuple[str, ...] = (
    "mode", "started", "slots", "gained", "lost", "batch", "failed", "dead", "rejected", "resized", "retrying",
    "transaction_ended", "idle", "woken", "reconnecting", "reconnected", "claim_failed", "listen_failed",
    "left", "leave_failed", "stopped",
)

# The reasons of a `lost` event.
LOST_REASONS: Tuple[str, ...] = ("given back", "taken", "expired", "released", "connection lost", "resized")

# (name, type, labels) of the metrics served on metrics_port.
METRICS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("pg_claim_items_total", "counter", ("fleet", "slot")),
    ("pg_claim_batches_total", "counter", ("fleet", "slot")),
    ("pg_claim_failures_total", "counter", ("fleet", "slot")),
    ("pg_claim_dead_items_total", "counter", ("fleet", "slot")),
    ("pg_claim_handovers_total", "counter", ("fleet", "direction")),
    ("pg_claim_fence_rejections_total", "counter", ("fleet",)),
    ("pg_claim_reconnects_total", "counter", ("fleet",)),
    ("pg_claim_slots_held", "gauge", ("fleet",)),
    ("pg_claim_batch_duration_seconds", "histogram", ("fleet",)),
)

# The upper bounds (seconds) of the batch latency histogram's buckets.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def describe() -> Dict[str, Any]:
    """The vocabulary as plain data (JSON-ready), option names in snake_case."""
    options: List[Dict[str, str]] = [{"name": k, "default": d} for k, d in OPTIONS]
    return {"options": options, "events": list(EVENTS), "lost_reasons": list(LOST_REASONS),
            "metrics": [{"name": m, "type": t, "labels": list(ls)} for m, t, ls in METRICS],
            "buckets": list(BUCKETS)}
