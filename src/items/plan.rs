//! Pure query planning for `my_items` and `slot_counts`: which mapping
//! function a method uses for a key type, and the SQL text that selects a
//! share. No PostgreSQL calls here; every identifier passed in is already
//! quoted by the caller.

/// How keys map to slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// integer keys: modulo (`slot_of`); text, bytea, uuid: crc32 (`slot_of`)
    Auto,
    /// crc32 of the key (`slot_of`); integer keys: crc32 of their decimal text
    Crc32,
    /// jump consistent hash (`jump_slot`)
    Jump,
    /// PostgreSQL's own hash partitioning (`pg_hash_slot`)
    PgHash,
}

/// The valid method names, for error messages.
pub const METHOD_NAMES: &str = "auto, crc32, jump, pg_hash";

impl Method {
    /// Parse a method name (exact, lower case).
    pub fn parse(name: &str) -> Option<Method> {
        match name {
            "auto" => Some(Method::Auto),
            "crc32" => Some(Method::Crc32),
            "jump" => Some(Method::Jump),
            "pg_hash" => Some(Method::PgHash),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Method::Auto => "auto",
            Method::Crc32 => "crc32",
            Method::Jump => "jump",
            Method::PgHash => "pg_hash",
        }
    }
}

/// The families of key types the mapping functions know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// smallint, integer, bigint
    Int,
    /// text, varchar, char(n)
    Text,
    Bytea,
    Uuid,
    /// anything else (numeric, date, ...): only `pg_hash` handles it
    Other,
}

/// What the mapping expression applies to the key before the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgForm {
    /// the key column itself (implicit casts, e.g. varchar → text, are the
    /// server's)
    Key,
    /// the key's text form, `(key)::text`
    KeyAsText,
}

/// The mapping function a method uses for a key type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// `slot_of`, `jump_slot` or `pg_hash_slot`
    pub func: &'static str,
    pub arg: ArgForm,
}

impl Mapping {
    /// The SQL expression `<schema>.<func>(<key>, <n>)`. `schema` and `key`
    /// must already be quoted identifiers; `n` is a parameter reference or a
    /// literal integer.
    pub fn expr(&self, schema: &str, key: &str, n: &str) -> String {
        match self.arg {
            ArgForm::Key => format!("{schema}.{}({key}, {n})", self.func),
            ArgForm::KeyAsText => format!("{schema}.{}(({key})::pg_catalog.text, {n})", self.func),
        }
    }
}

/// The mapping of `method` for keys of `kind`, or the reason there is none.
pub fn mapping(method: Method, kind: KeyKind) -> Result<Mapping, &'static str> {
    use KeyKind::*;
    let key = |func| {
        Ok(Mapping {
            func,
            arg: ArgForm::Key,
        })
    };
    match (method, kind) {
        (Method::PgHash, _) => key("pg_hash_slot"),
        (_, Other) => Err("only method 'pg_hash' maps keys of this type; \
                           slot_of and jump_slot take smallint, integer, bigint, text, bytea and uuid"),
        (Method::Auto, _) => key("slot_of"),
        (Method::Crc32, Int) => Ok(Mapping {
            func: "slot_of",
            arg: ArgForm::KeyAsText,
        }),
        (Method::Crc32, _) => key("slot_of"),
        (Method::Jump, _) => key("jump_slot"),
    }
}

/// Everything needed to write the query for one share. Identifiers are
/// quoted already.
pub struct ShareQuery<'a> {
    /// the relation to read: the table, or the one hash partition holding the share
    pub from: &'a str,
    /// explicit column list (reading a partition: the parent's columns in the
    /// parent's order); None selects `*`
    pub columns: Option<&'a [String]>,
    /// the key column
    pub key: &'a str,
    /// the key column's type with its modifier, schema-qualified, for the
    /// `after` cast (`character(5)`: a type name printed without its
    /// modifier can read back as another type, `character` as `char(1)`)
    pub key_type: &'a str,
    /// the key type's greater-than operator from its default btree operator
    /// class, as `OPERATOR(schema.>)`, so `search_path` cannot capture it
    pub gt_op: &'a str,
    /// the slot filter `<expr> OPERATOR(pg_catalog.=) $1` (n written in as a
    /// literal); None when `from` is the share's own partition
    pub filter: Option<String>,
    /// the route column (the column mapped to a slot; the key by default)
    pub route: &'a str,
    /// reading the share's own partition by a nullable route column: leave
    /// out rows whose route is NULL, which belong to no slot (PostgreSQL
    /// routes them to one partition)
    pub route_not_null: bool,
    /// the route column is of a composite type: "not NULL" is then `NOT (x
    /// IS NULL)`, which keeps a row with some NULL fields (a row belongs to
    /// no slot only when the whole value is NULL), where `x IS NOT NULL`
    /// would need every field set
    pub route_is_row: bool,
    /// which rows are pending (`NOT done`, `sent_at IS NULL`): the predicate
    /// of the partial index that serves the share, written exactly as
    /// `create_index_sql` writes it
    pub pending: Option<&'a str>,
    pub after: bool,
    pub batch: bool,
    /// an index `((<filter expression>), key)` serves the share in key
    /// order: the slot condition is written as a range and the page's start
    /// as a row comparison, ordered by (slot, key), so that only that index
    /// gives the order without a sort, also in a generic plan, whose
    /// estimates would otherwise favour the primary key with the slot as a
    /// filter (every row of the other slots read and rejected)
    pub slot_key_index: bool,
}

/// The SELECT for one share. Parameters: $1 slot, $2 n, $3 after (text),
/// $4 batch.
pub fn share_sql(q: &ShareQuery) -> String {
    let cols = match q.columns {
        Some(c) => c.join(", "),
        None => "*".to_string(),
    };
    let mut sql = format!("SELECT {cols} FROM {}", q.from);
    let mut conds = Vec::new();
    // the slot index form needs one operator name for both columns of the
    // row comparison: the key's `>` must be pg_catalog's, as the slot's is
    let ordered = q.after || q.batch;
    let ranged = match &q.filter {
        Some(_) if q.slot_key_index && ordered => !q.after || q.gt_op == "OPERATOR(pg_catalog.>)",
        _ => false,
    };
    match &q.filter {
        Some(f) if ranged && q.after => {
            conds.push(format!("{f} OPERATOR(pg_catalog.<=) $1"));
            conds.push(format!(
                "ROW({f}, {}) OPERATOR(pg_catalog.>) ROW($1, $3::{})",
                q.key, q.key_type
            ));
        }
        Some(f) if ranged => {
            conds.push(format!("{f} OPERATOR(pg_catalog.>=) $1"));
            conds.push(format!("{f} OPERATOR(pg_catalog.<=) $1"));
        }
        Some(f) => conds.push(format!("{f} OPERATOR(pg_catalog.=) $1")),
        None => {}
    }
    if q.route_not_null && q.route_is_row {
        conds.push(format!("NOT ({} IS NULL)", q.route));
    } else if q.route_not_null {
        conds.push(format!("{} IS NOT NULL", q.route));
    }
    if let Some(p) = q.pending {
        conds.push(p.to_string());
    }
    if q.after && !ranged {
        conds.push(format!("{} {} $3::{}", q.key, q.gt_op, q.key_type));
    }
    if !conds.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conds.join(" AND "));
    }
    match &q.filter {
        Some(f) if ranged => sql.push_str(&format!(" ORDER BY {f}, {}", q.key)),
        _ if ordered => sql.push_str(&format!(" ORDER BY {}", q.key)),
        _ => {}
    }
    if q.batch {
        sql.push_str(" LIMIT $4");
    }
    sql
}

/// The query behind `slot_counts`: rows per slot 0..n-1, zero for empty
/// slots; rows whose key is NULL belong to no slot. Parameter: $1 n. Every
/// operator, function and type is schema-qualified.
pub fn counts_sql(rel: &str, slot_expr: &str) -> String {
    format!(
        "SELECT g.slot, COALESCE(c.items, 0::pg_catalog.int8) AS items \
         FROM pg_catalog.generate_series(0, $1 OPERATOR(pg_catalog.-) 1) AS g(slot) \
         LEFT JOIN (SELECT {slot_expr} AS slot, pg_catalog.count(*) AS items \
                    FROM {rel} GROUP BY 1) AS c ON c.slot OPERATOR(pg_catalog.=) g.slot \
         ORDER BY g.slot"
    )
}

/// The index that makes a share an index range scan in key order; partial
/// (`WHERE <pending>`) when the share is the pending rows.
pub fn create_index_sql(rel: &str, slot_expr: &str, key: &str, pending: Option<&str>) -> String {
    match pending {
        Some(p) => format!("CREATE INDEX ON {rel} (({slot_expr}), {key}) WHERE {p};"),
        None => format!("CREATE INDEX ON {rel} (({slot_expr}), {key});"),
    }
}

/// How a pending column says which rows are pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingForm {
    /// a boolean "done" flag: pending while it is false (`NOT done`; NULL is
    /// not pending, as in a partial index `WHERE NOT done`)
    NotFlag,
    /// a nullable column set when the row is done (`sent_at`): pending while
    /// it is NULL
    IsNull,
}

/// The predicate selecting pending rows by the (quoted) column `col`.
pub fn pending_sql(form: PendingForm, col: &str) -> String {
    match form {
        PendingForm::NotFlag => format!("NOT {col}"),
        PendingForm::IsNull => format!("{col} IS NULL"),
    }
}

/// Parse a hash partition bound as `pg_get_expr(relpartbound, oid)` prints
/// it: `FOR VALUES WITH (modulus 8, remainder 3)` → (8, 3).
pub fn parse_hash_bound(bound: &str) -> Option<(i32, i32)> {
    let inner = bound
        .trim()
        .strip_prefix("FOR VALUES WITH (")?
        .strip_suffix(')')?;
    let mut modulus = None;
    let mut remainder = None;
    for part in inner.split(',') {
        let mut words = part.split_whitespace();
        let (name, value) = (words.next()?, words.next()?);
        if words.next().is_some() {
            return None;
        }
        let value: i32 = value.parse().ok()?;
        match name {
            "modulus" => modulus = Some(value),
            "remainder" => remainder = Some(value),
            _ => return None,
        }
    }
    Some((modulus?, remainder?))
}

/// Given the bounds of every partition of a table hash-partitioned by the
/// key, the index of the partition that holds `slot` when every partition's
/// modulus is `n`; None when the partitioning does not match `n` (then the
/// share is read through the parent with the slot filter).
pub fn partition_for_slot(bounds: &[Option<(i32, i32)>], n: i32, slot: i32) -> Option<usize> {
    if bounds.is_empty() || bounds.iter().any(|b| !matches!(b, Some((m, _)) if *m == n)) {
        return None;
    }
    bounds
        .iter()
        .position(|b| matches!(b, Some((_, r)) if *r == slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_parse() {
        for m in [Method::Auto, Method::Crc32, Method::Jump, Method::PgHash] {
            assert_eq!(Method::parse(m.name()), Some(m));
            assert!(METHOD_NAMES.contains(m.name()));
        }
        assert_eq!(Method::parse("modulo"), None);
        assert_eq!(Method::parse("AUTO"), None);
        assert_eq!(Method::parse(""), None);
    }

    #[test]
    fn mapping_per_method_and_kind() {
        let m = |method, kind| mapping(method, kind).map(|m| m.expr("s", "k", "$2"));
        assert_eq!(m(Method::Auto, KeyKind::Int).unwrap(), "s.slot_of(k, $2)");
        assert_eq!(m(Method::Auto, KeyKind::Text).unwrap(), "s.slot_of(k, $2)");
        assert_eq!(m(Method::Auto, KeyKind::Uuid).unwrap(), "s.slot_of(k, $2)");
        assert_eq!(m(Method::Auto, KeyKind::Bytea).unwrap(), "s.slot_of(k, $2)");
        assert_eq!(
            m(Method::Crc32, KeyKind::Int).unwrap(),
            "s.slot_of((k)::pg_catalog.text, $2)"
        );
        assert_eq!(m(Method::Crc32, KeyKind::Text).unwrap(), "s.slot_of(k, $2)");
        assert_eq!(m(Method::Jump, KeyKind::Int).unwrap(), "s.jump_slot(k, $2)");
        assert_eq!(
            m(Method::Jump, KeyKind::Uuid).unwrap(),
            "s.jump_slot(k, $2)"
        );
        assert_eq!(
            m(Method::PgHash, KeyKind::Other).unwrap(),
            "s.pg_hash_slot(k, $2)"
        );
        assert!(m(Method::Auto, KeyKind::Other).is_err());
        assert!(m(Method::Crc32, KeyKind::Other).is_err());
        assert!(m(Method::Jump, KeyKind::Other).is_err());
    }

    #[test]
    fn share_sql_shapes() {
        let base = ShareQuery {
            from: "public.items",
            columns: None,
            key: "id",
            key_type: "pg_catalog.int8",
            gt_op: "OPERATOR(pg_catalog.>)",
            filter: Some("s.slot_of(id, $2)".into()),
            route: "id",
            route_not_null: false,
            route_is_row: false,
            pending: None,
            after: false,
            batch: false,
            slot_key_index: false,
        };
        assert_eq!(
            share_sql(&base),
            "SELECT * FROM public.items WHERE s.slot_of(id, $2) OPERATOR(pg_catalog.=) $1"
        );
        let paged = ShareQuery {
            after: true,
            batch: true,
            ..base
        };
        assert_eq!(
            share_sql(&paged),
            "SELECT * FROM public.items WHERE s.slot_of(id, $2) OPERATOR(pg_catalog.=) $1 \
             AND id OPERATOR(pg_catalog.>) $3::pg_catalog.int8 ORDER BY id LIMIT $4"
        );
        // with an index ((slot expression), id): a range and a row comparison
        let indexed = ShareQuery {
            slot_key_index: true,
            ..paged
        };
        assert_eq!(
            share_sql(&indexed),
            "SELECT * FROM public.items WHERE s.slot_of(id, $2) OPERATOR(pg_catalog.<=) $1 \
             AND ROW(s.slot_of(id, $2), id) OPERATOR(pg_catalog.>) ROW($1, $3::pg_catalog.int8) \
             ORDER BY s.slot_of(id, $2), id LIMIT $4"
        );
        let first_page = ShareQuery {
            after: false,
            filter: indexed.filter.clone(),
            ..indexed
        };
        assert_eq!(
            share_sql(&first_page),
            "SELECT * FROM public.items WHERE s.slot_of(id, $2) OPERATOR(pg_catalog.>=) $1 \
             AND s.slot_of(id, $2) OPERATOR(pg_catalog.<=) $1 ORDER BY s.slot_of(id, $2), id LIMIT $4"
        );
        // a key whose > is not pg_catalog's keeps the equality form
        let citext = ShareQuery {
            gt_op: "OPERATOR(public.>)",
            filter: indexed.filter.clone(),
            ..indexed
        };
        assert!(share_sql(&citext).contains("OPERATOR(pg_catalog.=) $1"));
        let cols = vec!["id".to_string(), "\"a b\"".to_string()];
        let part = ShareQuery {
            from: "public.items_p3",
            columns: Some(&cols),
            key: "id",
            key_type: "pg_catalog.int8",
            gt_op: "OPERATOR(pg_catalog.>)",
            filter: None,
            route: "id",
            route_not_null: true,
            route_is_row: false,
            pending: None,
            after: false,
            batch: true,
            slot_key_index: false,
        };
        assert_eq!(
            share_sql(&part),
            "SELECT id, \"a b\" FROM public.items_p3 WHERE id IS NOT NULL ORDER BY id LIMIT $4"
        );
        // a composite key with a NULL field still belongs to a slot
        let row = ShareQuery {
            route_is_row: true,
            ..part
        };
        assert!(share_sql(&row).contains("WHERE NOT (id IS NULL) ORDER BY id"));
        let pending = pending_sql(PendingForm::IsNull, "sent_at");
        let routed = ShareQuery {
            filter: Some("s.slot_of(customer_id, 8)".into()),
            route: "customer_id",
            pending: Some(&pending),
            after: true,
            batch: true,
            ..base
        };
        assert_eq!(
            share_sql(&routed),
            "SELECT * FROM public.items WHERE s.slot_of(customer_id, 8) OPERATOR(pg_catalog.=) $1 \
             AND sent_at IS NULL AND id OPERATOR(pg_catalog.>) $3::pg_catalog.int8 ORDER BY id LIMIT $4"
        );
        let routed_part = ShareQuery {
            from: "public.items_p3",
            filter: None,
            route: "customer_id",
            route_not_null: true,
            route_is_row: false,
            pending: Some("NOT done"),
            after: false,
            batch: false,
            ..base
        };
        assert_eq!(
            share_sql(&routed_part),
            "SELECT * FROM public.items_p3 WHERE customer_id IS NOT NULL AND NOT done"
        );
        assert_eq!(
            create_index_sql("public.outbox", "s.slot_of(id, 8)", "id", Some(&pending)),
            "CREATE INDEX ON public.outbox ((s.slot_of(id, 8)), id) WHERE sent_at IS NULL;"
        );
        assert_eq!(
            create_index_sql("public.t", "s.slot_of(c, 8)", "id", None),
            "CREATE INDEX ON public.t ((s.slot_of(c, 8)), id);"
        );
        assert_eq!(
            pending_sql(PendingForm::NotFlag, "\"Done\""),
            "NOT \"Done\""
        );
    }

    #[test]
    fn hash_bounds() {
        assert_eq!(
            parse_hash_bound("FOR VALUES WITH (modulus 8, remainder 3)"),
            Some((8, 3))
        );
        assert_eq!(parse_hash_bound("FOR VALUES FROM (1) TO (5)"), None);
        assert_eq!(parse_hash_bound("DEFAULT"), None);
        assert_eq!(
            parse_hash_bound("FOR VALUES WITH (modulus x, remainder 3)"),
            None
        );
        let b = |v: &[(i32, i32)]| v.iter().map(|x| Some(*x)).collect::<Vec<_>>();
        let four = b(&[(4, 2), (4, 0), (4, 3), (4, 1)]);
        assert_eq!(partition_for_slot(&four, 4, 3), Some(2));
        assert_eq!(partition_for_slot(&four, 4, 0), Some(1));
        assert_eq!(partition_for_slot(&four, 8, 0), None);
        let mixed = b(&[(2, 0), (4, 1), (4, 3)]);
        assert_eq!(partition_for_slot(&mixed, 4, 1), None);
        let missing = b(&[(4, 0), (4, 1)]);
        assert_eq!(partition_for_slot(&missing, 4, 3), None);
        assert_eq!(partition_for_slot(&[None], 4, 0), None);
        assert_eq!(partition_for_slot(&[], 4, 0), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
        /// Any text a caller passes as a method or that a catalog holds as a
        /// bound (empty, long, quotes, control characters, any Unicode):
        /// no panic, and only the four method names parse.
        #[test]
        fn hostile_text_never_panics(text in "(?s).{0,300}", bound_n in proptest::prelude::any::<i32>(), slot in proptest::prelude::any::<i32>()) {
            match Method::parse(&text) {
                Some(m) => proptest::prop_assert_eq!(m.name(), text.as_str()),
                None => proptest::prop_assert!(!["auto", "crc32", "jump", "pg_hash"].contains(&text.as_str())),
            }
            let _ = parse_hash_bound(&text);
            let wrapped = format!("FOR VALUES WITH ({text})");
            let _ = parse_hash_bound(&wrapped);
            // bounds of any moduli and remainders, any n and slot
            let bounds = vec![Some((bound_n, slot)), None, Some((slot, bound_n))];
            if let Some(i) = partition_for_slot(&bounds, bound_n, slot) {
                proptest::prop_assert!(i < bounds.len());
                proptest::prop_assert_eq!(bounds[i].map(|b| b.1), Some(slot));
            }
        }
    }

    proptest::proptest! {
        /// Whatever order the partitions are listed in, the slot's partition
        /// is the one whose remainder is the slot; one partition missing or
        /// of another modulus means no routing.
        #[test]
        fn partition_routing(n in 1i32..64, seed in proptest::prelude::any::<u64>(), slot_pick in 0i32..64) {
            let slot = slot_pick % n;
            let mut rems: Vec<i32> = (0..n).collect();
            // a deterministic shuffle from the seed
            let mut x = seed | 1;
            for i in (1..rems.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                rems.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let bounds: Vec<Option<(i32, i32)>> = rems.iter().map(|r| Some((n, *r))).collect();
            let i = partition_for_slot(&bounds, n, slot).unwrap();
            proptest::prop_assert_eq!(rems[i], slot);
            let text = format!("FOR VALUES WITH (modulus {n}, remainder {slot})");
            proptest::prop_assert_eq!(parse_hash_bound(&text), Some((n, slot)));
            if n > 1 {
                proptest::prop_assert_eq!(partition_for_slot(&bounds, n + 1, slot), None);
                let mut mixed = bounds.clone();
                mixed[0] = Some((2 * n, rems[0]));
                proptest::prop_assert_eq!(partition_for_slot(&mixed, n, slot), None);
            }
        }
    }
}
