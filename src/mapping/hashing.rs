//! Pure key-to-slot arithmetic, with no PostgreSQL dependency.
//!
//! Everything here is plain Rust so it can be unit- and property-tested
//! without a server; the SQL functions of `mapping` (`v1`, `pg_hash`, `range`) are thin shells
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

/// The seed PostgreSQL passes to a type's extended hash function when it
/// routes a row to a hash partition (`HASH_PARTITION_SEED` in
/// `catalog/partition.h`).
pub const HASH_PARTITION_SEED: u64 = 0x7A5B_2236_7996_DCFD;

/// PostgreSQL's `hash_combine64` (`common/hashfn.h`), which folds the
/// per-column hashes of a hash partition key into one.
#[inline]
pub fn hash_combine64(a: u64, b: u64) -> u64 {
    a ^ b
        .wrapping_add(0x49a0_f4dd_15e5_a8e3)
        .wrapping_add(a << 54)
        .wrapping_add(a >> 7)
}

/// The hash partition remainder (`n >= 1`) of a single-column key whose
/// seeded extended hash is `hash`: the server starts from 0, combines each
/// column's hash with `hash_combine64`, and takes the unsigned remainder by
/// the modulus.
#[inline]
pub fn partition_remainder(hash: u64, n: i32) -> i32 {
    debug_assert!(n >= 1);
    (hash_combine64(0, hash) % n as u64) as i32
}

/// The number of sorted elements `<=` the key, by binary search. `cmp(i)`
/// compares element `i` with the key. With strictly increasing elements this
/// is the index of the first element greater than the key.
#[inline]
pub fn upper_bound_by(len: usize, mut cmp: impl FnMut(usize) -> std::cmp::Ordering) -> usize {
    let (mut lo, mut hi) = (0usize, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if cmp(mid) == std::cmp::Ordering::Greater {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// The first index `i` (`>= 1`) whose element is not strictly greater than
/// element `i - 1`, or None when the `len` elements are strictly increasing.
/// `cmp(a, b)` compares elements a and b.
pub fn first_not_increasing(
    len: usize,
    mut cmp: impl FnMut(usize, usize) -> std::cmp::Ordering,
) -> Option<usize> {
    (1..len).find(|&i| cmp(i - 1, i) != std::cmp::Ordering::Less)
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

    #[test]
    fn hash_combine64_from_zero_adds_the_constant() {
        assert_eq!(hash_combine64(0, 0), 0x49a0_f4dd_15e5_a8e3);
        assert_eq!(hash_combine64(0, 1), 0x49a0_f4dd_15e5_a8e4);
        assert_eq!(
            hash_combine64(0, u64::MAX),
            0x49a0_f4dd_15e5_a8e3u64.wrapping_sub(1)
        );
        // a non-zero accumulator shifts in its own bits
        let a = 0x0123_4567_89ab_cdefu64;
        assert_eq!(
            hash_combine64(a, 5),
            a ^ 5u64
                .wrapping_add(0x49a0_f4dd_15e5_a8e3)
                .wrapping_add(a << 54)
                .wrapping_add(a >> 7)
        );
    }

    #[test]
    fn partition_remainder_is_unsigned() {
        // hash + constant wraps past 2^64; the remainder is taken unsigned
        let h = u64::MAX - 0x49a0_f4dd_15e5_a8e3 + 10; // combines to 9
        assert_eq!(partition_remainder(h, 4), 1);
        assert_eq!(partition_remainder(h, 1), 0);
        assert_eq!(
            partition_remainder(0, 1_000_000_007),
            (0x49a0_f4dd_15e5_a8e3u64 % 1_000_000_007) as i32
        );
    }

    #[test]
    fn upper_bound_edges() {
        let b = [10, 20, 30];
        let ub = |k: i32| upper_bound_by(b.len(), |i| b[i].cmp(&k));
        assert_eq!(ub(5), 0);
        assert_eq!(ub(10), 1);
        assert_eq!(ub(19), 1);
        assert_eq!(ub(20), 2);
        assert_eq!(ub(30), 3);
        assert_eq!(ub(i32::MAX), 3);
        assert_eq!(upper_bound_by(0, |_| unreachable!()), 0);
    }

    #[test]
    fn first_not_increasing_finds_the_offender() {
        let check = |v: &[i32]| first_not_increasing(v.len(), |a, b| v[a].cmp(&v[b]));
        assert_eq!(check(&[]), None);
        assert_eq!(check(&[1]), None);
        assert_eq!(check(&[1, 2, 3]), None);
        assert_eq!(check(&[1, 2, 2]), Some(2));
        assert_eq!(check(&[3, 1, 2]), Some(1));
    }

    /// A second jump hash written from the paper's description, with the
    /// 64-bit multiply done in u128 and the division as `floor` of f64: used to
    /// cross-check `jump_hash` over random keys and bucket counts.
    fn jump_reference(mut key: u64, n: i32) -> i32 {
        let (mut b, mut j) = (-1i64, 0i64);
        while j < n as i64 {
            b = j;
            key = (key as u128 * 2_862_933_555_777_941_757u128 + 1) as u64;
            let r = (key >> 33) as f64 + 1.0;
            j = ((b as f64 + 1.0) * (2_147_483_648.0 / r)).floor() as i64;
        }
        b as i32
    }

    #[test]
    fn jump_moves_about_one_in_n_plus_one() {
        // 200k keys from a fixed generator: the share that moves from n to n+1
        // buckets is 1/(n+1) within a few standard deviations, all into bucket n;
        // modulo moves n/(n+1) of them.
        let keys: Vec<u64> = (0..200_000u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) ^ 0xD1B5_4A32_D192_ED03)
            .collect();
        for n in [1, 2, 7, 10, 63, 100, 1000] {
            let mut moved = 0usize;
            let mut moved_mod = 0usize;
            for &k in &keys {
                let (a, b) = (jump_hash(k, n), jump_hash(k, n + 1));
                if a != b {
                    assert_eq!(b, n);
                    moved += 1;
                }
                if k % n as u64 != k % (n as u64 + 1) {
                    moved_mod += 1;
                }
            }
            let f = moved as f64 / keys.len() as f64;
            let expect = 1.0 / (n as f64 + 1.0);
            let sigma = (expect * (1.0 - expect) / keys.len() as f64).sqrt();
            assert!(
                (f - expect).abs() < 5.0 * sigma + 1e-9,
                "n={n} f={f} expect={expect}"
            );
            let fm = moved_mod as f64 / keys.len() as f64;
            let mod_expect = n as f64 / (n as f64 + 1.0);
            assert!((fm - mod_expect).abs() < 0.01, "n={n} modulo={fm} jump={f}");
        }
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
        fn jump_matches_reference(key in any::<u64>(), n in 1i32..1_000_000) {
            prop_assert_eq!(jump_hash(key, n), jump_reference(key, n));
        }

        #[test]
        fn upper_bound_matches_linear_count(
            mut v in proptest::collection::vec(any::<i16>(), 0..40),
            key in any::<i16>(),
        ) {
            v.sort();
            v.dedup();
            let linear = v.iter().filter(|&&b| b <= key).count();
            prop_assert_eq!(upper_bound_by(v.len(), |i| v[i].cmp(&key)), linear);
            prop_assert_eq!(first_not_increasing(v.len(), |a, b| v[a].cmp(&v[b])), None);
        }

        #[test]
        fn partition_remainder_in_range(hash in any::<u64>(), n in 1i32..=i32::MAX) {
            let r = partition_remainder(hash, n);
            prop_assert!(r >= 0 && r < n);
            prop_assert_eq!(r as u64, hash.wrapping_add(0x49a0_f4dd_15e5_a8e3) % n as u64);
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The inputs of the bad-input matrix (tests/hostile/matrix.py) at
        /// the core: the edge values of n and of the keys, and keys of up to
        /// 64 KiB of arbitrary (mostly not UTF-8) bytes.
        #[test]
        fn hostile_inputs_stay_in_range(
            key in proptest::collection::vec(any::<u8>(), 0..65_537),
            int_key in prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0i64), Just(-1i64), any::<i64>()],
            n in prop_oneof![Just(1i32), Just(2i32), Just(i32::MAX), 1i32..=i32::MAX],
        ) {
            let s = crc32_slot(&key, n);
            prop_assert!((0..n).contains(&s));
            prop_assert!((0..n).contains(&modulo_slot(int_key, n)));
            prop_assert!((0..n).contains(&jump_hash(int_key as u64, n)));
            prop_assert!((0..n).contains(&jump_hash(crc32(&key) as u64, n)));
            prop_assert!((0..n).contains(&partition_remainder(int_key as u64, n)));
        }
    }
}
