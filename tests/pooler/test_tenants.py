"""A tenant's k slots (slot_of_spread) with k different holders of a
claim_leases fleet, on real connections.

A table of orders of 40 tenants (one large, the others small) carries its
slot as a generated column, slot_of_spread(tenant, order_id, 16, 4). Four
holders, each a thread with connections of its own, join the fleet of n = 16
one after another with max => 4 and call claim_leases every 0.2 s (ttl 5 s);
the test polls lease_holders with a deadline until every slot is held, four
by each holder. Then:

- every tenant's rows lie on at most k = 4 slots, spaced n/k apart;
- the k slots a tenant can reach are held by k different holders;
- each holder drains its slots with my_items(..., route => 'slot'),
  writing each batch behind fence() and logging (tenant, holder): every
  order is done exactly once, no tenant is served by more than k holders,
  and the large tenant by exactly k.

The layer `elastic` of scripts/test runs it (tests/pooler/test_tenants.py).
"""
import threading
import time

import psycopg
from harness import Expectations, connect, poll

N, K, HOLDERS, TENANTS = 16, 4, 4, 40
NAME = "tenants_fleet"
DEADLINE_S = 60


SETUP = f"""
CREATE EXTENSION IF NOT EXISTS pg_claim;
DROP TABLE IF EXISTS tf_orders, tf_log;
CREATE TABLE tf_orders (
    tenant text NOT NULL, order_id bigint NOT NULL, done boolean NOT NULL DEFAULT false,
    slot integer GENERATED ALWAYS AS (slot_of_spread(tenant, order_id, {N}, {K})) STORED,
    PRIMARY KEY (tenant, order_id));
CREATE INDEX tf_orders_slot ON tf_orders (slot_of(slot, {N}), tenant, order_id) WHERE NOT done;
CREATE TABLE tf_log (tenant text, order_id bigint, holder text);
INSERT INTO tf_orders (tenant, order_id) SELECT 'big', g FROM generate_series(1, 2000) g;
INSERT INTO tf_orders (tenant, order_id) SELECT 'small-' || t, g FROM generate_series(1, {TENANTS - 1}) t, generate_series(1, 5) g;
SELECT count(*) FROM claim_leases('{NAME}', {N}, 'setup', max => 0);
"""


class Holder(threading.Thread):
    """Calls claim_leases every 0.2 s on one connection; once told to work,
    drains its slots on another, each batch fenced."""

    def __init__(self, name):
        super().__init__(daemon=True)
        self.name_ = name
        self.tokens = {}
        self.work = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.error = None

    def run(self):
        try:
            with connect() as claim, psycopg.connect(dbname="postgres") as w:
                while not self.stop.is_set():
                    rows = claim.execute("SELECT slot, token FROM claim_leases(%s, %s, %s, max => %s, ttl => '5 s')",
                                         (NAME, N, self.name_, N // HOLDERS)).fetchall()
                    with self.lock:
                        self.tokens = dict(rows)
                    if self.work.is_set():
                        self.drain(w)
                    time.sleep(0.2)
                claim.execute("SELECT count(*) FROM claim_leases(%s, %s, %s, max => 0)", (NAME, N, self.name_))
        except Exception as e:  # reported by the main thread
            self.error = e

    def drain(self, w):
        with self.lock:
            held = dict(self.tokens)
        for slot, token in held.items():
            with w.transaction():
                w.execute("SELECT fence(%s, %s, %s)", (NAME, slot, token))
                rows = w.execute(f"SELECT tenant, order_id FROM my_items(NULL::tf_orders, %s, {N}, key => 'order_id', "
                                 "route => 'slot', pending => 'done', batch => 50)", (slot,)).fetchall()
                for tenant, order_id in rows:
                    w.execute("UPDATE tf_orders SET done = true WHERE tenant = %s AND order_id = %s", (tenant, order_id))
                    w.execute("INSERT INTO tf_log VALUES (%s, %s, %s)", (tenant, order_id, self.name_))


def holds(c, query, want):
    return c.execute(query).fetchone()[0] == want


def test_tenant_slots_with_different_holders(cluster):
    check = Expectations(show_ok=True)
    holders = []
    with connect() as c:
        c.execute(SETUP)
        try:
            for i in range(HOLDERS):
                h = Holder(f"h{i}")
                h.start()
                holders.append(h)
                # one after another: each joins a fleet whose earlier holders hold their share
                poll(lambda: holds(c, f"SELECT count(*) FROM lease_holders('{NAME}') WHERE holder = 'h{i}' AND NOT expired",
                                   N // HOLDERS), DEADLINE_S, f"holder h{i} holding {N // HOLDERS} slots")
            held = dict(c.execute(f"SELECT slot, holder FROM lease_holders('{NAME}') WHERE NOT expired").fetchall())
            check(len(held) == N, f"every slot held ({len(held)} of {N}): {sorted(held.items())}")

            reach = c.execute("SELECT tenant, array_agg(DISTINCT slot ORDER BY slot), slot_of(tenant, %s) "
                              "FROM tf_orders GROUP BY tenant", (N,)).fetchall()
            check(all(len(s) <= K for _, s, _ in reach), f"every tenant on at most {K} slots")
            check(all((s - base) % (N // K) == 0 for _, slots, base in reach for s in slots),
                  f"a tenant's slots spaced n/k = {N // K} apart from slot_of(tenant, n)")
            apart = [(t, [held.get((base + i * (N // K)) % N) for i in range(K)]) for t, _, base in reach]
            same = [(t, hs) for t, hs in apart if len(set(hs)) != K]
            check(not same, f"each tenant's {K} slots held by {K} different holders"
                  + (f" (not: {same[:3]})" if same else ""))

            for h in holders:
                h.work.set()
            poll(lambda: holds(c, "SELECT count(*) FROM tf_orders WHERE NOT done", 0), DEADLINE_S, "the table drained")
        finally:
            for h in holders:
                h.stop.set()
            for h in holders:
                h.join(timeout=DEADLINE_S)
        for h in holders:
            check(h.error is None, f"holder {h.name_} ran without error ({h.error})")

        once = c.execute("SELECT count(*), count(DISTINCT (tenant, order_id)), "
                         "(SELECT count(*) FROM tf_orders) FROM tf_log").fetchone()
        check(once[0] == once[1] == once[2], f"every order done exactly once (log {once[0]}, distinct {once[1]}, "
                                             f"orders {once[2]})")
        most = c.execute("SELECT max(h), (SELECT count(DISTINCT holder) FROM tf_log WHERE tenant = 'big') "
                         "FROM (SELECT count(DISTINCT holder) h FROM tf_log GROUP BY tenant) s").fetchone()
        check(most[0] <= K and most[1] == K,
              f"at most {K} holders served one tenant (most: {most[0]}), the large tenant {most[1]}")
        left = c.execute(f"SELECT count(*) FROM lease_holders('{NAME}') WHERE NOT expired").fetchone()[0]
        check(left == 0, f"every holder left the fleet ({left} live leases)")
        c.execute("DROP TABLE tf_orders, tf_log")
    check.verify()
