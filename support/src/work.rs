//! The work of the demo and of the queue benchmark: a table of items
//! `(id, payload, done)` that workers mark done, and a processing log
//! `(item_id, slot, worker_pid, processed_at)` that every processed item is
//! written to, checked afterwards for items processed twice or never.

use postgres::Client;

/// Creates afresh the work table `items`, holding ids 1 to `count` at
/// `fillfactor`, and the empty processing log `log`; then runs `indexes`
/// (SQL: the indexes the caller's workers read through) and vacuums the
/// work table.
pub fn create_work_tables(
    c: &mut Client,
    items: &str,
    log: &str,
    count: i64,
    fillfactor: u32,
    indexes: &str,
) -> Result<(), postgres::Error> {
    c.batch_execute(&format!(
        "SET client_min_messages = warning;
         DROP TABLE IF EXISTS {log}, {items};
         CREATE TABLE {items} (
             id      bigint PRIMARY KEY,
             payload text NOT NULL,
             done    boolean NOT NULL DEFAULT false
         ) WITH (fillfactor = {fillfactor});
         INSERT INTO {items} (id, payload)
             SELECT g, 'item ' || g FROM generate_series(1, {count}) g;
         CREATE TABLE {log} (
             item_id      bigint NOT NULL,
             slot         integer NOT NULL,
             worker_pid   integer NOT NULL,
             processed_at timestamptz NOT NULL
         );
         {indexes}
         RESET client_min_messages;"
    ))?;
    c.batch_execute(&format!("VACUUM ANALYZE {items}"))
}
