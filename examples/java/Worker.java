// A pg_claim worker in Java (JDBC, pgjdbc) for the example schema
// (examples/schema.sql): it sends the messages of `outbox`.
//
//     javac -cp /usr/share/java/postgresql.jar -d classes examples/java/Worker.java
//     PGHOST=127.0.0.1 PGDATABASE=app java -cp classes:/usr/share/java/postgresql.jar Worker [--exit-when-empty]
//
// The same worker as examples/python/worker.py (its docstring says what it
// does): claim_slots, my_items, a failure record per failed message, LISTEN on
// the slots' channels with a fallback poll, reconnect with back-off, exit on
// SIGTERM or SIGINT (status 143 or 130, the JVM's), or with --exit-when-empty
// (status 0) once its slots have nothing left. It connects over TCP to
// PGHOST:PGPORT (pgjdbc does not use Unix sockets), database PGDATABASE, as
// PGUSER with PGPASSWORD.
//
// Parameters are bound as Java strings, longs and ints. pgjdbc sends a String
// as `varchar`, which PostgreSQL casts to text but not to interval, and a long
// as `bigint`, which it casts to neither: so every interval parameter is
// written `?::interval`, and my_items' `after` (text) is written `?::text`,
// which takes the last key as a long or as a String alike. (Or add
// `stringtype=unspecified` to the URL: Strings are then typed by the server.)
//
// Like the Python worker, it refuses to work behind a pooler (status 2) unless
// MAILER_SESSION_POOL=1 says the pool is in session mode.
//
// MAILER_MODE=lease: leases instead (claim_leases, docs/leases.md), which work
// through a transaction-mode pooler such as PgBouncer: any number of these
// workers shares the 8 slots, each message is sent in a transaction that
// starts with fence(), a worker polls (MAILER_POLL_S) instead of LISTENing,
// and gives its slots back when it stops. Through PgBouncer pgjdbc must not
// prepare statements on the server: the URL sets prepareThreshold=0. (The
// Python and Node.js examples do this through the worker libraries.)

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import org.postgresql.PGConnection;

public class Worker {
    static final String NAME = "mailer";
    static final int N = 8, BATCH = 50;
    static final int MAX_ATTEMPTS = Integer.parseInt(env("MAILER_MAX_ATTEMPTS", "5"));
    static final String BACKOFF = env("MAILER_BACKOFF", "10 seconds");
    static final long POLL_MS = (long) (1000 * Double.parseDouble(env("MAILER_POLL_S", "30"))); // the fallback poll
    static final String WORKER = "java-" + ProcessHandle.current().pid();
    static final boolean SESSION_POOL = "1".equals(System.getenv("MAILER_SESSION_POOL")); // a pooler in session mode is in between
    static final boolean LEASE = "lease".equals(env("MAILER_MODE", "session"));
    static final String TTL = env("MAILER_TTL", "10 seconds");
    static boolean exitWhenEmpty;
    static volatile boolean stopping;

    static String env(String name, String otherwise) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? otherwise : v;
    }

    static void say(Object... words) {
        StringBuilder b = new StringBuilder();
        for (Object w : words) b.append(b.length() > 0 ? " " : "").append(w);
        System.out.println(b);
        System.out.flush();
    }

    // A lost connection (the server restarted, the network failed, ...), not a failed message.
    static boolean lost(SQLException e) {
        String s = e.getSQLState();
        return s != null && (s.startsWith("08") || s.startsWith("57P0"));
    }

    // The connection is not one server session: a pooler in between.
    static class NotASession extends SQLException {
        NotASession(String message) { super(message); }
    }

    // Deliver one message. Here: a row in `deliveries`, in the caller's
    // transaction; the reserved domain .invalid stands for a bounce.
    static void send(Connection c, String recipient, String body, long item) throws Exception {
        if (recipient.endsWith(".invalid")) throw new Exception("550 no such mailbox: " + recipient);
        try (PreparedStatement st = c.prepareStatement("INSERT INTO deliveries (outbox_id, worker) VALUES (?, ?)")) {
            st.setLong(1, item);
            st.setString(2, WORKER);
            st.executeUpdate();
        }
    }

    // docs/workers.md: begin
    // the batch, with the failure records of its own messages only
    static final String FETCH =
        "WITH o AS (SELECT * FROM my_items(NULL::outbox, ?, ?, after => ?::text, pending => 'sent_at', batch => ?))"
        + " SELECT o.id, o.recipient, o.body, o.sent_at IS NULL AS pending, f.state AS failure"
        + " FROM o LEFT JOIN item_failures(?, VARIADIC ARRAY(SELECT id::text FROM o)) f ON f.item = o.id::text"
        + " ORDER BY o.id";
    static final String CLAIM = "SELECT claim_slots(?, ?, ?, ?::interval), pg_backend_pid()";
    // seconds until the first retry of a failed, still unsent message of the
    // given slots; NULL: none (a record of a message sent meanwhile by another
    // kind of worker does not count)
    static final String NEXT_RETRY =
        "SELECT extract(epoch FROM min(f.retry_at) - clock_timestamp())::float8"
        + " FROM item_failures(?) f JOIN outbox o ON o.id = f.item::bigint AND o.sent_at IS NULL"
        + " WHERE f.state <> 'dead' AND slot_of(o.id, ?) = ANY (?)";

    record Item(long id, String recipient, String body, String failure) {}

    // Where each slot's walk over its share is: the last key of its batch,
    // whether this pass sent something, and the slots whose last whole pass
    // had nothing due (quiet: when every slot is, the worker waits).
    static class Walk {
        final Map<Integer, Long> after = new HashMap<>();
        final Set<Integer> busy = new HashSet<>(), quiet = new HashSet<>();

        // The due messages of slot s's next batch; the walk goes on after it.
        List<Item> next(PreparedStatement fetch, int s) throws SQLException {
            fetch.setInt(1, s);
            fetch.setInt(2, N);
            if (after.containsKey(s)) fetch.setLong(3, after.get(s)); else fetch.setNull(3, Types.BIGINT);
            fetch.setInt(4, BATCH);
            fetch.setString(5, NAME);
            List<Item> due = new ArrayList<>();
            int rows = 0;
            long last = 0;
            try (ResultSet r = fetch.executeQuery()) {
                while (r.next()) {
                    rows++;
                    last = r.getLong(1);
                    String failure = r.getString(5);
                    if (r.getBoolean(4) && (failure == null || failure.equals("due")))
                        due.add(new Item(last, r.getString(2), r.getString(3), failure));
                }
            }
            if (!due.isEmpty()) {
                busy.add(s);
                quiet.remove(s);
            }
            if (rows < BATCH) { // the share is walked: quiet if nothing was due
                after.remove(s);
                if (!busy.remove(s)) quiet.add(s);
            } else {
                after.put(s, last);
            }
            return due;
        }

        void forget(int s) {
            after.remove(s);
            busy.remove(s);
            quiet.remove(s);
        }
    }

    // Send one message and mark it sent in one transaction; record a failure.
    // With a lease's token, the transaction starts with fence(): if the slot
    // has moved on to another worker, nothing of it commits (SQLSTATE PC001,
    // thrown to the caller).
    static void process(Connection c, Item it, int slot, Long token) throws SQLException {
        try {
            c.setAutoCommit(false);
            if (token != null) {
                try (PreparedStatement st = c.prepareStatement("SELECT fence(?, ?, ?)")) {
                    st.setString(1, NAME);
                    st.setInt(2, slot);
                    st.setLong(3, token);
                    st.executeQuery().close();
                }
            }
            try (PreparedStatement st = c.prepareStatement("UPDATE outbox SET sent_at = now() WHERE id = ? AND sent_at IS NULL")) {
                st.setLong(1, it.id());
                if (st.executeUpdate() == 0) { // sent meanwhile by another kind of worker (docs/migrating.md)
                    c.commit();
                    say("skipped", it.id());
                    return;
                }
            }
            send(c, it.recipient(), it.body(), it.id());
            if (it.failure() != null) { // it failed before: forget that
                try (PreparedStatement st = c.prepareStatement("SELECT clear_failure(?, ?::text)")) {
                    st.setString(1, NAME);
                    st.setLong(2, it.id());
                    st.executeQuery().close();
                }
            }
            c.commit();
        } catch (Exception e) {
            // the database's error, not the message's: never recorded as its failure
            if (e instanceof SQLException q) throw q;
            c.rollback(); // the delivery failed
            c.setAutoCommit(true);
            try (PreparedStatement st = c.prepareStatement("SELECT record_failure(?, ?::text, ?, ?, ?::interval)")) {
                st.setString(1, NAME);
                st.setLong(2, it.id());
                st.setString(3, e.getMessage());
                st.setInt(4, MAX_ATTEMPTS);
                st.setString(5, BACKOFF);
                try (ResultSet r = st.executeQuery()) {
                    r.next();
                    say(r.getString(1).equals("retry") ? "failed" : "dead", it.id(), e.getMessage());
                }
            }
        } finally {
            c.setAutoCommit(true);
        }
    }

    // Work until told to stop (true) or the share is empty (false).
    static boolean serve(Connection c, int server) throws SQLException {
        List<Integer> slots = new ArrayList<>();
        Walk walk = new Walk();
        try (PreparedStatement claim = c.prepareStatement(CLAIM);
             PreparedStatement fetch = c.prepareStatement(FETCH);
             PreparedStatement nextRetry = c.prepareStatement(NEXT_RETRY);
             Statement plain = c.createStatement()) {
            while (!stopping) {
                // between batches: take unserved slots, give one back to a waiting newcomer
                List<Integer> held = claim(claim, server);
                Set<Integer> changed = new TreeSet<>(slots);
                changed.addAll(held);
                for (int s : changed) { // LISTEN on the channels of the slots held
                    if (slots.contains(s) == held.contains(s)) continue;
                    try (ResultSet r = plain.executeQuery("SELECT slot_channel('" + NAME + "', " + s + ")")) {
                        r.next();
                        String channel = "\"" + r.getString(1).replace("\"", "\"\"") + "\"";
                        plain.execute((held.contains(s) ? "LISTEN " : "UNLISTEN ") + channel);
                    }
                    walk.forget(s);
                }
                if (!held.equals(slots)) say("slots", String.join(" ", held.stream().map(String::valueOf).toList()));
                slots = held;
                for (int s : slots) { // one batch of each slot's share
                    for (Item it : walk.next(fetch, s)) {
                        if (stopping) return true;
                        process(c, it, s, null);
                    }
                }
                if (slots.isEmpty() || !walk.quiet.containsAll(slots)) continue;
                nextRetry.setString(1, NAME);
                nextRetry.setInt(2, N);
                nextRetry.setArray(3, c.createArrayOf("integer", slots.toArray()));
                Double retryIn = number(nextRetry);
                if (retryIn == null && exitWhenEmpty) return false;
                say("waiting");
                long until = System.currentTimeMillis()
                    // at least 0.1 s: a retry due now is fetched by the next pass, not by a busy loop
                    + (retryIn == null ? POLL_MS : Math.min(POLL_MS, (long) (Math.max(retryIn, 0.1) * 1000)));
                while (System.currentTimeMillis() < until && !stopping) {
                    if (waitForNotify(c, Math.min(until - System.currentTimeMillis(), 1000))) {
                        say("woken");
                        break;
                    }
                    // each second: claim again, as another worker may have given a slot up for this one
                    if (!claim(claim, server).equals(slots)) break;
                }
                walk.quiet.clear(); // woken or not: walk every share again
            }
        }
        return true;
    }

    // This session's slots, claimed again: its own plus unserved ones.
    static List<Integer> claim(PreparedStatement claim, int server) throws SQLException {
        claim.setString(1, NAME);
        claim.setInt(2, N);
        claim.setInt(3, N);
        claim.setString(4, "1 second"); // a String: hence ?::interval
        try (ResultSet r = claim.executeQuery()) {
            r.next();
            if (r.getInt(2) != server) // a transaction-mode pooler: the claim stays with another connection
                throw new NotASession("claim_slots ran in server process " + r.getInt(2) + ", not " + server
                    + ": the pool is not in session mode");
            return Arrays.asList((Integer[]) r.getArray(1).getArray());
        }
    }
    // docs/workers.md: end

    // Lease mode: the slots are leases of this worker's holder, claimed again
    // (and renewed) between batches; true when told to stop, false when empty.
    static boolean serveLeases(Connection c, String holder) throws SQLException {
        Map<Integer, Long> held = new HashMap<>();
        Walk walk = new Walk();
        try (PreparedStatement claim = c.prepareStatement(
                 "SELECT slot, token FROM claim_leases(?, ?, ?, ttl => ?::interval) ORDER BY slot");
             PreparedStatement fetch = c.prepareStatement(FETCH);
             PreparedStatement nextRetry = c.prepareStatement(NEXT_RETRY);
             PreparedStatement renew = c.prepareStatement("SELECT extract(epoch FROM ?::interval) * 1000 / 3")) {
            renew.setString(1, TTL);
            long renewMs = number(renew).longValue(); // claim again (which renews) at least every third of the TTL
            while (!stopping) {
                claim.setString(1, NAME);
                claim.setInt(2, N);
                claim.setString(3, holder);
                claim.setString(4, TTL);
                Map<Integer, Long> now = new java.util.TreeMap<>();
                try (ResultSet r = claim.executeQuery()) {
                    while (r.next()) now.put(r.getInt(1), r.getLong(2));
                }
                if (!now.keySet().equals(held.keySet()))
                    say("slots", String.join(" ", now.keySet().stream().map(String::valueOf).toList()));
                for (int s : held.keySet()) if (!now.containsKey(s)) walk.forget(s);
                held = now;
                slots:
                for (var slot : held.entrySet()) { // one batch of each slot's share
                    int s = slot.getKey();
                    for (Item it : walk.next(fetch, s)) {
                        if (stopping) return true;
                        try {
                            process(c, it, s, slot.getValue());
                        } catch (SQLException e) {
                            if (!"PC001".equals(e.getSQLState())) throw e;
                            say("fenced", s); // the lease moved on: claim again
                            walk.forget(s);
                            continue slots;
                        }
                    }
                }
                if (!held.isEmpty() && !walk.quiet.containsAll(held.keySet())) continue;
                nextRetry.setString(1, NAME);
                nextRetry.setInt(2, N);
                nextRetry.setArray(3, c.createArrayOf("integer", held.keySet().toArray()));
                Double retryIn = number(nextRetry);
                if (retryIn == null && exitWhenEmpty) return false;
                say("waiting");
                long until = System.currentTimeMillis() + Math.min(Math.min(POLL_MS, renewMs),
                    retryIn == null ? POLL_MS : (long) (Math.max(retryIn, 0.1) * 1000));
                while (!stopping && System.currentTimeMillis() < until) {
                    try { Thread.sleep(20); } catch (InterruptedException e) { return true; }
                }
                walk.quiet.clear();
            }
            return true;
        } finally {
            giveBack(c, holder);
        }
    }

    // The first column of a one-row query as a number; null for NULL.
    static Double number(PreparedStatement st) throws SQLException {
        try (ResultSet r = st.executeQuery()) {
            r.next();
            return r.getObject(1) == null ? null : r.getDouble(1);
        }
    }

    // Lease mode, stopping: give every slot back (else they expire after the TTL).
    static void giveBack(Connection c, String holder) {
        try (PreparedStatement st = c.prepareStatement("SELECT count(*) FROM claim_leases(?, ?, ?, max => 0)")) {
            c.setAutoCommit(true);
            st.setString(1, NAME);
            st.setInt(2, N);
            st.setString(3, holder);
            st.executeQuery().close();
        } catch (SQLException e) {
            // the connection is gone: the leases expire after the TTL
        }
    }

    // Until a notification arrives (true), `ms` pass or a signal comes.
    static boolean waitForNotify(Connection c, long ms) throws SQLException {
        PGConnection pg = c.unwrap(PGConnection.class);
        long deadline = System.currentTimeMillis() + ms;
        while (!stopping) {
            long left = deadline - System.currentTimeMillis();
            if (left <= 0) return false;
            var notes = pg.getNotifications((int) Math.max(1, Math.min(left, 500)));
            if (notes != null && notes.length > 0) return true;
        }
        return false;
    }

    static Connection connect() throws SQLException {
        String url = "jdbc:postgresql://" + env("PGHOST", "localhost") + ":" + env("PGPORT", "5432") + "/"
            + env("PGDATABASE", env("PGUSER", System.getProperty("user.name")));
        Properties p = new Properties();
        p.setProperty("user", env("PGUSER", System.getProperty("user.name")));
        if (System.getenv("PGPASSWORD") != null) p.setProperty("password", System.getenv("PGPASSWORD"));
        p.setProperty("ApplicationName", NAME);
        if (LEASE) p.setProperty("prepareThreshold", "0"); // a transaction-mode pooler: no server-side prepared statements
        return DriverManager.getConnection(url, p);
    }

    // The server process of this connection; refuses one behind a pooler.
    static int checkSession(Connection c) throws SQLException {
        int opened = c.unwrap(PGConnection.class).getBackendPID();
        try (Statement st = c.createStatement(); ResultSet r = st.executeQuery("SELECT pg_backend_pid()")) {
            r.next();
            int pid = r.getInt(1);
            if (pid != opened && !SESSION_POOL)
                throw new NotASession("the server process (pid " + pid + ") is not the one the connection was opened"
                    + " with (pid " + opened + "): a connection pooler is in between. This worker holds its slots"
                    + " with session locks and LISTENs, which need one server session per connection: connect to"
                    + " PostgreSQL directly, or through a pool in session mode and set MAILER_SESSION_POOL=1."
                    + " Behind a transaction-mode pooler use leases (docs/leases.md).");
            return pid;
        }
    }

    public static void main(String[] args) throws Exception {
        exitWhenEmpty = Arrays.asList(args).contains("--exit-when-empty");
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> { // SIGTERM, SIGINT: finish the message at hand
            stopping = true;
            try { main.join(10_000); } catch (InterruptedException e) { /* exit now */ }
        }));
        long pause = 100;
        // lease mode: one holder per process (host, pid and a random part)
        String holder = WORKER + "-" + java.net.InetAddress.getLocalHost().getHostName() + "-"
            + Long.toHexString(new java.util.Random().nextLong() >>> 32);
        while (true) {
            try (Connection c = connect()) {
                pause = 100;
                boolean told = LEASE ? serveLeases(c, holder) : serve(c, checkSession(c));
                say("exit", told ? "told to stop" : "nothing left");
                return;
            } catch (NotASession e) {
                say("exit", "refused:", e.getMessage());
                Runtime.getRuntime().halt(2); // not System.exit: the shutdown hook waits for this thread
            } catch (SQLException e) {
                if (!lost(e)) throw e;
                say("reconnecting", "in " + pause / 1000.0 + " s:", e.getMessage().lines().findFirst().orElse(""));
                long until = System.currentTimeMillis() + pause;
                while (!stopping && System.currentTimeMillis() < until) Thread.sleep(20);
                if (stopping) { say("exit", "told to stop"); return; }
                pause = Math.min(pause * 2, 5000);
            }
        }
    }
}
