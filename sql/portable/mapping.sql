-- The mapping functions of the portable edition (docs/portable.md): the same
-- names, arguments, results and errors as the extension's version-1 C
-- functions (src/mapping/v1.rs, src/mapping/pg_hash.rs, src/mapping/range.rs),
-- in SQL and PL/pgSQL. A mapping's values never change: the portable layer
-- of scripts/test compares them with the extension's on thousands of keys.

-- n below 1: the mapping functions' error (22023). IMMUTABLE, so that the
-- SQL functions that call it stay inlinable.
CREATE FUNCTION @extschema@.pg_claim_bad_n(n integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'n must be at least 1, got %', n USING ERRCODE = '22023',
        HINT = 'The argument n is the number of slots the keys are split into: pass the worker count (1 or more).';
END $$;

-- crc32(bytea): CRC-32/ISO-HDLC (zlib), unsigned. PostgreSQL 18's built-in
-- pg_catalog.crc32(bytea) computes the same checksum in C; where it exists
-- the function below is replaced by a call of it (the DO block after it).
-- Otherwise a table-driven loop, one step per byte; the table is a constant
-- of the loop's expression, folded once into its cached plan.
CREATE FUNCTION @extschema@.crc32(key bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c bigint := 4294967295;
BEGIN
    FOR i IN 0 .. pg_catalog.length(key) - 1 LOOP
        c := ('{0,1996959894,3993919788,2567524794,124634137,1886057615,3915621685,2657392035,249268274,2044508324,3772115230,2547177864,162941995,2125561021,3887607047,2428444049,498536548,1789927666,4089016648,2227061214,450548861,1843258603,4107580753,2211677639,325883990,1684777152,4251122042,2321926636,335633487,1661365465,4195302755,2366115317,997073096,1281953886,3579855332,2724688242,1006888145,1258607687,3524101629,2768942443,901097722,1119000684,3686517206,2898065728,853044451,1172266101,3705015759,2882616665,651767980,1373503546,3369554304,3218104598,565507253,1454621731,3485111705,3099436303,671266974,1594198024,3322730930,2970347812,795835527,1483230225,3244367275,3060149565,1994146192,31158534,2563907772,4023717930,1907459465,112637215,2680153253,3904427059,2013776290,251722036,2517215374,3775830040,2137656763,141376813,2439277719,3865271297,1802195444,476864866,2238001368,4066508878,1812370925,453092731,2181625025,4111451223,1706088902,314042704,2344532202,4240017532,1658658271,366619977,2362670323,4224994405,1303535960,984961486,2747007092,3569037538,1256170817,1037604311,2765210733,3554079995,1131014506,879679996,2909243462,3663771856,1141124467,855842277,2852801631,3708648649,1342533948,654459306,3188396048,3373015174,1466479909,544179635,3110523913,3462522015,1591671054,702138776,2966460450,3352799412,1504918807,783551873,3082640443,3233442989,3988292384,2596254646,62317068,1957810842,3939845945,2647816111,81470997,1943803523,3814918930,2489596804,225274430,2053790376,3826175755,2466906013,167816743,2097651377,4027552580,2265490386,503444072,1762050814,4150417245,2154129355,426522225,1852507879,4275313526,2312317920,282753626,1742555852,4189708143,2394877945,397917763,1622183637,3604390888,2714866558,953729732,1340076626,3518719985,2797360999,1068828381,1219638859,3624741850,2936675148,906185462,1090812512,3747672003,2825379669,829329135,1181335161,3412177804,3160834842,628085408,1382605366,3423369109,3138078467,570562233,1426400815,3317316542,2998733608,733239954,1555261956,3268935591,3050360625,752459403,1541320221,2607071920,3965973030,1969922972,40735498,2617837225,3943577151,1913087877,83908371,2512341634,3803740692,2075208622,213261112,2463272603,3855990285,2094854071,198958881,2262029012,4057260610,1759359992,534414190,2176718541,4139329115,1873836001,414664567,2282248934,4279200368,1711684554,285281116,2405801727,4167216745,1634467795,376229701,2685067896,3608007406,1308918612,956543938,2808555105,3495958263,1231636301,1047427035,2932959818,3654703836,1088359270,936918000,2847714899,3736837829,1202900863,817233897,3183342108,3401237130,1404277552,615818150,3134207493,3453421203,1423857449,601450431,3009837614,3294710456,1567103746,711928724,3020668471,3272380065,1510334235,755167117}'::bigint[])[((c # pg_catalog.get_byte(key, i)) & 255) + 1] # (c >> 8);
    END LOOP;
    RETURN c # 4294967295;
END $$;
DO $crc$
BEGIN
    IF pg_catalog.to_regprocedure('pg_catalog.crc32(bytea)') IS NOT NULL THEN
        CREATE OR REPLACE FUNCTION @extschema@.crc32(key bytea) RETURNS bigint
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
        RETURN pg_catalog.crc32(key);
    END IF;
END $crc$;

CREATE FUNCTION @extschema@.crc32(key text) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN @extschema@.crc32(pg_catalog.convert_to(key, 'UTF8'));

-- slot_of on integers: the non-negative remainder, inlined into the caller's
-- query (a SQL function without SET clause; operators schema-qualified).
CREATE FUNCTION @extschema@.slot_of(key smallint, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN n OPERATOR(pg_catalog.<) 1 THEN @extschema@.pg_claim_bad_n(n)
            ELSE (((key::bigint OPERATOR(pg_catalog.%) n) OPERATOR(pg_catalog.+) n) OPERATOR(pg_catalog.%) n)::integer END;
CREATE FUNCTION @extschema@.slot_of(key integer, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN n OPERATOR(pg_catalog.<) 1 THEN @extschema@.pg_claim_bad_n(n)
            ELSE (((key::bigint OPERATOR(pg_catalog.%) n) OPERATOR(pg_catalog.+) n) OPERATOR(pg_catalog.%) n)::integer END;
CREATE FUNCTION @extschema@.slot_of(key bigint, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN n OPERATOR(pg_catalog.<) 1 THEN @extschema@.pg_claim_bad_n(n)
            ELSE (((key OPERATOR(pg_catalog.%) n) OPERATOR(pg_catalog.+) n) OPERATOR(pg_catalog.%) n)::integer END;
-- on text, bytea and uuid: crc32 of the UTF-8 bytes (of the uuid's canonical
-- lowercase text form) mod n
CREATE FUNCTION @extschema@.slot_of(key text, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN n OPERATOR(pg_catalog.<) 1 THEN @extschema@.pg_claim_bad_n(n)
            ELSE (@extschema@.crc32(key) OPERATOR(pg_catalog.%) n)::integer END;
CREATE FUNCTION @extschema@.slot_of(key bytea, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN n OPERATOR(pg_catalog.<) 1 THEN @extschema@.pg_claim_bad_n(n)
            ELSE (@extschema@.crc32(key) OPERATOR(pg_catalog.%) n)::integer END;
CREATE FUNCTION @extschema@.slot_of(key uuid, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN n OPERATOR(pg_catalog.<) 1 THEN @extschema@.pg_claim_bad_n(n)
            ELSE (@extschema@.crc32(key::text) OPERATOR(pg_catalog.%) n)::integer END;

-- Jump consistent hash of a 64-bit key (Lamping and Veach), with the
-- multiplication modulo 2^64 in numeric and the division in float8, as the
-- extension computes it.
CREATE FUNCTION @extschema@.jump_slot(key bigint, n integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k numeric := CASE WHEN key < 0 THEN key::numeric + 18446744073709551616 ELSE key::numeric END;
    b bigint := -1;
    j bigint := 0;
BEGIN
    IF n < 1 THEN
        PERFORM @extschema@.pg_claim_bad_n(n);
    END IF;
    WHILE j < n LOOP
        b := j;
        k := pg_catalog.mod(k * 2862933555777941757 + 1, 18446744073709551616);
        j := pg_catalog.trunc((b + 1)::float8
                              * (2147483648::float8 / (pg_catalog.div(k, 8589934592) + 1)::float8))::bigint;
    END LOOP;
    RETURN b::integer;
END $$;
CREATE FUNCTION @extschema@.jump_slot(key text, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN @extschema@.jump_slot(@extschema@.crc32(key), n);
CREATE FUNCTION @extschema@.jump_slot(key bytea, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN @extschema@.jump_slot(@extschema@.crc32(key), n);
CREATE FUNCTION @extschema@.jump_slot(key uuid, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN @extschema@.jump_slot(@extschema@.crc32(key::text), n);

-- pg_hash_slot's hash of a bytea key: PostgreSQL's hash_bytes_extended (Bob
-- Jenkins' lookup3, as in src/common/hashfn.c) of the bytes with a 64-bit
-- seed, which hashvarlenaextended computes for bytea and SQL cannot call (it
-- takes an internal argument). Bytes that are valid text hash as that text
-- with hashtextextended, the same function in C under a deterministic
-- collation; the others go through this PL/pgSQL copy, on unsigned 32-bit
-- words kept in bigints. The layer portable compares both with the
-- extension's pg_hash_slot.
CREATE FUNCTION @extschema@.pg_claim_hash_bytes(key bytea, seed bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m constant bigint := 4294967295;
    len integer := pg_catalog.length(key);
    rest integer := len;
    p integer := 0;
    a bigint;
    b bigint;
    c bigint;
    w integer;
BEGIN
    a := (2654435769 + len + 3923095) & m;
    b := a;
    c := a;
    IF seed <> 0 THEN
        a := (a + ((seed >> 32) & m)) & m;
        b := (b + (seed & m)) & m;
        -- mix(a, b, c)
        a := (a - c) & m; a := a # (((c << 4) | (c >> 28)) & m); c := (c + b) & m;
        b := (b - a) & m; b := b # (((a << 6) | (a >> 26)) & m); a := (a + c) & m;
        c := (c - b) & m; c := c # (((b << 8) | (b >> 24)) & m); b := (b + a) & m;
        a := (a - c) & m; a := a # (((c << 16) | (c >> 16)) & m); c := (c + b) & m;
        b := (b - a) & m; b := b # (((a << 19) | (a >> 13)) & m); a := (a + c) & m;
        c := (c - b) & m; c := c # (((b << 4) | (b >> 28)) & m); b := (b + a) & m;
    END IF;
    WHILE rest >= 12 LOOP
        a := (a + pg_catalog.get_byte(key, p) + (pg_catalog.get_byte(key, p + 1)::bigint << 8)
                + (pg_catalog.get_byte(key, p + 2)::bigint << 16) + (pg_catalog.get_byte(key, p + 3)::bigint << 24)) & m;
        b := (b + pg_catalog.get_byte(key, p + 4) + (pg_catalog.get_byte(key, p + 5)::bigint << 8)
                + (pg_catalog.get_byte(key, p + 6)::bigint << 16) + (pg_catalog.get_byte(key, p + 7)::bigint << 24)) & m;
        c := (c + pg_catalog.get_byte(key, p + 8) + (pg_catalog.get_byte(key, p + 9)::bigint << 8)
                + (pg_catalog.get_byte(key, p + 10)::bigint << 16) + (pg_catalog.get_byte(key, p + 11)::bigint << 24)) & m;
        a := (a - c) & m; a := a # (((c << 4) | (c >> 28)) & m); c := (c + b) & m;
        b := (b - a) & m; b := b # (((a << 6) | (a >> 26)) & m); a := (a + c) & m;
        c := (c - b) & m; c := c # (((b << 8) | (b >> 24)) & m); b := (b + a) & m;
        a := (a - c) & m; a := a # (((c << 16) | (c >> 16)) & m); c := (c + b) & m;
        b := (b - a) & m; b := b # (((a << 19) | (a >> 13)) & m); a := (a + c) & m;
        c := (c - b) & m; c := c # (((b << 4) | (b >> 28)) & m); b := (b + a) & m;
        p := p + 12;
        rest := rest - 12;
    END LOOP;
    -- the last 11 bytes (little-endian words; the lowest byte of c is left
    -- for the length, which the initial state holds)
    FOR i IN REVERSE rest - 1 .. 0 LOOP
        w := pg_catalog.get_byte(key, p + i);
        IF i >= 8 THEN
            c := (c + (w::bigint << (8 * (i - 7)))) & m;
        ELSIF i >= 4 THEN
            b := (b + (w::bigint << (8 * (i - 4)))) & m;
        ELSE
            a := (a + (w::bigint << (8 * i))) & m;
        END IF;
    END LOOP;
    -- final(a, b, c)
    c := c # b; c := (c - (((b << 14) | (b >> 18)) & m)) & m;
    a := a # c; a := (a - (((c << 11) | (c >> 21)) & m)) & m;
    b := b # a; b := (b - (((a << 25) | (a >> 7)) & m)) & m;
    c := c # b; c := (c - (((b << 16) | (b >> 16)) & m)) & m;
    a := a # c; a := (a - (((c << 4) | (c >> 28)) & m)) & m;
    b := b # a; b := (b - (((a << 14) | (a >> 18)) & m)) & m;
    c := c # b; c := (c - (((b << 24) | (b >> 8)) & m)) & m;
    -- (b << 32) | c as a signed 64-bit value
    RETURN (b << 32) | c;
END $$;

-- pg_hash_slot's hash of a bytea key (above): as text when the bytes are
-- UTF-8 text in a UTF8 database (hashtextextended, in C). Whether they are is
-- a regular expression over their hex digits (RFC 3629, which is what the
-- server accepts, without NUL), not a conversion that may fail: catching its
-- error would open a subtransaction, which a parallel worker cannot.
CREATE FUNCTION @extschema@.pg_claim_hash_bytea(key bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.getdatabaseencoding() = 'UTF8' AND pg_catalog.encode(key, 'hex') ~ ('^(?:0[1-9a-f]|[1-7][0-9a-f]'
            '|c[2-9a-f][89ab][0-9a-f]|d[0-9a-f][89ab][0-9a-f]'
            '|e0[ab][0-9a-f][89ab][0-9a-f]|e[1-9a-cef](?:[89ab][0-9a-f]){2}|ed[89][0-9a-f][89ab][0-9a-f]'
            '|f0[9ab][0-9a-f](?:[89ab][0-9a-f]){2}|f[1-3](?:[89ab][0-9a-f]){3}|f48[0-9a-f](?:[89ab][0-9a-f]){2})*$') THEN
        RETURN pg_catalog.hashtextextended(pg_catalog.convert_from(key, 'UTF8') COLLATE "C", 8816678312871386365);
    END IF;
    RETURN @extschema@.pg_claim_hash_bytes(key, 8816678312871386365);
END $$;

-- pg_hash_slot: the remainder PARTITION BY HASH (key) with MODULUS n routes
-- key to: the extended hash function (support function 2) of the key type's
-- default hash operator class, seeded with the partition seed, combined
-- from 0 and taken mod n, all modulo 2^64. The usual key types call their
-- hash function directly, with the key's collation; others find it in the
-- catalogs and call it through EXECUTE. No EXCEPTION block: it runs in
-- parallel workers, which cannot open a subtransaction.
CREATE FUNCTION @extschema@.pg_hash_slot(key anyelement, n integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t regtype := pg_catalog.pg_typeof(key);
    h bigint;
    base oid;
    cls record;
    f regproc;
    arg record;
BEGIN
    IF n < 1 THEN
        PERFORM @extschema@.pg_claim_bad_n(n);
    END IF;
    IF t = 'integer'::regtype THEN
        h := pg_catalog.hashint4extended(key, 8816678312871386365);
    ELSIF t = 'bigint'::regtype THEN
        h := pg_catalog.hashint8extended(key, 8816678312871386365);
    ELSIF t = 'text'::regtype OR t = 'character varying'::regtype THEN
        h := pg_catalog.hashtextextended(key, 8816678312871386365);
    ELSIF t = 'character'::regtype THEN
        -- char(n): trailing spaces do not count (the key as it is, never
        -- cast to "character", which is char(1))
        h := pg_catalog.hashbpcharextended(key, 8816678312871386365);
    ELSIF t = 'uuid'::regtype THEN
        h := pg_catalog.uuid_hash_extended(key, 8816678312871386365);
    ELSIF t = 'bytea'::regtype THEN
        h := @extschema@.pg_claim_hash_bytea(key);
    -- types whose hash function takes another type of the same binary form,
    -- given the key's binary value: date (int4 days since 2000-01-01),
    -- timestamptz (timestamp, microseconds since 2000 UTC), boolean ("char"),
    -- xid and cid (unsigned 32 bits as int4), xid8 (unsigned 64 bits as int8)
    ELSIF t = 'date'::regtype THEN
        h := pg_catalog.hashint4extended(CASE WHEN key = 'infinity'::date THEN 2147483647
                                              WHEN key = '-infinity'::date THEN -2147483648
                                              ELSE key - '2000-01-01'::date END, 8816678312871386365);
    ELSIF t = 'timestamp with time zone'::regtype THEN
        h := pg_catalog.timestamp_hash_extended(key AT TIME ZONE 'UTC', 8816678312871386365);
    ELSIF t = 'boolean'::regtype THEN
        h := pg_catalog.hashcharextended(CASE WHEN key THEN 1 ELSE 0 END::integer::"char", 8816678312871386365);
    ELSIF t = 'xid'::regtype OR t = 'cid'::regtype THEN
        h := pg_catalog.hashint4extended(((key::text::bigint + 2147483648) % 4294967296 - 2147483648)::integer,
                                         8816678312871386365);
    ELSIF t = 'xid8'::regtype THEN
        h := pg_catalog.hashint8extended(((key::text::numeric + 9223372036854775808) % 18446744073709551616
                                          - 9223372036854775808)::bigint, 8816678312871386365);
    ELSE
        -- a domain hashes as its base type
        SELECT coalesce(nullif(ty.typbasetype, 0), ty.oid) INTO base FROM pg_catalog.pg_type ty WHERE ty.oid = t;
        SELECT c.opcintype, c.opcfamily INTO cls FROM pg_catalog.pg_opclass c
        WHERE c.opcmethod = (SELECT a.oid FROM pg_catalog.pg_am a WHERE a.amname = 'hash') AND c.opcdefault
          AND (c.opcintype = base
               OR EXISTS (SELECT 1 FROM pg_catalog.pg_cast k WHERE k.castsource = base
                          AND k.casttarget = c.opcintype AND k.castmethod = 'b')
               OR (c.opcintype = 'anyarray'::regtype AND EXISTS (SELECT 1 FROM pg_catalog.pg_type e WHERE e.oid = base AND e.typelem <> 0 AND e.typlen = -1))
               OR (c.opcintype = 'anyenum'::regtype AND EXISTS (SELECT 1 FROM pg_catalog.pg_type e WHERE e.oid = base AND e.typtype = 'e'))
               OR (c.opcintype = 'anyrange'::regtype AND EXISTS (SELECT 1 FROM pg_catalog.pg_type e WHERE e.oid = base AND e.typtype = 'r'))
               OR (c.opcintype = 'anymultirange'::regtype AND EXISTS (SELECT 1 FROM pg_catalog.pg_type e WHERE e.oid = base AND e.typtype = 'm'))
               OR (c.opcintype = 'record'::regtype AND EXISTS (SELECT 1 FROM pg_catalog.pg_type e WHERE e.oid = base AND e.typtype = 'c')))
        ORDER BY c.opcintype = base DESC
        LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'type % has no default hash operator class, so it cannot be a hash partition key', t
                USING ERRCODE = '42883',
                HINT = 'The function pg_hash_slot accepts the types PARTITION BY HASH accepts; cast the key to one of them (for example key::text), or use slot_of or jump_slot.';
        END IF;
        SELECT p.amproc INTO f FROM pg_catalog.pg_amproc p
        WHERE p.amprocfamily = cls.opcfamily AND p.amproclefttype = cls.opcintype
          AND p.amprocrighttype = cls.opcintype AND p.amprocnum = 2;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'type % has no extended hash function in its default hash operator class', t
                USING ERRCODE = '42883',
                HINT = 'PARTITION BY HASH needs the opclass''s support function 2; cast the key to a type that has one (for example key::text).';
        END IF;
        -- the key cast to the hash function's argument type by its internal
        -- name (so no type modifier applies), or as it is to a polymorphic
        -- one (anyarray, anyenum, ...); a type whose hash function takes
        -- another type without a cast from it (its binary form, as date
        -- above) needs the extension: found in the catalogs, not by trying
        SELECT ty.typtype = 'p' AS poly, ty.oid = base OR EXISTS (
                   SELECT 1 FROM pg_catalog.pg_cast k WHERE k.castsource = base AND k.casttarget = ty.oid) AS castable,
               pg_catalog.quote_ident(ns.nspname) || '.' || pg_catalog.quote_ident(ty.typname) AS name,
               (SELECT b.typcollation <> 0 FROM pg_catalog.pg_type b WHERE b.oid = base) AS collatable
        INTO arg
        FROM pg_catalog.pg_proc pr JOIN pg_catalog.pg_type ty ON ty.oid = pr.proargtypes[0]
        JOIN pg_catalog.pg_namespace ns ON ns.oid = ty.typnamespace
        WHERE pr.oid = f;
        IF NOT (arg.poly OR arg.castable) THEN
            RAISE EXCEPTION 'pg_hash_slot of a key of type % needs the pg_claim extension', t
                USING ERRCODE = '0A000',
                HINT = pg_catalog.format('The portable edition cannot call %s on a %s; cast the key to a type it maps (for example key::text), or use slot_of or jump_slot.', f, t);
        END IF;
        EXECUTE pg_catalog.format('SELECT %s($1%s%s, $2)', f, CASE WHEN arg.poly THEN '' ELSE '::' || arg.name END,
                                  CASE WHEN arg.collatable THEN ' COLLATE ' || pg_catalog.pg_collation_for(key) END)
            INTO h USING key, 8816678312871386365::bigint;
    END IF;
    RETURN pg_catalog.mod(pg_catalog.mod(CASE WHEN h < 0 THEN h::numeric + 18446744073709551616 ELSE h::numeric END
                                         + 5305509591434766563, 18446744073709551616), n)::integer;
END $$;

-- range_slot: how many bounds are <= key, by binary search with the type's
-- default btree ordering; the bounds must be one-dimensional, without NULL
-- and strictly increasing.
CREATE FUNCTION @extschema@.range_slot(key anyelement, bounds anyarray) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    lo integer;
    hi integer;
    mid integer;
    first_ integer;
    len integer;
BEGIN
    IF pg_catalog.array_ndims(bounds) > 1 THEN
        RAISE EXCEPTION 'bounds must be a one-dimensional array, got % dimensions', pg_catalog.array_ndims(bounds)
            USING ERRCODE = '22023',
            HINT = 'Pass the bounds as a flat sorted array, for example ARRAY[10, 20, 30].';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_opclass c
                   JOIN pg_catalog.pg_am a ON a.oid = c.opcmethod AND a.amname = 'btree'
                   JOIN pg_catalog.pg_type ty ON ty.oid = (SELECT coalesce(nullif(d.typbasetype, 0), d.oid)
                                                            FROM pg_catalog.pg_type d WHERE d.oid = pg_catalog.pg_typeof(key))
                   WHERE c.opcdefault AND (c.opcintype = ty.oid
                         OR EXISTS (SELECT 1 FROM pg_catalog.pg_cast k WHERE k.castsource = ty.oid
                                    AND k.casttarget = c.opcintype AND k.castmethod = 'b')
                         OR (c.opcintype = 'anyenum'::regtype AND ty.typtype = 'e')
                         OR (c.opcintype = 'anyarray'::regtype AND ty.typcategory = 'A')
                         OR (c.opcintype = 'anyrange'::regtype AND ty.typtype = 'r')
                         OR (c.opcintype = 'anymultirange'::regtype AND ty.typtype = 'm')
                         OR (c.opcintype = 'record'::regtype AND ty.typtype = 'c'))) THEN
        RAISE EXCEPTION 'type % has no default btree operator class, so range_slot cannot order it', pg_catalog.pg_typeof(key)
            USING ERRCODE = '42883',
            HINT = 'The function range_slot accepts the types PARTITION BY RANGE accepts; cast the key and the bounds to one of them (for example ::text).';
    END IF;
    first_ := coalesce(pg_catalog.array_lower(bounds, 1), 1);
    len := coalesce(pg_catalog.array_length(bounds, 1), 0);
    -- the first NULL or out-of-order bound, in one statement (planned once);
    -- by subscript, so that a composite bound stays one value (unnest would
    -- expand it into its columns), and NULL as a value, not a row of NULLs
    SELECT g.i INTO mid
    FROM pg_catalog.generate_subscripts(bounds, 1) AS g(i)
    WHERE pg_catalog.num_nulls(bounds[g.i]) = 1 OR (g.i > first_ AND NOT bounds[g.i - 1] < bounds[g.i])
    ORDER BY g.i LIMIT 1;
    IF mid IS NOT NULL THEN
        IF pg_catalog.num_nulls(bounds[mid]) = 1 THEN
            RAISE EXCEPTION 'bounds must not contain NULL, found one at bounds[%]', mid USING ERRCODE = '22023',
                HINT = 'Remove the NULLs, for example with array_remove(bounds, NULL).';
        END IF;
        RAISE EXCEPTION 'bounds must be strictly increasing, but bounds[%] = % is not greater than bounds[%] = %',
            mid, pg_catalog.quote_literal(bounds[mid]::text), mid - 1, pg_catalog.quote_literal(bounds[mid - 1]::text)
            USING ERRCODE = '22023',
            HINT = 'Sort the bounds and remove duplicates, for example ARRAY(SELECT DISTINCT b FROM unnest(bounds) b ORDER BY b).';
    END IF;
    -- the number of bounds <= key
    lo := 0;
    hi := len;
    WHILE lo < hi LOOP
        mid := lo + (hi - lo) / 2;
        IF bounds[first_ + mid] > key THEN
            hi := mid;
        ELSE
            lo := mid + 1;
        END IF;
    END LOOP;
    RETURN lo;
END $$;
