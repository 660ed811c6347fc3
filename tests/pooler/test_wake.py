"""Wake-up and fleet size through PgBouncer, as docs/wake.md and
docs/claiming.md ("Fleet size") say (through the
`pgbouncer` fixture's PgBouncer, whose database entry pg_claim_session is the
database postgres in session mode with a pool of 2).

1. Session mode: a claim_slot worker LISTENs on slot_channel of its slot and
   gets notify_slot's notification of a new row of its slot.
2. Transaction mode: the same LISTEN through the transaction pool delivers
   nothing, while a direct listener gets the notification.
3. A session pool (2) smaller than the fleet (3 workers, n = 3): the third
   client waits for a server connection (PgBouncer shows it waiting), and
   slot_status shows the slot nobody serves; when a worker leaves, the
   waiting client gets its server connection and claims the freed slot, and
   a slot is still unserved.
"""
import threading
import time

import pytest

from harness import Failure, check, connect, log, poll

from .common import admin, pooler_port

SESSION_DB = "pg_claim_session"


def through(dbname):
    return connect(dbname, host="127.0.0.1", port=pooler_port(), user="postgres", prepare_threshold=None)


def notified(conn, channel, seconds):
    """Whether a notification on `channel` arrives within `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        for n in conn.notifies(timeout=left, stop_after=1):
            if n.channel == channel:
                return True
    return False


def insert_for_slot(d, slot):
    """Insert rows into pw_outbox until one lands in `slot` (of 2)."""
    for _ in range(64):
        (s,) = d.execute("INSERT INTO pw_outbox (customer_id, recipient, body)"
                         " VALUES (1, 'a@example.com', 'x') RETURNING slot_of(id, 2)").fetchone()
        if s == slot:
            return
    raise Failure(f"no row of slot {slot} in 64 inserts")


def status(d, name, n):
    return [(r[0], r[1]) for r in d.execute(
        "SELECT slot, state FROM slot_status(%s, %s) ORDER BY slot", (name, n)).fetchall()]


def pool(database):
    rows = [r for r in admin("SHOW POOLS") if r["database"] == database]
    return rows[0] if rows else {"cl_active": 0, "cl_waiting": 0, "sv_active": 0}


def wait_for(what, cond, seconds=20):
    poll(cond, seconds, what, interval=0.02)


@pytest.fixture(scope="module")
def outbox():
    """pw_outbox, whose rows notify their slot of 2 (notify_slot)."""
    d = connect()
    d.execute("CREATE EXTENSION IF NOT EXISTS pg_claim")
    d.execute("DROP TABLE IF EXISTS pw_outbox")
    d.execute("""CREATE TABLE pw_outbox (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer_id bigint NOT NULL,
        recipient text NOT NULL, body text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(), sent_at timestamptz)""")
    d.execute("CREATE TRIGGER pw_wake AFTER INSERT ON pw_outbox"
              " FOR EACH ROW EXECUTE FUNCTION notify_slot('pw', '2', 'id')")
    yield d
    d.execute("DROP TABLE pw_outbox")
    d.close()


@pytest.fixture(scope="module")
def channel(outbox):
    """The channel of the slot a worker claimed through the session pool:
    (the slot, its channel)."""
    w = through(SESSION_DB)
    (slot,) = w.execute("SELECT claim_slot('pw', 2)").fetchone()
    check(slot is not None, "the worker claimed a slot through the session pool")
    (channel,) = w.execute("SELECT slot_channel('pw', %s)", (slot,)).fetchone()
    yield w, slot, channel
    w.close()


@pytest.fixture
def control(channel):
    """A direct listener on the channel."""
    c = connect()
    c.execute(f"LISTEN {channel[2]}")
    yield c
    c.close()


def test_session_mode_listen_wakes_the_worker(outbox, channel, control):
    w, slot, channel = channel
    w.execute(f"LISTEN {channel}")
    insert_for_slot(outbox, slot)
    check(notified(w, channel, 20), "session mode: the worker got the notification of its slot")
    check(notified(control, channel, 20), "the direct listener got it too")
    log(f"wake through PgBouncer, session mode: LISTEN {channel} woke the worker of slot {slot}")


def test_transaction_mode_listen_delivers_nothing(outbox, channel, control):
    _, slot, channel = channel
    t = through("postgres")
    t.execute(f"LISTEN {channel}")
    insert_for_slot(outbox, slot)
    check(notified(control, channel, 20), "the direct listener got the notification")
    check(not notified(t, channel, 2), "transaction mode: a LISTEN through the pool delivered a notification")
    t.execute("SELECT 1")
    check(not notified(t, channel, 0.1), "transaction mode: delivered after a statement")
    log("wake through PgBouncer, transaction mode: nothing delivered (the direct listener got it)")
    t.close()


def test_session_pool_smaller_than_the_fleet(outbox, channel):
    """A session pool of 2 for 3 workers (after the worker of the tests above
    gave its server connection back)."""
    channel[0].close()
    d = outbox
    wait_for("the session pool is idle", lambda: pool(SESSION_DB)["cl_active"] == 0)
    workers, results = [], {}

    def work(i):
        c = through(SESSION_DB)
        workers.append(c)
        results[i] = c.execute("SELECT claim_slot('pw_pool', 3)").fetchone()[0]

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(3)]
    for th in threads:
        th.start()
    wait_for("two claims and one client waiting for a server connection",
             lambda: len(results) == 2 and pool(SESSION_DB)["cl_waiting"] == 1)
    check(sorted(results.values()) == [0, 1], f"the two connected workers hold slots 0 and 1: {results}")
    check(status(d, "pw_pool", 3) == [(0, "session"), (1, "session"), (2, "unserved")],
          f"slot_status shows slot 2 unserved: {status(d, 'pw_pool', 3)}")
    log("session pool of 2, 3 workers for n = 3: one client waits for a server connection;"
        " slot_status('pw_pool', 3) shows slot 2 unserved")
    # a worker leaves (releasing its slot: this PgBouncer's server_reset_query
    # is empty, so a server session would otherwise keep its claim for the
    # next client): the waiting client gets the server connection and claims
    first = next(c for c in workers if c.execute("SELECT my_slot('pw_pool')").fetchone()[0] == 0)
    first.execute("SELECT release_slot('pw_pool')")
    first.close()
    wait_for("the waiting client's claim", lambda: len(results) == 3)
    waiting = next(i for i in range(3) if i not in (k for k, v in list(results.items())[:2]))
    check(results[waiting] == 0, f"the client that waited claimed the freed slot 0: {results}")
    states = [s for _, s in status(d, "pw_pool", 3)]
    check(states.count("unserved") == 1 and states.count("session") == 2,
          f"still one slot unserved with two server connections: {status(d, 'pw_pool', 3)}")
    for c in workers:
        c.close()
    for th in threads:
        th.join(timeout=10)
