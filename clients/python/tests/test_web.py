"""`pg-claim web` over plain HTTP (urllib) against a real server (PGHOST,
PGPORT, PGUSER: the scripts/test cluster), in a database of its own: the
address and token rules, the Host check, the headers, the errors, the
actions' refusals and outcomes, SIGTERM. The browser checks (a live fleet,
planted scripts, JavaScript off) are the web layer's (tests/web). The pure
parts (samples, the plot, escaping) run without a server."""
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import psycopg
import pytest

from pg_claim import _web, _web_data, _web_pages

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
DB = "py_web_test"
DSN = f"dbname={DB}"


# --- the pure parts --------------------------------------------------------------

def test_values_are_escaped_for_html():
    assert _web_pages.esc("<script>a&b</script>\x1b\"'") == "&lt;script&gt;a&amp;b&lt;/script&gt;\\x1b&quot;&#x27;"
    assert _web_pages.esc(None) == ""
    assert _web_pages.fleet_href("a b&c") == "/fleet?name=a+b%26c"


def test_samples_give_rates_and_a_series():
    s = _web_data.Samples()
    slots = lambda t, a, b: [{"slot": 0, "pending": a, "now": t}, {"slot": 1, "pending": b, "now": t}]  # noqa: E731
    assert s.add("k", slots(100.0, 50, 10)) == {0: None, 1: None}
    assert s.add("k", slots(102.0, 40, 10)) == {0: 5.0, 1: 0.0}
    # within a second of the last sample: the rate since the one before, no new sample
    assert s.add("k", slots(102.5, 38, 10)) == {0: 12 / 2.5, 1: 0.0}
    assert s.series("k") == [(0.0, 5.0)]
    s.add("k", slots(104.0, 30, 8))
    assert s.series("k") == [(2.0, 5.0), (0.0, 6.0)]
    assert s.series("other") == []


def test_the_plot_is_numbers_only():
    svg = _web_pages.rate_svg([(4.0, 10.0), (2.0, -3.0), (0.0, 7.5)])
    assert svg.startswith("<svg id=\"rate-plot\"") and svg.count("<polyline") == 1
    pts = re.search(r'points="([^"]*)"', svg).group(1).split()
    assert len(pts) == 3 and all(re.fullmatch(r"[\d.]+,[\d.]+", p) for p in pts)
    assert "rate-empty" in _web_pages.rate_svg([(0.0, 1.0)])


def test_backlog_levels():
    assert [_web_pages.level(p, 100) for p in (None, 0, 1, 25, 50, 100)] == ["bq", "b0", "b1", "b2", "b3", "b5"]


def test_loopback_addresses():
    assert all(_web.is_loopback(a) for a in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(_web.is_loopback(a) for a in ("0.0.0.0", "::", "10.1.2.3", "db.example.com"))


# --- against the server ----------------------------------------------------------

@pytest.fixture(scope="module")
def db():
    try:
        with psycopg.connect(dbname="postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {DB}")
    except psycopg.OperationalError as e:
        pytest.skip(f"no server: {e}")
    c = psycopg.connect(dbname=DB, autocommit=True)
    c.execute("CREATE EXTENSION pg_claim")
    c.execute("CREATE TABLE jobs (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
    c.execute("INSERT INTO jobs SELECT g, false FROM generate_series(1, 40) g")
    c.execute("SELECT define_fleet('jobs', 'jobs', 4, pending => 'done')")
    c.execute("SELECT count(*) FROM claim_leases('jobs', 4, 'h1', ttl => '1 hour')")
    c.execute("SELECT record_failure('jobs', '3', 'boom', 5, '1 hour')")
    yield c
    c.close()
    with psycopg.connect(dbname="postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def start(*args, env=None, dsn=DSN):
    e = dict(os.environ, PYTHONPATH=SRC)
    e.pop(_web.TOKEN_ENV, None)
    e.update(env or {})
    p = subprocess.Popen([sys.executable, "-m", "pg_claim", "web", "--port", "0", *args, dsn],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    line = p.stdout.readline()
    assert line.startswith("pg-claim web: http://"), (line, p.stderr.read() if p.poll() is not None else "")
    return p, line.split()[2].rstrip("/")


@pytest.fixture
def server(db):
    made = []

    def make(*args, **kw):
        p, url = start(*args, **kw)
        made.append(p)
        return url
    yield make
    for p in made:
        p.terminate()
        assert p.wait(10) == 0


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **kw):
        return None


def get(url, headers=None, data=None):
    """(status, headers, body) of one request; redirects not followed."""
    req = urllib.request.Request(url, data=data.encode() if isinstance(data, str) else data, headers=headers or {})
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=10) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def csrf_of(body):
    return re.search(r'name="csrf" value="([^"]+)"', body).group(1)


def test_another_address_needs_a_token(db):
    env = dict(os.environ, PYTHONPATH=SRC)
    env.pop(_web.TOKEN_ENV, None)
    p = subprocess.run([sys.executable, "-m", "pg_claim", "web", "--bind", "0.0.0.0", "--port", "0", DSN],
                       capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 2 and "--bind 0.0.0.0 is not a loopback address: a token is required" in p.stderr
    assert "hint: pass --token TOKEN (or set PG_CLAIM_WEB_TOKEN)" in p.stderr
    p = subprocess.run([sys.executable, "-m", "pg_claim", "web", "--port", "70000", DSN],
                       capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 2 and "--port must be from 0 to 65535, got 70000" in p.stderr


def test_a_token_guards_every_request(server):
    url = server("--bind", "0.0.0.0", env={_web.TOKEN_ENV: "s3cret"})
    url = url.replace("0.0.0.0", "127.0.0.1")
    status, _, body = get(url + "/")
    assert status == 401 and "token required" in body
    assert get(url + "/?token=wrong")[0] == 401
    assert get(url + "/", {"Authorization": "Bearer s3cret"})[0] == 200
    status, headers, _ = get(url + "/fleet?name=jobs&token=s3cret")
    assert status == 303 and headers["Location"] == "/fleet?name=jobs"
    cookie = headers["Set-Cookie"].split(";")[0]
    assert "s3cret" not in cookie and "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
    status, _, body = get(url + "/fleet?name=jobs", {"Cookie": cookie})
    assert status == 200 and 'id="fleet-name">jobs<' in body
    assert get(url + "/action", {"Cookie": "pg_claim_web_token=x"}, data="a=b")[0] == 401


def test_loopback_answers_loopback_host_names_only(server):
    url = server()
    assert get(url + "/")[0] == 200
    port = urllib.parse.urlsplit(url).port
    assert get(url + "/", {"Host": f"localhost:{port}"})[0] == 200
    status, _, body = get(url + "/", {"Host": f"attacker.example:{port}"})
    assert status == 421 and "loopback" in body


def test_pages_headers_and_errors(server, db):
    url = server()
    status, headers, body = get(url + "/")
    assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
    assert headers["Cache-Control"] == "no-store" and '<a class="fleet" href="/fleet?name=jobs">jobs</a>' in body
    assert '<noscript><meta http-equiv="refresh" content="3"></noscript>' in body
    status, _, part = get(url + "/fleet?name=jobs&part=main")
    assert status == 200 and not part.startswith("<!DOCTYPE") and part.startswith("<h1>fleet")
    assert "<form" not in part  # actions off: no forms
    evil = "x'); DROP TABLE jobs; --<b>"
    status, _, body = get(url + "/fleet?" + urllib.parse.urlencode({"name": evil}))
    assert status == 404 and "fleet &quot;x&#x27;); DROP TABLE jobs; --&lt;b&gt;&quot; is not defined" in body
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 40
    status, _, body = get(url + "/fleet?name=jobs&page=7")
    assert status == 200 and "1 failure records, none on page 7" in body
    status, _, body = get(url + "/fleet?name=jobs&page=-1")
    assert status == 400 and "page must be an integer from 0, got -1" in body
    assert get(url + "/nothing")[0] == 404 and get(url + "/static/../_web.py")[0] == 404
    status, headers, js = get(url + "/static/web.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and "part" in js


def test_actions_are_refused_unless_allowed(server, db):
    url = server()
    status, _, body = get(url + "/action", data="fleet=jobs&action=clear&item=3&csrf=x")
    assert status == 403 and "--allow-actions" in body
    assert db.execute("SELECT count(*) FROM item_failures('jobs')").fetchone()[0] == 1


def test_actions_with_allow_actions(server, db):
    url = server("--allow-actions")
    _, _, body = get(url + "/fleet?name=jobs")
    csrf = csrf_of(body)
    assert 'class="act act-clear"' in body and 'class="act act-retry"' not in body  # item 3 is not dead
    assert get(url + "/action", data="fleet=jobs&action=clear&item=3")[0] == 403
    assert get(url + "/action", data=f"fleet=jobs&action=clear&item=3&csrf={csrf}x")[0] == 403
    status, _, body = get(url + "/action", data=f"csrf={csrf}&fleet=jobs&action=drop&item=3")
    assert status == 400 and "no action drop" in body
    status, _, body = get(url + "/action", data=f"csrf={csrf}&fleet=jobs&action=release&slot=x&token=1")
    assert status == 400 and "integer slot and token" in body
    status, _, body = get(url + "/action", data=f"csrf={csrf}&fleet=jobs&action=retry&item=3")
    assert status == 409 and "is not dead (retry)" in body
    status, _, body = get(url + "/action", data=f"csrf={csrf}&fleet=nope&action=clear&item=3")
    assert status == 404 and "is not defined" in body
    status, _, body = get(url + "/action", data=f"csrf={csrf}&fleet=jobs&action=clear&item=3")
    assert status == 200 and "cleared the failure record of item 3" in body
    status, _, body = get(url + "/action", data=f"csrf={csrf}&fleet=jobs&action=clear&item=3")
    assert status == 409 and "has no failure record" in body
    status, _, body = get(url + "/action", data=f"csrf={csrf}&fleet=jobs&action=release&slot=1&token=12345")
    assert status == 409 and "not released: token 12345 does not hold slot 1" in body
    slot, token = db.execute("SELECT slot, token FROM lease_holders('jobs') WHERE slot = 2").fetchone()
    status, _, body = get(url + "/action", data=f"csrf={csrf}&fleet=jobs&action=release&slot={slot}&token={token}")
    assert status == 200 and "released the lease of slot 2" in body
    assert db.execute("SELECT expired FROM lease_holders('jobs') WHERE slot = 2").fetchone()[0]


def test_a_lost_connection_is_replaced(server, db):
    url = server()
    assert get(url + "/fleet?name=jobs")[0] == 200
    ended = db.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                       " WHERE datname = %s AND application_name = 'pg-claim'", (DB,)).fetchone()[0]
    assert ended >= 1
    status, _, body = get(url + "/fleet?name=jobs")
    assert status == 200 and 'id="fleet-name">jobs<' in body


def test_sigterm_ends_it_and_a_missing_database_fails_early(db):
    p, url = start()
    assert get(url + "/")[0] == 200
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    env = dict(os.environ, PYTHONPATH=SRC)
    r = subprocess.run([sys.executable, "-m", "pg_claim", "web", "--port", "0", "dbname=py_web_no_such_db"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 1 and r.stderr.startswith("pg-claim: cannot connect:")
