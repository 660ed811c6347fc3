"""What the web layer's test (tests/web/run.py) drives: `pg-claim web`
servers as processes, and Debian's Chromium headless through Selenium and
Debian's chromedriver (no browser download: both paths given)."""
import os
import subprocess
import sys
import threading
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from fleet_driver import Failure

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "clients", "python", "src")
CHROMIUM = os.environ.get("PGC_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PGC_CHROMEDRIVER", "/usr/bin/chromedriver")


class WebServer:
    """`python3 -m pg_claim web --port 0 ARGS... DSN`, its URL read from the
    first line it prints; its stderr (the action log) kept."""

    def __init__(self, dsn, *args, env=None):
        e = dict(os.environ, PYTHONPATH=SRC, **(env or {}))
        e.pop(("PG_CLAIM_WEB_TOKEN"), None)
        self.proc = subprocess.Popen([sys.executable, "-m", "pg_claim", "web", "--port", "0", *args, dsn],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=e)
        self.log = []
        line = self.proc.stdout.readline()
        if not line.startswith("pg-claim web: http://"):
            raise Failure(f"pg-claim web did not start: {line!r} {self.proc.stderr.read()!r}")
        self.url = line.split()[2].rstrip("/")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))

    def stop(self):
        self.proc.terminate()
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise Failure("pg-claim web did not exit within 10 s of SIGTERM")


def browser(javascript=True):
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,1000", "--hide-scrollbars"):
        o.add_argument(a)
    if not javascript:
        o.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)


# The DOM is read in one script each: the page replaces its main part every
# second, so elements found one call earlier may be gone.

def texts(driver, css):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent.trim())", css)


def one_text(driver, css):
    t = driver.execute_script("const e = document.querySelector(arguments[0]); return e && e.textContent.trim()", css)
    if t is None:
        raise Failure(f"no element {css} on {driver.current_url}")
    return t


def grid(driver):
    """slot -> {holder, pending, token, expires, rate} as the page shows them."""
    cells = driver.execute_script("""
        return Array.from(document.querySelectorAll('#grid .slot'), c => {
          const o = {slot: c.dataset.slot};
          for (const k of ['holder', 'pending', 'token', 'expires', 'rate'])
            o[k] = c.querySelector('.' + k).textContent.trim();
          return o;
        })""")
    return {int(c.pop("slot")): c for c in cells}


def table_rows(driver, css):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'),"
        " r => Array.from(r.querySelectorAll('td'), d => d.textContent.trim()))", css)


def click(driver, by, what):
    """Clicks the element, found again if the page replaced it meanwhile."""
    wait_until(lambda: driver.find_element(by, what).click() or True, 5, f"a clickable {what}")


def click_form(driver, action, item):
    """Clicks the button of the form of `action` for `item`."""
    def go():
        for f in driver.find_elements(By.CSS_SELECTOR, f"form.act-{action}"):
            if f.find_element(By.CSS_SELECTOR, "input[name=item]").get_attribute("value") == item:
                f.find_element(By.TAG_NAME, "button").click()
                return True
        raise Failure(f"no {action} form for item {item}")
    wait_until(go, 5, f"the {action} form of item {item}")


def post(driver, fields):
    """POSTs a form to /action from the page (fetch, as a page's script
    could): the HTTP status and the page's text."""
    return driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/action', {method: 'POST', body: new URLSearchParams(arguments[0])})
          .then(r => r.text().then(t => done([r.status, t])), e => done([0, String(e)]));
    """, fields)


def wait_until(fn, timeout, what, interval=0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # noqa: BLE001 - the DOM changes under the driver while it updates
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise Failure(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
