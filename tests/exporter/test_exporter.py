"""contrib/prometheus against the real exporter (scripts/test exporter).

Two fleets in a database of their own: `mailer` (session holders on two of
its 4 slots, a failing item and a dead one) and `leased` (lease holders on
two of its 3 slots, a third lease expired, a dead item, no age column).
Debian's prometheus-postgres-exporter runs with
contrib/prometheus/pg_claim.yaml on a free port, discovering every database
of the server; each value of its /metrics is checked against the views
fleet_slots and fleets and against the tables themselves, and a fleet of
another database stays out (`master: true`). Then the fleets
change (a fleet defined, a holder gone, a slot's share done, a fleet
dropped) and a later scrape must show it with no restart. A role that may
not read a fleet's table sees NaN for its backlog. Last, promtool lints the
scrape (check metrics), checks contrib/prometheus/alerts.yml and runs its
unit tests (tests/exporter/alerts_test.yml).

Runs against the server of PGHOST/PGPORT (the scripts/test cluster, which
listens on 127.0.0.1 with trust authentication). Every value is an
expectation of its own (expect: the test goes on and fails at the end with
every one that did not hold).
"""
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest

import harness
from harness import Expectations, Failure, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUERIES = os.path.join(ROOT, "contrib", "prometheus", "pg_claim.yaml")
ALERTS = os.path.join(ROOT, "contrib", "prometheus", "alerts.yml")
ALERT_TESTS = os.path.join(ROOT, "tests", "exporter", "alerts_test.yml")
DB = "pg_claim_exporter"
OTHER_DB = "pg_claim_exporter_other"
MONITOR = "exporter_monitor"

SLOT_METRICS = ["pending", "oldest_pending_seconds", "oldest_claimable_seconds", "holder_present",
                "unserved_seconds", "failing_items", "dead_items"]
FLEET_METRICS = ["slots", "holders", "unserved_slots", "pending_items", "oldest_pending_seconds",
                 "oldest_claimable_seconds", "failing_items", "dead_items"]

check = Expectations()  # the test verifies them at its end


def connect(db=DB, **kw):
    return harness.connect(db, **kw)


# --- the exporter ------------------------------------------------------------

class Exporter:
    def __init__(self, user, tmp, extra=()):
        exe = shutil.which("prometheus-postgres-exporter")
        if not exe:
            raise Failure("prometheus-postgres-exporter is not installed (scripts/lib.sh installs it)")
        self.port = free_port()
        self.log = os.path.join(tmp, f"exporter-{user}.log")
        env = dict(os.environ,
                   DATA_SOURCE_NAME=f"postgresql://{user}@127.0.0.1:{os.environ['PGPORT']}/{DB}?sslmode=disable")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [exe, f"--web.listen-address=127.0.0.1:{self.port}", f"--extend.query-path={QUERIES}",
                 # this layer checks pg_claim's queries: the exporter's own
                 # ones (every database of the server) only cost time
                 "--disable-default-metrics", "--disable-settings-metrics", *extra],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def scrape(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()

    def poll(self, cond, what, deadline_s=20.0):
        """The first scrape for which cond(metrics) holds, within the deadline."""
        deadline = time.monotonic() + deadline_s
        last = None
        while True:
            if self.proc.poll() is not None:
                raise Failure(f"the exporter exited with {self.proc.returncode}:\n{open(self.log).read()}")
            try:
                text = self.scrape()
                last = parse(text)
                if cond(last):
                    return text, last
            except OSError:
                pass
            if time.monotonic() > deadline:
                print(open(self.log).read()[-4000:])
                raise Failure(f"no scrape of the exporter showed {what} within {deadline_s:.0f} s; last: "
                         f"{sorted(k for k in (last or {}) if k[0].startswith('pg_claim'))[:20]}")
            time.sleep(0.2)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, frozenset(labels without server)): value}; also ('#TYPE', name): type."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            out[("#TYPE", name)] = kind
            continue
        m = LINE.match(line)
        if not m:
            continue
        labels = {k: v for k, v in LABEL.findall(m.group(2) or "") if k != "server"}
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return out


def value(metrics, name, **labels):
    return metrics.get((name, frozenset((k, str(v)) for k, v in labels.items())))


def families(metrics, prefix):
    return {k[0] for k in metrics if k[0].startswith(prefix)}


# --- the fleets --------------------------------------------------------------

def setup(admin):
    for d in (DB, OTHER_DB):
        admin.execute(f"DROP DATABASE IF EXISTS {d} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {d}")
    # another database of the server with a fleet of its own: the exporter,
    # discovering every database, runs the queries on its DSN's only
    with connect(OTHER_DB) as o:
        o.execute("CREATE EXTENSION pg_claim")
        o.execute("CREATE TABLE elsewhere (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
        o.execute("SELECT define_fleet('elsewhere', 'elsewhere', 2, pending => 'done')")
    admin.execute(f"DROP ROLE IF EXISTS {MONITOR}")
    admin.execute(f"CREATE ROLE {MONITOR} LOGIN")
    c = connect()
    c.execute("CREATE EXTENSION pg_claim")
    c.execute("""CREATE TABLE jobs (id bigint PRIMARY KEY, created_at timestamptz NOT NULL,
                                    done boolean NOT NULL DEFAULT false)""")
    # ages from 0 to about an hour, a fifth of the rows done
    c.execute("""INSERT INTO jobs SELECT g, now() - (g * 7 % 3600) * interval '1 second', g % 5 = 0
                 FROM generate_series(1, 600) g""")
    c.execute("SELECT define_fleet('mailer', 'jobs', 4, pending => 'done', age => 'created_at')")
    c.execute("""CREATE TABLE tasks (id bigint PRIMARY KEY, payload text, finished_at timestamptz)""")
    c.execute("INSERT INTO tasks SELECT g, 'p', CASE WHEN g % 3 = 0 THEN now() END FROM generate_series(1, 300) g")
    c.execute("SELECT define_fleet('leased', 'tasks', 3, pending => 'finished_at')")
    # failures: a failing item in slot 2 of mailer, a dead one in slot 3
    # (each its slot's oldest pending row, so the slot's oldest claimable row
    # is another), a dead one of leased
    item = lambda tbl, n, slot, cond: c.execute(
        f"SELECT id FROM {tbl} WHERE slot_of(id, {n}) = {slot} AND {cond} "
        f"ORDER BY {'created_at' if tbl == 'jobs' else 'id'}, id LIMIT 1").fetchone()[0]
    c.execute("SELECT record_failure('mailer', %s::text, 'relay down')", (item("jobs", 4, 2, "NOT done"),))
    c.execute("SELECT record_failure('mailer', %s::text, 'bad address', 1)", (item("jobs", 4, 3, "NOT done"),))
    c.execute("SELECT record_failure('leased', %s::text, 'bad payload', 1)",
              (item("tasks", 3, 1, "finished_at IS NULL"),))
    # holders: two sessions of mailer (slots 0 and 1), two lease holders of leased (0 and 1)
    sessions = []
    for want in (0, 1):
        s = connect()
        check(s.execute("SELECT claim_slot('mailer', 4)").fetchone()[0] == want, f"session claims slot {want}")
        sessions.append(s)
    for holder in ("worker-a", "worker-b"):
        c.execute("SELECT * FROM claim_lease('leased', 3, %s, ttl => '10 minutes')", (holder,))
    # slot 2 of leased: a lease that expires at once, so the slot is unserved
    # since a known time
    c.execute("SELECT * FROM claim_lease('leased', 3, 'worker-c', ttl => '100 milliseconds')")
    return c, sessions


def expected(c):
    """The views, and the tables read directly, at the server's now()."""
    now = c.execute("SELECT extract(epoch FROM now())::float8").fetchone()[0]
    slots = c.execute("""SELECT fleet, slot, pending, extract(epoch FROM oldest)::float8, mode IS NOT NULL,
                                extract(epoch FROM unserved_since)::float8, failing, dead,
                                extract(epoch FROM claimable)::float8 FROM fleet_slots""").fetchall()
    fleets = c.execute("""SELECT fleet, n, holders, unserved, pending, extract(epoch FROM oldest)::float8,
                                 failing, dead, age, extract(epoch FROM claimable)::float8 FROM fleets""").fetchall()
    # from the tables themselves: each slot's pending rows, oldest row, and
    # oldest row that is neither dead nor waiting for a retry
    direct = {}
    for fleet, tbl, n, pred, age in (("mailer", "jobs", 4, "NOT done", "created_at"),
                                     ("leased", "tasks", 3, "finished_at IS NULL", None)):
        age_sql = f"extract(epoch FROM min(t.{age}))::float8" if age else "NULL::float8"
        claimable_sql = (f"extract(epoch FROM min(t.{age}) FILTER (WHERE t.id::text NOT IN "
                         f"(SELECT item FROM item_failures('{fleet}') WHERE state <> 'due')))::float8"
                         if age else "NULL::float8")
        for slot, k, oldest, claimable in c.execute(
                f"SELECT g, count(t.id), {age_sql}, {claimable_sql}"
                f" FROM generate_series(0, {n} - 1) g LEFT JOIN {tbl} t ON slot_of(t.id, {n}) = g AND {pred}"
                " GROUP BY g"):
            direct[(fleet, slot)] = (k, oldest, claimable)
    return now, slots, fleets, direct


def age_of(now, ts, pending):
    if pending is None:
        return math.nan
    if pending == 0:
        return 0.0
    return math.nan if ts is None else now - ts


def claimable_age(now, oldest, claimable, pending):
    """oldest_claimable_seconds as the queries define it: as the oldest
    pending row's age, but of the oldest claimable row; 0 when every pending
    row is dead or waiting for a retry."""
    if pending is None or pending == 0 or oldest is None:
        return age_of(now, oldest, pending)
    return 0.0 if claimable is None else now - claimable


def close(got, want, tol):
    if want is None or (isinstance(want, float) and math.isnan(want)):
        return got is not None and math.isnan(got)
    return got is not None and abs(got - want) <= tol


def compare(metrics, c, t0, phase):
    """Every exported value against the views (and the tables) read right
    after the scrape; ages within the time between the scrape and the read."""
    now, slots, fleets, direct = expected(c)
    tol = time.monotonic() - t0 + 1.0
    seen = set()
    for fleet, slot, pending, oldest, held, unserved_since, failing, dead, claimable in slots:
        if fleet not in ("mailer", "leased"):
            continue
        seen.add((fleet, slot))
        lab = dict(fleet=fleet, slot=slot)
        g = lambda m: value(metrics, "pg_claim_slot_" + m, **lab)
        where = f"{phase}: {fleet} slot {slot}"
        check(g("pending") == pending, f"{where}: pending {g('pending')}, view {pending}")
        check(g("pending") == direct[(fleet, slot)][0], f"{where}: pending {g('pending')}, table {direct[(fleet, slot)][0]}")
        check(close(g("oldest_pending_seconds"), age_of(now, oldest, pending), tol),
              f"{where}: oldest_pending_seconds {g('oldest_pending_seconds')}, view {age_of(now, oldest, pending)}")
        check(close(g("oldest_pending_seconds"), age_of(now, direct[(fleet, slot)][1], pending), tol),
              f"{where}: oldest_pending_seconds {g('oldest_pending_seconds')}, table {direct[(fleet, slot)][1]}")
        want_claimable = claimable_age(now, oldest, claimable, pending)
        check(close(g("oldest_claimable_seconds"), want_claimable, tol),
              f"{where}: oldest_claimable_seconds {g('oldest_claimable_seconds')}, view {want_claimable}")
        direct_claimable = claimable_age(now, direct[(fleet, slot)][1], direct[(fleet, slot)][2], pending)
        check(close(g("oldest_claimable_seconds"), direct_claimable, tol),
              f"{where}: oldest_claimable_seconds {g('oldest_claimable_seconds')}, table {direct_claimable}")
        check(g("holder_present") == (1.0 if held else 0.0), f"{where}: holder_present {g('holder_present')}, view {held}")
        want_unserved = 0.0 if held else (math.nan if unserved_since is None else now - unserved_since)
        check(close(g("unserved_seconds"), want_unserved, tol),
              f"{where}: unserved_seconds {g('unserved_seconds')}, view {want_unserved}")
        check(g("failing_items") == failing, f"{where}: failing_items {g('failing_items')}, view {failing}")
        check(g("dead_items") == dead, f"{where}: dead_items {g('dead_items')}, view {dead}")
    for fleet, n, holders, unserved, pending, oldest, failing, dead, age, claimable in fleets:
        if fleet not in ("mailer", "leased"):
            continue
        g = lambda m: value(metrics, "pg_claim_fleet_" + m, fleet=fleet)
        where = f"{phase}: fleet {fleet}"
        check(g("slots") == n, f"{where}: slots {g('slots')}, view {n}")
        check(g("holders") == holders, f"{where}: holders {g('holders')}, view {holders}")
        check(g("unserved_slots") == unserved, f"{where}: unserved_slots {g('unserved_slots')}, view {unserved}")
        check(g("pending_items") == pending, f"{where}: pending_items {g('pending_items')}, view {pending}")
        check(g("pending_items") == sum(k for (f, _), (k, _, _) in direct.items() if f == fleet),
              f"{where}: pending_items {g('pending_items')}, table")
        check(close(g("oldest_pending_seconds"), age_of(now, oldest, pending), tol),
              f"{where}: oldest_pending_seconds {g('oldest_pending_seconds')}, view {age_of(now, oldest, pending)}")
        want_claimable = claimable_age(now, oldest, claimable, pending)
        check(close(g("oldest_claimable_seconds"), want_claimable, tol),
              f"{where}: oldest_claimable_seconds {g('oldest_claimable_seconds')}, view {want_claimable}")
        check(g("failing_items") == failing, f"{where}: failing_items {g('failing_items')}, view {failing}")
        check(g("dead_items") == dead, f"{where}: dead_items {g('dead_items')}, view {dead}")
    return now, slots, fleets


def test_exporter_shows_what_the_views_say():
    """The four steps above; the scrape after each change."""
    for tool in ("prometheus-postgres-exporter", "promtool"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is not installed (scripts/lib.sh installs it with apt)")
    t_start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="pg_claim_exporter.")
    admin = connect("postgres")
    c, sessions = setup(admin)
    exporters = []
    try:
        e = Exporter("postgres", tmp, ["--auto-discover-databases"])
        exporters.append(e)
        want = {"pg_claim_slot_" + m for m in SLOT_METRICS} | {"pg_claim_fleet_" + m for m in FLEET_METRICS}

        # 1. every metric of both fleets, each value as the views and tables say
        t0 = time.monotonic()
        text, m = e.poll(lambda m: want <= families(m, "pg_claim_")
                         and value(m, "pg_claim_fleet_slots", fleet="leased") is not None
                         and value(m, "pg_claim_slot_holder_present", fleet="leased", slot=2) == 0.0,
                         "both fleets, the expired lease")
        check(families(m, "pg_claim_") == want, f"metric names: {sorted(families(m, 'pg_claim_'))}")
        for name in want:
            check(m.get(("#TYPE", name)) == "gauge", f"{name} is a gauge: {m.get(('#TYPE', name))}")
        check(value(m, "pg_exporter_last_scrape_error") == 0.0, "pg_exporter_last_scrape_error is 0")
        check(value(m, "pg_claim_fleet_slots", fleet="elsewhere") is None,
              "master: true: another database's fleet is not scraped")
        check(sorted({dict(k[1]).get("fleet") for k in m if k[0].startswith("pg_claim_")}) == ["leased", "mailer"],
              "only the fleets of the DSN's database")
        check(any(k[0] == "pg_exporter_user_queries_load_error" and v == 0.0 for k, v in m.items() if k[0] != "#TYPE"),
              "the query file loaded (pg_exporter_user_queries_load_error 0)")
        now, slots, fleets = compare(m, c, t0, "first scrape")
        # what this set-up makes, whatever the views say
        check(value(m, "pg_claim_slot_holder_present", fleet="mailer", slot=1) == 1.0, "mailer slot 1 held")
        check(value(m, "pg_claim_slot_holder_present", fleet="mailer", slot=2) == 0.0, "mailer slot 2 unserved")
        check(value(m, "pg_claim_slot_failing_items", fleet="mailer", slot=2) == 1.0, "mailer slot 2 failing 1")
        check(value(m, "pg_claim_slot_dead_items", fleet="mailer", slot=3) == 1.0, "mailer slot 3 dead 1")
        check(value(m, "pg_claim_fleet_holders", fleet="mailer") == 2.0, "mailer: 2 holders")
        check(value(m, "pg_claim_fleet_holders", fleet="leased") == 2.0, "leased: 2 holders")
        check(value(m, "pg_claim_fleet_unserved_slots", fleet="leased") == 1.0, "leased: 1 unserved")
        check(value(m, "pg_claim_fleet_dead_items", fleet="leased") == 1.0, "leased: 1 dead")
        check(value(m, "pg_claim_slot_oldest_pending_seconds", fleet="mailer", slot=0) > 600,
              "mailer slot 0: oldest pending over 10 minutes")
        check(math.isnan(value(m, "pg_claim_slot_oldest_pending_seconds", fleet="leased", slot=2)),
              "leased (no age column): oldest pending NaN")
        for slot in (2, 3):  # a failing and a dead item, each the slot's oldest row
            check(value(m, "pg_claim_slot_oldest_claimable_seconds", fleet="mailer", slot=slot)
                  < value(m, "pg_claim_slot_oldest_pending_seconds", fleet="mailer", slot=slot),
                  f"mailer slot {slot}: the oldest claimable row is younger than the oldest pending (its item)")
        check(math.isnan(value(m, "pg_claim_slot_oldest_claimable_seconds", fleet="leased", slot=2)),
              "leased (no age column): oldest claimable NaN")
        expired = c.execute("SELECT extract(epoch FROM now() - expires_at)::float8 FROM lease_holders('leased')"
                            " WHERE holder = 'worker-c'").fetchone()[0]
        check(0 < value(m, "pg_claim_slot_unserved_seconds", fleet="leased", slot=2) <= expired,
              f"leased slot 2: unserved since its lease expired ({expired:.1f} s ago)")
        print(f"first scrape: {len(slots)} slots, {len(fleets)} fleets checked", flush=True)
        with open(os.path.join(tmp, "scrape.txt"), "w") as f:
            f.write(text)

        # 2. the fleets change; the exporter follows with no edit or restart
        c.execute("SELECT define_fleet('late', 'jobs', 2, pending => 'done', age => 'created_at')")
        sessions[1].close()  # mailer slot 1 loses its holder
        c.execute("UPDATE jobs SET done = true WHERE slot_of(id, 4) = 0")
        t0 = time.monotonic()
        text2, m = e.poll(lambda m: value(m, "pg_claim_fleet_slots", fleet="late") == 2.0
                          and value(m, "pg_claim_slot_holder_present", fleet="mailer", slot=1) == 0.0
                          and value(m, "pg_claim_slot_pending", fleet="mailer", slot=0) == 0.0,
                          "the new fleet, the lost holder and the done share")
        compare(m, c, t0, "after the changes")
        check(value(m, "pg_claim_slot_oldest_pending_seconds", fleet="mailer", slot=0) == 0.0,
              "a done share: oldest pending 0")
        # a session's end leaves no record of when: NaN (compare() checked it against the view)
        check(math.isnan(value(m, "pg_claim_slot_unserved_seconds", fleet="mailer", slot=1)),
              "the slot whose session ended: unserved_seconds NaN")
        check(value(m, "pg_claim_fleet_holders", fleet="mailer") == 1.0, "mailer: 1 holder left")
        late = c.execute("SELECT count(*) FROM jobs WHERE NOT done").fetchone()[0]
        check(value(m, "pg_claim_fleet_pending_items", fleet="late") == late, "late: pending of the whole table")
        c.execute("SELECT drop_fleet('late')")
        e.poll(lambda m: value(m, "pg_claim_fleet_slots", fleet="late") is None
               and value(m, "pg_claim_slot_pending", fleet="late", slot=0) is None
               and value(m, "pg_claim_fleet_slots", fleet="mailer") == 4.0, "the dropped fleet gone")
        print("changes: a defined fleet appears, a lost holder and a done share show, a dropped fleet goes",
              flush=True)

        # 3. a role without SELECT on the tables: NaN backlog, the rest as for the owner
        c.execute(f"GRANT USAGE ON SCHEMA public TO {MONITOR}")
        r = Exporter(MONITOR, tmp)
        exporters.append(r)
        _, m = r.poll(lambda m: value(m, "pg_claim_fleet_slots", fleet="mailer") is not None
                      or value(m, "pg_exporter_last_scrape_error") == 1.0, "the monitor role's scrape")
        if check(value(m, "pg_claim_fleet_slots", fleet="mailer") == 4.0,
                 f"a role without SELECT on the table scrapes the fleets:\n{open(r.log).read()[-2000:]}"):
            check(math.isnan(value(m, "pg_claim_slot_pending", fleet="mailer", slot=2)),
                  "no SELECT on the table: pending NaN")
            check(math.isnan(value(m, "pg_claim_slot_oldest_pending_seconds", fleet="mailer", slot=2)),
                  "no SELECT on the table: oldest NaN")
            check(math.isnan(value(m, "pg_claim_fleet_pending_items", fleet="mailer")),
                  "no SELECT on the table: fleet pending NaN")
            check(value(m, "pg_claim_slot_holder_present", fleet="mailer", slot=0) == 1.0,
                  "no SELECT on the table: holders still shown")
            # a lease of another role: its holder is hidden, the slot still held
            check(value(m, "pg_claim_slot_holder_present", fleet="leased", slot=0) == 1.0,
                  "another role's lease: holder_present 1")
            check(value(m, "pg_claim_fleet_unserved_slots", fleet="leased") == 1.0,
                  "another role's leases: unserved_slots counts every slot")
            print("a role without SELECT on the table: NaN backlog, holders shown", flush=True)

        # 4. promtool: the scrape's pg_claim families lint clean, the rules check, their unit tests pass
        ours = "\n".join(l for l in text.splitlines() if re.match(r"^(# (HELP|TYPE) )?pg_claim_", l)) + "\n"
        p = subprocess.run(["promtool", "check", "metrics"], input=ours, capture_output=True, text=True)
        check(p.returncode == 0, f"promtool check metrics: {p.stdout}{p.stderr}")
        p = subprocess.run(["promtool", "check", "rules", ALERTS], capture_output=True, text=True)
        check(p.returncode == 0 and "SUCCESS" in p.stdout, f"promtool check rules: {p.stdout}{p.stderr}")
        p = subprocess.run(["promtool", "test", "rules", os.path.basename(ALERT_TESTS)],
                           cwd=os.path.dirname(ALERT_TESTS), capture_output=True, text=True)
        check(p.returncode == 0 and "SUCCESS" in p.stdout, f"promtool test rules: {p.stdout}{p.stderr}")
        print("promtool: metrics lint clean, rules checked, rule unit tests passed", flush=True)
    finally:
        for e in exporters:
            e.stop()
        for s in sessions:
            s.close()
        c.close()
        for d in (DB, OTHER_DB):
            admin.execute(f"DROP DATABASE IF EXISTS {d} WITH (FORCE)")
        admin.execute(f"DROP ROLE IF EXISTS {MONITOR}")
        admin.close()
        shutil.rmtree(tmp, ignore_errors=True)
    harness.log(f"exporter: {len(check.failed) or 'no'} expectations failed, {time.monotonic() - t_start:.1f} s")
    check.verify()
