// Type declarations of pg-claim (clients/node).
import type { ClientBase, ClientConfig } from "pg";

/** A duration: milliseconds, or a PostgreSQL interval in one unit ('5 seconds', '500 milliseconds'). */
export type Duration = number | string;

/** What a batch's handler gets besides the client and the rows. */
export interface BatchInfo {
  /** the fleet's name */
  name: string;
  /** the slot whose share the rows are */
  slot: number;
  /** the slot's fencing token (lease mode; a bigint as a string), null in session mode */
  token: string | null;
  /** the slot's partition when the table is hash-partitioned with modulus n (slot_partition), else null */
  partition: string | null;
  /** the table, as the server spells it */
  table: string;
  /** this worker's holder */
  holder: string;
}

/**
 * Called once per batch, inside the batch's transaction (in lease mode after
 * fence passed for the slot): write through `client`, and clear each row's
 * `pending` column. Throwing rolls the batch back; it is then retried item by
 * item under savepoints, and each failing item goes through record_failure.
 * A transient error (isTransient: a lost connection, 40001, 40P01, classes
 * 53 and 58) retries the batch after a back-off instead, up to 5 times in a
 * row for its first item. The handler must not end the transaction (COMMIT,
 * ROLLBACK on `client`): such a batch is never counted, and goes item by item.
 */
export type Handler<Row = Record<string, any>> = (client: ClientBase, rows: Row[], batch: BatchInfo) => Promise<void>;

/**
 * Why a slot was lost: "given back" (claim_leases or claim_slots gave it to
 * another worker for balance), "taken" (another holder has it: taken over
 * after this worker's lease expired, or refused by the fence), "expired"
 * (this worker's lease ran out: no good claim for a ttl, or the slot came
 * back with a new token), "released" (stop()), "connection lost" (session
 * mode: the session and its locks are gone), "resized" (lease mode:
 * resize_fleet changed the fleet's n, every token of the name is dead).
 */
export type LostReason = "given back" | "taken" | "expired" | "released" | "connection lost" | "resized";

/** The events of docs/libraries.md (the Python library tells the same ones). */
export type WorkerEvent =
  | { type: "mode"; mode: "lease" | "session"; why: string }
  | { type: "started"; mode: "lease" | "session"; table: string; key: string; method: string; partitioned: boolean }
  | { type: "slots"; held: number[]; gained: number[]; lost: number[] }
  | { type: "gained"; slot: number; token: string | null }
  | { type: "lost"; slot: number; token: string | null; reason: LostReason }
  | { type: "batch"; slot: number; token: string | null; items: number; failed: number; seconds: number }
  | { type: "failed"; slot: number; item: string; error: string; state: "retry" }
  | { type: "dead"; slot: number; item: string; error: string; state: "dead" }
  /** the fence refused the slot's token (PC001): the slot is lost ("taken") */
  | { type: "rejected"; slot: number; token: string | null }
  /** lease mode: resize_fleet changed the fleet's n; every slot is dropped and claimed again with n */
  | { type: "resized"; oldN: number; n: number }
  /** the handler failed transiently: the batch again after pauseMs; count: in a row for this first item (5: the failure path) */
  | { type: "retrying"; slot: number; item: string; error: string; count: number; pauseMs: number }
  /** the handler of item ended the transaction and its row is no longer pending (it committed): no failure recorded */
  | { type: "transaction_ended"; slot: number; item: string; error: string }
  /** nothing to do in a whole round: waits ms; retryMs until the next retry of a failed item (null: none) */
  | { type: "idle"; ms: number; retryMs: number | null }
  | { type: "woken" }
  | { type: "reconnecting"; error: string; pauseMs: number }
  | { type: "reconnected" }
  | { type: "claim_failed"; error: string }
  | { type: "listen_failed"; error: string; pauseMs: number }
  | { type: "left"; slots: number[] }
  | { type: "leave_failed"; error: string }
  | { type: "stopped"; error: string | null };

export interface WorkerOptions<Row = Record<string, any>> {
  /** libpq-style URL; without it (and without `connection`) the PG* environment variables */
  conninfo?: string;
  /** further node-postgres client settings (merged under conninfo) */
  connection?: ClientConfig;
  /** the fleet's name (claims, failure records, channels) */
  name: string;
  /** the table whose rows are shared out */
  table: string;
  /** the number of slots; the same for every worker of the fleet (at most 1024 in lease mode) */
  n: number;
  /** the column marking rows still to do: a boolean (pending while false) or a nullable column (pending while NULL) */
  pending: string;
  /** at most this many rows per batch (default 50) */
  batch?: number;
  /** 'lease' (default; works through transaction poolers), 'session' (claim_slots on a direct connection), 'auto' */
  mode?: "lease" | "session" | "auto";
  /** lease mode: a lease's time to live (default '30 seconds'); renewed every ttl / 3 */
  ttl?: Duration;
  /** lease mode: the period of claim_leases (default ttl / 3) */
  renewInterval?: Duration;
  /** the server ends a batch's transaction idle this long (default ttl; 0: never) */
  idleInTransactionTimeout?: Duration;
  /** the client-side deadline of every query on the worker's connections, the handler's included (default ttl; 0: none) */
  queryTimeout?: Duration;
  handler: Handler<Row>;
  /** the key column (default: the single-column primary key) */
  key?: string;
  /** the column mapped to the slot when it is not the key: rows of one value are handled in key order */
  route?: string;
  /** my_items' method (default: 'pg_hash' on a table hash-partitioned with modulus n, else 'auto') */
  method?: "auto" | "crc32" | "jump" | "pg_hash";
  /** the tenant column: each batch takes the slot's tenants in turn (my_items_fair), each tenant's rows in key order */
  fair?: string;
  /** k: the slot is slot_of_spread(route, key, n, k), a tenant (the route column, required) on at most k slots */
  spread?: number;
  /** Citus: the column the table is distributed by (with shardKeys): each batch reads its slot's rows with the slot's value of it, one task on one shard */
  shardColumn?: string;
  /** Citus: each slot's value of shardColumn (every row of a slot has it): an object or Map from slot to value, or an array indexed by slot */
  shardKeys?: Record<number, string | number> | Map<number, string | number> | Array<string | number>;
  /** at most this many slots per worker (default n) */
  maxSlots?: number;
  /** lease mode: this worker's holder (default host:pid:random) */
  holder?: string;
  /** a direct connection (not through a transaction pooler) to LISTEN on the held slots' channels */
  notifyConninfo?: string;
  /** the longest wait when there is nothing to do (default 1 s; 30 s when it LISTENs) */
  pollInterval?: Duration;
  /** record_failure's max_attempts (default 5) */
  maxAttempts?: number;
  /** record_failure's backoff (default '10 seconds') */
  backoff?: Duration;
  /** session mode through a pool in session mode: skip the start-up check */
  sessionPool?: boolean;
  /** lease mode: balance by remaining work (report_backlog with the fence; a slot wanted elsewhere given back after its batch; default true) */
  balance?: boolean;
  /** serve Prometheus metrics on http://metricsHost:metricsPort/metrics (needs prom-client; 0: any free port) */
  metricsPort?: number;
  /** the address the metrics endpoint listens on (default '127.0.0.1'; '0.0.0.0' or '::' for every interface) */
  metricsHost?: string;
  /** called with every event (logging, metrics); its errors are ignored */
  onEvent?: (event: WorkerEvent & { name: string; holder: string }) => void;
}

/** A held slot: its number and its token (lease mode: a bigint as a string). */
export interface HeldSlot<Token = string> { slot: number; token: Token }

/** The slots a worker holds, with its cursor into each share (pg_claim.Held of the Python library). */
export class Held<Token = string> {
  constructor(options?: { validMs?: number; marginMs?: number });
  replace(rows: ({ slot: number; token: Token } | [number, Token])[], asked?: number): { gained: HeldSlot<Token>[]; lost: HeldSlot<Token>[] };
  failed(now?: number): HeldSlot<Token>[];
  drop(slot: number, token: Token): boolean;
  snapshot(): Map<number, Token>;
  workable(now?: number): boolean;
  next(now?: number): { slot: number; token: Token; cursor: string | null } | null;
  validLeft(now?: number): number;
  pick(slot: number, cursor: string | null, now?: number): { slot: number; token: Token; cursor: string | null } | null;
  advance(slot: number, token: Token, cursor: string | null): void;
}

export class Stats {
  items: number;
  batches: number;
  failures: number;
  deadItems: number;
  slotsTaken: number;
  slotsLost: number;
  fenced: number;
  reconnects: number;
  batchSeconds: number;
  slotsHeld: number;
}

export class Worker<Row = Record<string, any>> {
  constructor(options: WorkerOptions<Row>);
  /** Works until stop() (or SIGTERM/SIGINT with handleSignals); resolves once the slots are given back. */
  run(options?: { handleSignals?: boolean }): Promise<void>;
  /** Finish the batch in progress, give the slots back; resolves when run() does. */
  stop(): Promise<void>;
  readonly holder: string;
  readonly mode: "lease" | "session" | "auto";
  readonly stats: Stats;
  /** slot -> token of the slots held now */
  readonly held: Map<number, string | null>;
  /** the port of the Prometheus endpoint while running */
  readonly metricsAddress?: number;
}

/** run() in session mode when the connection is not one server session (a pooler). */
export class NotASessionError extends Error {
  code: "PG_CLAIM_NOT_A_SESSION";
}

export function makeHolder(): string;
export function isConnectionLost(error: unknown): boolean;
/** Whether a handler's error is transient (the batch is retried after a back-off, not recorded at once). */
export function isTransient(error: unknown): boolean;
export function durationMs(value: Duration, what: string): number;

/** The vocabulary of docs/libraries.md, shared with the Python library: options, events, metrics. */
export function describe(): {
  options: { name: string; default: string }[];
  events: string[];
  lost_reasons: string[];
  metrics: { name: string; type: "counter" | "gauge" | "histogram"; labels: string[] }[];
  buckets: number[];
};
