"""`pg-claim web` in a real browser (Debian's Chromium headless, Selenium,
Debian's chromedriver), against a live fleet of pg_claim.Worker processes
(lease mode) through PgBouncer in transaction mode (PGC_POOLER_PORT), the
web server reading through the same PgBouncer:

1. the fleets page and the fleet page show what the views fleets,
   fleet_slots and lease_holders hold (the workers stopped meanwhile);
2. a fleet whose name, holder, failing items and errors are planted
   <script>, <img onerror> and <svg onload>: each shown as text, none run
   (window.pwned and document.title untouched), also after updates;
3. one worker SIGKILLed: the page, updating itself without a reload, shows
   its slots taken by the others within the deadline; the rate plot drawn;
4. with --allow-actions: retry of a dead item, clear of a failure record,
   release of a stuck lease, each done and logged; refused without the CSRF
   token, and by a server without --allow-actions (no forms shown either);
   a role without the lease owner's privileges: release_lease refuses;
5. the failure records paged; the page with JavaScript off (refreshes);
6. the portable edition in a database of its own: the same pages, an action.

One test each, in this order, on one module fixture (`web`: the fleet of 3
workers, a web server with --allow-actions and one without, the browser).

--screenshot FILE (scripts/test web --screenshot FILE) saves the fleet page
as a PNG (docs/img/web.png)."""
import os
import signal
import subprocess
import sys
import time
import urllib.parse

import pytest
from selenium.webdriver.common.by import By

from harness import WorkerProcess, check, connect, log, poll

from .browser import (SRC, WebServer, browser, click, click_form, grid, one_text, post, table_rows, texts,
                      wait_until)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, SRC)
from pg_claim.cli import fmt_age, fmt_int  # noqa: E402

TIME_LIMIT_S = 150
DB, PORTABLE_DB = "web_test", "web_portable"
NAME, N, TTL_S, ITEMS = "fleet", 8, 5.0, 8000
PLANT = "window.pwned = 1; document.title = 'pwned'"
EVIL = f"<script>{PLANT}</script>"
EVIL_HOLDER = f"<img src=x onerror=\"{PLANT}\">"
EVIL_ITEM = f"<svg onload=\"{PLANT}\">"
EVIL_ERROR = f"</td></table><script>{PLANT}</script>"
QUOTED = urllib.parse.quote(EVIL)


def dsn(pgbouncer, dbname=DB):
    """The conninfo of dbname through the layer's PgBouncer (the workers' and web servers')."""
    return f"host=127.0.0.1 port={pgbouncer.port} dbname={dbname} user=postgres"


def setup(databases, roles):
    databases(DB)
    databases(PORTABLE_DB, extension=False)
    with connect() as d:
        roles(d, {"web_viewer": "LOGIN"})
    with connect(DB) as d:
        d.execute(f"""
            CREATE TABLE items (id bigserial PRIMARY KEY, payload text NOT NULL,
                                done boolean NOT NULL DEFAULT false);
            CREATE INDEX ON items ((slot_of(id, {N})), id) WHERE NOT done;
            CREATE TABLE processing_log (seq bigserial PRIMARY KEY, item bigint NOT NULL, holder text NOT NULL,
                slot integer NOT NULL, token bigint NOT NULL, logged_at timestamptz DEFAULT clock_timestamp());
            INSERT INTO items (payload) SELECT 'p' FROM generate_series(1, {ITEMS});
            ANALYZE items;
            GRANT SELECT ON items TO web_viewer;""")
        d.execute("SELECT define_fleet(%s, 'items', %s, pending => 'done')", (NAME, N))
        # the planted fleet: a stuck lease holder (1 hour), failure records
        d.execute("SELECT define_fleet(%s, 'items', 4, pending => 'done')", (EVIL,))
        d.execute("SELECT count(*) FROM claim_leases(%s, 4, %s, ttl => '1 hour')", (EVIL, EVIL_HOLDER))
        d.execute("SELECT record_failure(%s, %s, %s, 1)", (EVIL, EVIL_ITEM, EVIL_ERROR))
        d.execute("SELECT record_failure(%s, 'a-dead-1', 'relay down', 1)", (EVIL,))
        d.execute("SELECT record_failure(%s, 'a-retry-1', 'timeout', 5, '1 hour')", (EVIL,))
        d.execute("SELECT record_failure(%s, 'p' || lpad(g::text, 2, '0'), 'error ' || g) "
                  "FROM generate_series(0, 29) g", (EVIL,))


class Worker(WorkerProcess):
    seq = 0

    def __init__(self, workdir, pgbouncer):
        Worker.seq += 1
        self.label = f"w{Worker.seq}"
        env = dict(os.environ, FLEET_DSN=dsn(pgbouncer), FLEET_TTL_S=str(TTL_S), FLEET_ITEM_MS="20",
                   FLEET_POLL_S="0.2", PYTHONPATH=SRC)
        env.pop("PGSERVICE", None)
        super().__init__([sys.executable, os.path.join(ROOT, "clients", "python", "tests", "fleet_worker.py")],
                         env, os.path.join(workdir, f"{self.label}.err"))
        self.holder = self.wait_event("started", 0, 20)["holder"]

    def __str__(self):
        return self.label


def live_leases(d, name=NAME):
    return {s: h for s, h in d.execute("SELECT slot, holder FROM lease_holders(%s) WHERE NOT expired", (name,))}


def balanced(d, workers):
    h = live_leases(d)
    return sorted(h) == list(range(N)) and set(h.values()) == {w.holder for w in workers}


def check_values(driver, web, d, workers):
    """1: the pages equal the views, read while the workers are stopped."""
    for w in workers:
        os.kill(w.pid, signal.SIGSTOP)
    try:
        poll(lambda: all(w.state() == "T" for w in workers), 10, "the workers to stop")
        # a commit sent just before a stop may still land: the views' reads agree twice in a row first
        seen = []

        def settled():
            seen.append(d.execute("SELECT array_agg((slot, holder, pending, token)::text ORDER BY fleet, slot)"
                                  " FROM fleet_slots").fetchone()[0])
            return len(seen) > 1 and seen[-1] == seen[-2]
        poll(settled, 10, "the views to settle", interval=0.2)
        fleets = d.execute("SELECT fleet, tbl::text, n, holders, unserved, pending, now() - oldest, failing, dead"
                           " FROM fleets ORDER BY fleet").fetchall()
        slots = d.execute("SELECT slot, holder, pending, token FROM fleet_slots WHERE fleet = %s ORDER BY slot",
                          (NAME,)).fetchall()
        driver.get(web.url + "/")
        shown = table_rows(driver, "table.fleets")
        want = [[f, t, str(n), fmt_int(h), fmt_int(u), fmt_int(p), fmt_age(o), fmt_int(fl), fmt_int(dd)]
                for f, t, n, h, u, p, o, fl, dd in fleets]
        # the age of the oldest moves with the clock: compared apart, within a second
        check([r[:6] + r[7:] for r in shown] == [r[:6] + r[7:] for r in want],
              f"the fleets page differs from the view fleets: {shown} != {want}")
        click(driver, By.LINK_TEXT, NAME)
        cells = wait_until(lambda: texts(driver, "#fleet-name") == [NAME] and grid(driver), 10, "the fleet page")
        check(sorted(cells) == list(range(N)), f"the grid shows slots {sorted(cells)}, not 0..{N - 1}")
        for slot, holder, pending, token in slots:
            c = cells[slot]
            # a slot given back to a lighter holder just before the stop is unserved
            held = c["holder"] == holder if holder is not None else c["holder"].startswith("unserved")
            check(held and (c["pending"], c["token"]) == (fmt_int(pending), "-" if token is None else str(token)),
                  f"slot {slot} on the page {c} differs from fleet_slots {(holder, pending, token)}")
        check(one_text(driver, "#sum-pending") == fmt_int(sum(s[2] for s in slots)), "the summary's pending")
        holders = {r[0]: r[2] for r in table_rows(driver, "table.holders")}
        for w in workers:
            mine = ", ".join(str(s) for s, h, _, _ in slots if h == w.holder)
            check(holders.get(w.holder) == mine, f"holders table: {w.holder} -> {holders.get(w.holder)} != {mine}")
    finally:
        for w in workers:
            os.kill(w.pid, signal.SIGCONT)
    log(f"ok: the fleets and fleet pages equal the views ({len(fleets)} fleets, {N} slots)")


def check_planted(driver, web, d):
    """2: the planted markup is shown as text and never runs."""
    driver.get(web.url + "/")
    title = driver.title
    click(driver, By.LINK_TEXT, EVIL)
    wait_until(lambda: texts(driver, "#fleet-name") == [EVIL], 10, "the planted fleet's page, its name as text")
    wait_until(lambda: int(driver.execute_script("return document.documentElement.dataset.updates || 0")) >= 2,
               15, "two updates of the planted fleet's page")
    check(driver.execute_script("return window.pwned") is None, "a planted script ran (window.pwned is set)")
    check(driver.title != "pwned" and driver.title.startswith("pg-claim web"), f"the title changed: {driver.title}")
    check(one_text(driver, "#fleet-name") == EVIL, "the fleet name is not shown as text")
    check(set(r["holder"] for r in grid(driver).values()) == {EVIL_HOLDER}, "the planted holder is not shown as text")
    items = texts(driver, "table.failures .item")
    errors = texts(driver, "table.failures .error")
    check(EVIL_ITEM in items and EVIL_ERROR in errors, f"the planted item and error are not shown as text: {items}")
    check(driver.find_elements(By.CSS_SELECTOR, "main script, main img, main svg:not(#rate-plot)") == [],
          "the page has elements made of planted text")
    driver.get(web.url + "/")
    check(driver.execute_script("return window.pwned") is None and driver.title == title, "the fleets page ran a plant")
    log("ok: planted <script>, <img onerror>, <svg onload> in a fleet name, holder, item, error: shown, never run")


def check_kill(driver, web, d, workers):
    """3: a killed worker's slots move; the page follows without a reload."""
    driver.get(web.url + "/fleet?name=" + NAME)
    driver.execute_script("window.notReloaded = 42")
    before = int(driver.execute_script("return document.documentElement.dataset.updates || 0"))
    victim, rest = workers[0], workers[1:]
    mine = sorted(s for s, c in grid(driver).items() if c["holder"] == victim.holder)
    check(mine, f"{victim} holds no slot on the page before the kill")
    os.kill(victim.pid, signal.SIGKILL)
    t0 = time.monotonic()
    live = {w.holder for w in rest}

    def moved():
        g = grid(driver)
        return len(g) == N and all(c["holder"] in live for c in g.values()) and g
    g = wait_until(moved, TTL_S + 20, f"the page to show {victim}'s slots {mine} taken by {sorted(live)}")
    log(f"ok: {victim} killed; the page showed its slots {mine} taken by the others in "
        f"{time.monotonic() - t0:.1f} s ({sorted(set(c['holder'] for c in g.values()))})")
    check(driver.execute_script("return window.notReloaded") == 42, "the page was reloaded, not updated in place")
    after = int(driver.execute_script("return document.documentElement.dataset.updates || 0"))
    check(after > before, "the page did not update itself")
    poll(lambda: balanced(d, rest), 20, "the leases to balance over the live workers")
    wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#rate-plot polyline"), 10, "the rate plot")
    rate = wait_until(lambda: one_text(driver, "#sum-rate") not in ("-", "") and one_text(driver, "#sum-rate"),
                      10, "the fleet's rate")
    check(float(rate.replace(",", "")) > 0, f"the fleet drains, but its rate shows {rate}")
    log(f"ok: the page updated itself {after - before} times without a reload; rate {rate} items/s, plotted")


def failure_items(d, name=EVIL):
    return {i: s for i, s in d.execute("SELECT item, state FROM item_failures(%s)", (name,))}


def check_actions(driver, web, viewer, d):
    """4: actions with --allow-actions, refusals without it and without CSRF."""
    url = web.url + "/fleet?name=" + QUOTED
    driver.get(url)
    click_form(driver, "retry", "a-dead-1")
    out = wait_until(lambda: one_text(driver, "p.message"), 10, "the retry's outcome")
    check("given back" in out and "a-dead-1" not in failure_items(d), f"retry of a-dead-1: {out}")
    click(driver, By.ID, "back")
    click_form(driver, "clear", "a-retry-1")
    out = wait_until(lambda: one_text(driver, "p.message"), 10, "the clear's outcome")
    check("cleared" in out and "a-retry-1" not in failure_items(d), f"clear of a-retry-1: {out}")
    driver.get(url)
    check(driver.find_elements(By.CSS_SELECTOR, "form.act-retry input[value='p00']") == [],
          "a retry form for an item that is not dead")
    token = d.execute("SELECT token FROM lease_holders(%s) WHERE slot = 0", (EVIL,)).fetchone()[0]
    click(driver, By.CSS_SELECTOR, "#slot-0 form.act-release button")
    out = wait_until(lambda: one_text(driver, "p.message"), 10, "the release's outcome")
    expired = d.execute("SELECT expired FROM lease_holders(%s) WHERE slot = 0", (EVIL,)).fetchone()[0]
    check("released" in out and expired, f"release of slot 0: {out}, expired {expired}")
    # the log is read from the server's stderr by a thread: polled
    logged = wait_until(lambda: len([x for x in web.log if " done " in x]) >= 3 and
                        [x for x in web.log if " done " in x], 5, f"three actions in the log: {web.log}")
    check(len(logged) == 3 and "done retry" in logged[0] and "done clear" in logged[1] and
          f"done release fleet \"{EVIL}\" slot 0 token {token}" in logged[2], f"the actions' log: {logged}")
    log("ok: retry of a dead item, clear of a record, release of a stuck lease: done and logged")
    # refused: no CSRF token, a wrong one; a server without --allow-actions
    driver.get(url)
    for fields, what in (({}, "no"), ({"csrf": "x" * 43}, "a wrong")):
        status, text = post(driver, dict(fields, fleet=EVIL, action="clear", item="p00"))
        check(status == 403 and "CSRF" in text and "p00" in failure_items(d), f"{what} CSRF token: {status}")
    wait_until(lambda: sum("missing or wrong CSRF token" in x for x in web.log) == 2, 5, "the refusals in the log")
    driver.get(viewer.url + "/fleet?name=" + NAME)
    status, text = post(driver, {"fleet": EVIL, "action": "clear", "item": "p00"})
    check(status == 403 and "--allow-actions" in text and "p00" in failure_items(d), f"actions off: {status}")
    log("ok: actions refused without the CSRF token (403) and without --allow-actions (403); no forms there")


def check_privileges(driver, d):
    """4: a role without the privileges of the leases' owner: the extension refuses."""
    # direct: the pooler's auth file has only postgres
    web = WebServer(f"host={os.environ['PGHOST']} port={os.environ['PGPORT']} dbname={DB} user=web_viewer",
                    "--allow-actions")
    try:
        driver.get(web.url + "/fleet?name=" + NAME)
        check(driver.find_elements(By.CSS_SELECTOR, "form.act-release") == [],
              "release forms for leases the role may not see")
        cells = grid(driver)
        # (a slot between two holders is unserved: no holder to hide)
        check(len(cells) == N and all(c["holder"] == "(not visible)" or c["holder"].startswith("unserved")
                                      for c in cells.values()) and all(c["token"] == "-" for c in cells.values()),
              f"another role's holders and tokens shown: {cells}")
        slot, token = d.execute("SELECT slot, token FROM lease_holders(%s) WHERE NOT expired LIMIT 1",
                                (NAME,)).fetchone()
        # the viewer's server shows forms for failure records (anyone may clear those): its CSRF token
        driver.get(web.url + "/fleet?name=" + QUOTED)
        csrf = driver.execute_script("return document.querySelector('form.act-clear input[name=csrf]').value")
        status, text = post(driver, {"csrf": csrf, "fleet": NAME, "action": "release", "slot": str(slot),
                                     "token": str(token)})
        still = d.execute("SELECT NOT expired AND token = %s FROM lease_holders(%s) WHERE slot = %s",
                          (token, NAME, slot)).fetchone()[0]
        check(status == 409 and "not released" in text and still, f"release by web_viewer: {status} {text[:200]}")
        log("ok: a role without the owner's privileges sees no holder, no token, and release_lease refuses it")
    finally:
        web.stop()


def check_paging_and_nojs(driver, web, d):
    """5: failure records paged; the page without JavaScript."""
    want = [i for i, in d.execute("SELECT item FROM item_failures(%s) ORDER BY item", (EVIL,))]
    driver.get(web.url + "/fleet?name=" + QUOTED)
    first = texts(driver, "table.failures .item")
    click(driver, By.CSS_SELECTOR, "a[rel=next]")
    second = wait_until(lambda: "page=1" in driver.current_url and texts(driver, "table.failures .item"), 10,
                        "the second page of failure records")
    check(first + second == want and len(first) == 25, f"paging: {len(first)} + {len(second)} != {len(want)}")
    nojs = browser(javascript=False)
    try:
        nojs.get(web.url + "/fleet?name=" + NAME)
        check(len(grid(nojs)) == N, "the page without JavaScript has no grid")
        stamp = one_text(nojs, ".stamp time")
        wait_until(lambda: one_text(nojs, ".stamp time") != stamp, 10, "the page without JavaScript to refresh")
        check(len(grid(nojs)) == N, "the refreshed page without JavaScript has no grid")
    finally:
        nojs.quit()
    log(f"ok: {len(want)} failure records in pages of 25; without JavaScript the page shows and refreshes")


def check_portable(driver, workdir, pgbouncer):
    """6: the portable edition, in a database without the extension."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "portable"), "--out", workdir],
                         capture_output=True, text=True, check=True).stdout.split()[0]
    with connect(PORTABLE_DB) as c:
        c.execute("CREATE SCHEMA claim")
        c.execute("SET search_path = claim")
        c.execute(open(out, encoding="utf-8").read())
        c.execute("SET search_path = public, claim")
        c.execute("CREATE TABLE jobs (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
        c.execute("INSERT INTO jobs SELECT g, g % 3 = 0 FROM generate_series(1, 300) g")
        c.execute("SELECT define_fleet('jobs', 'public.jobs', 4, pending => 'done')")
        c.execute("SELECT count(*) FROM claim_leases('jobs', 4, 'portable-1', max => 2, ttl => '1 hour')")
        c.execute("SELECT record_failure('jobs', '7', 'bad row', 1)")
        want = c.execute("SELECT slot, holder, pending, token FROM fleet_slots WHERE fleet = 'jobs' ORDER BY slot"
                         ).fetchall()
        web = WebServer(dsn(pgbouncer, PORTABLE_DB), "--allow-actions")
        try:
            driver.get(web.url + "/")
            check("portable" in one_text(driver, "header") and texts(driver, "a.fleet") == ["jobs"],
                  "the portable edition's fleets page")
            click(driver, By.LINK_TEXT, "jobs")
            cells = wait_until(lambda: texts(driver, "#fleet-name") == ["jobs"] and grid(driver), 10, "its page")
            for slot, holder, pending, token in want:
                got = cells[slot]
                shown = holder or f"unserved{got['holder'][8:]}", fmt_int(pending), "-" if token is None else str(token)
                check((got["holder"], got["pending"], got["token"]) == shown,
                      f"portable slot {slot}: {got} != {(holder, pending, token)}")
            click_form(driver, "retry", "7")
            out = wait_until(lambda: one_text(driver, "p.message"), 10, "the portable retry's outcome")
            left = c.execute("SELECT count(*) FROM item_failures('jobs')").fetchone()[0]
            check("given back" in out and left == 0, f"portable retry: {out}, {left} records left")
        finally:
            web.stop()
    log("ok: the portable edition: the pages equal its views; a dead item retried")


class Web:
    """What the tests share: a direct connection to the test database, the
    fleet of 3 workers (balanced), a web server with --allow-actions and one
    without (both --refresh 1), and the browser."""
    d = web = viewer = driver = None
    workers = ()


@pytest.fixture(scope="module")
def web(databases, roles, workdir, pgbouncer, fleet):
    setup(databases, roles)
    w = Web()
    try:
        w.d = connect(DB)
        w.workers = [fleet.add(Worker(workdir, pgbouncer)) for _ in range(3)]
        w.web = WebServer(dsn(pgbouncer), "--allow-actions", "--refresh", "1")
        w.viewer = WebServer(dsn(pgbouncer), "--refresh", "1")
        w.driver = browser()
        poll(lambda: balanced(w.d, w.workers), 20, "the leases to balance over 3 workers")
        yield w
    finally:
        if w.driver:
            w.driver.quit()
        for srv in (w.web, w.viewer):
            if srv and srv.proc.poll() is None:
                srv.proc.kill()
        fleet.stop()
        if w.d:
            w.d.close()


def test_pages_equal_the_views(web):
    check_values(web.driver, web.web, web.d, web.workers)


def test_planted_markup_never_runs(web):
    check_planted(web.driver, web.web, web.d)


def test_killed_worker_moves_on_the_page(web, request):
    check_kill(web.driver, web.web, web.d, web.workers)
    shot = request.config.getoption("--screenshot")
    if shot:
        web.driver.get(web.web.url + "/fleet?name=" + NAME)
        wait_until(lambda: web.driver.find_elements(By.CSS_SELECTOR, "#rate-plot polyline"), 10, "the plot")
        web.driver.save_screenshot(shot)
        log(f"screenshot: {shot}")


def test_actions(web):
    check_actions(web.driver, web.web, web.viewer, web.d)


def test_privileges(web):
    check_privileges(web.driver, web.d)


def test_paging_and_no_javascript(web):
    check_paging_and_nojs(web.driver, web.web, web.d)


def test_portable(web, workdir, pgbouncer):
    check_portable(web.driver, workdir, pgbouncer)


def test_no_forms_without_actions_and_exit(web):
    web.driver.get(web.viewer.url + "/fleet?name=" + NAME)
    check(web.driver.find_elements(By.CSS_SELECTOR, "form") == [], "a server without --allow-actions shows forms")
    for w in (web.web, web.viewer):
        check(w.stop() == 0, "pg-claim web did not exit 0 at SIGTERM")
