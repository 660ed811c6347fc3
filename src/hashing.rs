//! Pure key-to-slot arithmetic, with no PostgreSQL dependency.
//!
//! Everything here is plain Rust so it can be unit- and property-tested
//! without a server; the SQL functions in `mapping.rs` are thin shells
//! around these.

/// CRC-32/ISO-HDLC (the zlib, PNG, Ethernet CRC): reflected polynomial
/// 0xEDB88320, initial value and final XOR 0xFFFFFFFF.
///
/// `crc32(b"123456789") == 0xCBF4_3926`.
#[inline]
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The non-negative remainder of `key` by `n` (`n >= 1`).
///
/// Unlike SQL's `%`, the result is never negative: `-7 mod 3 = 2`.
/// Computed in i64 so `i64::MIN` and `n = 1` cannot overflow.
#[inline]
pub fn modulo_slot(key: i64, n: i32) -> i32 {
    debug_assert!(n >= 1);
    key.rem_euclid(n as i64) as i32
}

/// `crc32(bytes) mod n` (`n >= 1`).
#[inline]
pub fn crc32_slot(bytes: &[u8], n: i32) -> i32 {
    debug_assert!(n >= 1);
    (crc32(bytes) % (n as u32)) as i32
}

/// The canonical 36-character lowercase text form of a UUID
/// (`8-4-4-4-12` hex digits), written into a stack buffer.
pub fn uuid_text(bytes: &[u8; 16]) -> [u8; 36] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 36];
    let mut pos = 0;
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[pos] = b'-';
            pos += 1;
        }
        out[pos] = HEX[(b >> 4) as usize];
        out[pos + 1] = HEX[(b & 0x0f) as usize];
        pos += 2;
    }
    out
}

/// crc32 of the UUID's canonical text form.
#[inline]
pub fn uuid_crc32(bytes: &[u8; 16]) -> u32 {
    crc32(&uuid_text(bytes))
}

/// Lamping–Veach jump consistent hash: maps a 64-bit key to a bucket in
/// `0..n` (`n >= 1`) so that growing `n` to `n + 1` moves only about
/// `1/(n+1)` of the keys, all of them into the new bucket.
///
/// The key is taken as its 64 bits (a negative i64 as two's complement).
#[inline]
pub fn jump_hash(key: u64, n: i32) -> i32 {
    debug_assert!(n >= 1);
    let mut k = key;
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < n as i64 {
        b = j;
        k = k.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = (((b + 1) as f64) * ((1u64 << 31) as f64 / (((k >> 33) + 1) as f64))) as i64;
    }
    b as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b"123456789"), 3_421_780_262);
    }

    #[test]
    fn crc32_known_vectors() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"a"), 0xE8B7_BE43);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
        // UTF-8 bytes of a non-ASCII string ("héllo" = 68 c3 a9 6c 6c 6f)
        assert_eq!(
            crc32("héllo".as_bytes()),
            crc32(&[0x68, 0xc3, 0xa9, 0x6c, 0x6c, 0x6f])
        );
    }

    #[test]
    fn modulo_is_non_negative() {
        assert_eq!(modulo_slot(-7, 3), 2);
        assert_eq!(modulo_slot(7, 3), 1);
        assert_eq!(modulo_slot(0, 5), 0);
        assert_eq!(modulo_slot(i64::MIN, 1), 0);
        assert_eq!(modulo_slot(i64::MIN, 3), 1); // -2^63 = -3074457345618258603*3 + 1
        assert_eq!(
            modulo_slot(i64::MAX, i32::MAX),
            (i64::MAX % i32::MAX as i64) as i32
        );
        assert_eq!(
            modulo_slot(i64::MIN, i32::MAX),
            i64::MIN.rem_euclid(i32::MAX as i64) as i32
        );
    }

    #[test]
    fn empty_key_is_slot_zero() {
        // crc32 of no bytes is 0, so the empty key always maps to slot 0.
        for n in 1..50 {
            assert_eq!(crc32_slot(b"", n), 0);
        }
    }

    #[test]
    fn uuid_text_is_canonical() {
        let b: [u8; 16] = [
            0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38,
            0x0a, 0x11,
        ];
        assert_eq!(
            std::str::from_utf8(&uuid_text(&b)).unwrap(),
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
        );
    }

    #[test]
    fn jump_published_vectors() {
        assert_eq!(jump_hash(10_863_919_174_838_991, 11), 6);
        assert_eq!(jump_hash(2202, 100_001), 15018);
        assert_eq!(jump_hash(0, 1), 0);
        assert_eq!(jump_hash(u64::MAX, 1), 0);
    }

    proptest! {
        #[test]
        fn modulo_in_range(key in any::<i64>(), n in 1i32..=i32::MAX) {
            let s = modulo_slot(key, n);
            prop_assert!(s >= 0 && s < n);
            // agrees with the mathematical definition
            prop_assert_eq!(((key as i128 % n as i128 + n as i128) % n as i128) as i32, s);
        }

        #[test]
        fn crc32_slot_in_range_and_deterministic(key in proptest::collection::vec(any::<u8>(), 0..64), n in 1i32..=i32::MAX) {
            let s = crc32_slot(&key, n);
            prop_assert!(s >= 0 && s < n);
            prop_assert_eq!(s, crc32_slot(&key.clone(), n));
            prop_assert_eq!(s as u32, crc32(&key) % n as u32);
        }

        #[test]
        fn crc32_of_text_is_crc32_of_its_utf8(key in "\\PC{0,40}", n in 1i32..10_000) {
            prop_assert_eq!(crc32_slot(key.as_bytes(), n), (crc32(key.as_bytes()) % n as u32) as i32);
        }

        #[test]
        fn jump_in_range(key in any::<u64>(), n in 1i32..100_000) {
            let b = jump_hash(key, n);
            prop_assert!(b >= 0 && b < n);
        }

        #[test]
        fn jump_moves_only_into_new_bucket(key in any::<u64>(), n in 1i32..5_000) {
            let before = jump_hash(key, n);
            let after = jump_hash(key, n + 1);
            prop_assert!(after == before || after == n);
        }

        #[test]
        fn uuid_text_roundtrips(bytes in any::<[u8; 16]>()) {
            let t = uuid_text(&bytes);
            let s = std::str::from_utf8(&t).unwrap();
            prop_assert_eq!(s.len(), 36);
            let hex: String = s.chars().filter(|c| *c != '-').collect();
            let expect: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            prop_assert_eq!(hex, expect);
        }
    }
}
