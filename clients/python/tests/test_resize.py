"""pg_claim.Worker following an online resize (resize_fleet) against a real
server: a live lease worker is resized 4 -> 8 in the middle of a drain, a
second one starts after it with the old n; both follow the new n by
themselves, every row is handled once, no slot is told lost for a wrong
reason. A session worker refused with 55000 stops with a clear error.
Skipped without a server (PGHOST, PGPORT, PGUSER)."""
import threading
import time

import psycopg

import pg_claim

from test_server import Run, db, make_table, wait_for  # noqa: F401  (db: the fixture)


def slow_handler(tbl, seen_n, lock):
    def handle(tx, rows):
        ids = [r["id"] for r in rows]
        tx.execute(psycopg.sql.SQL("UPDATE {} SET done = true WHERE id = ANY(%s)").format(rows.table), (ids,))
        tx.execute("INSERT INTO log SELECT %s, unnest(%s::bigint[]), %s, %s, %s",
                   (tbl, ids, rows.slot, rows.token, rows.table.as_string(tx)))
        with lock:
            seen_n.append(rows.slot)
        time.sleep(0.01)  # a drain of a few seconds: the resize lands in its middle
    return handle


def test_a_lease_worker_follows_a_resize(db):  # noqa: F811
    tbl, name, rows = "t_resize", "resize_py", 3000
    make_table(db, tbl, rows)
    seen, lock = [], threading.Lock()
    first = Run(name=name, table=tbl, n=4, pending="done", batch=10, ttl=3, handler=slow_handler(tbl, seen, lock),
                poll_interval=0.2)
    second = None
    try:
        wait_for(lambda: db.execute("SELECT count(*) FROM log WHERE tbl = %s", (tbl,)).fetchone()[0] >= 300,
                 what="a part of the drain")
        held_before = set(first.worker.slots)
        assert held_before and held_before <= set(range(4))
        (old,) = db.execute("SELECT resize_fleet(%s, 8)", (name,)).fetchone()
        assert old == 4
        wait_for(lambda: first.said("resized"), what="the resized event")
        assert first.said("resized") == [{"old_n": 4, "n": 8}]
        # a worker started with the old n: its first claim is refused (PC002), it follows
        second = Run(name=name, table=tbl, n=4, pending="done", batch=10, ttl=3,
                     handler=slow_handler(tbl, seen, lock), poll_interval=0.2)
        wait_for(lambda: second.said("resized") or second.error, what="the second worker's resized event")
        assert second.error is None, second.error
        assert second.said("resized") == [{"old_n": 4, "n": 8}]
        wait_for(lambda: db.execute(f"SELECT count(*) FROM {tbl} WHERE NOT done").fetchone()[0] == 0,
                 timeout=60, what="the drain")
        wait_for(lambda: len(set(first.worker.slots) | set(second.worker.slots)) == 8, what="all 8 slots served")
        assert first.worker.n == second.worker.n == 8
        # a slot handed over between the two holders is unheld for a moment: polled
        leased = lambda: db.execute("SELECT slot, holder FROM lease_holders(%s) WHERE NOT expired ORDER BY slot",  # noqa: E731
                                    (name,)).fetchall()
        wait_for(lambda: len(leased()) == 8, what="all 8 slots leased")
        holders = leased()
        assert [s for s, _ in holders] == list(range(8))
        assert {h for _, h in holders} == {first.worker.holder, second.worker.holder}
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert first.error is None and second.error is None
    # every row once; slots of the new n only after the resize
    dup = db.execute("SELECT item, count(*) FROM log WHERE tbl = %s GROUP BY item HAVING count(*) > 1",
                     (tbl,)).fetchall()
    assert dup == []
    assert db.execute("SELECT count(DISTINCT item) FROM log WHERE tbl = %s", (tbl,)).fetchone()[0] == rows
    assert max(seen) >= 4
    # right after the resized event, every slot held then is lost as `resized`; no lease
    # of the old n is ever told `taken` (a fence refused after the resize is not another
    # holder's), and no slot `expired` (a lease of the new n may be `taken` for balance:
    # a worker whose batches are fenced loses a slot between two batches at once)
    resized_at = next(i for i, (_, e, _f) in enumerate(first.events) if e == "resized")
    after = first.events[resized_at + 1:]
    upto = next(i for i, (_, e, _f) in enumerate(after) if e == "slots")
    told = [(f["slot"], f["reason"]) for _, e, f in after[:upto] if e == "lost"]
    assert told and {r for _, r in told} == {"resized"}
    assert after[upto][2]["held"] == []
    old = {(f["slot"], f["token"]) for _, e, f in first.events[:resized_at] if e == "gained"}
    for run in (first, second):
        lost = run.said("lost")
        reasons = {f["reason"] for f in lost if (f["slot"], f["token"]) in old}
        assert reasons <= {"resized", "given back", "released"}, reasons
        assert "expired" not in {f["reason"] for f in lost}
    # the claims after the resize name n = 8: every gained token after it is one of the new leases
    gained_after = [f["slot"] for _, e, f in first.events[resized_at:] if e == "gained"]
    assert gained_after and max(gained_after) < 8



def test_a_session_worker_stops_with_a_clear_error(db):  # noqa: F811
    """Session mode does not follow: claim_slots refused with 55000 (the
    name is leased by a lease fleet) stops the worker with pg_claim.Error."""
    tbl, name = "t_resize_session", "resize_session"
    make_table(db, tbl, 50)
    db.execute("SELECT count(*) FROM claim_leases(%s, 4, 'someone', ttl => '30 seconds')", (name,))
    w = Run(name=name, table=tbl, n=4, pending="done", mode="session", handler=lambda tx, rows: None)
    wait_for(lambda: not w.thread.is_alive(), what="the session worker to stop")
    assert isinstance(w.error, pg_claim.Error), w.error
    assert "55000" in str(w.error) and "not resized online" in str(w.error)
    assert isinstance(w.error.__cause__, psycopg.Error) and w.error.__cause__.sqlstate == "55000"
    assert w.said("gained") == []


def test_a_batch_in_flight_commits_before_the_resize(db):  # noqa: F811
    """resize_fleet waits for the fenced batch in flight, which commits; the
    worker then follows (resized), and the old token's next fence is not
    told as `taken`."""
    tbl, name = "t_resize_flight", "resize_flight"
    make_table(db, tbl, 300)
    entered, release, first = threading.Event(), threading.Event(), {}

    def handle(tx, rows):
        if not first:
            first.update(slot=rows.slot, token=rows.token, ids=[r["id"] for r in rows])
            entered.set()
            release.wait(30)  # inside the fenced transaction, while the resize is called
        ids = [r["id"] for r in rows]
        tx.execute(psycopg.sql.SQL("UPDATE {} SET done = true WHERE id = ANY(%s)").format(rows.table), (ids,))
        tx.execute("INSERT INTO log SELECT %s, unnest(%s::bigint[]), %s, %s, %s",
                   (tbl, ids, rows.slot, rows.token, rows.table.as_string(tx)))
    w = Run(name=name, table=tbl, n=2, pending="done", batch=10, ttl=5, handler=handle, poll_interval=0.2)
    result = {}
    try:
        assert entered.wait(20), "no batch started"

        def resize():
            with psycopg.connect(dbname=db.info.dbname, autocommit=True, application_name="resizer") as c:
                result["old"] = c.execute("SELECT resize_fleet(%s, 3)", (name,)).fetchone()[0]
        t = threading.Thread(target=resize, daemon=True)
        t.start()
        # the resize waits for the batch (a lock wait of its session), and has not returned
        wait_for(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'resizer'"
                                    " AND wait_event_type IN ('Lock', 'LWLock')").fetchone()[0] == 1,
                 what="the resize waiting for the batch in flight")
        assert "old" not in result and w.said("resized") == []
        release.set()
        t.join(20)
        assert result.get("old") == 2
        wait_for(lambda: w.said("resized"), what="the resized event")
        wait_for(lambda: db.execute(f"SELECT count(*) FROM {tbl} WHERE NOT done").fetchone()[0] == 0,
                 what="the drain")
    finally:
        release.set()
        w.stop()
    assert w.error is None
    assert w.said("resized") == [{"old_n": 2, "n": 3}]
    # the batch in flight committed, once
    logged = db.execute("SELECT item, count(*), min(token) FROM log WHERE tbl = %s AND item = ANY(%s) GROUP BY item",
                        (tbl, first["ids"])).fetchall()
    assert sorted(i for i, _, _ in logged) == sorted(first["ids"])
    assert all(k == 1 and tok == first["token"] for _, k, tok in logged)
    assert db.execute("SELECT count(*), count(DISTINCT item) FROM log WHERE tbl = %s", (tbl,)).fetchone() == (300, 300)
    assert "taken" not in {f["reason"] for f in w.said("lost")}
    assert any(f["slot"] == first["slot"] and f["reason"] == "resized" for f in w.said("lost"))
