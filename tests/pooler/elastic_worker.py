#!/usr/bin/env python3
"""One elastic lease worker in Python (psycopg 3), started by
tests/pooler/test_elastic.py.

It connects through PgBouncer in pool_mode = transaction (the PG* environment
variables). A thread calls claim_leases(ELASTIC_NAME, ELASTIC_N, holder,
ttl => ELASTIC_TTL_S) every ELASTIC_PERIOD_S on a connection of its own; its
result is every slot the worker holds (tests/pylib/elastic_leases.py). The
worker loop takes the held slots in turn, fetches a batch of the slot's
share of `items` with my_items, works on it, and writes it in one
transaction behind fence(): a PC001 drops the slot until the next call
returns it. On SIGTERM it finishes its batch, then gives every slot back and
leaves the live set (claim_leases(..., max => 0)) and exits 0.

With ELASTIC_BALANCE=1 (tests/pooler/test_balance.py) it also balances by
remaining work (docs/leases.md, "Balancing"): each batch's transaction
reports the slot's pending items left (a bounded count) with
report_backlog, a slot found walked reports 0, and a slot the report says
is wanted elsewhere (the report lists every slot of the holder that another
holder wants) is released right after the batch commits.

Every change of the held slots, batch, write, rejected write and reconnection
is one JSON line on stdout.
"""
import datetime
import os
import secrets
import signal
import socket
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
from elastic_leases import Claimer, Held  # noqa: E402
from fleet_worker import emitter, run  # noqa: E402

NAME = os.environ["ELASTIC_NAME"]
N = int(os.environ["ELASTIC_N"])
TTL_S = float(os.environ["ELASTIC_TTL_S"])
PERIOD_S = float(os.environ["ELASTIC_PERIOD_S"])
BATCH = int(os.environ["ELASTIC_BATCH"])
ITEM_S = float(os.environ["ELASTIC_ITEM_MS"]) / 1000
BALANCE = os.environ.get("ELASTIC_BALANCE") == "1"
# the slot's pending items left, counted up to a cap (report_backlog's weight)
REMAINING = ("SELECT report_backlog(%s, %s, %s, (SELECT count(*) FROM (SELECT 1 FROM items"
             " WHERE slot_of(customer, %s) = %s AND NOT done LIMIT 10000) c))")
walked = set()  # (slot, token) of the leases whose share was found walked
POLL_S = 0.1  # the pause after a round over the held slots that found nothing to do
# one holder: this process, on this host (a pid is reused, the random part is not)
HOLDER = os.environ.get("ELASTIC_HOLDER") or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
emit = emitter(HOLDER)
stopping = threading.Event()


def connect():
    # PgBouncer 1.18 has no max_prepared_statements: no server-side prepares
    return psycopg.connect(autocommit=True, prepare_threshold=None)


def process(ids):
    time.sleep(ITEM_S * len(ids))  # the work on one batch (e-mails, calls, ...)


def work_once(conn, held):
    """One batch of the next held slot. Returns False when there was nothing to do."""
    got = held.next()
    if got is None:
        return False
    slot, token, after = got
    rows = conn.execute("SELECT id, done FROM my_items(NULL::items, %s, %s, route => 'customer',"
                        " after => %s, batch => %s)",
                        (slot, N, after, BATCH)).fetchall()
    if not rows:  # the share is walked; new items come after the cursor
        if BALANCE and (slot, token) not in walked:  # reported empty once per lease
            walked.add((slot, token))
            conn.execute("SELECT report_backlog(%s, %s, %s, 0)", (NAME, slot, token))
        return False
    last = str(rows[-1][0])
    todo = [item for item, done in rows if not done]
    if todo:
        emit("fetched", slot=slot, token=token, items=len(todo))
        process(todo)  # a batch takes well under the ttl
        try:
            with conn.transaction():  # the batch's writes commit only if the slot is still ours
                conn.execute("SELECT fence(%s, %s, %s)", (NAME, slot, token))
                conn.execute("UPDATE items SET done = true WHERE id = ANY(%s)", (todo,))
                conn.execute("INSERT INTO processing_log (item, worker, slot, token)"
                             " SELECT unnest(%s::bigint[]), %s, %s, %s", (todo, HOLDER, slot, token))
                wanted = BALANCE and conn.execute(REMAINING, (NAME, slot, token, N, slot)).fetchone()[0]
        except psycopg.Error as e:
            if e.sqlstate != "PC001":
                raise
            held.drop(slot, token)
            emit("rejected", slot=slot, token=token, items=len(todo), how="PC001")
            return True
        emit("wrote", slot=slot, token=token, items=len(todo))
        if wanted:  # slots another holder wants (this one or others): given back after this batch
            mine = held.snapshot()
            for s in wanted:
                if s in mine:
                    released = conn.execute("SELECT release_lease(%s, %s, %s)", (NAME, s, mine[s])).fetchone()[0]
                    held.drop(s, mine[s])
                    emit("gave", slot=s, token=mine[s], released=released)
            return True
    held.advance(slot, token, last)
    return True


def main():
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    held = Held(valid_s=TTL_S)

    def changed(gained, lost):
        for slot, token in lost:
            emit("lost", slot=slot, token=token)
        emit("held", slots=sorted(held.snapshot().items()))

    claimer = Claimer(connect, NAME, N, HOLDER, TTL_S, PERIOD_S, held, changed)
    emit("started", ttl=str(datetime.timedelta(seconds=TTL_S)))
    claimer.start()
    conn, idle = None, 0
    while not stopping.is_set():
        try:
            conn = conn or connect()
            if work_once(conn, held):
                idle = 0
            else:
                idle += 1
                if idle >= max(1, len(held.snapshot())):  # a round over the held slots found nothing
                    idle = 0
                    stopping.wait(POLL_S)
        except psycopg.Error as e:
            # the connection is gone: connect again; the held slots are the claim thread's
            if conn is not None and not (conn.broken or conn.closed):
                raise
            emit("reconnecting", error=str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            conn = None
            time.sleep(POLL_S)
    if conn is not None:
        conn.close()
    gone = claimer.leave()
    emit("left", slots=gone)


if __name__ == "__main__":
    run(main, emit, float(os.environ.get("ELASTIC_LIFETIME_S", "120")))
