#!/usr/bin/env python3
"""One lease worker in Python (psycopg 3), started by tests/pooler/run.py.

It connects through PgBouncer in pool_mode = transaction (the PG* environment
variables), claims a lease of FLEET_NAME with n = FLEET_N (a standby polls
until a slot is free), walks its share of `items` with my_items and writes
each batch in one transaction behind fence(). It reports every claim, batch,
write, rejected write and lost lease as one JSON line on stdout.

The part between the "docs/leases.md" markers is shown verbatim in
docs/leases.md ("Worker loops"); run.py fails when the two differ.
"""
import datetime
import json
import os
import sys
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
from fleet_worker import run  # noqa: E402

NAME = os.environ["FLEET_NAME"]
N = int(os.environ["FLEET_N"])
TTL = datetime.timedelta(seconds=float(os.environ["FLEET_TTL_S"]))
RENEW_S = float(os.environ["FLEET_RENEW_S"])
BATCH = int(os.environ["FLEET_BATCH"])
ITEM_S = float(os.environ["FLEET_ITEM_MS"]) / 1000
POLL_S = 0.2  # a standby's claim interval, and a walked share's pause
HOLDER = f"py-{os.getpid()}"


def emit(event, **fields):
    print(json.dumps({"event": event, "worker": HOLDER, "t": time.time(), **fields}), flush=True)


def process(ids):
    time.sleep(ITEM_S * len(ids))  # the work on one batch (e-mails, calls, ...)


# docs/leases.md: begin
def work(conn, slot, token):
    """Process the share of `slot` until the lease is lost; returns why."""
    after, renew_at = None, time.monotonic() + RENEW_S
    while True:
        if time.monotonic() >= renew_at:
            (until,) = conn.execute("SELECT renew_lease(%s, %s, %s, %s)",
                                    (NAME, slot, token, TTL)).fetchone()
            if until is None:
                return "renew_lease returned NULL"
            renew_at = time.monotonic() + RENEW_S
        rows = conn.execute(
            "SELECT id, done FROM my_items(NULL::items, %s, %s, after => %s, batch => %s)",
            (slot, N, after, BATCH)).fetchall()
        if not rows:  # the whole share is walked: start again from its beginning
            after = None
            time.sleep(POLL_S)
            continue
        after = str(rows[-1][0])
        todo = [item for item, done in rows if not done]
        if not todo:
            continue
        emit("fetched", slot=slot, token=token, items=len(todo))
        process(todo)
        try:
            with conn.transaction():  # the batch's writes commit only if the lease is ours
                conn.execute("SELECT fence(%s, %s, %s)", (NAME, slot, token))
                conn.execute("UPDATE items SET done = true WHERE id = ANY(%s)", (todo,))
                conn.execute("INSERT INTO processing_log (item, worker, token)"
                             " SELECT unnest(%s::bigint[]), %s, %s", (todo, HOLDER, token))
        except psycopg.Error as e:
            if e.sqlstate != "PC001":
                raise
            emit("rejected", slot=slot, token=token, items=len(todo), how="PC001")
            return "fence raised PC001"
        emit("wrote", slot=slot, token=token, items=len(todo))


def main():
    # PgBouncer 1.18 has no max_prepared_statements: no server-side prepares
    with psycopg.connect(autocommit=True, prepare_threshold=None) as conn:
        while True:
            row = conn.execute("SELECT slot, token FROM claim_lease(%s, %s, %s, %s)",
                               (NAME, N, HOLDER, TTL)).fetchone()
            if row is None:  # all n slots are leased: a standby
                time.sleep(POLL_S)
                continue
            slot, token = row
            emit("claimed", slot=slot, token=token)
            why = work(conn, slot, token)
            emit("lost", slot=slot, token=token, why=why)
# docs/leases.md: end


if __name__ == "__main__":
    run(main, emit, float(os.environ.get("FLEET_LIFETIME_S", "100")))
