"""The driver's side of the outbox fleet tests (test_resize.py, test_cap.py):
a worker process of resize_worker.py (Python) or resize_worker.js (Node.js),
pg_claim's library worker in lease mode through the pooler on the outbox
table, routed by customer with the jump mapping."""
import os
import sys

from harness import WorkerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


class OutboxWorker(WorkerProcess):
    """One worker of fleet `name` (n slots, ttl `ttl_s`, `item_ms` of work
    per message) on database `db` through the pooler at `port`; `holder`
    is its holder text, read from its first event."""
    seq = 0

    def __init__(self, workdir, lang, n, *, db, name, port, ttl_s, item_ms):
        OutboxWorker.seq += 1
        self.label = f"w{OutboxWorker.seq}-{lang}"
        self.lang = lang
        env = dict(os.environ, RESIZE_N=str(n), RESIZE_TTL_S=str(ttl_s), RESIZE_NAME=name, RESIZE_ITEM_MS=str(item_ms),
                   RESIZE_DSN=f"host=127.0.0.1 port={port} dbname={db} user=postgres",
                   PGHOST="127.0.0.1", PGPORT=str(port), PGDATABASE=db, PGUSER="postgres",
                   PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "clients", "python", "src"),
                                               os.environ.get("PYTHONPATH", "")]))
        env.pop("PGSERVICE", None)
        cmd = [sys.executable, os.path.join(HERE, "resize_worker.py")] if lang == "py" else \
            ["node", os.path.join(HERE, "resize_worker.js")]
        super().__init__(cmd, env, os.path.join(workdir, f"{self.label}.err"))
        self.holder = self.wait_event("holder", 0, 20)["holder"]

    def __str__(self):
        return self.label


def outbox_tables(d, customers, per_customer):
    """The outbox (message r of customer c has id (r - 1) * customers + c:
    the customers interleaved in id order) and its processing log."""
    d.execute("""
        CREATE TABLE outbox (id bigint PRIMARY KEY, customer_id integer NOT NULL, body text NOT NULL,
                             sent_at timestamptz);
        CREATE TABLE sent_log (seq bigserial PRIMARY KEY, item bigint NOT NULL, customer_id integer NOT NULL,
                               slot integer NOT NULL, token bigint NOT NULL, holder text NOT NULL,
                               logged_at timestamptz NOT NULL DEFAULT clock_timestamp());""")
    d.execute("INSERT INTO outbox SELECT (r - 1) * %s + c, c, 'm' || r FROM generate_series(1, %s) r,"
              " generate_series(1, %s) c", (customers, per_customer, customers))


def check_outbox_log(d, items):
    """Every message logged exactly once, none left unsent, and per customer
    the log (by seq) in id order."""
    from harness import check
    total, distinct = d.execute("SELECT count(*), count(DISTINCT item) FROM sent_log").fetchone()
    check(total == items and distinct == items, f"every message logged once: {total} rows, {distinct} distinct")
    (unsent,) = d.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()
    check(unsent == 0, f"{unsent} messages left unsent")
    (disorder,) = d.execute("""
        SELECT count(*) FROM (SELECT item, lag(item) OVER (PARTITION BY customer_id ORDER BY seq) AS prev
                              FROM sent_log) x WHERE item < prev""").fetchone()
    check(disorder == 0, f"{disorder} messages logged before an earlier message of their customer")
