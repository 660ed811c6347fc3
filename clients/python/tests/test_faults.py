"""pg_claim.Worker against handlers that misbehave and a network path that
stops answering, on the scripts/test cluster (see test_server.py): a handler
that commits or rolls back the batch's transaction itself, one whose item
always fails with a transient error or closes the connection, retries at
their back-off's time, and a half-open connection (a TCP proxy that stops
forwarding bytes without closing a socket)."""
import os
import socket
import threading
import time

import psycopg
import pytest

from test_server import DB, Run, db, failures, handler_for, make_table, wait_for  # noqa: F401 (db: fixture)


def items_done(db, tbl):
    return db.execute(f"SELECT count(*) FROM {tbl} WHERE done").fetchone()[0]


def test_a_handler_that_commits_itself_leaves_no_failure_records(db):
    """Its rows are done (its COMMIT did that), but the batch is never counted
    as done, and no row that is done gets a failure record."""
    make_table(db, "selfcommit", 20)

    def handle(tx, rows):
        tx.execute("UPDATE selfcommit SET done = true WHERE id = ANY(%s)", ([r["id"] for r in rows],))
        tx.execute("COMMIT")
    r = Run(name="selfcommit", table="selfcommit", n=1, pending="done", batch=20, ttl=3, handler=handle,
            backoff=0.1, poll_interval=0.2)
    try:
        wait_for(lambda: items_done(db, "selfcommit") == 20, what="the rows done")
        wait_for(lambda: r.said("idle"), what="idle")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert failures(db, "selfcommit") == []
    assert r.worker.stats.snapshot()["items"] == 0
    assert not r.said("failed") and all(b["items"] == 0 for b in r.said("batch"))


@pytest.mark.parametrize("how", ["ROLLBACK", "COMMIT"])
def test_a_handler_that_ends_the_transaction_of_an_item_makes_it_dead(db, how):
    """A handler that runs ROLLBACK (or COMMIT, without doing the row) for
    one item: that item fails at each attempt, its attempts add up (never
    reset by a clear_failure outside the transaction) and it is dead after
    max_attempts; the others are done once."""
    tbl = f"ends_{how.lower()}"
    make_table(db, tbl, 30, poison=[7])

    def handle(tx, rows):
        if any(r["payload"] == "poison" for r in rows):
            tx.execute(how)
            return
        tx.execute(f"UPDATE {tbl} SET done = true WHERE id = ANY(%s)", ([r["id"] for r in rows],))
    r = Run(name=tbl, table=tbl, n=1, pending="done", batch=10, ttl=3, handler=handle, max_attempts=3,
            backoff=0.1, poll_interval=0.2)
    try:
        wait_for(lambda: failures(db, tbl) == [("7", "dead", 3)], 20, "item 7 dead after 3 attempts")
        wait_for(lambda: items_done(db, tbl) == 29, what="the other 29 done")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert r.worker.stats.snapshot()["items"] == 29
    assert [f["attempts"] for f in r.said("failed") + r.said("dead")] == [1, 2, 3]
    assert "ended inside the handler" in r.said("dead")[0]["error"]


@pytest.mark.parametrize("how", ["deadlock", "close"])
def test_an_item_that_always_fails_transiently_is_recorded(db, how):
    """An item whose handler always raises 40P01 (or closes the connection):
    the batch is tried again after 0.1, 0.2, 0.4, 0.8 s (the cap being ttl/3
    = 1 s), then goes item by item after 5 transient failures in a row, so
    the item's failure is recorded and it is dead after max_attempts; the
    rest is done and the worker opens a bounded number of connections."""
    tbl = f"transient_{how}"
    make_table(db, tbl, 30, poison=[12])

    def handle(tx, rows):
        if any(r["payload"] == "poison" for r in rows):
            if how == "close":
                tx.close()
                return
            tx.execute("DO $$BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END$$")
        tx.execute(f"UPDATE {tbl} SET done = true WHERE id = ANY(%s)", ([r["id"] for r in rows],))
    r = Run(name=tbl, table=tbl, n=1, pending="done", batch=10, ttl=3, handler=handle, max_attempts=2,
            backoff=0.1, poll_interval=0.2)
    try:
        wait_for(lambda: failures(db, tbl) == [("12", "dead", 2)], 30, "item 12 dead after 2 attempts")
        wait_for(lambda: items_done(db, tbl) == 29, what="the other 29 done")
    finally:
        r.stop()
    assert r.error is None, r.error
    pauses = [f["pause"] for _, e, f in r.events if e in ("retrying", "reconnecting")]
    assert pauses[:4] == [0.1, 0.2, 0.4, 0.8], pauses
    assert all(p <= 1.0 for p in pauses), pauses
    # two attempts, each after at most 5 transient failures (and one more
    # for a closed connection, whose record is written on the next one)
    assert len(pauses) <= 2 * 6, pauses
    if how == "close":
        assert r.worker.stats.snapshot()["reconnects"] <= 2 * 6
    errors = [f["error"] for f in r.said("failed") + r.said("dead")]
    assert len(errors) == 2 and all(("deadlock" if how == "deadlock" else "closed") in e for e in errors), errors


def test_retries_run_at_their_back_off(db):
    """A poison item early in a share whose walk takes seconds: its attempts
    are spaced by the back-off (0.3 s, doubled at each attempt), not by the
    walk coming round."""
    make_table(db, "ontime", 400, poison=[3])
    attempts = []

    def handle(tx, rows):
        if len(rows) == 1 and rows[0]["payload"] == "poison":
            attempts.append(time.monotonic())
        time.sleep(0.05)
        handler_for("ontime")(tx, rows)
    r = Run(name="ontime", table="ontime", n=1, pending="done", batch=5, ttl=5, handler=handle, max_attempts=4,
            backoff=0.3, poll_interval=0.2)
    try:
        wait_for(lambda: failures(db, "ontime") == [("3", "dead", 4)], 30, "item 3 dead")
        walked = items_done(db, "ontime")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert len(attempts) == 4, attempts
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    # never early; late by at most a second (a loaded machine), far below
    # a pass of the walk (80 batches of 0.05 s: 4 s)
    for gap, want in zip(gaps, (0.3, 0.6, 1.2)):
        assert want - 0.05 <= gap <= want + 1.0, gaps
    # the item was dead before the walk's first pass was over
    assert walked < 399, walked


# --- a half-open connection ------------------------------------------------------

class Proxy:
    """A TCP proxy on 127.0.0.1 to the server's Unix-domain socket that, on
    stall(), stops forwarding bytes both ways without closing a socket (new
    connections are accepted and not forwarded either): to the worker, a
    network path that drops every packet."""

    def __init__(self):
        self.upstream = os.path.join(os.environ.get("PGHOST", "/tmp"), f".s.PGSQL.{os.environ.get('PGPORT', 5432)}")
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX)
            server.connect(self.upstream)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while True:
                self.flowing.wait()
                data = src.recv(65536)
                if not data:
                    break
                self.flowing.wait()  # bytes read before a stall are held
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def stall(self):
        self.flowing.clear()

    def resume(self):
        self.flowing.set()

    def close(self):
        self.flowing.set()
        self.listener.close()
        for s in self.sockets:
            s.close()


def test_a_half_open_connection_is_bounded_by_the_ttl(db):
    """Through the proxy, lease mode, ttl 3 s: once it stalls, the claimer
    fails (claim_failed), no batch starts after 2/3 of the ttl, every slot is
    dropped after about a ttl; once it flows again the worker reconnects and
    works; stalled in the middle of a batch, stop() returns within the ttl."""
    make_table(db, "halfopen", 0)
    proxy = Proxy()
    started = []
    in_batch = threading.Event()

    def handle(tx, rows):
        started.append(time.monotonic())
        if any(r["payload"] == "stall" for r in rows):
            proxy.stall()
            in_batch.set()
        tx.execute("UPDATE halfopen SET done = true WHERE id = ANY(%s)", ([r["id"] for r in rows],))
    ttl = 3.0
    r = Run(conninfo=f"host=127.0.0.1 port={proxy.port} dbname={DB} user={os.environ.get('PGUSER', 'postgres')}",
            name="halfopen", table="halfopen", n=2, pending="done", ttl=ttl, handler=handle, poll_interval=0.2)
    try:
        wait_for(lambda: len(r.worker.slots) == 2, what="both slots held")
        db.execute("INSERT INTO halfopen SELECT g, 'p', false FROM generate_series(1, 20) g")
        wait_for(lambda: items_done(db, "halfopen") == 20, what="the first rows done")
        t0 = time.monotonic()
        proxy.stall()
        db.execute("INSERT INTO halfopen SELECT g, 'p', false FROM generate_series(21, 40) g")
        # the next call within ttl/3, its reply given up after 2/3 of the ttl
        wait_for(lambda: any(t > t0 for t, e, _ in r.events if e == "claim_failed"), ttl + 1, "claim_failed")
        wait_for(lambda: not r.worker.slots, ttl + 2.5, "every slot dropped")
        dropped = time.monotonic() - t0
        assert dropped <= ttl + 2.5, dropped
        assert r.worker.stats.snapshot()["held"] == 0
        assert not [t for t in started if t > t0 + ttl * 2 / 3]
        proxy.resume()
        wait_for(lambda: items_done(db, "halfopen") == 40, 20, "the rows done after the path came back")
        assert r.error is None, r.error
        # stalled inside a batch (its UPDATE waits for a reply that never comes)
        db.execute("INSERT INTO halfopen VALUES (41, 'stall', false)")
        assert in_batch.wait(10), "the stalling batch never started"
        time.sleep(0.2)
        took = r.stop(timeout=ttl + 5)
        assert took <= ttl, took
    finally:
        proxy.close()
        if r.thread.is_alive():
            r.stop()
    assert r.error is None, r.error


def test_a_claim_answered_late_but_in_time_keeps_the_slots(db):
    """Lease mode, ttl 6 s: the claimer's call waits 3 s on a row lock that
    another session holds on the holder's member row (longer than the
    renew period of 2 s, shorter than 2/3 of the ttl, 4 s). The reply is
    awaited and taken: no claim_failed, no slot lost."""
    make_table(db, "late_reply", 0)
    r = Run(name="late_reply", table="late_reply", n=2, pending="done", ttl=6, holder="late-reply",
            handler=handler_for("late_reply"), poll_interval=0.2)
    try:
        wait_for(lambda: len(r.worker.slots) == 2, what="both slots held")
        t0 = time.monotonic()
        with psycopg.connect(dbname=DB) as locker:
            locker.execute("SELECT 1 FROM pg_claim_lease_members WHERE name = 'late_reply' AND holder = 'late-reply'"
                           " FOR UPDATE")
            waited = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                      " AND query LIKE '%claim_leases%' AND now() - query_start > interval '3 seconds'")
            wait_for(lambda: db.execute(waited).fetchone()[0] > 0, 10, "a claim_leases call waiting 3 s")
        db.execute("INSERT INTO late_reply SELECT g, 'p', false FROM generate_series(1, 20) g")
        wait_for(lambda: items_done(db, "late_reply") == 20, 10, "the rows done after the lock")
        late = [(e, f) for t, e, f in r.events if t > t0 and e in ("claim_failed", "lost")]
        assert late == [], late
        assert len(r.worker.slots) == 2
    finally:
        r.stop()
    assert r.error is None, r.error
