"""Lease mode's balance by remaining work (docs/leases.md, "Balancing")
against the server of test_server.py: a joiner's share within seconds, the
weights counted in windows, the census after new rows and of taken slots,
balance=False."""
import time

from test_server import Run, db, handler_for, make_table, wait_for  # noqa: F401  (db: the fixture)


def test_a_joiner_gets_its_share_by_weight_within_seconds(db):
    """Balance by remaining work (docs/leases.md, "Balancing"): a worker
    that joins a fleet whose only worker holds every slot takes slots that
    no batch holds at once, and the others after that worker's batch
    (report_backlog says they are wanted), within a few seconds, not at
    the holder's next renew (ttl / 3 = 10 s); the weights are on the
    leases; every row once."""
    tbl, name = "t_balance", "balance"
    make_table(db, tbl, 2000)

    def slow(tx, rows):
        time.sleep(0.005 * len(rows))
        handler_for(tbl)(tx, rows)
    first = Run(name=name, table=tbl, n=4, pending="done", batch=10, ttl=30, handler=slow, poll_interval=0.2)
    second = None
    try:
        # past the damping (least(ttl / 3, 5 s)): the first worker's leases are 5 s old
        wait_for(lambda: db.execute("SELECT count(*) = 4 FROM lease_holders(%s) WHERE NOT expired"
                                    " AND acquired_at < now() - interval '5.2 seconds'", (name,)).fetchone()[0],
                 timeout=15, what="the first worker's leases, 5 s old")
        assert db.execute(f"SELECT count(*) > 0 FROM {tbl} WHERE NOT done").fetchone()[0], "drained before the join"
        joined = time.monotonic()
        second = Run(name=name, table=tbl, n=4, pending="done", batch=10, ttl=30, handler=slow, poll_interval=0.2)
        wait_for(lambda: second.said("gained"), timeout=8, what="the joiner's first slot")
        took = time.monotonic() - joined
        assert took < 5, f"the joiner got its first slot {took:.1f} s after it started"
        # taken between two batches (the first worker learns it at its next
        # fence of the slot), or marked and given back after a batch
        wait_for(lambda: any(f.get("reason") in ("given back", "taken") for f in first.said("lost")),
                 timeout=5, what="the first worker's slot lost for balance")
        assert db.execute("SELECT count(backlog) > 0 FROM pg_claim_leases WHERE name = %s", (name,)).fetchone()[0]
        wait_for(lambda: db.execute(f"SELECT count(*) = 0 FROM {tbl} WHERE NOT done").fetchone()[0],
                 timeout=60, what="the drain")
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert first.error is None and second.error is None, (first.error, second.error)
    (logged, distinct) = db.execute("SELECT count(*), count(DISTINCT item) FROM log WHERE tbl = %s", (tbl,)).fetchone()
    assert logged == distinct == 2000


def test_the_weight_is_the_slots_counted_pending_rows(db):
    """A slot's weight is its pending rows ahead of the cursor, counted in
    windows (pg_claim/_backlog.py), not the batch size a full batch showed:
    the leases carry weights beyond the first window, and none above the
    slot's own rows."""
    from pg_claim._backlog import FIRST_WINDOW
    tbl, name = "t_counted", "counted"
    make_table(db, tbl, 2000)
    (most,) = db.execute(f"SELECT max(k) FROM (SELECT count(*) AS k FROM {tbl} GROUP BY slot_of(id, 2)) x").fetchone()

    def slow(tx, rows):
        time.sleep(0.002 * len(rows))
        handler_for(tbl)(tx, rows)
    r = Run(name=name, table=tbl, n=2, pending="done", batch=10, ttl=30, handler=slow, poll_interval=0.2)
    seen = []
    try:
        def weights():
            seen.extend(w for (w,) in db.execute("SELECT backlog FROM pg_claim_leases WHERE name = %s"
                                                 " AND backlog IS NOT NULL", (name,)))
            return any(w > FIRST_WINDOW * 10 for w in seen)
        wait_for(weights, timeout=20, what="a weight beyond the first window")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert max(seen) <= most, (most, sorted(set(seen)))


def test_balance_off_sends_no_report(db):
    """balance=False: no report_backlog, no weight on the leases."""
    tbl, name = "t_nobalance", "nobalance"
    make_table(db, tbl, 100)
    r = Run(name=name, table=tbl, n=4, pending="done", batch=10, ttl=3, handler=handler_for(tbl),
            poll_interval=0.2, balance=False)
    try:
        wait_for(lambda: db.execute(f"SELECT count(*) = 0 FROM {tbl} WHERE NOT done").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert r.error is None
    assert db.execute("SELECT count(backlog) = 0 FROM pg_claim_leases WHERE name = %s", (name,)).fetchone()[0]


def batches_until_weighed(db, tbl, name, n, rows_before, rows_after):
    """A worker of n slots with rows_before rows, slow batches (0.2 s); when
    rows_after is not None, once every slot weighs 0 those rows come. The
    number of batches it ran until every slot's lease carried a weight
    above 0, and those weights."""
    make_table(db, tbl, rows_before)
    batches = []

    def slow(tx, rows):
        time.sleep(0.2)
        handler_for(tbl)(tx, rows)
    r = Run(name=name, table=tbl, n=n, pending="done", batch=10, ttl=30, handler=slow, poll_interval=0.2,
            on_event=lambda e, f: e == "batch" and batches.append(f))
    try:
        if rows_after is not None:
            wait_for(lambda: db.execute("SELECT count(*) FROM pg_claim_leases WHERE name = %s AND backlog = 0"
                                        " AND expires_at > now()", (name,)).fetchone()[0] == n,
                     what="every slot weighed 0")
            db.execute(f"INSERT INTO {tbl} SELECT g, 'p', false FROM generate_series(1, {rows_after}) g")
        wait_for(lambda: db.execute("SELECT count(*) FROM pg_claim_leases WHERE name = %s AND backlog > 0",
                                    (name,)).fetchone()[0] == n, what="every slot weighed")
        seen = len(batches)
        weights = [w for (w,) in db.execute("SELECT backlog FROM pg_claim_leases WHERE name = %s", (name,))]
    finally:
        r.stop()
    assert r.error is None, r.error
    return seen, weights


def test_new_rows_are_weighed_in_every_slot_at_once(db):
    """A batch that finds rows in a slot that weighed 0 counts the worker's
    other slots that weigh 0 at once (a census) and reports their weights
    with its own: once rows come to every slot of an idle worker, every
    lease carries its weight after its first batch (a poll's lag: two), not
    one batch per slot."""
    n = 8
    seen, weights = batches_until_weighed(db, "t_census", "census", n, 0, n * 100)
    assert seen <= 2, f"every slot weighed only after {seen} batches"
    assert all(0 < w <= 100 for w in weights), weights


def test_taken_slots_are_weighed_at_once(db):
    """The slots a worker takes are counted at its next batch, in one
    census, not each at its own first batch: a worker that starts with 8
    slots of rows reports every slot's weight after fewer than 8 batches,
    and no weight above a slot's own rows."""
    n = 8
    seen, weights = batches_until_weighed(db, "t_taken", "taken", n, n * 100, None)
    (most,) = db.execute("SELECT max(k) FROM (SELECT count(*) AS k FROM t_taken GROUP BY slot_of(id, %s)) x",
                         (n,)).fetchone()
    assert seen < n, f"every slot weighed only after {seen} batches"
    assert all(0 < w <= most for w in weights), (most, weights)
