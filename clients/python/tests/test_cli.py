"""The pg-claim command (pg_claim.cli) against a real server (PGHOST, PGPORT,
PGUSER: the scripts/test cluster), in a database of its own: its output
checked against the views fleet_slots and fleets; the state file of the
rates; the errors; top once, bounded, on a terminal and ended with Ctrl-C.
The pure parts run without a server."""
import datetime
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from pg_claim import cli

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
DB = "py_cli_test"
NOEXT = "py_cli_noext"
DSN = f"dbname={DB}"


def connect(dbname=DB):
    return psycopg.connect(dbname=dbname, autocommit=True)


@pytest.fixture(scope="module")
def db():
    try:
        with connect("postgres") as c:
            for d in (DB, NOEXT):
                c.execute(f"DROP DATABASE IF EXISTS {d} WITH (FORCE)")
                c.execute(f"CREATE DATABASE {d}")
    except psycopg.OperationalError as e:
        pytest.skip(f"no server: {e}")
    c = connect()
    c.execute("CREATE EXTENSION pg_claim")
    c.execute("CREATE TABLE outbox (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, sent_at timestamptz)")
    c.execute("INSERT INTO outbox SELECT g, now() - (g % 50) * interval '1 minute', NULL"
              " FROM generate_series(1, 400) g")
    c.execute("SELECT define_fleet('mailer', 'outbox', 4, pending => 'sent_at', age => 'created_at')")
    c.execute("SELECT define_fleet('billing', 'outbox', 2, pending => 'sent_at')")
    # a session holder of slot 0, a failing item of slot 1 and a dead one of slot 2
    holder = connect()
    assert holder.execute("SELECT claim_slot('mailer', 4)").fetchone()[0] == 0
    c.execute("SELECT record_failure('mailer', '5', 'relay down')")   # 5 % 4 = 1
    c.execute("SELECT record_failure('mailer', '6', 'bad address', 1)")  # 6 % 4 = 2
    yield c
    holder.close()
    c.close()
    with connect("postgres") as c:
        for d in (DB, NOEXT):
            c.execute(f"DROP DATABASE IF EXISTS {d} WITH (FORCE)")


@pytest.fixture
def state(tmp_path):
    return str(tmp_path / "state")


def run(*args, state=None, timeout=30):
    env = dict(os.environ, PYTHONPATH=SRC)
    if state:
        env["XDG_STATE_HOME"] = state
    return subprocess.run([sys.executable, "-m", "pg_claim", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def view_slots(db, fleet):
    return db.execute("SELECT slot, holder, mode, pending, oldest, failing, dead FROM fleet_slots"
                      " WHERE fleet = %s ORDER BY slot", (fleet,)).fetchall()


# --- the pure parts ------------------------------------------------------------

def test_ages_and_rates_are_formatted():
    d = datetime.timedelta
    assert [cli.fmt_age(x) for x in (None, d(seconds=-3), d(seconds=59), d(seconds=61), d(hours=2, minutes=5),
                                     d(days=3, hours=4))] == ["-", "0s", "59s", "1m01s", "2h05m", "3d04h"]
    assert [cli.fmt_rate(x) for x in (None, 0, 2.25, -7.5, 1234.4)] == ["-", "0.0", "2.2", "-7.5", "1,234"]
    assert cli.fmt_int(None) == "?" and cli.fmt_int(1234567) == "1,234,567"


def test_rates_come_from_the_fall_of_pending():
    slots = [{"slot": 0, "pending": 60, "now": 110.0}, {"slot": 1, "pending": 30, "now": 110.0},
             {"slot": 2, "pending": None, "now": 110.0}, {"slot": 3, "pending": 5, "now": 110.0}]
    prev = {"at": 100.0, "pending": {"0": 100, "1": 10, "2": 7}}
    assert cli.rates(slots, prev) == {0: 4.0, 1: -2.0, 2: None, 3: None}
    assert cli.rates(slots, None) == {0: None, 1: None, 2: None, 3: None}
    assert cli.rates(slots, {"at": 110.0, "pending": {"0": 1}})[0] is None  # no time passed


def test_the_state_file_follows_xdg_state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert cli.state_path() == str(tmp_path / "pg-claim" / "readings.json")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cli.state_path() == str(tmp_path / "home" / ".local" / "state" / "pg-claim" / "readings.json")


def test_the_entry_point_is_the_cli_main():
    with open(os.path.join(os.path.dirname(HERE), "pyproject.toml")) as f:
        text = f.read()
    assert re.search(r'^\[project\.scripts\]\npg-claim = "pg_claim\.cli:main"$', text, re.M)
    assert callable(cli.main)


def test_usage_errors_exit_2():
    p = run("status", "only-a-dsn")
    assert p.returncode == 2 and "FLEET" in p.stderr
    p = run("top", "--interval", "0", DSN, "mailer")
    assert p.returncode == 2 and "--interval must be more than 0" in p.stderr


# --- against the server --------------------------------------------------------

def test_status_json_is_the_view(db):
    p = run("status", "--json", DSN, "mailer")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert [sorted(o) for o in got] == [sorted(["slot", "holder", "mode", "pending", "oldest", "failing", "dead"])] * 4
    want = view_slots(db, "mailer")
    assert [(o["slot"], o["holder"], o["mode"], o["pending"],
             datetime.datetime.fromisoformat(o["oldest"]) if o["oldest"] else None, o["failing"], o["dead"])
            for o in got] == want
    # what the fixture made, whatever the view says
    assert got[0]["mode"] == "session" and got[1]["mode"] is None
    assert (got[1]["failing"], got[2]["dead"]) == (1, 1)
    assert sum(o["pending"] for o in got) == db.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()[0]


def test_status_table_is_the_view(db, state):
    p = run("status", DSN, "mailer", state=state)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    f = db.execute("SELECT n, holders, unserved, pending, failing, dead FROM fleets WHERE fleet = 'mailer'").fetchone()
    assert lines[0].startswith(f"fleet mailer: table outbox, n {f[0]}, {f[1]} holder(s), {f[2]} unserved, "
                               f"{f[3]:,} pending, oldest ")
    assert lines[0].endswith(f"{f[4]} failing, {f[5]} dead")
    assert lines[1].split() == ["slot", "holder", "mode", "pending", "oldest", "rate/s", "failing", "dead"]
    rows = lines[2:]
    want = view_slots(db, "mailer")
    assert len(rows) == len(want) == 4
    for line, (slot, holder, mode, pending, oldest, failing, dead) in zip(rows, want):
        cells = line.split()
        # slot, holder (one word, or "unserved AGE"), mode, pending, oldest, rate, failing, dead
        assert cells[0] == str(slot)
        assert cells[-5:] == [f"{pending:,}", cells[-4], "-", str(failing), str(dead)], line
        assert re.fullmatch(r"\d+m\d\ds|\d+s", cells[-4]), line  # oldest (minutes old)
        if mode is None:
            assert cells[1] == "unserved" and cells[-6] == "-", line
        else:
            assert " ".join(cells[1:-6]) == holder and cells[-6] == mode, line


def test_status_rate_since_the_previous_call(db, state):
    p = run("status", DSN, "mailer", state=state)
    assert p.returncode == 0, p.stderr
    assert all(line.split()[-3] == "-" for line in p.stdout.splitlines()[2:])  # the first call: no rate
    path = os.path.join(state, "pg-claim", "readings.json")
    before = json.load(open(path))
    (key,) = before
    assert key.endswith(f"/{DB}/mailer")
    db.execute("UPDATE outbox SET sent_at = now() WHERE id IN (SELECT id FROM outbox"
               " WHERE id % 4 = 3 AND sent_at IS NULL ORDER BY id LIMIT 40)")
    try:
        p = run("status", DSN, "mailer", state=state)
        assert p.returncode == 0, p.stderr
        after = json.load(open(path))[key]
        dt = after["at"] - before[key]["at"]
        rates = [line.split()[-3] for line in p.stdout.splitlines()[2:]]
        assert rates[:3] == ["0.0"] * 3
        assert rates[3] == cli.fmt_rate(40 / dt) and 40 / dt > 0
        assert before[key]["pending"]["3"] - after["pending"]["3"] == 40
    finally:
        db.execute("UPDATE outbox SET sent_at = NULL")


def test_the_state_file_keeps_no_password(db, state):
    p = run("status", f"{DSN} password=s3cret-pw", "mailer", state=state)
    assert p.returncode == 0, p.stderr
    assert "s3cret-pw" not in open(os.path.join(state, "pg-claim", "readings.json")).read()


def test_fleets_lists_the_view(db):
    p = run("fleets", DSN)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["fleet", "table", "n", "holders", "unserved", "pending", "oldest", "failing", "dead"]
    want = db.execute("SELECT fleet, tbl::text, n, holders, unserved, pending, failing, dead FROM fleets"
                      " ORDER BY fleet").fetchall()
    assert [line.split()[0] for line in lines[1:]] == [w[0] for w in want] == ["billing", "mailer"]
    for line, w in zip(lines[1:], want):
        cells = line.split()
        assert cells[:6] == [w[0], w[1], str(w[2]), str(w[3]), str(w[4]), f"{w[5]:,}"]
        assert cells[-2:] == [str(w[6]), str(w[7])]
    got = json.loads(run("fleets", "--json", DSN).stdout)
    assert [(o["fleet"], o["table"], o["n"], o["holders"], o["unserved"], o["pending"], o["failing"], o["dead"])
            for o in got] == want
    # billing has no age column
    assert [o["age"] for o in got] == [None, "created_at"]


def test_a_fleet_not_defined_exits_2_naming_it(db):
    p = run("status", DSN, "nope")
    assert p.returncode == 2
    assert f'fleet "nope" is not defined in database "{DB}"' in p.stderr
    assert "define_fleet('nope'" in p.stderr and "Traceback" not in p.stderr
    p = run("top", "--once", DSN, "nope")
    assert p.returncode == 2 and 'fleet "nope" is not defined' in p.stderr


def test_pg_claim_not_installed(db):
    p = run("fleets", f"dbname={NOEXT}")
    assert p.returncode == 1
    assert f'pg_claim is not installed in database "{NOEXT}"' in p.stderr and "CREATE EXTENSION pg_claim" in p.stderr


def test_cannot_connect(db):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    p = run("status", f"host=127.0.0.1 port={port} dbname={DB} connect_timeout=5", "mailer")
    assert p.returncode == 1
    assert p.stderr.startswith("pg-claim: cannot connect: ") and "Traceback" not in p.stderr
    p = run("fleets", "host=127.0.0.1 port=notaport")
    assert p.returncode == 1 and "cannot connect" in p.stderr and "Traceback" not in p.stderr
    p = run("fleets", "not a conninfo")  # malformed: a usage error
    assert p.returncode == 2 and "cannot connect" in p.stderr and "connection string" in p.stderr


def frames(text):
    return [f for f in text.split("\n\n") if f.strip()]


def test_top_once(db, state):
    p = run("top", "--once", DSN, "mailer", state=state)
    assert p.returncode == 0, p.stderr
    (frame,) = frames(p.stdout)
    lines = frame.splitlines()
    assert lines[0].startswith("fleet mailer: table outbox, n 4")
    assert re.match(r"\d\d:\d\d:\d\d UTC  fleet rate - items/s", lines[1])
    want = view_slots(db, "mailer")
    bars = lines[2:]
    assert len(bars) == 4
    most = max(w[3] for w in want)
    for line, w in zip(bars, want):
        m = re.match(r"slot (\d) \[(#*)(\.*)\] +([\d,]+) oldest +\S+ +(\S+)/s  (.*)$", line)
        assert m, line
        assert int(m.group(1)) == w[0] and int(m.group(4).replace(",", "")) == w[3]
        width = len(m.group(2)) + len(m.group(3))
        assert len(m.group(2)) == round(width * w[3] / most)  # the bar is the backlog
        assert m.group(6) == (f"{w[1]} ({w[2]})" if w[2] else "unserved") or m.group(6).startswith("unserved")


def test_top_bounded_run_shows_the_fleet_rate(db, state):
    p = run("top", "--count", "3", "--interval", "0.3", DSN, "mailer", state=state)
    assert p.returncode == 0, p.stderr
    got = frames(p.stdout)
    assert len(got) == 3
    assert "fleet rate - items/s" in got[0]
    assert "fleet rate 0.0 items/s" in got[1]  # nothing changed in between


def test_top_on_a_terminal_redraws_in_place(db, state):
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=SRC, XDG_STATE_HOME=state)
    p = subprocess.Popen([sys.executable, "-m", "pg_claim", "top", "--count", "2", "--interval", "0.2", DSN,
                          "mailer"], stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    assert p.wait(10) == 0, p.stderr.read()
    text = out.decode()
    # the second frame moves up over the first (its 6 lines) and clears below
    assert text.count("fleet mailer:") == 2 and "\x1b[6A\x1b[J" in text


def test_top_ends_cleanly_on_ctrl_c(db, state):
    env = dict(os.environ, PYTHONPATH=SRC, XDG_STATE_HOME=state)
    p = subprocess.Popen([sys.executable, "-m", "pg_claim", "top", "--interval", "0.2", DSN, "mailer"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().startswith("fleet mailer:")  # the first frame is out
        p.send_signal(signal.SIGINT)
        rc = p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read()
    assert rc == 0 and "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_another_roles_lease_is_held_but_not_named(db):
    roles = ("cli_lessor", "cli_viewer")
    for r in roles:
        db.execute(f"DROP ROLE IF EXISTS {r}")
        db.execute(f"CREATE ROLE {r} LOGIN")
    db.execute("GRANT SELECT ON outbox TO cli_viewer")
    db.execute("SELECT define_fleet('leasy', 'outbox', 2, pending => 'sent_at')")
    try:
        with psycopg.connect(dbname=DB, user="cli_lessor", autocommit=True) as lessor:
            assert lessor.execute("SELECT slot FROM claim_lease('leasy', 2, 'hidden-holder')").fetchone()[0] == 0
        viewer = f"dbname={DB} user=cli_viewer"
        got = json.loads(run("status", "--json", viewer, "leasy").stdout)
        assert [(o["slot"], o["mode"], o["holder"]) for o in got] == [(0, "lease", None), (1, None, None)]
        p = run("status", viewer, "leasy")
        assert p.returncode == 0, p.stderr
        assert "0 holder(s), 1 unserved" in p.stdout.splitlines()[0]
        assert p.stdout.splitlines()[2].split()[1:3] == ["(not", "visible)"]
        # the owner of the lease's role sees it
        assert json.loads(run("status", "--json", DSN, "leasy").stdout)[0]["holder"] == "hidden-holder"
        # a role that may not read the table: the backlog is unknown, the rest is there
        db.execute("REVOKE SELECT ON outbox FROM cli_viewer")
        got = json.loads(run("status", "--json", viewer, "leasy").stdout)
        assert [(o["pending"], o["oldest"], o["mode"]) for o in got] == [(None, None, "lease"), (None, None, None)]
        p = run("status", viewer, "leasy")
        assert "? pending" in p.stdout.splitlines()[0]
        assert [line.split()[-5] for line in p.stdout.splitlines()[2:]] == ["?", "?"]
    finally:
        db.execute("SELECT drop_fleet('leasy')")
        for r in roles:
            db.execute(f"DROP OWNED BY {r}")
            db.execute(f"DROP ROLE {r}")


def test_top_ends_quietly_when_its_reader_goes(db, state):
    env = dict(os.environ, PYTHONPATH=SRC, XDG_STATE_HOME=state)
    p = subprocess.Popen([sys.executable, "-m", "pg_claim", "top", "--count", "100", "--interval", "0.05", DSN,
                          "mailer"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert p.stdout.readline().startswith(b"fleet mailer:")
        p.stdout.close()  # as `pg-claim top | head -1` does
        rc = p.wait(20)
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read().decode()
    assert rc == 0 and err == "", err


# --- names with control characters; the portable edition ---------------------

EVIL = "py_cli_evil"
PORTABLE = "py_cli_portable"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


@pytest.fixture(scope="module")
def fresh():
    """Databases made for one test each, dropped at the end."""
    made = []

    def make(name):
        with connect("postgres") as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return connect(name)
    try:
        connect("postgres").close()
    except psycopg.OperationalError as e:
        pytest.skip(f"no server: {e}")
    yield make
    with connect("postgres") as c:
        for name in made:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_names_and_holders_are_escaped(fresh, state):
    """A fleet named with ESC [2J (clear the screen) and a newline, on a table
    with an ESC in its name, held by a holder text that recolours: every
    output shows them escaped, never raw."""
    c = fresh(EVIL)
    c.execute("CREATE EXTENSION pg_claim")
    c.execute('CREATE TABLE "tbl\x1b[2J" (id int PRIMARY KEY, done boolean NOT NULL DEFAULT false)')
    c.execute('INSERT INTO "tbl\x1b[2J" SELECT g FROM generate_series(1, 10) g')
    name = "evil\x1b[2J\nname\t\u202e"
    c.execute("SELECT define_fleet(%s, %s, 2, pending => 'done')", (name, '"tbl\x1b[2J"'))
    c.execute("SELECT count(*) FROM claim_leases(%s, 2, %s, ttl => '1 hour')", (name, "host\x1b[31m:1\r"))
    shown = "evil\\x1b[2J\\nname\\t\\u202e"
    dsn = f"dbname={EVIL}"
    outs = [run("fleets", dsn), run("status", dsn, name, state=state), run("top", "--once", dsn, name, state=state),
            run("status", dsn, name + "x")]
    for p in outs:
        assert "\x1b" not in p.stdout + p.stderr and "\u202e" not in p.stdout + p.stderr, p
        assert "\r" not in p.stdout + p.stderr
    assert outs[0].returncode == 0 and shown in outs[0].stdout and "tbl\\x1b[2J" in outs[0].stdout
    assert len(outs[0].stdout.splitlines()) == 2  # the header and one line: the newline is escaped
    for p in outs[1:3]:
        assert p.returncode == 0, p.stderr
        assert f"fleet {shown}: table " in p.stdout and "host\\x1b[31m:1\\r" in p.stdout
    assert outs[3].returncode == 2 and f'fleet "{shown}x" is not defined' in outs[3].stderr
    # JSON keeps the names as they are (JSON escapes them itself)
    p = run("fleets", "--json", dsn)
    assert json.loads(p.stdout)[0]["fleet"] == name and "\x1b" not in p.stdout


def test_the_portable_edition_is_found(fresh, state, tmp_path):
    """A database with the portable edition (scripts/portable's file run with
    search_path = claim, no CREATE EXTENSION): fleets, status and top read its
    views, whether or not the caller's search_path has its schema."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "portable"), "--out", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout.split()[0]
    c = fresh(PORTABLE)
    c.execute("CREATE SCHEMA claim")
    c.execute("SET search_path = claim")
    c.execute(open(out, encoding="utf-8").read())
    c.execute("SET search_path = public, claim")
    assert c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pg_claim'").fetchone()[0] == 0
    c.execute("CREATE TABLE jobs (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
    c.execute("INSERT INTO jobs SELECT g FROM generate_series(1, 100) g")
    c.execute("SELECT define_fleet('jobs', 'public.jobs', 4, pending => 'done')")
    c.execute("SELECT count(*) FROM claim_leases('jobs', 4, 'w1', ttl => '1 hour')")
    want = c.execute("SELECT slot, holder, pending FROM fleet_slots WHERE fleet = 'jobs' ORDER BY slot").fetchall()
    assert sum(w[2] for w in want) == 100
    for dsn in (f"dbname={PORTABLE}", f"dbname={PORTABLE} options='-c search_path=claim'"):
        p = run("fleets", dsn)
        assert p.returncode == 0, p.stderr
        assert re.search(r"^jobs +(public\.)?jobs +4 +1 +0 +100 ", p.stdout, re.M), p.stdout
        p = run("status", "--json", dsn, "jobs")
        assert p.returncode == 0, p.stderr
        assert [(o["slot"], o["holder"], o["pending"]) for o in json.loads(p.stdout)] == want
        p = run("top", "--once", dsn, "jobs", state=state)
        assert p.returncode == 0 and re.match(r"fleet jobs: table (public\.)?jobs, n 4", p.stdout), p.stderr
