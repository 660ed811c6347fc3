//! Text keys hash as their UTF-8 bytes whatever the database encoding: a
//! LATIN1 database gives the same slots and crc32 values as a UTF-8 one.

use pg_claim_sessions::{connect, dsn};

#[test]
fn latin1_database_hashes_utf8_bytes() {
    let mut admin = connect("mapping_encoding");
    // (one statement per call: CREATE/DROP DATABASE cannot run in a transaction)
    admin
        .batch_execute("DROP DATABASE IF EXISTS pg_claim_latin1")
        .unwrap();
    admin
        .batch_execute(
            "CREATE DATABASE pg_claim_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
        )
        .unwrap();
    let latin1_dsn = format!("{} dbname=pg_claim_latin1", dsn());
    let mut latin1 = pg_claim_support::connect(&latin1_dsn, "mapping_encoding_latin1")
        .expect("connect to LATIN1 database");
    latin1.batch_execute("CREATE EXTENSION pg_claim").unwrap();
    let enc: String = latin1
        .query_one("SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()", &[])
        .unwrap()
        .get(0);
    assert_eq!(enc, "LATIN1");

    // keys representable in LATIN1, most of them non-ASCII
    let keys = [
        "",
        "abc",
        "é",
        "héllo wörld",
        "ÄÖÜßäöü",
        "ñandú",
        "façade",
        "123456789",
    ];
    for key in keys {
        let q = "SELECT crc32($1::text), slot_of($1::text, 1000), slot_of($1::text, 7)";
        let in_utf8 = admin.query_one(q, &[&key]).unwrap();
        let in_latin1 = latin1.query_one(q, &[&key]).unwrap();
        let expect = crc32fast_reference(key.as_bytes());
        assert_eq!(
            in_utf8.get::<_, i64>(0),
            expect as i64,
            "utf8 db, key {key:?}"
        );
        assert_eq!(
            in_latin1.get::<_, i64>(0),
            expect as i64,
            "latin1 db, key {key:?}"
        );
        assert_eq!(
            in_latin1.get::<_, i32>(1),
            (expect % 1000) as i32,
            "key {key:?}"
        );
        assert_eq!(
            in_latin1.get::<_, i32>(2),
            (expect % 7) as i32,
            "key {key:?}"
        );
    }
    // stored (not just literal) LATIN1 text, longer than the in-line limit, toasted
    latin1
        .batch_execute(
            "CREATE TABLE enc_keys (k text);
             INSERT INTO enc_keys VALUES ('é'), (repeat('ÄÖÜ', 5000));",
        )
        .unwrap();
    for row in latin1
        .query("SELECT k, crc32(k) FROM enc_keys", &[])
        .unwrap()
    {
        let k: String = row.get(0);
        assert_eq!(
            row.get::<_, i64>(1),
            crc32fast_reference(k.as_bytes()) as i64
        );
    }
    drop(latin1);
    admin
        .batch_execute("DROP DATABASE pg_claim_latin1")
        .unwrap();
}

/// Bitwise CRC-32/ISO-HDLC, written independently of the extension's code.
fn crc32fast_reference(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
