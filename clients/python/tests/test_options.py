"""The options docs/libraries.md gave the Python library in 0.6.0 (the
Node.js library had them before): connection, renew_interval,
idle_in_transaction_timeout, query_timeout and session_pool, against the
server of test_server.py."""
import time
import types

import pytest

import pg_claim
from pg_claim._claimer import HUNGRY_CALLS, HUNGRY_S
from test_server import Run, db, make_table, wait_for  # noqa: F401  (db: the fixture)


def settings_seen(db, name, **kw):
    """Runs a worker over a table of 20 rows; what its handler saw of the
    batch's session: (idle_in_transaction_session_timeout, statement_timeout,
    application_name) of each batch."""
    make_table(db, name, 20)
    seen = []

    def handle(tx, rows):
        seen.append(tx.execute("SELECT current_setting('idle_in_transaction_session_timeout'),"
                               " current_setting('statement_timeout'), current_setting('application_name')")
                    .fetchone())
        tx.execute(f"UPDATE {name} SET done = true WHERE id = ANY(%s)", ([r["id"] for r in rows],))
    r = Run(name=name, table=name, n=2, pending="done", handler=handle, poll_interval=0.2, **kw)
    try:
        wait_for(lambda: db.execute(f"SELECT bool_and(done) FROM {name}").fetchone()[0], what="drain")
    finally:
        r.stop()
    assert r.error is None and seen
    return set(seen)


@pytest.mark.parametrize("mode", ["lease", "session"])
def test_the_limits_default_to_the_ttl(db, mode):
    assert settings_seen(db, f"limits_{mode}", mode=mode, ttl="3 seconds") == {("3s", "3s", "pg_claim limits_" + mode)}


def test_the_limits_and_the_driver_settings_are_the_options(db):
    seen = settings_seen(db, "limits_set", ttl="3 seconds", idle_in_transaction_timeout="7 seconds",
                         query_timeout=0, connection={"application_name": "mailer-7"})
    # query_timeout 0: no limit of the worker's, the server's setting (0 on the test cluster)
    assert seen == {("7s", "0", "mailer-7")}


def expiries(db, name, seconds):
    """The distinct expiries of the name's leases seen in `seconds`."""
    out, end = set(), time.monotonic() + seconds
    while time.monotonic() < end:
        out |= {r[0] for r in db.execute("SELECT expires_at FROM lease_holders(%s) WHERE NOT expired", (name,))}
        time.sleep(0.05)
    return out


def test_renew_interval_is_the_period_of_the_claims(db):
    make_table(db, "renewals", 0)
    runs = []
    try:
        for name, every in (("renew_fast", 0.3), ("renew_slow", None)):
            runs.append(Run(name=name, table="renewals", n=1, pending="done", ttl=6, renew_interval=every,
                            handler=lambda tx, rows: None))
        wait_for(lambda: all(r.worker.slots for r in runs), what="both leases")
        # past the quick calls of a worker with nothing to do (docs/leases.md, "Balancing")
        time.sleep(HUNGRY_CALLS * HUNGRY_S)
        fast, slow = expiries(db, "renew_fast", 1.6), expiries(db, "renew_slow", 1.6)
    finally:
        for r in runs:
            r.stop()
    # every 0.3 s: 5 renewals or so in 1.6 s; every ttl/3 = 2 s: at most 2 expiries seen
    assert len(fast) >= 4 and len(slow) <= 2, (len(fast), len(slow))


def test_renew_interval_must_be_below_the_ttl(db):
    make_table(db, "renew_bad", 0)
    r = Run(name="renew_bad", table="renew_bad", n=1, pending="done", ttl=2, renew_interval="2 seconds",
            handler=lambda tx, rows: None)
    r.thread.join(10)
    assert isinstance(r.error, pg_claim.Error) and "renew_interval must be above 0 and below the ttl" in str(r.error)
    with pytest.raises(ValueError, match="query_timeout must be at least 0"):
        pg_claim.Worker("", name="x", table="t", n=1, pending="done", handler=lambda tx, rows: None, query_timeout=-1)


def test_session_pool_skips_the_start_up_check():
    def conn(server_pid, start_up_pid):
        cur = types.SimpleNamespace(fetchone=lambda: (server_pid,))
        return types.SimpleNamespace(execute=lambda q: cur, info=types.SimpleNamespace(backend_pid=start_up_pid))
    direct = pg_claim.Worker("", name="x", table="t", n=1, pending="done", mode="session",
                             handler=lambda tx, rows: None)
    pooled = pg_claim.Worker("", name="x", table="t", n=1, pending="done", mode="session", session_pool=True,
                             handler=lambda tx, rows: None)
    assert direct.session_check(conn(7, 7)) == 7
    with pytest.raises(pg_claim.PoolerError, match="session_pool=True"):
        direct.session_check(conn(7, 9))
    assert pooled.session_check(conn(7, 9)) == 7
