"""pg_claim.Worker against a real server (PGHOST, PGPORT, PGUSER: the
scripts/test cluster) in a database of its own; through PgBouncer too when
PGC_POOLER_PORT names one in transaction mode. Skipped without a server."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psycopg
import pytest

import pg_claim

HERE = os.path.dirname(os.path.abspath(__file__))
# one database per pytest-xdist worker (the libs-python layer runs the
# modules two at a time); the modules of one worker run one after another
DB = "py_lib_test" + os.environ.get("PYTEST_XDIST_WORKER", "")


def connect(dbname=DB):
    return psycopg.connect(dbname=dbname, autocommit=True)


@pytest.fixture(scope="module")
def db():
    try:
        with connect("postgres") as c:
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {DB}")
    except psycopg.OperationalError as e:
        pytest.skip(f"no server: {e}")
    c = connect()
    c.execute("CREATE EXTENSION pg_claim")
    yield c
    c.close()
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def dsn(port=None):
    if port is None:
        return f"dbname={DB}"
    return f"host=127.0.0.1 port={port} dbname={DB} user=postgres"


def make_table(db, name, rows=500, poison=(), partitioned=False, n=4):
    db.execute(f"DROP TABLE IF EXISTS {name}")
    part = " PARTITION BY HASH (id)" if partitioned else ""
    db.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, payload text, done boolean NOT NULL DEFAULT false){part}")
    if partitioned:
        for r in range(n):
            db.execute(f"CREATE TABLE {name}_{r} PARTITION OF {name} FOR VALUES WITH (MODULUS {n}, REMAINDER {r})")
    db.execute("CREATE TABLE IF NOT EXISTS log (tbl text, item bigint, slot int, token bigint, part text)")
    db.execute(f"INSERT INTO {name} SELECT g, CASE WHEN g = ANY(%s) THEN 'poison' ELSE 'p' END, false"
               " FROM generate_series(1, %s) g", (list(poison), rows))


def handler_for(tbl):
    def handle(tx, rows):
        for r in rows:
            if r["payload"] == "poison":
                raise RuntimeError(f"poison {r['id']}")
        ids = [r["id"] for r in rows]
        tx.execute(psycopg.sql.SQL("UPDATE {} SET done = true WHERE id = ANY(%s)").format(rows.table), (ids,))
        tx.execute("INSERT INTO log SELECT %s, unnest(%s::bigint[]), %s, %s, %s",
                   (tbl, ids, rows.slot, rows.token, rows.table.as_string(tx)))
    return handle


class Run:
    """A Worker running in a thread, with its events."""

    def __init__(self, **kw):
        self.events = []
        kw.setdefault("on_event", lambda e, f: self.events.append((time.monotonic(), e, f)))
        self.worker = pg_claim.Worker(kw.pop("conninfo", dsn()), **kw)
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.worker.run()
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def stop(self, timeout=10):
        t = time.monotonic()
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        return time.monotonic() - t

    def said(self, event):
        return [f for _, e, f in self.events if e == event]


def wait_for(fn, timeout=20, what="a condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def failures(db, name):
    return db.execute("SELECT item, state, attempts FROM item_failures(%s) ORDER BY item", (name,)).fetchall()


@pytest.mark.parametrize("mode", ["lease", "session"])
def test_drain_with_a_poison_item(db, mode):
    tbl, name = f"t_{mode}", f"drain_{mode}"
    make_table(db, tbl, 500, poison=[77])
    runs = [Run(name=name, table=tbl, n=4, pending="done", batch=20, mode=mode, ttl=3,
                handler=handler_for(tbl), max_attempts=3, backoff=0.1, poll_interval=0.2) for _ in range(2)]
    try:
        wait_for(lambda: db.execute(f"SELECT count(*) = 499 FROM {tbl} WHERE done").fetchone()[0], what="drain")
        wait_for(lambda: failures(db, name) == [("77", "dead", 3)], what="the poison item dead")
    finally:
        took = [r.stop() for r in runs]
    assert all(r.error is None for r in runs), [r.error for r in runs]
    assert max(took) < 3
    (logged, distinct) = db.execute("SELECT count(*), count(DISTINCT item) FROM log WHERE tbl = %s", (tbl,)).fetchone()
    assert logged == distinct == 499
    stats = [r.worker.stats.snapshot() for r in runs]
    assert sum(s["items"] for s in stats) == 499 and sum(s["dead"] for s in stats) == 1
    assert sum(s["failures"] for s in stats) == 3
    assert sum(len(r.said("dead")) for r in runs) == 1
    if mode == "lease":
        assert db.execute("SELECT count(*) FROM lease_holders(%s) WHERE NOT expired", (name,)).fetchone()[0] == 0
    else:
        assert db.execute("SELECT count(*) FROM slot_holders(%s)", (name,)).fetchone()[0] == 0


def test_hash_partitioned_table_uses_the_slot_partition(db):
    make_table(db, "hp", 400, partitioned=True, n=4)
    r = Run(name="hp", table="hp", n=4, pending="done", batch=25, ttl=3, handler=handler_for("hp"),
            poll_interval=0.2)
    try:
        wait_for(lambda: db.execute("SELECT bool_and(done) FROM hp").fetchone()[0], what="drain")
    finally:
        r.stop()
    started = r.said("started")[0]
    assert started["partitioned"] and started["method"] == "pg_hash"
    wrong = db.execute("SELECT count(*) FROM log WHERE tbl = 'hp' AND part <> 'hp_' || slot"
                       " OR tbl = 'hp' AND pg_hash_slot(item, 4) <> slot").fetchone()[0]
    assert wrong == 0


def test_not_partitioned_with_modulus_n_falls_back_to_the_table(db):
    make_table(db, "hp8", 100, partitioned=True, n=8)
    r = Run(name="hp8", table="hp8", n=4, pending="done", ttl=3, handler=handler_for("hp8"), poll_interval=0.2)
    try:
        wait_for(lambda: db.execute("SELECT bool_and(done) FROM hp8").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert not r.said("started")[0]["partitioned"]
    assert db.execute("SELECT count(DISTINCT part) FROM log WHERE tbl = 'hp8'").fetchone()[0] == 1


def test_a_failing_batch_commits_the_rest_and_never_spins(db):
    make_table(db, "fails", 60, poison=list(range(1, 61, 2)))
    r = Run(name="fails", table="fails", n=2, pending="done", batch=10, ttl=3, handler=handler_for("fails"),
            max_attempts=2, backoff="200 milliseconds", poll_interval=0.5)
    try:
        wait_for(lambda: len([f for f in failures(db, "fails") if f[1] == "dead"]) == 30, what="30 dead")
        since = len(r.events)
        time.sleep(2)
        idle = [e for _, e, _ in r.events[since:] if e == "idle"]
        # a dead item is skipped: the worker waits for the poll, never in a loop
        assert 1 <= len(idle) <= 6, len(idle)
        # a failure record of a row no longer pending is never fetched
        db.execute("UPDATE fails SET done = true WHERE id = 1")
        db.execute("SELECT clear_failure('fails', '1')")
        db.execute("SELECT record_failure('fails', '1', 'old', 5, '0')")
        since = len(r.events)
        time.sleep(1.5)
        assert len([e for _, e, _ in r.events[since:] if e == "idle"]) <= 5
    finally:
        r.stop()
    assert db.execute("SELECT count(*) FROM fails WHERE done").fetchone()[0] == 31
    assert r.worker.stats.snapshot()["items"] == 30


def test_a_retried_item_that_succeeds_is_cleared(db):
    make_table(db, "flaky", 20)
    tries = {}

    def handle(tx, rows):
        for x in rows:
            tries[x["id"]] = tries.get(x["id"], 0) + 1
            if x["id"] == 5 and tries[5] < 3:
                raise RuntimeError("timeout")
        tx.execute("UPDATE flaky SET done = true WHERE id = ANY(%s)", ([x["id"] for x in rows],))
    r = Run(name="flaky", table="flaky", n=1, pending="done", ttl=3, handler=handle, backoff=0.05,
            poll_interval=0.5)
    try:
        wait_for(lambda: db.execute("SELECT bool_and(done) FROM flaky").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert failures(db, "flaky") == []
    # the batch, then item 5 alone (recorded), then its retry after the back-off
    assert len(r.said("failed")) == 1 and tries[5] == 3


@pytest.mark.parametrize("mode", ["lease", "session"])
def test_the_fetch_reads_only_the_batch_records(db, mode):
    """With 1,000 dead records of keys not in the table, one dead and one due
    item in it: the dead one is skipped, the due one done and its record
    cleared; the fetch calls item_failures with the batch's keys only, never
    item_failures(name) (counted by track_functions in the Worker's
    sessions)."""
    tbl, name = f"keyed_{mode}", f"keyed_{mode}"
    make_table(db, tbl, 300)
    db.execute("SELECT count(record_failure(%s, 'gone-' || g, 'e', 1)) FROM generate_series(1, 1000) g", (name,))
    db.execute("SELECT record_failure(%s, '40', 'set aside', 1), record_failure(%s, '41', 'due now', 5, '0')",
               (name, name))
    fns = ("item_failures(text)", "item_failures(text,text[])")

    def calls():
        return function_calls(db, fns)
    before = calls()
    r = Run(conninfo=dsn() + " options='-c track_functions=pl'", name=name, table=tbl, n=2, pending="done",
            batch=25, mode=mode, ttl=3, handler=handler_for(tbl), poll_interval=0.2)
    try:
        wait_for(lambda: db.execute(f"SELECT count(*) = 299 FROM {tbl} WHERE done").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert db.execute(f"SELECT array_agg(id) FROM {tbl} WHERE NOT done").fetchone()[0] == [40]
    assert db.execute("SELECT item, state FROM item_failures(%s, '40', '41')", (name,)).fetchall() == [("40", "dead")]
    # the Worker's sessions ended: their counts reach the statistics
    wait_for(lambda: calls()[fns[1]] > before[fns[1]], what="the keyed calls counted")
    after = calls()
    assert after[fns[0]] == before[fns[0]], (before, after)
    assert after[fns[1]] - before[fns[1]] >= 300 // 25


def function_calls(db, fns):
    return dict(db.execute("SELECT p.oid::regprocedure::text, coalesce(s.calls, 0) FROM pg_proc p"
                           " LEFT JOIN pg_stat_user_functions s ON s.funcid = p.oid"
                           " WHERE p.oid::regprocedure::text = ANY (%s)", (list(fns),)).fetchall())


def test_a_fleet_without_failure_records_fetches_without_them(db):
    """While the name has no failure record (has_failures, asked about once
    a second and at each slot's first batch), a lease Worker's fetch leaves
    the join with item_failures out: far fewer keyed item_failures calls
    than batches (counted by track_functions in the Worker's sessions)."""
    tbl, name = "t_no_failures", "no_failures"
    make_table(db, tbl, 600)
    fns = ("item_failures(text,text[])", "has_failures(text)")
    before = function_calls(db, fns)
    r = Run(conninfo=dsn() + " options='-c track_functions=pl'", name=name, table=tbl, n=2, pending="done",
            batch=10, mode="lease", ttl=3, handler=handler_for(tbl), poll_interval=0.2)
    try:
        wait_for(lambda: db.execute(f"SELECT count(*) = 600 FROM {tbl} WHERE done").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert r.error is None, r.error
    batches = r.worker.stats.snapshot()["batches"]
    wait_for(lambda: function_calls(db, fns)[fns[1]] > before[fns[1]], what="the checks counted")
    joined, asked = (function_calls(db, fns)[f] - before[f] for f in fns)
    assert batches >= 60 and 2 <= asked < batches / 2, (batches, asked)
    assert joined <= asked, (joined, asked)


def test_a_failure_recorded_elsewhere_is_seen_within_a_second(db):
    """A record made while a Worker fetches without the failure records (by
    other code than the fleet's workers) counts from the Worker's next check,
    at most a second later: the item set aside then is not handled."""
    tbl, name = "t_recorded_elsewhere", "recorded_elsewhere"
    make_table(db, tbl, 300)
    handle = handler_for(tbl)

    def slow(tx, batch):
        time.sleep(0.1)  # 30 batches: the item 290 comes about 3 s after the first batch
        handle(tx, batch)
    r = Run(name=name, table=tbl, n=1, pending="done", batch=10, mode="lease", ttl=3, handler=slow,
            poll_interval=0.2)
    try:
        wait_for(lambda: db.execute(f"SELECT count(*) >= 10 FROM {tbl} WHERE done").fetchone()[0],
                 what="the first batch")
        db.execute("SELECT record_failure(%s, '290', 'set aside by hand', 1)", (name,))
        wait_for(lambda: db.execute(f"SELECT count(*) = 299 FROM {tbl} WHERE done").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert db.execute(f"SELECT array_agg(id) FROM {tbl} WHERE NOT done").fetchone()[0] == [290]
    assert db.execute("SELECT count(*) FROM log WHERE tbl = %s AND item = 290", (tbl,)).fetchone()[0] == 0


def test_keys_over_1024_bytes_are_fetched(db):
    """Text keys longer than a failure record's item may be (1024 bytes):
    the fetch reads no record for them and the rows are handled."""
    db.execute("DROP TABLE IF EXISTS longkeys")
    db.execute("CREATE TABLE longkeys (id text PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
    db.execute("INSERT INTO longkeys SELECT repeat('k', 1100) || g FROM generate_series(1, 30) g")
    db.execute("INSERT INTO longkeys VALUES ('short')")

    def handle(tx, rows):
        tx.execute("UPDATE longkeys SET done = true WHERE id = ANY(%s)", ([x["id"] for x in rows],))
    r = Run(name="longkeys", table="longkeys", n=2, pending="done", batch=8, ttl=3, handler=handle,
            poll_interval=0.2)
    try:
        wait_for(lambda: db.execute("SELECT bool_and(done) FROM longkeys").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert not r.said("failed") and not r.said("dead")


def test_a_handler_that_swallows_an_error_fails_its_item_only(db):
    make_table(db, "swallow", 30, poison=[7])

    def handle(tx, rows):  # a statement's error is caught and ignored: the transaction is aborted
        tx.execute("UPDATE swallow SET done = true WHERE id = ANY(%s)", ([x["id"] for x in rows],))
        if any(x["payload"] == "poison" for x in rows):
            try:
                tx.execute("SELECT 1 / 0")
            except psycopg.errors.DivisionByZero:
                pass
    r = Run(name="swallow", table="swallow", n=1, pending="done", ttl=3, handler=handle, max_attempts=1,
            poll_interval=0.5)
    try:
        wait_for(lambda: failures(db, "swallow") == [("7", "dead", 1)], what="item 7 dead")
        wait_for(lambda: db.execute("SELECT count(*) FROM swallow WHERE done").fetchone()[0] == 29,
                 what="the other 29 done")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert "caught and ignored" in r.said("dead")[0]["error"]
    assert r.worker.stats.snapshot()["items"] == 29


def test_notify_wakes_a_lease_worker(db):
    make_table(db, "woken", 0)
    db.execute("CREATE TRIGGER woken_wake AFTER INSERT ON woken FOR EACH ROW EXECUTE FUNCTION notify_slot('woken', '4', 'id')")
    r = Run(name="woken", table="woken", n=4, pending="done", ttl=3, handler=handler_for("woken"),
            notify_conninfo=dsn(), poll_interval=30)
    try:
        wait_for(lambda: r.said("idle"), what="idle")
        time.sleep(0.7)  # the listener is LISTENing
        t = time.monotonic()
        db.execute("INSERT INTO woken VALUES (1, 'p', false)")
        wait_for(lambda: db.execute("SELECT done FROM woken").fetchone()[0], 10, "the new row handled")
        assert time.monotonic() - t < 5 and r.said("woken")
    finally:
        r.stop()


def test_metrics_endpoint(db):
    pytest.importorskip("prometheus_client")
    make_table(db, "metered", 100)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = Run(name="metered", table="metered", n=2, pending="done", ttl=3, handler=handler_for("metered"),
            metrics_port=port, poll_interval=0.2)
    try:
        wait_for(lambda: db.execute("SELECT bool_and(done) FROM metered").fetchone()[0], what="drain")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        # 127.0.0.1 only by default: another address of this machine is refused
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", port), timeout=5).close()
    finally:
        r.stop()
    total = sum(float(v) for v in re.findall(r'^pg_claim_items_total\{fleet="metered",slot="\d"\} (\S+)$', text, re.M))
    assert total == 100
    assert not re.search(r'[{,]name="', text)
    assert re.search(r'^pg_claim_batch_duration_seconds_count\{fleet="metered"\} [1-9]', text, re.M)
    assert re.search(r'^pg_claim_handovers_total\{direction="gained",fleet="metered"\} [1-9]', text, re.M)
    assert re.search(r'^pg_claim_slots_held\{fleet="metered"\} ', text, re.M)


def test_metrics_host_chooses_the_address(db):
    pytest.importorskip("prometheus_client")
    make_table(db, "metered_any", 10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = Run(name="metered_any", table="metered_any", n=1, pending="done", ttl=3, handler=handler_for("metered_any"),
            metrics_port=port, metrics_host="127.0.0.2", poll_interval=0.2)
    try:
        wait_for(lambda: r.said("started"), what="started")
        text = urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5).read().decode()
        assert "pg_claim_slots_held" in text
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        r.stop()


def test_a_missing_column_is_an_error_not_a_retry(db):
    make_table(db, "badcol", 5)
    r = Run(name="badcol", table="badcol", n=1, pending="sent_at", ttl=3, handler=handler_for("badcol"))
    r.thread.join(10)
    assert isinstance(r.error, psycopg.Error) and r.error.sqlstate == "42703"


pooler = pytest.mark.skipif("PGC_POOLER_PORT" not in os.environ, reason="no PgBouncer (PGC_POOLER_PORT)")


@pooler
def test_session_mode_refuses_a_transaction_pooler(db):
    make_table(db, "refused", 10)
    r = Run(conninfo=dsn(os.environ["PGC_POOLER_PORT"]), name="refused", table="refused", n=2,
            pending="done", mode="session", handler=handler_for("refused"))
    r.thread.join(10)
    assert isinstance(r.error, pg_claim.PoolerError) and "pooler" in str(r.error)
    assert db.execute("SELECT count(*) FROM slot_holders('refused')").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM refused WHERE done").fetchone()[0] == 0


@pooler
def test_auto_mode_picks_leases_behind_a_pooler(db):
    make_table(db, "auto", 100)
    r = Run(conninfo=dsn(os.environ["PGC_POOLER_PORT"]), name="auto", table="auto", n=2, pending="done",
            mode="auto", ttl=3, handler=handler_for("auto"), poll_interval=0.2)
    try:
        wait_for(lambda: db.execute("SELECT bool_and(done) FROM auto").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert r.said("started")[0]["mode"] == "lease"


def test_readme_quick_start_runs_as_written(db, tmp_path):
    readme = open(os.path.join(os.path.dirname(HERE), "README.md"), encoding="utf-8").read()
    quick = readme.split("## Quick start", 1)[1]
    setup = re.search(r"```sql\n(.*?)```", quick, re.S).group(1)
    program = re.search(r"```python\n(.*?)```", quick, re.S).group(1)
    with connect("postgres") as c:
        c.execute("DROP DATABASE IF EXISTS py_lib_quick WITH (FORCE)")
        c.execute("CREATE DATABASE py_lib_quick")
    try:
        with connect("py_lib_quick") as q:
            q.execute(setup)
            (tmp_path / "mailer.py").write_text(program)
            env = dict(os.environ, DATABASE_URL="dbname=py_lib_quick",
                       PYTHONPATH=os.path.join(os.path.dirname(HERE), "src"))
            procs = [subprocess.Popen([sys.executable, str(tmp_path / "mailer.py")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
            try:
                wait_for(lambda: q.execute("SELECT count(*) = 0 FROM outbox WHERE sent_at IS NULL").fetchone()[0],
                         30, "the quick start's outbox to be sent")
                # both running (a SIGTERM during the start-up, before run(), kills a process): the
                # first may have sent everything before the second was up
                wait_for(lambda: q.execute("SELECT count(DISTINCT holder) = 2 FROM lease_holders('mailer')"
                                           " WHERE NOT expired").fetchone()[0],
                         30, "both quick start workers to hold slots")
            finally:
                for p in procs:
                    p.send_signal(signal.SIGTERM)
                outs = [p.communicate(timeout=15) for p in procs]
            assert all(p.returncode == 0 for p in procs), outs
            sent = sum(o.count("sending ") for o, _ in outs)
            assert sent == 1000, (sent, [e[-500:] for _, e in outs])
    finally:
        with connect("postgres") as c:
            c.execute("DROP DATABASE IF EXISTS py_lib_quick WITH (FORCE)")


@pytest.mark.parametrize("table", ["box", "app.point"])
def test_a_table_named_like_a_builtin_type(db, table):
    """`box` and `point` are also geometric types of pg_catalog: the fetch's
    row type is the table's, by its schema-qualified name (`NULL::box` is the
    type, whose column t.id does not exist)."""
    db.execute("CREATE SCHEMA IF NOT EXISTS app")
    make_table(db, table, 40)
    tbl = table.split(".")[-1]
    r = Run(conninfo=dsn() + " options='-c search_path=app,public'", name=f"builtin_{tbl}", table=tbl, n=2,
            pending="done", batch=10, ttl=3, handler=handler_for(table), poll_interval=0.2)
    try:
        wait_for(lambda: db.execute(f"SELECT bool_and(done) FROM {table}").fetchone()[0] or r.error,
                 what="drain")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert db.execute("SELECT count(*) FROM log WHERE tbl = %s", (table,)).fetchone()[0] == 40


def make_tenants(db, tbl, big=600, small=20, each=2):
    """A large tenant's rows first (ids 1 .. big), then `small` tenants of
    `each` rows (higher ids), and the index my_items_fair walks."""
    db.execute(f"DROP TABLE IF EXISTS {tbl}")
    db.execute(f"CREATE TABLE {tbl} (id bigint PRIMARY KEY, tenant text NOT NULL, done boolean NOT NULL DEFAULT false)")
    db.execute(f"INSERT INTO {tbl} SELECT g, 'big', false FROM generate_series(1, %s) g", (big,))
    db.execute(f"INSERT INTO {tbl} SELECT %s + row_number() OVER (), 'small-' || t, false"
               " FROM generate_series(1, %s) t, generate_series(1, %s) r", (big, small, each))
    db.execute(f"CREATE TABLE IF NOT EXISTS tlog (tbl text, item bigint, tenant text, slot int, batch int)")


def tenant_handler(tbl):
    """Marks the rows done and logs each with its slot and the number of its
    batch (this worker's count, from 1)."""
    count = [0]

    def handle(tx, rows):
        count[0] += 1
        ids = [r["id"] for r in rows]
        tx.execute(psycopg.sql.SQL("UPDATE {} SET done = true WHERE id = ANY(%s)").format(rows.table), (ids,))
        tx.execute("INSERT INTO tlog SELECT %s, i, t, %s, %s FROM unnest(%s::bigint[], %s::text[]) u(i, t)",
                   (tbl, rows.slot, count[0], ids, [r["tenant"] for r in rows]))
    return handle


@pytest.mark.parametrize("fair", [None, "tenant"])
def test_fair_reaches_small_tenants_within_two_batches(db, fair):
    """One slot, a large tenant's 600 rows before 20 small tenants' 2 each:
    with fair, every small tenant's rows are in the first two batches; in key
    order (no fair) they wait behind the whole backlog."""
    tbl = f"ten_{fair or 'key'}"
    make_tenants(db, tbl)
    db.execute(f"CREATE INDEX ON {tbl} ((slot_of(id, 1)), tenant, id) WHERE NOT done")
    r = Run(name=tbl, table=tbl, n=1, pending="done", batch=50, ttl=3, fair=fair, handler=tenant_handler(tbl),
            poll_interval=0.2)
    try:
        wait_for(lambda: db.execute(f"SELECT bool_and(done) FROM {tbl}").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert r.error is None, r.error
    (rows, distinct, last_small, batches) = db.execute(
        "SELECT count(*), count(DISTINCT item), max(batch) FILTER (WHERE tenant <> 'big'), max(batch)"
        " FROM tlog WHERE tbl = %s", (tbl,)).fetchone()
    assert rows == distinct == 640
    if fair:
        assert last_small <= 2, last_small
        assert batches == 13  # 640 rows of 50 a batch: no batch came back short while rows remained
    else:
        assert last_small >= 12, last_small


def test_spread_keeps_a_tenant_on_at_most_k_slots(db):
    """n = 8, spread = 2, two workers: each row is done once, on the slot
    slot_of_spread(tenant, id, 8, 2) names; the large tenant on exactly 2
    slots, no tenant on more."""
    tbl = "ten_spread"
    make_tenants(db, tbl, big=400, small=30, each=4)
    db.execute(f"CREATE INDEX ON {tbl} ((slot_of_spread(tenant, id, 8, 2)), tenant, id) WHERE NOT done")
    runs = [Run(name=tbl, table=tbl, n=8, pending="done", batch=20, ttl=3, route="tenant", spread=2,
                handler=tenant_handler(tbl), poll_interval=0.2) for _ in range(2)]
    try:
        wait_for(lambda: db.execute(f"SELECT bool_and(done) FROM {tbl}").fetchone()[0], what="drain")
    finally:
        for r in runs:
            r.stop()
    assert all(r.error is None for r in runs), [r.error for r in runs]
    (rows, distinct, wrong) = db.execute(
        f"SELECT count(*), count(DISTINCT l.item), count(*) FILTER (WHERE l.slot <> slot_of_spread(t.tenant, t.id, 8, 2))"
        f" FROM tlog l JOIN {tbl} t ON t.id = l.item WHERE l.tbl = %s", (tbl,)).fetchone()
    assert (rows, distinct, wrong) == (520, 520, 0)
    per = dict(db.execute("SELECT tenant, count(DISTINCT slot) FROM tlog WHERE tbl = %s GROUP BY 1", (tbl,)).fetchall())
    assert per["big"] == 2 and max(per.values()) <= 2, per


def test_tenant_options_are_checked():
    h = lambda tx, rows: None  # noqa: E731
    with pytest.raises(ValueError, match="spread needs route"):
        pg_claim.Worker("", name="f", table="t", n=8, pending="done", handler=h, spread=2)
    with pytest.raises(ValueError, match="spread must be an integer between 1 and n = 8, got 9"):
        pg_claim.Worker("", name="f", table="t", n=8, pending="done", handler=h, route="tenant", spread=9)
    with pytest.raises(ValueError, match="method 'jump' does not go with fair or spread"):
        pg_claim.Worker("", name="f", table="t", n=8, pending="done", handler=h, fair="tenant", method="jump")


def test_fair_sets_a_poison_item_aside_and_drains_the_rest(db):
    """fair has no cursor: a failing row is read again at each batch of its
    slot until it is dead; the other rows, its tenant's included, are done,
    and the worker goes idle instead of fetching the dead row in a loop."""
    tbl = "ten_poison"
    make_tenants(db, tbl, big=200, small=5, each=3)
    poison = db.execute(f"SELECT min(id) FROM {tbl} WHERE tenant = 'small-1'").fetchone()[0]
    inner = tenant_handler(tbl)

    def handle(tx, rows):
        if any(r["id"] == poison for r in rows):
            raise RuntimeError("poison")
        inner(tx, rows)
    r = Run(name=tbl, table=tbl, n=2, pending="done", batch=20, ttl=3, fair="tenant", handler=handle,
            max_attempts=2, backoff=0.1, poll_interval=0.2)
    try:
        wait_for(lambda: db.execute(f"SELECT count(*) FILTER (WHERE NOT done) = 1 FROM {tbl}").fetchone()[0],
                 what="the drain")
        wait_for(lambda: failures(db, tbl) == [(str(poison), "dead", 2)], what="the poison item dead")
        wait_for(lambda: r.said("idle"), what="the worker idle")
        fetched = r.worker.stats.snapshot()["batches"]
        idle = len(r.said("idle"))
        wait_for(lambda: len(r.said("idle")) >= idle + 2, what="two more idle rounds")
    finally:
        r.stop()
    assert r.error is None, r.error
    assert r.worker.stats.snapshot()["batches"] == fetched  # idle rounds commit no batch
    (rows, distinct) = db.execute("SELECT count(*), count(DISTINCT item) FROM tlog WHERE tbl = %s", (tbl,)).fetchone()
    assert rows == distinct == 214
