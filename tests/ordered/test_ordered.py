"""Ordered per key: FIFO per customer, in parallel across customers.

Needs a running cluster with pg_claim installed (PGHOST/PGPORT, as
scripts/test sets them). An outbox of 1,000 customers x 50 messages, the
customers' messages interleaved in id order, is sent by worker processes
(worker.py, psycopg 3) that walk their share with my_items(..., route =>
'customer_id', pending => 'sent_at'):

1. session mode: 8 workers claim_slot('ordered', 8) and 3 standbys wait;
   three holders are killed with SIGKILL mid-run (one of them while a
   customer of its share is held back by a failing message); a standby
   takes each slot over and must resume at the slot's first message not
   done (sent or set aside) when it took over.
2. dynamic groups: 4 members share 32 partitions with claim_partitions;
   4 more join, 2 leave (SIGTERM: group_leave between batches), 1 is killed
   with SIGKILL and 1 more joins, all mid-run;
3. the SQL worker loop of docs/ordered.md, as printed there, in 4 sessions
   that each run nothing but the CALL, started one after another, on 80
   customers x 5 messages, one of them rejected: once with the customer
   waiting, once with the message set aside.

In the first two, some messages fail: three 'transient' ones fail their
first 3 attempts (the application waits: the customer is held back and
retried), two 'poison' ones always fail (the application sets them aside in
outbox_failed and the customer goes on). The processing log (sent_log,
written by a trigger in the transaction that marks messages sent, in id
order, its seq from a sequence shared with outbox_failed and attempts)
must show:

- every message sent exactly once, or set aside exactly once (the poison
  ones), none lost;
- per customer, the messages sent or set aside in strictly increasing id
  order (the checker is also shown to catch a swapped pair);
- a transient message held back its own customer only: none of the
  customer's later messages went before it, while other customers of the
  same share went on; a poison message held back nothing.

Every wait polls with a deadline; the module is bounded by TIME_LIMIT_S and
no worker outlives it.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest

import harness
from harness import Failure, check, log, poll

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DB = "pg_claim_ordered"
CUSTOMERS = 1000
PER_CUSTOMER = 50
TOTAL = CUSTOMERS * PER_CUSTOMER
SLOTS = 8          # session mode: n
STANDBYS = 3
PARTITIONS = 32    # dynamic groups: P
TRANSIENT = [(11, 10), (12, 25), (13, 40)]  # (customer, its k-th message) failing 3 times
POISON = [(21, 10), (22, 30)]               # always failing: set aside
TRANSIENT_FAILURES = 3
ITEM_MS = "1"      # simulated work per message
TIME_LIMIT_S = 170


def connect(dbname=DB):
    return harness.connect(dbname, application_name="ordered driver")


def test_docs_show_the_worker_loop_verbatim():
    doc = open(os.path.join(ROOT, "docs", "ordered.md"), encoding="utf-8").read()
    src = open(os.path.join(HERE, "worker.py"), encoding="utf-8").read()
    m = re.search(r"^# docs/ordered\.md: begin\n(.*?)^# docs/ordered\.md: end\n", src, re.S | re.M)
    check(m, "worker.py: no docs/ordered.md markers")
    check(f"```python\n{m.group(1)}```" in doc,
          "docs/ordered.md does not show the worker loop of tests/ordered/worker.py verbatim")
    log("docs/ordered.md shows the worker loop of worker.py verbatim")


# --------------------------------------------------------------------------
# The outbox

def fill(c, n):
    """A fresh outbox whose share index is for n slots, with its processing log."""
    c.execute("""
        SET client_min_messages = warning;
        DROP TABLE IF EXISTS outbox, outbox_failed, sent_log, faults, attempts, expected CASCADE;
        DROP SEQUENCE IF EXISTS ordered_seq;
        CREATE SEQUENCE ordered_seq;
        CREATE TABLE outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                             customer_id bigint NOT NULL, recipient text NOT NULL, body text NOT NULL,
                             created_at timestamptz NOT NULL DEFAULT now(), sent_at timestamptz);
        CREATE TABLE outbox_failed (LIKE outbox, error text NOT NULL,
                                    failed_at timestamptz NOT NULL DEFAULT now(),
                                    seq bigint NOT NULL DEFAULT nextval('ordered_seq'));
        CREATE TABLE sent_log (seq bigint PRIMARY KEY DEFAULT nextval('ordered_seq'),
                               item bigint NOT NULL, customer_id bigint NOT NULL, pid integer NOT NULL);
        CREATE OR REPLACE FUNCTION log_sent() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO sent_log (item, customer_id, pid)
            SELECT n.id, n.customer_id, pg_backend_pid()
            FROM new_rows n JOIN old_rows o USING (id)
            WHERE o.sent_at IS NULL AND n.sent_at IS NOT NULL ORDER BY n.id;
            RETURN NULL;
        END $$;
        CREATE TRIGGER outbox_sent AFTER UPDATE ON outbox REFERENCING OLD TABLE AS old_rows
            NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION log_sent();
        CREATE TABLE faults (item bigint PRIMARY KEY, kind text NOT NULL, failures integer);
        CREATE TABLE attempts (seq bigint PRIMARY KEY DEFAULT nextval('ordered_seq'),
                               item bigint NOT NULL, customer_id bigint NOT NULL, pid integer NOT NULL);
    """)
    c.execute(f"CREATE INDEX outbox_ordered ON outbox ((slot_of(customer_id, {n})), id) WHERE sent_at IS NULL")
    c.execute("""INSERT INTO outbox (customer_id, recipient, body)
                 SELECT c, 'customer' || c || '@example.com', 'message ' || k
                 FROM generate_series(1, %s) k, generate_series(1, %s) c ORDER BY k, c""",
              (PER_CUSTOMER, CUSTOMERS))
    c.execute("CREATE TABLE expected AS SELECT id, customer_id FROM outbox")
    for kind, faults in (("transient", TRANSIENT), ("poison", POISON)):
        for customer, k in faults:
            c.execute("""INSERT INTO faults
                         SELECT id, %s, %s FROM outbox WHERE customer_id = %s ORDER BY id OFFSET %s LIMIT 1""",
                      (kind, TRANSIENT_FAILURES if kind == "transient" else None, customer, k - 1))
    c.execute("VACUUM ANALYZE outbox")


def progress(c):
    (done,) = c.execute("SELECT (SELECT count(*) FROM sent_log) + (SELECT count(*) FROM outbox_failed)").fetchone()
    return done


# --------------------------------------------------------------------------
# Workers

class Worker:
    def __init__(self, fleet, mode, n):
        env = dict(os.environ, ORDERED_MODE=mode, ORDERED_N=str(n), ORDERED_ITEM_MS=ITEM_MS,
                   PGDATABASE=DB, ORDERED_LIFETIME_S=str(TIME_LIMIT_S))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py")], env=env,
                                     stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.events = []
        self.fleet = fleet
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                e = json.loads(line)
            except ValueError:
                e = {"event": "garbage", "line": line}
            with self.fleet.lock:
                self.events.append(e)
                if e["event"] == "error":
                    self.fleet.errors.append(e)

    def last(self, event):
        with self.fleet.lock:
            found = [e for e in self.events if e["event"] == event]
        return found[-1] if found else None

    def alive(self):
        return self.proc.poll() is None


class Fleet:
    def __init__(self, mode, n):
        self.mode, self.n = mode, n
        self.lock = threading.Lock()
        self.errors = []
        self.workers = []

    def start(self, count=1):
        new = [Worker(self, self.mode, self.n) for _ in range(count)]
        self.workers += new
        return new

    def check_errors(self):
        with self.lock:
            if self.errors:
                raise Failure(f"a worker failed: {self.errors[0]}")

    def stop(self):
        for w in self.workers:
            if w.alive():
                w.proc.kill()
        for w in self.workers:
            w.proc.wait(timeout=10)


def wait_progress(c, fleet, share, timeout=60):
    target = int(TOTAL * share)

    def reached():
        fleet.check_errors()
        return progress(c) >= target
    poll(reached, timeout, f"{share:.0%} of the messages processed")


def wait_done(c, fleet, timeout=90):
    wait_progress(c, fleet, 1.0, timeout)


# --------------------------------------------------------------------------
# Checks

ORDER_VIOLATIONS = """
    WITH p AS (SELECT seq, item, customer_id FROM {log}
               UNION ALL SELECT seq, id, customer_id FROM outbox_failed)
    SELECT count(*) FROM (SELECT item, lag(item) OVER (PARTITION BY customer_id ORDER BY seq) AS prev
                          FROM p) x
    WHERE prev >= item"""


def check_checker(c):
    """The order check catches one customer's two messages logged the wrong way round."""
    c.execute("CREATE TEMP TABLE swapped AS SELECT * FROM sent_log")
    c.execute("""WITH two AS (SELECT seq FROM swapped WHERE customer_id = 500 ORDER BY seq LIMIT 2)
                 UPDATE swapped SET seq = CASE WHEN seq = (SELECT min(seq) FROM two)
                                               THEN (SELECT max(seq) FROM two) ELSE (SELECT min(seq) FROM two) END
                 WHERE seq IN (SELECT seq FROM two)""")
    (v,) = c.execute(ORDER_VIOLATIONS.format(log="swapped")).fetchone()
    c.execute("DROP TABLE swapped")
    check(v == 1, f"the order check found {v} violations in a log with one swapped pair, not 1")
    log("the order check finds the one violation in a copy of the log with a swapped pair")


def check_outcome(c, n, label):
    (logged, distinct, foreign) = c.execute(
        "SELECT count(*), count(DISTINCT item), count(*) FILTER (WHERE item NOT IN (SELECT id FROM expected))"
        " FROM sent_log").fetchone()
    check(logged == distinct, f"{label}: {logged - distinct} messages sent more than once")
    check(foreign == 0, f"{label}: {foreign} log entries of unknown messages")
    failed = {r[0] for r in c.execute("SELECT id FROM outbox_failed").fetchall()}
    poison = {r[0] for r in c.execute("SELECT item FROM faults WHERE kind = 'poison'").fetchall()}
    (nfailed,) = c.execute("SELECT count(*) FROM outbox_failed").fetchone()
    check(failed == poison and nfailed == len(poison),
          f"{label}: set aside {sorted(failed)} ({nfailed} rows), expected the poison messages {sorted(poison)}")
    (missing, both) = c.execute("""
        SELECT count(*) FILTER (WHERE NOT s AND NOT f), count(*) FILTER (WHERE s AND f)
        FROM (SELECT id IN (SELECT item FROM sent_log) AS s, id IN (SELECT id FROM outbox_failed) AS f
              FROM expected) x""").fetchone()
    check(missing == 0, f"{label}: {missing} messages neither sent nor set aside")
    check(both == 0, f"{label}: {both} messages both sent and set aside")
    (v,) = c.execute(ORDER_VIOLATIONS.format(log="sent_log")).fetchone()
    check(v == 0, f"{label}: {v} messages processed before an earlier message of their customer")
    log(f"{label}: {logged} messages sent once each and {nfailed} set aside, in strictly increasing id "
        f"order for each of the {CUSTOMERS} customers")
    # a transient failure held back its customer, and nothing else of the share
    for item, customer in c.execute("SELECT f.item, e.customer_id FROM faults f JOIN expected e ON e.id = f.item"
                                    " WHERE kind = 'transient' ORDER BY 1").fetchall():
        (tries, first, last) = c.execute(
            "SELECT count(*), min(seq), max(seq) FROM attempts WHERE item = %s", (item,)).fetchone()
        (sent_seq,) = c.execute("SELECT seq FROM sent_log WHERE item = %s", (item,)).fetchone()
        check(tries == TRANSIENT_FAILURES, f"{label}: message {item} failed {tries} times, not {TRANSIENT_FAILURES}")
        check(sent_seq > last, f"{label}: message {item} was logged sent before its last failure")
        (overtook,) = c.execute("SELECT count(*) FROM sent_log WHERE customer_id = %s AND item > %s AND seq < %s",
                                (customer, item, sent_seq)).fetchone()
        check(overtook == 0, f"{label}: {overtook} later messages of customer {customer} went before {item}")
        (others,) = c.execute(f"""
            SELECT count(*) FROM sent_log
            WHERE seq > %s AND seq < %s AND customer_id <> %s
              AND slot_of(customer_id, {n}) = slot_of(%s::bigint, {n})""",
                              (first, sent_seq, customer, customer)).fetchone()
        check(others > 0, f"{label}: no other customer of message {item}'s share went on while it was held back")
        log(f"{label}: customer {customer} waited for message {item} ({tries} failed attempts); meanwhile "
            f"{others} messages of other customers of its share were sent")
    for item, customer in c.execute("SELECT f.item, e.customer_id FROM faults f JOIN expected e ON e.id = f.item"
                                    " WHERE kind = 'poison' ORDER BY 1").fetchall():
        (later, sent_later) = c.execute(
            "SELECT count(*), count(*) FILTER (WHERE id IN (SELECT item FROM sent_log))"
            " FROM expected WHERE customer_id = %s AND id > %s", (customer, item)).fetchone()
        check(later > 0 and later == sent_later,
              f"{label}: {later - sent_later} of customer {customer}'s messages after {item} not sent")
        log(f"{label}: customer {customer}'s message {item} was set aside and its {later} later messages sent")


def check_resumed(c, slot, backend):
    """The standby's first message of the slot (sent, set aside or failed) is
    the slot's first message not done when it started."""
    (first_seq, first_item) = c.execute("""
        SELECT seq, item FROM (SELECT seq, item, pid FROM sent_log UNION ALL SELECT seq, item, pid FROM attempts) x
        WHERE pid = %s ORDER BY seq LIMIT 1""", (backend,)).fetchone()
    (expected,) = c.execute(f"""
        SELECT min(id) FROM expected e
        WHERE slot_of(customer_id, {SLOTS}) = %s
          AND NOT EXISTS (SELECT FROM sent_log l WHERE l.item = e.id AND l.seq < %s)
          AND NOT EXISTS (SELECT FROM outbox_failed f WHERE f.id = e.id AND f.seq < %s)""",
                            (slot, first_seq, first_seq)).fetchone()
    check(first_item == expected,
          f"session: the standby of slot {slot} started at message {first_item}, not at {expected},"
          " the slot's first message not done")
    log(f"session: the standby of slot {slot} resumed at message {first_item}, the slot's first message not done")


def moved_customers(c):
    (moved,) = c.execute("""SELECT count(*) FROM (SELECT customer_id FROM sent_log GROUP BY customer_id
                                                  HAVING count(DISTINCT pid) > 1) x""").fetchone()
    return moved


# --------------------------------------------------------------------------
# 1. Session mode: claim_slot with standbys, holders killed

def session_run(c):
    fill(c, SLOTS)
    fleet = Fleet("session", SLOTS)
    try:
        holders = fleet.start(SLOTS)
        poll(lambda: all(w.last("claimed") for w in holders) or fleet.check_errors(), 30,
             "every first worker to claim a slot")
        check(sorted(w.last("claimed")["slot"] for w in holders) == list(range(SLOTS)),
              "the first workers do not hold distinct slots")
        standbys = fleet.start(STANDBYS)
        takeovers = []
        for share in (0.2, 0.45, 0.7):
            wait_progress(c, fleet, share)
            live = [w for w in fleet.workers if w.alive() and w.last("claimed")]
            # the first victim holds the slot of a customer held back by a failing message
            held = {slot for (slot,) in c.execute(
                f"SELECT DISTINCT slot_of(customer_id, {SLOTS}) FROM attempts"
                " WHERE item NOT IN (SELECT item FROM sent_log)").fetchall()}
            victim = next((w for w in live if w.last("claimed")["slot"] in held), live[0])
            slot = victim.last("claimed")["slot"]
            (before,) = c.execute(f"SELECT count(*) FROM outbox WHERE sent_at IS NULL"
                                  f" AND slot_of(customer_id, {SLOTS}) = %s", (slot,)).fetchone()
            victim.proc.kill()
            victim.proc.wait(timeout=10)
            heir = poll(lambda: next((w for w in standbys if w.alive() and w.last("claimed")
                                      and w.last("claimed")["slot"] == slot), None) or fleet.check_errors(),
                        30, f"a standby to take slot {slot} over")
            log(f"session: worker {victim.pid} of slot {slot} killed with SIGKILL at {share:.0%} "
                f"({before} unsent messages in its share{', one customer held back' if slot in held else ''});"
                f" standby {heir.pid} took the slot over")
            takeovers.append((slot, heir.last("claimed")["backend"]))
        wait_done(c, fleet)
        fleet.check_errors()
    finally:
        fleet.stop()
    check_outcome(c, SLOTS, "session")
    for slot, backend in takeovers:
        check_resumed(c, slot, backend)
    moved = moved_customers(c)
    check(moved > 0, "session: no customer's messages were sent by two workers (no takeover mid-share)")
    log(f"session: {moved} customers were served by two workers in turn (before and after a takeover)")


# --------------------------------------------------------------------------
# 2. Dynamic groups: joins, leaves and a kill

def group_run(c):
    fill(c, PARTITIONS)
    fleet = Fleet("group", PARTITIONS)

    def members():
        (m,) = c.execute("SELECT count(*) FROM group_members('ordered')").fetchone()
        return m
    try:
        fleet.start(4)
        wait_progress(c, fleet, 0.15)
        fleet.start(4)
        poll(lambda: members() == 8, 30, "8 members")
        log("group: 4 members joined at 15% (8 members)")
        wait_progress(c, fleet, 0.4)
        leavers = [w for w in fleet.workers if w.alive()][:2]
        for w in leavers:
            w.proc.send_signal(signal.SIGTERM)
        for w in leavers:
            poll(lambda: w.proc.poll() is not None, 30, f"member {w.pid} to leave")
            check(w.last("left") is not None and w.proc.returncode == 0, f"member {w.pid} did not leave cleanly")
        log("group: 2 members left at 40% (group_leave between batches)")
        wait_progress(c, fleet, 0.6)
        victim = next(w for w in fleet.workers if w.alive())
        victim.proc.kill()
        victim.proc.wait(timeout=10)
        fleet.start(1)
        poll(lambda: members() == 6, 30, "6 members")
        log(f"group: member {victim.pid} killed with SIGKILL at 60%, one more joined (6 members)")
        wait_done(c, fleet)
        fleet.check_errors()
    finally:
        for w in fleet.workers:
            if w.alive():
                w.proc.send_signal(signal.SIGTERM)
        fleet.stop()
    check_outcome(c, PARTITIONS, "group")
    moved = moved_customers(c)
    check(moved > 0, "group: no customer's messages were sent by two members (no partition moved mid-run)")
    log(f"group: {moved} customers were served by more than one member as partitions moved, their order kept")


# --------------------------------------------------------------------------
# 3. The SQL worker loop of docs/ordered.md, as printed there

def sql_loop_run(c):
    """4 sessions CALL the documented procedure (n = 4) on 80 customers x 5
    messages, one of which fails: with the loop as printed the customer
    waits; with its set-aside lines instead, the message moves to
    outbox_failed and the customer goes on. Order and exactly-once as above."""
    doc = open(os.path.join(ROOT, "docs", "ordered.md"), encoding="utf-8").read()
    m = re.search(r"```sql\n(CREATE PROCEDURE ordered_mailer.*?)```", doc, re.S)
    check(m, "docs/ordered.md: no CREATE PROCEDURE ordered_mailer")
    wait_sql = m.group(1)
    aside_sql = re.sub(r"\n( *)held := held \|\| m\.customer_id;[^\n]*", r"\n\1NULL;", wait_sql)
    aside_sql = re.sub(r"-- (INSERT INTO outbox_failed .*)", r"\1", aside_sql)
    check("held := held ||" not in aside_sql and re.search(r"\n *INSERT INTO outbox_failed", aside_sql),
          "docs/ordered.md: the procedure's wait and set-aside lines are not where the test expects them")
    for choice, sql in (("wait", wait_sql), ("set aside", aside_sql)):
        fill(c, 4)
        c.execute("DELETE FROM outbox WHERE customer_id > 80 OR id > 5000")  # 80 customers x 5 messages
        c.execute("DELETE FROM expected WHERE id NOT IN (SELECT id FROM outbox)")
        c.execute("DELETE FROM faults")
        (poison,) = c.execute("SELECT id FROM outbox WHERE customer_id = 3 ORDER BY id OFFSET 1 LIMIT 1").fetchone()
        c.execute("""CREATE OR REPLACE FUNCTION send_message(m outbox) RETURNS void LANGUAGE plpgsql AS $$
                     BEGIN
                         IF m.id = %s THEN RAISE EXCEPTION 'message %% was rejected', m.id; END IF;
                     END $$""" % poison)
        c.execute("DROP PROCEDURE IF EXISTS ordered_mailer")
        c.execute(sql)
        errors = []

        def call():
            try:
                with connect() as w:
                    # nothing but the CALL, as the doc says
                    w.execute("CALL ordered_mailer(4, true)")
            except psycopg.Error as e:
                errors.append(e)
        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:  # one after another: the first ones find every slot unserved
            t.start()
            time.sleep(0.3)
        for t in threads:
            t.join(60)
        check(not errors and not any(t.is_alive() for t in threads), f"sql loop ({choice}): {errors or 'a CALL hangs'}")
        (v,) = c.execute(ORDER_VIOLATIONS.format(log="sent_log")).fetchone()
        (logged, distinct) = c.execute("SELECT count(*), count(DISTINCT item) FROM sent_log").fetchone()
        (later,) = c.execute("SELECT count(*) FROM expected WHERE customer_id = 3 AND id > %s", (poison,)).fetchone()
        (unsent,) = c.execute("SELECT array_agg(id ORDER BY id) FROM outbox WHERE sent_at IS NULL").fetchone()
        (failed,) = c.execute("SELECT array_agg(id) FROM outbox_failed").fetchone()
        check(v == 0 and logged == distinct, f"sql loop ({choice}): {v} order violations, {logged - distinct} repeats")
        if choice == "wait":
            check(logged == 400 - 1 - later and unsent[0] == poison and len(unsent) == 1 + later and failed is None,
                  f"sql loop (wait): {logged} sent, unsent {unsent}, set aside {failed}")
        else:
            check(logged == 399 and unsent is None and failed == [poison],
                  f"sql loop (set aside): {logged} sent, unsent {unsent}, set aside {failed}")
        log(f"the SQL loop of docs/ordered.md ({choice}), 4 sessions: {logged} messages sent once each in order; "
            + (f"customer 3 waits at message {poison} with {later} behind it" if choice == "wait"
               else f"message {poison} set aside, customer 3's {later} later messages sent"))


@pytest.fixture(scope="module")
def c(databases):
    """The test database (pg_claim, no notices below warnings) and the driver's connection."""
    databases(DB, extension=False)
    with connect() as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute("CREATE EXTENSION pg_claim")
        yield conn


def test_session_mode(c):
    session_run(c)
    check_checker(c)


def test_dynamic_groups(c):
    group_run(c)


def test_sql_loop_of_the_docs(c):
    sql_loop_run(c)
