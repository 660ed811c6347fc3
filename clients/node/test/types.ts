// Compiled by `npm run typecheck` (tsc --strict): the declarations of index.d.ts as a user sees them.
import { Worker, NotASessionError, WorkerEvent } from "..";

interface Message { id: string; recipient: string; sent_at: Date | null }

const w = new Worker<Message>({
  name: "mailer", table: "outbox", n: 8, pending: "sent_at", batch: 50, mode: "lease", ttl: "5 seconds",
  handler: async (client, rows, batch) => {
    const ids: string[] = rows.map((r) => r.id);
    await client.query("UPDATE outbox SET sent_at = now() WHERE id = ANY($1)", [ids]);
    const slot: number = batch.slot;
    void slot;
  },
  onEvent: (e: WorkerEvent) => { if (e.type === "failure") console.log(e.item, e.state); },
});
w.run({ handleSignals: true }).catch((e) => { if (e instanceof NotASessionError) process.exit(2); });
const items: number = w.stats.items;
void items;
