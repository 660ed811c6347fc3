// What docs/workers.md ("Java: binding parameters") says about binding
// pg_claim's parameters from JDBC, checked against a server: a String bound
// to an interval parameter and a long bound to my_items' `after` fail with
// 42883 unless the SQL casts them (`?::interval`, `?::text`), or, for the
// String, the URL sets stringtype=unspecified. Run by tests/loops/run.py:
// java -cp CLASSES:postgresql.jar JdbcBinding URL (in a database with
// examples/schema.sql and outbox rows); exits 1 on any difference.

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;

public class JdbcBinding {
    static int failures = 0;

    // Runs sql with the arguments bound by setObject (String, Long, Integer);
    // expects the SQLSTATE `state`, or success when it is null.
    static void expect(Connection c, String url, String state, String sql, Object... args) throws SQLException {
        String got;
        try (PreparedStatement st = c.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) st.setObject(i + 1, args[i]);
            try (ResultSet r = st.executeQuery()) {
                r.next();
                got = null;
            }
        } catch (SQLException e) {
            got = e.getSQLState();
        }
        boolean ok = state == null ? got == null : state.equals(got);
        if (!ok) failures++;
        System.out.println((ok ? "ok   " : "FAIL ") + sql + " bound as "
            + java.util.Arrays.stream(args).map(a -> a.getClass().getSimpleName()).toList()
            + (url.contains("stringtype") ? " (stringtype=unspecified)" : "") + ": "
            + (got == null ? "works" : got) + (ok ? "" : ", expected " + (state == null ? "success" : state)));
    }

    public static void main(String[] args) throws Exception {
        String url = args[0];
        try (Connection c = DriverManager.getConnection(url, "postgres", "")) {
            expect(c, url, "42883", "SELECT claim_slot(?, ?, ?)", "jdbc_check", 8, "1 second");
            expect(c, url, null, "SELECT claim_slot(?, ?, ?::interval)", "jdbc_check", 8, "1 second");
            expect(c, url, "42883", "SELECT id FROM my_items(NULL::outbox, ?, ?, after => ?)", 0, 8, 16L);
            expect(c, url, null, "SELECT id FROM my_items(NULL::outbox, ?, ?, after => ?::text)", 0, 8, 16L);
            expect(c, url, null, "SELECT id FROM my_items(NULL::outbox, ?, ?, after => ?::text)", 0, 8, "16");
            expect(c, url, null, "SELECT id FROM my_items(NULL::outbox, ?, ?, after => ?)", 0, 8, "16");
            expect(c, url, null, "SELECT record_failure(?, ?::text, ?, ?, ?::interval)",
                   "jdbc_check", 17L, "an error", 3, "1 second");
            expect(c, url, null, "SELECT clear_failure(?, ?::text)", "jdbc_check", 17L);
        }
        String loose = url + (url.contains("?") ? "&" : "?") + "stringtype=unspecified";
        try (Connection c = DriverManager.getConnection(loose, "postgres", "")) {
            expect(c, loose, null, "SELECT claim_slot(?, ?, ?)", "jdbc_check", 8, "1 second");
            expect(c, loose, "42883", "SELECT id FROM my_items(NULL::outbox, ?, ?, after => ?)", 0, 8, 16L);
        }
        System.exit(failures == 0 ? 0 : 1);
    }
}
