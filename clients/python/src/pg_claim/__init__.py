"""pg_claim: worker library for pg_claim fleets (PostgreSQL extension).

    import pg_claim

    def handle(tx, rows):
        ids = [r["id"] for r in rows]
        tx.execute("UPDATE outbox SET sent_at = now() WHERE id = ANY(%s)", (ids,))

    pg_claim.Worker(conninfo, name="mailer", table="outbox", n=8, pending="sent_at",
                    batch=50, mode="lease", ttl="5 seconds", handler=handle).run()

See README.md for the modes, failures, wake-ups, stopping and metrics.
"""
from ._held import Held
from ._metrics import Stats
from ._vocabulary import describe
from ._worker import (Batch, Error, Handler, PoolerError, Worker, make_holder,
                      transient)

__version__ = "0.6.0"

__all__ = ["Batch", "Error", "Handler", "Held", "PoolerError", "Stats", "Worker",
           "describe", "make_holder", "transient", "__version__"]
