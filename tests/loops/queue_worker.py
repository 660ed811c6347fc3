#!/usr/bin/env python3
"""A FOR UPDATE SKIP LOCKED queue worker on the example schema, as
docs/migrating.md shows it: the "before" of a cut-over, which
tests/loops/test_loops.py runs next to pg_claim workers (examples/python/worker.py).

It sends (a row in `deliveries`, like the example workers, and 20 ms of
"work") batches of 10 messages, each batch in one transaction that locks,
sends and marks, until SIGTERM; then it finishes the batch at hand and exits.
"""
import os
import signal
import threading
import time

import psycopg

WORKER = f"queue-{os.getpid()}"
STOP = threading.Event()


def main():
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    with psycopg.connect(autocommit=True) as conn:
        while not STOP.is_set():
            with conn.transaction():
                rows = conn.execute("""SELECT id FROM outbox
                                       WHERE sent_at IS NULL
                                       ORDER BY id LIMIT 10
                                       FOR UPDATE SKIP LOCKED""").fetchall()
                ids = [r[0] for r in rows]
                time.sleep(0.02 if ids else 0)  # the work
                conn.execute("INSERT INTO deliveries (outbox_id, worker) SELECT unnest(%s::bigint[]), %s",
                             (ids, WORKER))
                conn.execute("UPDATE outbox SET sent_at = now() WHERE id = ANY (%s)", (ids,))
            if not ids:
                STOP.wait(0.05)
    print("exit told to stop", flush=True)


if __name__ == "__main__":
    main()
