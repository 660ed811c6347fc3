//! A fresh work table (and, for PgQ, fresh queues filled by a producer) for
//! every run.

use crate::config::Config;
use crate::methods::claims_slot;
use pg_claim_support::create_work_tables;
use postgres::Client;

/// Creates a fresh table (and queue) for one run, so no method inherits
/// another's dead tuples or bloat.
pub fn prepare(
    admin: &mut Client,
    cfg: &Config,
    method: &str,
    w: usize,
) -> Result<(), postgres::Error> {
    let index = match method {
        m if claims_slot(m) => {
            format!("CREATE INDEX bench_items_slot ON bench_items ((slot_of(id, {w})), id);")
        }
        "skip_locked" | "skip_locked_simple" => {
            "CREATE INDEX bench_items_pending ON bench_items (id) WHERE NOT done;".into()
        }
        _ => String::new(),
    };
    create_work_tables(
        admin,
        "bench_items",
        "bench_log",
        cfg.items,
        cfg.fillfactor,
        &index,
    )?;
    if method == "pgq" {
        // Drop the previous run's queues, then one queue per worker, each
        // ticked every `batch` events so a PgQ batch is `batch` events.
        admin.batch_execute(
            "SELECT pgq.drop_queue(queue_name, true) FROM pgq.queue WHERE queue_name LIKE 'bench_q%'",
        )?;
        for q in 0..w {
            admin.execute("SELECT pgq.create_queue($1)", &[&format!("bench_q{q}")])?;
            admin.execute(
                "SELECT pgq.set_queue_config($1, 'ticker_max_count', $2)",
                &[&format!("bench_q{q}"), &cfg.batch.to_string()],
            )?;
            admin.execute(
                "SELECT pgq.register_consumer($1, 'bench')",
                &[&format!("bench_q{q}")],
            )?;
        }
        // The producer: events carry item ids; a tick after each `batch`
        // events of a queue (each chunk committed before its tick).
        admin.batch_execute(&format!(
            "DO $$
             DECLARE q int; lo bigint;
             BEGIN
               FOR q IN 0..{w1} LOOP
                 lo := 0;
                 LOOP
                   PERFORM pgq.insert_event('bench_q' || q, 'item', id::text)
                      FROM (SELECT id FROM bench_items WHERE id % {w} = q AND id > lo
                             ORDER BY id LIMIT {b}) s;
                   EXIT WHEN NOT FOUND;
                   SELECT max(id) INTO lo FROM (SELECT id FROM bench_items
                     WHERE id % {w} = q AND id > lo ORDER BY id LIMIT {b}) s;
                   COMMIT;
                   PERFORM pgq.ticker('bench_q' || q);
                   COMMIT;
                 END LOOP;
                 -- a last, shorter chunk: tick it too
                 PERFORM pgq.set_queue_config('bench_q' || q, 'ticker_max_count', '1');
                 PERFORM pgq.ticker('bench_q' || q);
                 COMMIT;
               END LOOP;
             END $$;",
            w1 = w - 1,
            b = cfg.batch
        ))?;
    }
    admin.batch_execute("CHECKPOINT")?;
    Ok(())
}
