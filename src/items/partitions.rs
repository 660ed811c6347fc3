//! Hash-partition routing: the partition of a hash-partitioned table that
//! holds exactly one slot's rows, when reading it directly is the same as
//! reading the table with the slot filter.

use super::catalog::{can_select_table, Table};
use super::columns::Key;
use super::plan;
use crate::backend::catalog::qualified_rel_name;
use crate::backend::error::internal;
use pgrx::pg_sys;
use pgrx::prelude::*;

impl Table {
    /// The partition that holds `slot`, when reading it directly returns
    /// exactly the rows of the caller's own
    /// `SELECT ... FROM parent WHERE pg_hash_slot(key, n) = slot`
    /// (the caller leaves out rows whose key is NULL); its qualified name.
    /// That needs all of:
    /// - the table hash-partitioned by exactly the key, with modulus `n` in
    ///   every partition;
    /// - the partition key hashed as `pg_hash_slot` hashes it: the key type's
    ///   default hash operator class and the column's collation;
    /// - no row-level security on the table or the partition (a query on the
    ///   table applies the table's policies, one on the partition the
    ///   partition's), and `SELECT` on both for the caller (a query on the
    ///   table checks the table's privileges only).
    ///
    /// Otherwise None, and the share is read through the table with the
    /// slot filter.
    pub fn hash_partition_for(
        &self,
        key: &Key,
        n: i32,
        slot: i32,
    ) -> Option<(pg_sys::Oid, String)> {
        // SAFETY: the relation is open
        let parent_rls = unsafe { (*self.rel.rd_rel).relrowsecurity };
        if parent_rls || !can_select_table(self.relid) {
            return None;
        }
        // SAFETY: catalog look-up on an existing type
        let opclass = unsafe { pg_sys::GetDefaultOpClass(key.decl_type, pg_sys::HASH_AM_OID) };
        if opclass == pg_sys::InvalidOid {
            return None;
        }
        let rows: Vec<PartitionRow> = Spi::connect(|client| {
            let table = client.select(
                "SELECT c.oid, pg_catalog.pg_get_expr(c.relpartbound, c.oid), c.relrowsecurity
                 FROM pg_catalog.pg_partitioned_table pt
                 JOIN pg_catalog.pg_inherits i
                   ON i.inhparent OPERATOR(pg_catalog.=) pt.partrelid AND NOT i.inhdetachpending
                 JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
                 WHERE pt.partrelid OPERATOR(pg_catalog.=) $1
                   AND pt.partstrat OPERATOR(pg_catalog.=) 'h'
                   AND pt.partnatts OPERATOR(pg_catalog.=) 1
                   AND pt.partattrs[0] OPERATOR(pg_catalog.=) $2
                   AND pt.partclass[0] OPERATOR(pg_catalog.=) $3
                   AND pt.partcollation[0] OPERATOR(pg_catalog.=) $4::pg_catalog.oid",
                None,
                &[
                    self.relid.into(),
                    key.attnum.into(),
                    opclass.into(),
                    // as int8: pgrx passes the invalid oid 0 (no collation) as NULL
                    i64::from(key.collation.to_u32()).into(),
                ],
            )?;
            let mut out = Vec::new();
            for row in table {
                let oid: Option<pg_sys::Oid> = row.get(1)?;
                let bound: Option<String> = row.get(2)?;
                let rls: Option<bool> = row.get(3)?;
                if let Some(oid) = oid {
                    out.push((
                        oid,
                        bound.as_deref().and_then(plan::parse_hash_bound),
                        rls.unwrap_or(true),
                    ));
                }
            }
            Ok::<_, pgrx::spi::Error>(out)
        })
        .unwrap_or_else(|e| internal("read the partitions", e));
        let bounds: Vec<Option<(i32, i32)>> = rows.iter().map(|r| r.1).collect();
        let i = plan::partition_for_slot(&bounds, n, slot)?;
        let (child, _, child_rls) = rows[i];
        if child_rls || !can_select_table(child) {
            return None;
        }
        Some((child, qualified_rel_name(child)))
    }
}

/// A hash partition: its oid, its (modulus, remainder), whether it has
/// row-level security enabled.
type PartitionRow = (pg_sys::Oid, Option<(i32, i32)>, bool);
