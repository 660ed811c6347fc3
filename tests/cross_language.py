#!/usr/bin/env python3
"""Cross-language agreement: slot_of(text, n) and crc32(text) in the database
equal zlib.crc32(key) % n computed by Python's standard library (and by Node's
zlib when the installed Node has zlib.crc32), over thousands of random keys,
many of them non-ASCII; and slot_of_spread(tenant, key, n, k) equals
(crc32(tenant) % n + (crc32(key) % k) * (n // k)) % n (docs/tenants.md), a
key's tenant being the next key.

Connects with psql using the PG* environment variables set by scripts/test.
"""
import json
import random
import shutil
import subprocess
import sys
import tempfile
import zlib

N_KEYS = 5000
MODULI = [1, 2, 3, 7, 8, 64, 1000, 2147483647]
# (n, k) of slot_of_spread
SPREADS = [(1, 1), (8, 4), (10, 3), (64, 64), (1000, 7), (2147483647, 2)]

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


def psql(sql, stdin=None):
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", "-d", "postgres", "-c", sql],
        input=stdin, capture_output=True, text=True, check=True,
    ).stdout


def main():
    rng = random.Random(20261122)
    keys = [random_key(rng) for _ in range(N_KEYS)] + ["", "123456789", "é", "😀"]
    non_ascii = sum(1 for k in keys if not k.isascii())

    psql("CREATE EXTENSION IF NOT EXISTS pg_claim")
    psql("DROP TABLE IF EXISTS xlang_keys; CREATE TABLE xlang_keys (i int PRIMARY KEY, k text NOT NULL)")
    copy_data = "".join(f"{i}\t{k}\n" for i, k in enumerate(keys))
    subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", "postgres", "-c",
         "COPY xlang_keys (i, k) FROM STDIN"],
        input=copy_data, text=True, check=True, capture_output=True,
    )
    cols = ", ".join(f"slot_of(k, {n})" for n in MODULI)
    spreads = ", ".join(f"slot_of_spread(k, (SELECT b.k FROM xlang_keys b WHERE b.i = (a.i + 1) % {len(keys)}), {n}, {k})"
                        for n, k in SPREADS)
    out = psql(f"SELECT i, crc32(k), {cols}, {spreads} FROM xlang_keys a ORDER BY i")
    db = {}
    for line in out.splitlines():
        parts = [int(x) for x in line.split("|")]
        db[parts[0]] = parts[1:]
    psql("DROP TABLE xlang_keys")

    mismatches = 0
    for i, k in enumerate(keys):
        crc = zlib.crc32(k.encode("utf-8"))
        nxt = zlib.crc32(keys[(i + 1) % len(keys)].encode("utf-8"))
        expect = [crc] + [crc % n for n in MODULI] + [(crc % n + (nxt % kk) * (n // kk)) % n for n, kk in SPREADS]
        if db[i] != expect:
            mismatches += 1
            if mismatches <= 5:
                print(f"MISMATCH key={k!r}: database {db[i]} python {expect}", file=sys.stderr)
    print(f"python zlib: {len(keys)} keys ({non_ascii} non-ASCII) x {len(MODULI)} moduli, "
          f"{len(SPREADS)} spreads, "
          f"{mismatches} mismatches")
    ok = mismatches == 0

    node = shutil.which("node")
    has_crc = node and subprocess.run(
        [node, "-e", "process.exit(typeof require('zlib').crc32 === 'function' ? 0 : 1)"]
    ).returncode == 0
    if has_crc:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"keys": keys, "moduli": MODULI, "spreads": SPREADS}, f)
            path = f.name
        js = (
            "const zlib=require('zlib');const d=JSON.parse(require('fs').readFileSync(process.argv[1]));"
            "const crc=k=>zlib.crc32(Buffer.from(k,'utf8'));"
            "console.log(JSON.stringify(d.keys.map((k,i)=>{const c=crc(k);const b=crc(d.keys[(i+1)%d.keys.length]);"
            "return [c].concat(d.moduli.map(n=>c%n),"
            "d.spreads.map(([n,kk])=>(c%n+(b%kk)*Math.floor(n/kk))%n));})));"
        )
        node_out = json.loads(subprocess.run([node, "-e", js, path], capture_output=True,
                                             text=True, check=True).stdout)
        node_mismatch = sum(1 for i in range(len(keys)) if node_out[i] != db[i])
        print(f"node zlib:   {len(keys)} keys x {len(MODULI)} moduli, {len(SPREADS)} spreads, "
              f"{node_mismatch} mismatches")
        ok = ok and node_mismatch == 0
    else:
        print("node zlib:   skipped (this Node has no zlib.crc32; it needs Node >= 20.15)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
