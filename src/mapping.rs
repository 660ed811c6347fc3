//! Key → slot mappings (DESIGN.md §1): pure, IMMUTABLE STRICT PARALLEL SAFE
//! SQL functions, thin shells around `crate::hashing`.

use crate::error::check_n;
use crate::hashing::{crc32, crc32_slot, jump_hash, modulo_slot, uuid_crc32};
use pgrx::prelude::*;

mod pg_hash;
mod range;

// ---------------------------------------------------------------- slot_of

/// `slot_of(smallint, n)`: the non-negative remainder of key by n.
#[pg_extern(name = "slot_of", immutable, strict, parallel_safe)]
fn slot_of_int2(key: i16, n: i32) -> i32 {
    check_n(n);
    modulo_slot(key as i64, n)
}

/// `slot_of(integer, n)`: the non-negative remainder of key by n.
#[pg_extern(name = "slot_of", immutable, strict, parallel_safe)]
fn slot_of_int4(key: i32, n: i32) -> i32 {
    check_n(n);
    modulo_slot(key as i64, n)
}

/// `slot_of(bigint, n)`: the non-negative remainder of key by n.
#[pg_extern(name = "slot_of", immutable, strict, parallel_safe)]
fn slot_of_int8(key: i64, n: i32) -> i32 {
    check_n(n);
    modulo_slot(key, n)
}

/// `slot_of(text, n)`: crc32 of the key's UTF-8 bytes, mod n.
#[pg_extern(name = "slot_of", immutable, strict, parallel_safe)]
fn slot_of_text(key: &str, n: i32) -> i32 {
    check_n(n);
    crc32_slot(key.as_bytes(), n)
}

/// `slot_of(bytea, n)`: crc32 of the bytes, mod n.
#[pg_extern(name = "slot_of", immutable, strict, parallel_safe)]
fn slot_of_bytea(key: &[u8], n: i32) -> i32 {
    check_n(n);
    crc32_slot(key, n)
}

/// `slot_of(uuid, n)`: crc32 of the canonical lowercase text form, mod n.
#[pg_extern(name = "slot_of", immutable, strict, parallel_safe)]
fn slot_of_uuid(key: pgrx::Uuid, n: i32) -> i32 {
    check_n(n);
    (uuid_crc32(key.as_bytes()) % n as u32) as i32
}

// ---------------------------------------------------------------- crc32

/// `crc32(text)`: unsigned CRC-32/ISO-HDLC of the UTF-8 bytes.
#[pg_extern(name = "crc32", immutable, strict, parallel_safe)]
fn crc32_text(key: &str) -> i64 {
    crc32(key.as_bytes()) as i64
}

/// `crc32(bytea)`: unsigned CRC-32/ISO-HDLC of the bytes.
#[pg_extern(name = "crc32", immutable, strict, parallel_safe)]
fn crc32_bytea(key: &[u8]) -> i64 {
    crc32(key) as i64
}

// ---------------------------------------------------------------- jump_slot

/// `jump_slot(bigint, n)`: jump consistent hash of the key's 64 bits.
#[pg_extern(name = "jump_slot", immutable, strict, parallel_safe)]
fn jump_slot_int8(key: i64, n: i32) -> i32 {
    check_n(n);
    jump_hash(key as u64, n)
}

/// `jump_slot(text, n)`: jump consistent hash of crc32 of the UTF-8 bytes.
#[pg_extern(name = "jump_slot", immutable, strict, parallel_safe)]
fn jump_slot_text(key: &str, n: i32) -> i32 {
    check_n(n);
    jump_hash(crc32(key.as_bytes()) as u64, n)
}

/// `jump_slot(bytea, n)`: jump consistent hash of crc32 of the bytes.
#[pg_extern(name = "jump_slot", immutable, strict, parallel_safe)]
fn jump_slot_bytea(key: &[u8], n: i32) -> i32 {
    check_n(n);
    jump_hash(crc32(key) as u64, n)
}

/// `jump_slot(uuid, n)`: jump consistent hash of crc32 of the text form.
#[pg_extern(name = "jump_slot", immutable, strict, parallel_safe)]
fn jump_slot_uuid(key: pgrx::Uuid, n: i32) -> i32 {
    check_n(n);
    jump_hash(uuid_crc32(key.as_bytes()) as u64, n)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn slot_of_integer_overloads() {
        assert_eq!(
            Spi::get_one::<i32>("SELECT slot_of(-7::smallint, 3)"),
            Ok(Some(2))
        );
        assert_eq!(
            Spi::get_one::<i32>("SELECT slot_of(-7::integer, 3)"),
            Ok(Some(2))
        );
        assert_eq!(
            Spi::get_one::<i32>("SELECT slot_of(-7::bigint, 3)"),
            Ok(Some(2))
        );
        assert_eq!(
            Spi::get_one::<i32>("SELECT slot_of((-9223372036854775808)::bigint, 3)"),
            Ok(Some(1))
        );
    }

    #[pg_test]
    fn crc32_check_value() {
        assert_eq!(
            Spi::get_one::<i64>("SELECT crc32('123456789')"),
            Ok(Some(3_421_780_262))
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT crc32('\\x313233343536373839'::bytea)"),
            Ok(Some(3_421_780_262))
        );
    }

    #[pg_test]
    fn slot_of_text_is_crc32_mod_n() {
        let ok = Spi::get_one::<bool>(
            "SELECT bool_and(slot_of(k, 7) = crc32(k) % 7) \
             FROM (SELECT md5(g::text) || 'ü' AS k FROM generate_series(1, 500) g) s",
        );
        assert_eq!(ok, Ok(Some(true)));
    }

    #[pg_test]
    fn slot_of_uuid_hashes_text_form() {
        let ok = Spi::get_one::<bool>(
            "SELECT bool_and(slot_of(u, 13) = slot_of(u::text, 13)) \
             FROM (SELECT md5(g::text)::uuid AS u FROM generate_series(1, 500) g) s",
        );
        assert_eq!(ok, Ok(Some(true)));
    }

    #[pg_test]
    fn null_key_gives_null() {
        assert_eq!(
            Spi::get_one::<i32>("SELECT slot_of(NULL::text, 3)"),
            Ok(None)
        );
        assert_eq!(Spi::get_one::<i32>("SELECT slot_of(5, NULL)"), Ok(None));
    }

    #[pg_test(error = "n must be at least 1, got 0")]
    fn zero_n_is_an_error() {
        let _ = Spi::get_one::<i32>("SELECT slot_of(5, 0)");
    }

    #[pg_test]
    fn functions_are_immutable_strict_parallel_safe_without_set() {
        let bad = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc \
             WHERE proname IN ('slot_of', 'crc32', 'jump_slot') \
               AND (provolatile <> 'i' OR NOT proisstrict OR proparallel <> 's' \
                    OR proconfig IS NOT NULL)",
        );
        assert_eq!(bad, Ok(Some(0)));
        let n = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE proname IN ('slot_of', 'crc32', 'jump_slot')",
        );
        assert_eq!(n, Ok(Some(12)));
    }
}
