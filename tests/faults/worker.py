#!/usr/bin/env python3
"""One worker of the fault fleet (tests/faults/run.py), psycopg 3.

It drains its share of the table FAULT_TABLE in one of three modes:

- session: claim_slot(name, n, wait) on its own connection (a standby waits
  in claim_slot), my_token(name) for the fencing token;
- lease: claim_lease(name, n, holder, ttl) (a standby polls), renew_lease
  every FAULT_RENEW_S;
- elastic: claim_leases(name, n, holder, ttl => ttl) every FAULT_RENEW_S,
  whose result is every slot the worker holds (its fair share of the n
  slots among the live holders); it works on them in turn, and a slot not
  in a call's result is dropped at once.

Either way it walks the share with my_items in key order and writes each
batch in one transaction behind fence(): the items' update and one row per
item in processing_log (table, item, worker, slot, token), so the log is the
checker's record of who wrote what with which token. Any broken connection
(server stopped, backend killed, failover, partition) makes it reconnect
with exponential backoff, re-reading the server's conninfo from
FAULT_DSN_FILE (the driver rewrites it after a failover), and claim again;
a lost lease or a PC001 makes it claim again (elastic: drops the slot until
claim_leases returns it again). Every claim (elastic: every change of the
held slots), loss, rejected write and reconnect is one JSON line on stdout
for the driver.
"""
import datetime
import json
import os
import random
import sys
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
from elastic_leases import CLAIM, Held  # noqa: E402
from fleet_worker import run  # noqa: E402

DSN_FILE = os.environ["FAULT_DSN_FILE"]  # the server's libpq conninfo, read at every connect
MODE = os.environ["FAULT_MODE"]
NAME = os.environ["FAULT_NAME"]
TABLE = os.environ["FAULT_TABLE"]
N = int(os.environ["FAULT_N"])
TTL = datetime.timedelta(seconds=float(os.environ["FAULT_TTL_S"]))
RENEW_S = float(os.environ["FAULT_RENEW_S"])
BATCH = int(os.environ["FAULT_BATCH"])
ITEM_S = float(os.environ["FAULT_ITEM_MS"]) / 1000
HOLDER = os.environ.get("FAULT_HOLDER") or f"{MODE}-{os.getpid()}"
POLL_S = 0.1  # a lease standby's claim interval, and a walked share's pause
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 1.0


def emit(event, **fields):
    print(json.dumps({"event": event, "worker": HOLDER, "t": time.time(), **fields}), flush=True)


class Lost(Exception):
    """The claim is gone (lease lost, fence raised PC001): claim again."""


class ConnectionLost(Exception):
    """The connection broke, and the claim with it: reconnect and claim again."""


def claim(conn):
    """(slot, token) of a new claim; None while a standby."""
    if MODE == "session":
        (slot,) = conn.execute("SELECT claim_slot(%s, %s, '1 s')", (NAME, N)).fetchone()
        if slot is None:
            return None
        (token,) = conn.execute("SELECT my_token(%s)", (NAME,)).fetchone()
        return slot, token
    row = conn.execute("SELECT slot, token FROM claim_lease(%s, %s, %s, %s)",
                       (NAME, N, HOLDER, TTL)).fetchone()
    if row is None:
        time.sleep(POLL_S)
    return row


def write(conn, slot, token, todo):
    """The batch's writes, committed only while the claim is ours."""
    try:
        with conn.transaction():
            conn.execute("SELECT fence(%s, %s, %s)", (NAME, slot, token))
            conn.execute(f"UPDATE {TABLE} SET done = true WHERE id = ANY(%s)", (todo,))
            conn.execute("INSERT INTO processing_log (tbl, item, worker, slot, token)"
                         " SELECT %s, unnest(%s::bigint[]), %s, %s, %s",
                         (TABLE, todo, HOLDER, slot, token))
    except psycopg.Error as e:
        if e.sqlstate != "PC001":
            raise
        emit("rejected", slot=slot, token=token, items=len(todo))
        raise Lost("fence raised PC001") from e


def work(conn, slot, token):
    after, renew_at = None, time.monotonic() + RENEW_S
    while True:
        if MODE == "lease" and time.monotonic() >= renew_at:
            (until,) = conn.execute("SELECT renew_lease(%s, %s, %s, %s)",
                                    (NAME, slot, token, TTL)).fetchone()
            if until is None:
                raise Lost("renew_lease returned NULL")
            renew_at = time.monotonic() + RENEW_S
        rows = conn.execute(f"SELECT id, done FROM my_items(NULL::{TABLE}, %s, %s, after => %s,"
                            " batch => %s)", (slot, N, after, BATCH)).fetchall()
        if not rows:  # the share is walked: wait for new items after the last one
            time.sleep(POLL_S)
            continue
        todo = [item for item, done in rows if not done]
        if todo:
            emit("fetched", slot=slot, token=token, items=len(todo))
            time.sleep(ITEM_S * len(todo))  # the work on one batch
            write(conn, slot, token, todo)
        after = str(rows[-1][0])


def work_elastic(conn):
    """Elastic mode: claim_leases every RENEW_S on this connection; between the
    calls, a batch of each held slot in turn."""
    held = Held(TTL.total_seconds())
    next_call, idle = 0.0, 0

    def report():
        emit("held", slots=sorted(held.snapshot().items()), pid=conn.info.backend_pid)
    while True:
        if time.monotonic() >= next_call:
            asked = time.monotonic()
            rows = conn.execute(CLAIM, (NAME, N, HOLDER, TTL)).fetchall()
            gained, lost = held.replace(rows, asked)
            for slot, token in lost:
                emit("lost", slot=slot, token=token, why="not in the result of claim_leases")
            if gained or lost:
                report()
            next_call = asked + RENEW_S
        got = held.next()
        if got is None:
            time.sleep(POLL_S)
            continue
        slot, token, after = got
        rows = conn.execute(f"SELECT id, done FROM my_items(NULL::{TABLE}, %s, %s, after => %s,"
                            " batch => %s)", (slot, N, after, BATCH)).fetchall()
        if not rows:  # the share is walked: new items come after the cursor
            idle += 1
            if idle >= len(held.snapshot()):  # a round over the held slots found nothing
                idle = 0
                time.sleep(POLL_S)
            continue
        idle = 0
        todo = [item for item, done in rows if not done]
        if todo:
            emit("fetched", slot=slot, token=token, items=len(todo))
            time.sleep(ITEM_S * len(todo))  # the work on one batch
            try:
                write(conn, slot, token, todo)
            except Lost as e:
                held.drop(slot, token)
                emit("lost", slot=slot, token=token, why=str(e))
                report()
                continue
        held.advance(slot, token, str(rows[-1][0]))


def session(conn):
    """Claim and work on one connection until it breaks."""
    emit("connected", port=conn.info.port, pid=conn.info.backend_pid)
    if MODE == "elastic":
        return work_elastic(conn)
    while True:
        got = claim(conn)
        if got is None:
            continue
        emit("claimed", slot=got[0], token=got[1], pid=conn.info.backend_pid)
        try:
            work(conn, *got)
        except Lost as e:
            emit("lost", slot=got[0], token=got[1], why=str(e))
            if MODE == "session":
                conn.execute("SELECT release_slot(%s)", (NAME,))


def main():
    backoff = BACKOFF_MIN_S
    while True:
        try:
            dsn = open(DSN_FILE, encoding="utf-8").read()  # rewritten by the driver after a failover
            with psycopg.connect(dsn, autocommit=True, application_name=HOLDER) as conn:
                backoff = BACKOFF_MIN_S
                try:
                    session(conn)
                except psycopg.Error as e:
                    # server gone, backend killed, statement cancelled, session
                    # ended by idle_in_transaction_session_timeout (25P03),
                    # partition: the claim is lost with the connection. Any
                    # other error on a live connection is a bug: fatal.
                    if not (isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)) or conn.broken):
                        raise
                    raise ConnectionLost(f"{type(e).__name__}: {str(e).strip()[:200]}") from e
        except (psycopg.OperationalError, ConnectionLost) as e:  # a failed connect, or the above
            emit("disconnected", error=str(e).strip()[:200])
            time.sleep(backoff * (1 + random.random()))  # reconnect and claim again
            backoff = min(backoff * 2, BACKOFF_MAX_S)


if __name__ == "__main__":
    run(main, emit, float(os.environ["FAULT_LIFETIME_S"]))
