"""The options shard_column and shard_keys (docs/scale-out.md, "The worker
library on Citus") against the server of test_server.py, without Citus:
each slot's batches read only the rows with the slot's shard key, and by
the mapping, so a row under another slot's key is read by no worker; every
other row is handled once, each customer's in key order. The same fleet on
Citus, where those reads are single-shard, is tests/citus/lease.py's."""
import pytest

import pg_claim
from test_server import Run, db, wait_for  # noqa: F401  (db: the fixture)

N = 4
KEYS = {0: 100, 1: 101, 2: 102, 3: 103}
CUSTS, ROWS = 12, 600


def make_sharded(db, name):
    """ROWS rows of CUSTS customers, each under its slot's shard key; the
    rows with id % 97 = 0 under the next slot's key (misplaced)."""
    db.execute(f"DROP TABLE IF EXISTS {name}")
    db.execute(f"CREATE TABLE {name} (id bigint NOT NULL, skey int NOT NULL, cust int NOT NULL,"
               " done boolean NOT NULL DEFAULT false, PRIMARY KEY (skey, id))")
    db.execute("CREATE TEMP TABLE IF NOT EXISTS keys (slot int, key int)")
    db.execute("TRUNCATE keys")
    db.execute("INSERT INTO keys SELECT * FROM unnest(%s::int[], %s::int[])", (list(KEYS), list(KEYS.values())))
    db.execute(f"INSERT INTO {name} (id, skey, cust) SELECT g, k.key, g % {CUSTS} FROM generate_series(1, {ROWS}) g"
               f" JOIN keys k ON k.slot = (slot_of(g % {CUSTS}, {N}) + (g % 97 = 0)::int) % {N}")
    db.execute("CREATE TABLE IF NOT EXISTS shard_log (tbl text, item bigint, cust int, skey int, slot int,"
               " ord bigserial)")


def test_each_slot_reads_its_shard_key_only(db):
    make_sharded(db, "sk")

    def handle(tx, rows):
        tx.execute("UPDATE sk SET done = true WHERE skey = %s AND id = ANY(%s)",
                   (KEYS[rows.slot], [r["id"] for r in rows]))
        tx.execute("INSERT INTO shard_log (tbl, item, cust, skey, slot) SELECT 'sk', u.*, %s FROM"
                   " unnest(%s::bigint[], %s::int[], %s::int[]) u",
                   (rows.slot, [r["id"] for r in rows], [r["cust"] for r in rows], [r["skey"] for r in rows]))
    runs = [Run(name="sk", table="sk", n=N, pending="done", key="id", route="cust", batch=20, ttl=3,
                poll_interval=0.2, handler=handle, shard_column="skey", shard_keys=KEYS) for _ in range(2)]
    misplaced = db.execute("SELECT count(*) FROM sk WHERE id % 97 = 0").fetchone()[0]
    try:
        wait_for(lambda: db.execute("SELECT count(*) FROM sk WHERE NOT done").fetchone()[0] == misplaced,
                 what="every row under its slot's key done")
        # a while longer: the misplaced rows stay pending
        wait_for(lambda: all(r.said("idle") for r in runs), what="both workers idle")
    finally:
        for r in runs:
            r.stop()
    assert all(r.error is None for r in runs), [r.error for r in runs]
    total, distinct, wrong = db.execute(
        "SELECT count(*), count(DISTINCT item), count(*) FILTER (WHERE slot <> slot_of(cust, %s)"
        " OR skey <> (%s::int[])[slot + 1]) FROM shard_log WHERE tbl = 'sk'", (N, list(KEYS.values()))).fetchone()
    assert (total, distinct, wrong) == (ROWS - misplaced, ROWS - misplaced, 0)
    assert db.execute("SELECT count(*) FROM sk WHERE done AND id % 97 = 0").fetchone()[0] == 0
    back = db.execute("SELECT count(*) FROM (SELECT item < lag(item) OVER (PARTITION BY cust ORDER BY ord) AS b"
                      " FROM shard_log WHERE tbl = 'sk') s WHERE b").fetchone()[0]
    assert back == 0


def test_the_shard_options_are_checked(db):
    h = lambda tx, rows: None  # noqa: E731
    base = dict(name="f", table="t", n=N, pending="done", handler=h)
    with pytest.raises(ValueError, match="shard_column and shard_keys go together"):
        pg_claim.Worker("", **base, shard_column="skey")
    with pytest.raises(ValueError, match="shard_column and shard_keys go together"):
        pg_claim.Worker("", **base, shard_keys=KEYS)
    with pytest.raises(TypeError, match="shard_keys must map each slot to its shard key"):
        pg_claim.Worker("", **base, shard_column="skey", shard_keys=42)
    assert pg_claim.Worker("", **base, shard_column="skey", shard_keys=[100, 101, 102, 103]).shard_keys == KEYS
    with pytest.raises(ValueError, match="shard_keys has no key for slot 3 of n = 4"):
        pg_claim.Worker("", **base, shard_column="skey", shard_keys={0: 1, 1: 2, 2: 3})
    with pytest.raises(ValueError, match="does not go with method 'jump', fair or spread"):
        pg_claim.Worker("", **base, shard_column="skey", shard_keys=KEYS, method="jump")
    with pytest.raises(ValueError, match="does not go with method None, fair or spread"):
        pg_claim.Worker("", **base, shard_column="skey", shard_keys=KEYS, fair="cust")
    make_sharded(db, "sk_bad")
    r = Run(name="sk_bad", table="sk_bad", n=N, pending="done", key="id", handler=h, ttl=3,
            shard_column="shard", shard_keys=KEYS)
    wait_for(lambda: not r.thread.is_alive(), what="the worker to stop")
    assert isinstance(r.error, pg_claim.Error) and "sk_bad has no column 'shard' (option shard_column)" in str(r.error)
