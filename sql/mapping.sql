-- The per-row mapping functions slot_of, crc32 and jump_slot: version-1 C
-- functions (src/mapping/v1.rs), IMMUTABLE STRICT PARALLEL SAFE, no SET clause.
CREATE FUNCTION @extschema@.slot_of(key smallint, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_slot_of_int2';
CREATE FUNCTION @extschema@.slot_of(key integer, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_slot_of_int4';
CREATE FUNCTION @extschema@.slot_of(key bigint, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_slot_of_int8';
CREATE FUNCTION @extschema@.slot_of(key text, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_slot_of_text';
CREATE FUNCTION @extschema@.slot_of(key bytea, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_slot_of_bytea';
CREATE FUNCTION @extschema@.slot_of(key uuid, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_slot_of_uuid';
CREATE FUNCTION @extschema@.crc32(key text) RETURNS bigint
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_crc32_text';
CREATE FUNCTION @extschema@.crc32(key bytea) RETURNS bigint
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_crc32_bytea';
CREATE FUNCTION @extschema@.jump_slot(key bigint, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_jump_slot_int8';
CREATE FUNCTION @extschema@.jump_slot(key text, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_jump_slot_text';
CREATE FUNCTION @extschema@.jump_slot(key bytea, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_jump_slot_bytea';
CREATE FUNCTION @extschema@.jump_slot(key uuid, n integer) RETURNS integer
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_claim_jump_slot_uuid';

COMMENT ON FUNCTION @extschema@.slot_of(smallint, integer) IS 'the non-negative remainder of key by n, in 0 .. n-1';
COMMENT ON FUNCTION @extschema@.slot_of(integer, integer) IS 'the non-negative remainder of key by n, in 0 .. n-1';
COMMENT ON FUNCTION @extschema@.slot_of(bigint, integer) IS 'the non-negative remainder of key by n, in 0 .. n-1';
COMMENT ON FUNCTION @extschema@.slot_of(text, integer) IS 'crc32 of the key''s UTF-8 bytes mod n, in 0 .. n-1';
COMMENT ON FUNCTION @extschema@.slot_of(bytea, integer) IS 'crc32 of the bytes mod n, in 0 .. n-1';
COMMENT ON FUNCTION @extschema@.slot_of(uuid, integer) IS 'crc32 of the uuid''s canonical lowercase text form mod n, in 0 .. n-1';
COMMENT ON FUNCTION @extschema@.crc32(text) IS 'unsigned CRC-32/ISO-HDLC (zlib) of the UTF-8 bytes';
COMMENT ON FUNCTION @extschema@.crc32(bytea) IS 'unsigned CRC-32/ISO-HDLC (zlib) of the bytes';
COMMENT ON FUNCTION @extschema@.jump_slot(bigint, integer) IS 'jump consistent hash of the key''s 64 bits into 0 .. n-1';
COMMENT ON FUNCTION @extschema@.jump_slot(text, integer) IS 'jump consistent hash of crc32 of the UTF-8 bytes into 0 .. n-1';
COMMENT ON FUNCTION @extschema@.jump_slot(bytea, integer) IS 'jump consistent hash of crc32 of the bytes into 0 .. n-1';
COMMENT ON FUNCTION @extschema@.jump_slot(uuid, integer) IS 'jump consistent hash of crc32 of the uuid''s text form into 0 .. n-1';
