"""Cross-language agreement: slot_of(text, n) and crc32(text) in the database
equal zlib.crc32(key) % n computed by Python's standard library (and by Node's
zlib when the installed Node has zlib.crc32), over thousands of random keys,
many of them non-ASCII; and slot_of_spread(tenant, key, n, k) equals
(crc32(tenant) % n + (crc32(key) % k) * (n // k)) % n (docs/tenants.md), a
key's tenant being the next key.

The database's values are read once, in a database of the module's own on
the server of PGHOST and PGPORT (scripts/test sets them).
"""
import json
import random
import shutil
import subprocess
import zlib

import pytest

from harness import check, connect, log

N_KEYS = 5000
MODULI = [1, 2, 3, 7, 8, 64, 1000, 2147483647]
# (n, k) of slot_of_spread
SPREADS = [(1, 1), (8, 4), (10, 3), (64, 64), (1000, 7), (2147483647, 2)]
DB = "pg_claim_xlang"

ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.@",
    "äöüßéèêçñøåæœ",  # Latin-1 range, 2 UTF-8 bytes
    "Ωπσλжщыяאבג",  # Greek, Cyrillic, Hebrew
    "日本語中文한국어",  # 3 UTF-8 bytes
    "😀🚀🎉🐘",  # 4 UTF-8 bytes
]


def random_key(rng):
    length = rng.randint(0, 40)
    pools = rng.sample(ALPHABETS, rng.randint(1, len(ALPHABETS)))
    return "".join(rng.choice(rng.choice(pools)) for _ in range(length))


@pytest.fixture(scope="module")
def keys():
    rng = random.Random(20261122)
    return [random_key(rng) for _ in range(N_KEYS)] + ["", "123456789", "é", "😀"]


@pytest.fixture(scope="module")
def database_values(keys, databases):
    """{i: [crc32, slot_of for each modulus..., slot_of_spread for each
    spread...]} of key i, computed by the database."""
    with connect(databases(DB)) as c:
        c.execute("CREATE TABLE xlang_keys (i int PRIMARY KEY, k text NOT NULL)")
        with c.cursor().copy("COPY xlang_keys (i, k) FROM STDIN") as copy:
            for i, k in enumerate(keys):
                copy.write_row((i, k))
        cols = ", ".join(f"slot_of(k, {n})" for n in MODULI)
        spreads = ", ".join(f"slot_of_spread(k, (SELECT b.k FROM xlang_keys b WHERE b.i = (a.i + 1) % {len(keys)}), {n}, {k})"
                            for n, k in SPREADS)
        rows = c.execute(f"SELECT i, crc32(k), {cols}, {spreads} FROM xlang_keys a ORDER BY i").fetchall()
    db = {r[0]: [int(x) for x in r[1:]] for r in rows}
    check(len(db) == len(keys), f"the database returned {len(db)} rows for {len(keys)} keys")
    return db


def mismatches(keys, db, other):
    """The keys whose values in `other` (a list, by key) are not the
    database's, and the first five of them described."""
    bad = [i for i in range(len(keys)) if other[i] != db[i]]
    shown = "\n".join(f"  key={keys[i]!r}: database {db[i]}, computed {other[i]}" for i in bad[:5])
    return bad, shown


def test_python_zlib(keys, database_values):
    expected = []
    for i, k in enumerate(keys):
        crc = zlib.crc32(k.encode("utf-8"))
        nxt = zlib.crc32(keys[(i + 1) % len(keys)].encode("utf-8"))
        expected.append([crc] + [crc % n for n in MODULI]
                        + [(crc % n + (nxt % kk) * (n // kk)) % n for n, kk in SPREADS])
    bad, shown = mismatches(keys, database_values, expected)
    non_ascii = sum(1 for k in keys if not k.isascii())
    log(f"python zlib: {len(keys)} keys ({non_ascii} non-ASCII) x {len(MODULI)} moduli, "
        f"{len(SPREADS)} spreads, {len(bad)} mismatches")
    check(not bad, f"Python's zlib disagrees with the database on {len(bad)} keys:\n{shown}")


JS = (
    "const zlib=require('zlib');const d=JSON.parse(require('fs').readFileSync(process.argv[1]));"
    "const crc=k=>zlib.crc32(Buffer.from(k,'utf8'));"
    "console.log(JSON.stringify(d.keys.map((k,i)=>{const c=crc(k);const b=crc(d.keys[(i+1)%d.keys.length]);"
    "return [c].concat(d.moduli.map(n=>c%n),"
    "d.spreads.map(([n,kk])=>(c%n+(b%kk)*Math.floor(n/kk))%n));})));"
)


def test_node_zlib(keys, database_values, tmp_path):
    node = shutil.which("node")
    has_crc = node and subprocess.run(
        [node, "-e", "process.exit(typeof require('zlib').crc32 === 'function' ? 0 : 1)"]
    ).returncode == 0
    if not has_crc:
        pytest.skip("this Node has no zlib.crc32 (it needs Node >= 20.15)")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": keys, "moduli": MODULI, "spreads": SPREADS}), encoding="utf-8")
    out = subprocess.run([node, "-e", JS, str(path)], capture_output=True, text=True, check=True).stdout
    bad, shown = mismatches(keys, database_values, json.loads(out))
    log(f"node zlib:   {len(keys)} keys x {len(MODULI)} moduli, {len(SPREADS)} spreads, {len(bad)} mismatches")
    check(not bad, f"Node's zlib disagrees with the database on {len(bad)} keys:\n{shown}")
