// Compiled by `npm run typecheck` (tsc --strict): the declarations of index.d.ts as a user sees them.
import { Worker, NotASessionError, WorkerEvent, LostReason, Held, describe, isTransient } from "..";

interface Message { id: string; recipient: string; sent_at: Date | null }

const w = new Worker<Message>({
  name: "mailer", table: "outbox", n: 8, pending: "sent_at", batch: 50, mode: "lease", ttl: "5 seconds",
  handler: async (client, rows, batch) => {
    const ids: string[] = rows.map((r) => r.id);
    await client.query("UPDATE outbox SET sent_at = now() WHERE id = ANY($1)", [ids]);
    const slot: number = batch.slot;
    void slot;
  },
  queryTimeout: "5 seconds", metricsPort: 9187, metricsHost: "127.0.0.1",
  onEvent: (e: WorkerEvent) => {
    if (e.type === "failed" || e.type === "dead") console.log(e.item, e.state);
    if (e.type === "lost") { const why: LostReason = e.reason; console.log(e.slot, why); }
    if (e.type === "retrying") console.log(e.item, e.count, e.pauseMs);
  },
});
const transient: boolean = isTransient(new Error("x"));
void transient;
w.run({ handleSignals: true }).catch((e) => { if (e instanceof NotASessionError) process.exit(2); });
const items: number = w.stats.items;
void items;
const h = new Held({ validMs: 3000, marginMs: 1000 });
const { gained } = h.replace([{ slot: 0, token: "1" }], Date.now());
const next = h.next();
if (next !== null && gained.length) h.advance(next.slot, next.token, next.cursor);
const events: string[] = describe().events;
void events;
