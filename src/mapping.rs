//! Key → slot mappings (reference: README.md and docs/choosing-a-mapping.md):
//! IMMUTABLE STRICT PARALLEL SAFE SQL functions, thin shells around the pure
//! arithmetic in `hashing`:
//! - `v1`: `slot_of`, `crc32` and `jump_slot`, version-1 C functions (they run
//!   once per row, so they bypass pgrx's argument machinery);
//! - `pg_hash`: `pg_hash_slot`, PostgreSQL's own hash partitioning;
//! - `range`: `range_slot`, a binary search over sorted bounds;
//! - `poly`: their polymorphic (`anyelement`, `anyarray`) arguments.

#[cfg(any(test, feature = "pg_test"))]
use pgrx::prelude::*;

pub mod hashing;
mod pg_hash;
mod poly;
mod range;
pub(crate) mod v1;

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
    fn jump_slot_published_vectors() {
        assert_eq!(
            Spi::get_one::<i32>("SELECT jump_slot(10863919174838991, 11)"),
            Ok(Some(6))
        );
        assert_eq!(
            Spi::get_one::<i32>("SELECT jump_slot(2202, 100001)"),
            Ok(Some(15018))
        );
    }

    #[pg_test]
    fn pg_hash_slot_names_the_partition_rows_are_stored_in() {
        Spi::run(
            "CREATE TABLE pgt_hash (k uuid) PARTITION BY HASH (k);
             CREATE TABLE pgt_hash_0 PARTITION OF pgt_hash FOR VALUES WITH (MODULUS 3, REMAINDER 0);
             CREATE TABLE pgt_hash_1 PARTITION OF pgt_hash FOR VALUES WITH (MODULUS 3, REMAINDER 1);
             CREATE TABLE pgt_hash_2 PARTITION OF pgt_hash FOR VALUES WITH (MODULUS 3, REMAINDER 2);
             INSERT INTO pgt_hash SELECT md5(g::text)::uuid FROM generate_series(1, 3000) g;",
        )
        .unwrap();
        let ok = Spi::get_one::<bool>(
            "SELECT bool_and(tableoid = ('pgt_hash_' || pg_hash_slot(k, 3))::regclass)
                AND count(DISTINCT tableoid) = 3
             FROM pgt_hash",
        );
        assert_eq!(ok, Ok(Some(true)));
    }

    #[pg_test]
    fn range_slot_counts_bounds_at_or_below() {
        assert_eq!(
            Spi::get_one::<i32>("SELECT range_slot(20, ARRAY[10, 20, 30])"),
            Ok(Some(2))
        );
        assert_eq!(
            Spi::get_one::<i32>("SELECT range_slot('m'::text, ARRAY['a', 'n'])"),
            Ok(Some(1))
        );
    }

    #[pg_test(error = "bounds must not contain NULL, found one at bounds[2]")]
    fn range_slot_rejects_null_bounds() {
        let _ = Spi::get_one::<i32>("SELECT range_slot(1, ARRAY[1, NULL])");
    }

    #[pg_test(
        error = "type point has no default hash operator class, so it cannot be a hash partition key"
    )]
    fn pg_hash_slot_rejects_unhashable_types() {
        let _ = Spi::get_one::<i32>("SELECT pg_hash_slot(point '(1,2)', 3)");
    }

    #[pg_test]
    fn new_mappings_are_immutable_strict_parallel_safe_without_set() {
        let bad = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc \
             WHERE proname IN ('pg_hash_slot', 'range_slot') \
               AND (provolatile <> 'i' OR NOT proisstrict OR proparallel <> 's' \
                    OR proconfig IS NOT NULL)",
        );
        assert_eq!(bad, Ok(Some(0)));
        let n = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE proname IN ('pg_hash_slot', 'range_slot')",
        );
        assert_eq!(n, Ok(Some(2)));
    }

    #[pg_test]
    fn functions_are_immutable_strict_parallel_safe_without_set() {
        // the extension's own: PostgreSQL 18 has a pg_catalog.crc32(bytea)
        const OURS: &str = "pronamespace = (SELECT extnamespace FROM pg_extension \
                            WHERE extname = 'pg_claim') \
                            AND proname IN ('slot_of', 'crc32', 'jump_slot')";
        let bad = Spi::get_one::<i64>(&format!(
            "SELECT count(*) FROM pg_proc WHERE {OURS} \
               AND (provolatile <> 'i' OR NOT proisstrict OR proparallel <> 's' \
                    OR proconfig IS NOT NULL)"
        ));
        assert_eq!(bad, Ok(Some(0)));
        let n = Spi::get_one::<i64>(&format!("SELECT count(*) FROM pg_proc WHERE {OURS}"));
        assert_eq!(n, Ok(Some(12)));
    }
}
