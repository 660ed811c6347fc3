"""The example workers (examples/*/worker.*) against a real server.

Needs a running cluster with pg_claim installed that listens on 127.0.0.1
(PGPORT, as scripts/test sets it), its data directory (PGC_DATA) and its
binaries (PGC_BIN), so the test can restart it.

For each language (Python psycopg 3, Node.js pg, Java JDBC, Ruby pg), in a
fresh database with examples/schema.sql:

1. 4 workers serve the 8 slots of 'mailer' (claim_slots) and drain 2,000
   messages, one of which always fails (a bounce). With a fifth of them sent,
   the server is restarted (pg_ctl restart -m fast): every worker must report
   the lost connection, reconnect, and the rest must be sent after the restart.
   The bouncing message is recorded as failed, retried, and set aside (dead)
   after 3 attempts.
2. Every worker waits (fallback poll 60 s); 40 new messages are inserted and
   must be sent well before any poll: the workers are woken by NOTIFY.
3. SIGTERM: every worker exits, saying it was told to.
4. 200 more messages, the last of which bounces, and 4 new workers with
   --exit-when-empty: they send them, retry the bounce at the end of its
   share (behind sent messages) until it is set aside, and exit by themselves.

Then every message but the bouncing ones is in `deliveries` exactly once, the
bouncing ones never, and docs/workers.md shows each worker's loop verbatim.

Then what docs/workers.md says about binding parameters from JDBC
(JdbcBinding.java), and the cut-over of docs/migrating.md: 2 queue workers
(FOR UPDATE SKIP LOCKED, queue_worker.py) and 2 pg_claim workers
(examples/python/worker.py) send 2,000 messages at the same time, the queue
workers are stopped half-way, and every message is sent exactly once.

Then, for each language: a due failure record of a message sent meanwhile
by someone else must not keep 2 workers with --exit-when-empty from exiting
(nor make them print "waiting" in a loop); and a worker started through
PgBouncer in transaction mode (the test starts one) must refuse to work:
status 2, "exit refused: ...", no slot held, no failure recorded, nothing
sent; and, in lease mode (MAILER_MODE=lease) through that PgBouncer, 3
workers of each language send 600 messages (one bounces), one of them
SIGKILLed on the way (its slots move on after the 2 s TTL): every good
message once, the bounce set aside, SIGTERM stops the others, which give
their slots back. Each part is a test: test_language[LANG], test_jdbc_binding,
test_cut_over, test_stale_failure, test_refused_behind_pooler,
test_leases_through_pgbouncer (scripts/test loops python pooler).
"""
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
from harness import Failure, PgBouncer, check, failure_state, log

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(ROOT, "examples")
DB = "pg_claim_loops"
JDBC_JAR = "/usr/share/java/postgresql.jar"
WORKERS, ITEMS, WAKE_ITEMS, LAST_ITEMS, LEASE_ITEMS = 4, 2000, 40, 200, 600
MAX_ATTEMPTS = 3
POLL_S = 60  # the workers' fallback poll: longer than any wait of the test
TIME_LIMIT_S = 520
LANGUAGES = ("python", "node", "java", "ruby")


def connect(dbname=DB):
    return harness.connect(dbname, host="127.0.0.1", user="postgres")


def poll(fn, timeout, what):
    """harness.poll, where a call that finds the server restarting counts
    as not yet."""

    def attempt():
        try:
            return fn()
        except psycopg.OperationalError:
            return None  # the server restarting

    return harness.poll(attempt, timeout, what)


def check_docs():
    """docs/workers.md shows the loop of each worker verbatim, and
    docs/claiming.md ("The example") the example schema's table and index."""
    doc = open(os.path.join(ROOT, "docs", "workers.md"), encoding="utf-8").read()
    for path, fence in (("python/worker.py", "python"), ("node/worker.js", "js"),
                        ("java/Worker.java", "java"), ("ruby/worker.rb", "ruby")):
        src = open(os.path.join(EXAMPLES, path), encoding="utf-8").read()
        m = re.search(r"^ *(?:#|//) docs/workers\.md: begin\n(.*?)^ *(?:#|//) docs/workers\.md: end\n",
                      src, re.S | re.M)
        check(m, f"examples/{path}: no docs/workers.md markers")
        check(f"```{fence}\n{m.group(1)}```" in doc,
              f"docs/workers.md does not show the loop of examples/{path} verbatim")
    schema = open(os.path.join(EXAMPLES, "schema.sql"), encoding="utf-8").read()
    guide = open(os.path.join(ROOT, "docs", "claiming.md"), encoding="utf-8").read()
    for stmt in re.findall(r"^CREATE (?:TABLE outbox|INDEX outbox_pending) .*?;\n", schema, re.S | re.M):
        check(stmt in guide, f"docs/claiming.md does not show examples/schema.sql's {stmt.split('(')[0].strip()}")
    log("docs/workers.md shows the loops of the four workers verbatim; docs/claiming.md the example schema")


class Worker:
    cond = threading.Condition()

    def __init__(self, cmd, env, workdir, lang):
        self.lang = lang
        self.err_path = os.path.join(workdir, f"{lang}-{len(os.listdir(workdir))}.err")
        with open(self.err_path, "w") as err:
            # setpriv: the kernel kills the worker if the test dies
            self.proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--"] + cmd, cwd=ROOT,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=err, env=env, text=True)
        self.pid = self.proc.pid
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def wait(self, timeout):
        """The exit status, once the process has ended and its output is read."""
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        return rc

    def _read(self):
        for line in self.proc.stdout:
            with Worker.cond:
                self.lines.append(line.rstrip("\n"))
                Worker.cond.notify_all()

    def said(self, word, since=0):
        with Worker.cond:
            return [ln for ln in self.lines[since:] if ln.split(" ", 1)[0] == word]

    def last(self):
        with Worker.cond:
            return self.lines[-1].split(" ", 1)[0] if self.lines else None

    def stderr(self):
        return open(self.err_path, errors="replace").read()[-3000:]

    def __str__(self):
        return f"{self.lang} worker {self.proc.pid}"


def command(lang, classes):
    return {"python": [sys.executable, os.path.join(EXAMPLES, "python", "worker.py")],
            "node": ["node", os.path.join(EXAMPLES, "node", "worker.js")],
            "java": ["java", "-cp", f"{classes}:{JDBC_JAR}", "Worker"],
            "ruby": ["ruby", os.path.join(EXAMPLES, "ruby", "worker.rb")]}[lang]


def insert(d, count, poison_at=None):
    """count messages (customer ids 0 .. 49); the message number poison_at bounces."""
    d.execute("""INSERT INTO outbox (customer_id, recipient, body)
                 SELECT g %% 50, CASE WHEN g = %s THEN 'nobody@example.invalid'
                                     ELSE 'user' || g || '@example.com' END, 'hello ' || g
                 FROM generate_series(1, %s) g""", (poison_at, count))


def sent(d):
    return d.execute("SELECT count(DISTINCT outbox_id) FROM deliveries").fetchone()[0]


def lease_spread(d):
    """(slots leased, distinct holders) of the examples' fleet."""
    return tuple(d.execute("SELECT count(*), count(DISTINCT holder) FROM slot_status('mailer', 8)"
                           " WHERE state = 'lease'").fetchone())


def stop_all(workers):
    harness.stop_all(workers, kill=True)


def fresh_database():
    """A new database with examples/schema.sql; a connection to it."""
    with connect("postgres") as d:
        d.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        d.execute(f"CREATE DATABASE {DB}")
    d = connect()
    d.execute(open(os.path.join(EXAMPLES, "schema.sql"), encoding="utf-8").read())
    return d


def worker_env():
    env = dict(os.environ, PGHOST="127.0.0.1", PGDATABASE=DB, PGUSER="postgres",
               MAILER_POLL_S=str(POLL_S), MAILER_BACKOFF="200 milliseconds",
               MAILER_MAX_ATTEMPTS=str(MAX_ATTEMPTS),
               # the Python worker runs on the checkout's worker library (clients/python)
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "clients", "python", "src"),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop("PGSERVICE", None)
    return env


def run_language(lang, classes, workdir, cluster):
    d = fresh_database()
    env = worker_env()
    insert(d, ITEMS, poison_at=ITEMS // 2)
    (poison,) = d.execute("SELECT id FROM outbox WHERE recipient LIKE '%.invalid'").fetchone()
    workers = []
    t0 = time.monotonic()
    try:
        # 1. drain, with a server restart on the way
        workers = [Worker(command(lang, classes), env, workdir, lang) for _ in range(WORKERS)]
        poll(lambda: sent(d) >= ITEMS // 5, 60, f"{ITEMS // 5} messages sent")
        d.close()
        cluster.restart()
        d = connect()
        (before,) = d.execute("SELECT count(*) FROM deliveries WHERE delivered_at < pg_postmaster_start_time()"
                              ).fetchone()
        check(before < ITEMS - 1, f"every message was sent before the restart ({before})")
        poll(lambda: sent(d) == ITEMS - 1, 90, f"all {ITEMS - 1} good messages sent after the restart")
        poll(lambda: failure_state(d, "mailer", poison) == "dead", 30, "the bouncing message to be set aside")
        for w in workers:
            check(w.proc.poll() is None, f"{w} exited: {w.lines[-3:]} {w.stderr()}")
            # an idle worker notices the restart at its next call, within a second or so
            poll(lambda: w.said("reconnecting"), 30, f"{w} to report the restart ({w.lines[-5:]})")
        try:
            poll(lambda: any(w.said("dead") for w in workers), 10, "a worker to report the message set aside")
        except Failure as e:
            reports = "; ".join(f"{w}: {[ln for ln in w.lines if ln.split(' ', 1)[0] in ('failed', 'dead', 'reconnecting')]}"
                                for w in workers)
            record = d.execute("SELECT row_to_json(f) FROM item_failures('mailer') f WHERE item = %s",
                               (str(poison),)).fetchone()
            raise Failure(f"{e} (their reports: {reports}; the record: {record})") from None
        failed = sum(len(w.said("failed")) for w in workers)
        dead = sum(len(w.said("dead")) for w in workers)
        check(failed == MAX_ATTEMPTS - 1 and dead == 1,
              f"the bouncing message: {failed} 'failed' and {dead} 'dead' reports")
        log(f"  {lang}: {WORKERS} workers sent {before} messages before the restart and"
            f" {ITEMS - 1 - before} after it (each reconnected); the bounce failed {MAX_ATTEMPTS} times"
            f" and was set aside ({time.monotonic() - t0:.1f} s)")

        # 2. woken by NOTIFY, not by the poll
        poll(lambda: all(w.last() == "waiting" for w in workers), 30, "every worker to wait")
        marks = [len(w.lines) for w in workers]
        t1 = time.monotonic()
        insert(d, WAKE_ITEMS)
        poll(lambda: sent(d) == ITEMS - 1 + WAKE_ITEMS, POLL_S / 3,
             f"the {WAKE_ITEMS} new messages sent (before any fallback poll)")
        woken = sum(bool(w.said("woken", m)) for w, m in zip(workers, marks))
        check(woken > 0, "no worker reported a notification")
        log(f"  {lang}: {WAKE_ITEMS} new messages sent {time.monotonic() - t1:.2f} s after their insert,"
            f" {woken} of {WORKERS} workers woken by NOTIFY (fallback poll {POLL_S} s)")

        # 3. told to stop
        for w in workers:
            w.proc.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                rc = w.wait(15)
            except subprocess.TimeoutExpired:
                raise Failure(f"{w} did not exit within 15 s of SIGTERM: {w.lines[-3:]}") from None
            # the JVM exits with 128 + 15 after SIGTERM, the others with 0
            check(rc == (143 if lang == "java" else 0), f"{w} exited with {rc} after SIGTERM: {w.stderr()}")
            check(w.lines and w.lines[-1] == "exit told to stop", f"{w}'s last words: {w.lines[-3:]}")

        # 4. --exit-when-empty
        insert(d, LAST_ITEMS, poison_at=LAST_ITEMS)
        workers = [Worker(command(lang, classes) + ["--exit-when-empty"], env, workdir, lang)
                   for _ in range(WORKERS)]
        for w in workers:
            try:
                rc = w.wait(60)
            except subprocess.TimeoutExpired:
                raise Failure(f"{w} with --exit-when-empty did not exit: {w.lines[-3:]}") from None
            check(rc == 0 and w.lines[-1:] == ["exit nothing left"], f"{w} exited with {rc}:"
                  f" {w.lines[-3:]} {w.stderr()}")
        log(f"  {lang}: SIGTERM stopped every worker; {WORKERS} workers with --exit-when-empty sent"
            f" {LAST_ITEMS - 1} more messages, set the last one aside and exited")
    finally:
        stop_all(workers)

    # exactly once
    total = ITEMS - 1 + WAKE_ITEMS + LAST_ITEMS - 1
    bounces = [r[0] for r in d.execute("SELECT id FROM outbox WHERE recipient LIKE '%.invalid' ORDER BY id")]
    (rows, distinct, pending) = d.execute(
        "SELECT (SELECT count(*) FROM deliveries), (SELECT count(DISTINCT outbox_id) FROM deliveries),"
        " (SELECT array_agg(id ORDER BY id) FROM outbox WHERE sent_at IS NULL)").fetchone()
    (bounces_sent,) = d.execute("SELECT count(*) FROM deliveries WHERE outbox_id = ANY (%s)", (bounces,)).fetchone()
    (missing,) = d.execute("SELECT count(*) FROM outbox o WHERE id <> ALL (%s) AND NOT EXISTS"
                           " (SELECT 1 FROM deliveries WHERE outbox_id = o.id)", (bounces,)).fetchone()
    check(rows == distinct == total and missing == 0 and bounces_sent == 0 and pending == bounces,
          f"exactly once: {rows} deliveries of {distinct} messages for {total}, {missing} missing,"
          f" the bounces delivered {bounces_sent} times, unsent: {pending}")
    failures = d.execute("SELECT item::bigint, state, attempts FROM item_failures('mailer') ORDER BY 1").fetchall()
    check(failures == [(b, "dead", MAX_ATTEMPTS) for b in bounces], f"failure records: {failures}")
    d.close()
    log(f"  {lang}: {total} messages delivered exactly once, the {len(bounces)} bounces never"
        f" (dead after {MAX_ATTEMPTS} attempts)")


def jdbc_binding(classes):
    with fresh_database() as d:
        insert(d, 100)
    out = subprocess.run(["java", "-cp", f"{classes}:{JDBC_JAR}", "JdbcBinding",
                          f"jdbc:postgresql://127.0.0.1:{os.environ['PGPORT']}/{DB}"],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    check(out.returncode == 0, f"JDBC bindings differ from docs/workers.md:\n{out.stdout}{out.stderr}")
    log(f"  jdbc: {len(out.stdout.splitlines())} bindings as docs/workers.md says"
        " (a String for an interval and a long for after fail with 42883 unless cast)")


def cut_over(workdir):
    items = 2000
    d = fresh_database()
    insert(d, items)
    env = worker_env()
    queue = [Worker([sys.executable, os.path.join(HERE, "queue_worker.py")], env, workdir, "queue")
             for _ in range(2)]
    claim = [Worker(command("python", None), env, workdir, "python") for _ in range(2)]
    try:
        def both_sent():
            kinds = dict(d.execute("SELECT split_part(worker, '-', 1), count(*) FROM deliveries GROUP BY 1"
                                   ).fetchall())
            return kinds if kinds.get("queue", 0) > 0 and kinds.get("python", 0) > 0 else None
        try:
            poll(lambda: both_sent() and sent(d) >= items // 3, 60, "both kinds of worker to send")
        except Failure as e:
            raise Failure(f"{e}: {d.execute('SELECT worker, count(*) FROM deliveries GROUP BY 1').fetchall()}"
                          f" {[(str(w), w.proc.poll(), w.lines[-3:], w.stderr()) for w in queue + claim]}")
        for w in queue:
            w.proc.send_signal(signal.SIGTERM)
        for w in queue:
            check(w.wait(15) == 0, f"{w} after SIGTERM: {w.stderr()}")
        (queue_sent,) = d.execute("SELECT count(*) FROM deliveries WHERE worker LIKE 'queue-%'").fetchone()
        poll(lambda: sent(d) == items, 60, f"all {items} messages sent")
        for w in claim:
            w.proc.send_signal(signal.SIGTERM)
        for w in claim:
            check(w.wait(15) == 0, f"{w} after SIGTERM: {w.stderr()}")
    finally:
        stop_all(queue + claim)
    (rows, distinct, pending) = d.execute(
        "SELECT count(*), count(DISTINCT outbox_id), (SELECT count(*) FROM outbox WHERE sent_at IS NULL)"
        " FROM deliveries").fetchone()
    check(rows == distinct == items and pending == 0,
          f"cut-over: {rows} deliveries of {distinct} messages for {items}, {pending} unsent")
    skipped = sum(len(w.said("skipped")) for w in claim)
    d.close()
    log(f"  cut-over: 2 queue workers sent {queue_sent} messages and 2 pg_claim workers {items - queue_sent},"
        f" at the same time, then alone; each message once ({skipped} skipped by pg_claim workers"
        " because a queue worker had sent them)")


def behind_pooler(classes, workdir):
    """Each worker started through a transaction-mode PgBouncer refuses to
    work: status 2, `exit refused: ...`, nothing claimed, recorded or sent."""
    d = fresh_database()
    insert(d, 100)
    bouncer = PgBouncer("127.0.0.1", int(os.environ["PGPORT"]))
    try:
        env = dict(worker_env(), PGPORT=str(bouncer.port))
        for lang in LANGUAGES:
            w = Worker(command(lang, classes) + ["--exit-when-empty"], env, workdir, lang)
            try:
                rc = w.wait(20)
            except subprocess.TimeoutExpired:
                stop_all([w])
                raise Failure(f"{w} through PgBouncer (transaction mode) did not exit: {w.lines[-3:]}") from None
            check(rc == 2 and w.lines[-1:] and w.lines[-1].startswith("exit refused: ")
                  and "pooler" in w.lines[-1], f"{w} through PgBouncer exited with {rc}: {w.lines[-3:]} {w.stderr()}")
            (held, failures, delivered) = d.execute(
                "SELECT (SELECT count(*) FROM slot_holders('mailer')), (SELECT count(*) FROM item_failures('mailer')),"
                " (SELECT count(*) FROM deliveries)").fetchone()
            check(held == failures == delivered == 0,
                  f"{w} through PgBouncer left {held} slots held, {failures} failures, {delivered} deliveries")
    finally:
        bouncer.stop()
    d.close()
    log(f"  pooler: through PgBouncer (transaction mode) each of {', '.join(LANGUAGES)} refused to work"
        " (status 2, 'exit refused: ... a connection pooler is in between ...'); nothing claimed,"
        " recorded or sent")


def leases_through_pooler(classes, workdir):
    """Each worker in lease mode (MAILER_MODE=lease) through a
    transaction-mode PgBouncer: 3 of them hold slots, then drain the
    messages inserted, one is
    SIGKILLed on the way and its slots move on to the two others after the
    TTL, the bounce is
    set aside, every other message is sent once; SIGTERM stops the others,
    which give their leases back."""
    bouncer = PgBouncer("127.0.0.1", int(os.environ["PGPORT"]))
    try:
        for lang in LANGUAGES:
            d = fresh_database()
            env = dict(worker_env(), PGPORT=str(bouncer.port), MAILER_MODE="lease", MAILER_TTL="2 seconds",
                       MAILER_POLL_S="0.5")
            workers = [Worker(command(lang, classes), env, workdir, lang) for _ in range(3)]
            t0 = time.monotonic()
            try:
                # the messages once every worker holds slots: one that started
                # late would find them sent (3 workers drain them in about 1 s)
                poll(lambda: all(w.said("slots") for w in workers), 30, "every worker in lease mode holding slots")
                insert(d, LEASE_ITEMS, poison_at=LEASE_ITEMS // 3)
                poll(lambda: sent(d) >= LEASE_ITEMS // 4, 60, f"{LEASE_ITEMS // 4} messages sent")
                workers[0].proc.kill()
                workers[0].proc.wait()
                poll(lambda: sent(d) == LEASE_ITEMS - 1, 60,
                     f"all {LEASE_ITEMS - 1} good messages sent after a SIGKILL")
                poll(lambda: failure_state(d, "mailer", LEASE_ITEMS // 3) == "dead", 30,
                     "the bouncing message to be set aside")
                # the drain can end within the TTL of the kill: the killed
                # worker's leases live on until then, and move on after it
                poll(lambda: lease_spread(d) == (8, 2), 30,
                     "the SIGKILLed worker's slots leased by the two others after the TTL")
                for w in workers[1:]:
                    w.proc.send_signal(signal.SIGTERM)
                for w in workers[1:]:
                    try:
                        rc = w.wait(15)
                    except subprocess.TimeoutExpired:
                        raise Failure(f"{w} in lease mode did not exit within 15 s of SIGTERM: {w.lines[-3:]}") from None
                    check(rc == (143 if lang == "java" else 0) and w.lines[-1:] == ["exit told to stop"],
                          f"{w} in lease mode exited with {rc}: {w.lines[-3:]} {w.stderr()}")
                    check(w.said("slots"), f"{w} in lease mode never held a slot: {w.lines[-5:]}")
            finally:
                stop_all(workers)
            (rows, distinct, live) = d.execute(
                "SELECT (SELECT count(*) FROM deliveries), (SELECT count(DISTINCT outbox_id) FROM deliveries),"
                " (SELECT count(*) FROM slot_status('mailer', 8) WHERE state <> 'unserved')").fetchone()
            check(rows == distinct == LEASE_ITEMS - 1,
                  f"{lang} in lease mode: {rows} deliveries of {distinct} messages for {LEASE_ITEMS - 1}")
            check(live == 0, f"{lang} in lease mode: {live} slots still held after every worker stopped")
            d.close()
            log(f"  leases: 3 {lang} workers in lease mode through PgBouncer (transaction mode) sent"
                f" {LEASE_ITEMS - 1} messages once, one of them SIGKILLed on the way; the bounce set aside;"
                f" SIGTERM stopped the others, which gave their slots back ({time.monotonic() - t0:.1f} s)")
    finally:
        bouncer.stop()


def failure_of_sent_message(classes, workdir):
    """A due failure record of a message that someone else sent meanwhile
    (as in the cut-over) neither keeps --exit-when-empty from exiting nor
    makes a worker wait in a busy loop."""
    for lang in LANGUAGES:
        d = fresh_database()
        insert(d, 100)
        (item,) = d.execute("SELECT id FROM outbox ORDER BY id OFFSET 6 LIMIT 1").fetchone()
        d.execute("SELECT record_failure('mailer', %s, 'timeout', 5, '10 milliseconds')", (str(item),))
        d.execute("UPDATE outbox SET sent_at = now() WHERE id = %s", (item,))  # sent by another kind of worker
        time.sleep(0.05)  # the record is due
        workers = [Worker(command(lang, classes) + ["--exit-when-empty"], worker_env(), workdir, lang)
                   for _ in range(2)]
        try:
            for w in workers:
                try:
                    rc = w.wait(20)
                except subprocess.TimeoutExpired:
                    raise Failure(f"{w} with --exit-when-empty and a failure record of a sent message did not"
                                  f" exit; it said 'waiting' {len(w.said('waiting'))} times") from None
                check(rc == 0 and w.lines[-1:] == ["exit nothing left"] and len(w.said("waiting")) <= 5,
                      f"{w} exited with {rc}, said 'waiting' {len(w.said('waiting'))} times: {w.lines[-3:]}")
        finally:
            stop_all(workers)
        (rows, distinct) = d.execute("SELECT count(*), count(DISTINCT outbox_id) FROM deliveries").fetchone()
        check(rows == distinct == 99, f"{lang}: {rows} deliveries of {distinct} messages for 99")
        d.close()
    log(f"  stale failure record: with a due failure record of a message sent by another worker,"
        f" 2 workers of each of {', '.join(LANGUAGES)} with --exit-when-empty sent the other 99 once and exited")


@pytest.fixture(scope="module")
def classes(workdir):
    """The Java worker and JdbcBinding, compiled."""
    out = os.path.join(workdir, "classes")
    subprocess.run(["javac", "-cp", JDBC_JAR, "-d", out, os.path.join(EXAMPLES, "java", "Worker.java"),
                    os.path.join(HERE, "JdbcBinding.java")], check=True)
    return out


@pytest.fixture(scope="module")
def logs(workdir, databases):
    """The workers' stderr files (shown after a failure); the database is
    dropped after the module when every test passed."""
    d = os.path.join(workdir, "stderr")
    os.mkdir(d)
    databases.adopt(DB)
    return d


def test_docs_show_each_loop_verbatim():
    check_docs()


@pytest.mark.parametrize("lang", LANGUAGES)
def test_language(lang, classes, logs, cluster):
    run_language(lang, classes, logs, cluster)


def test_jdbc_binding(classes):
    jdbc_binding(classes)


def test_cut_over(logs):
    cut_over(logs)


def test_stale_failure(classes, logs):
    failure_of_sent_message(classes, logs)


def test_refused_behind_pooler(classes, logs):
    behind_pooler(classes, logs)


def test_leases_through_pgbouncer(classes, logs):
    leases_through_pooler(classes, logs)
