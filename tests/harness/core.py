"""Failures, checks, progress lines and polling with a deadline."""
import time


class Failure(AssertionError):
    """A check that did not hold; pytest reports it as a failed assertion."""


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def log(msg):
    """A progress line (pytest shows it with -s, or under a failed test)."""
    print(msg, flush=True)


def poll(fn, timeout, what, interval=0.05):
    """fn() until it returns something true, which is returned; Failure
    after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        r = fn()
        if r:
            return r
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Expectations:
    """Checks that let a test go on: expect(cond, what) records `what` when
    cond is false (and prints it; with show_ok, every check) and returns
    cond; verify() then fails with every one that did not hold."""

    def __init__(self, show_ok=False):
        self.failed = []
        self.show_ok = show_ok

    def __call__(self, cond, what):
        if not cond:
            self.failed.append(what)
            print(f"FAIL  {what}", flush=True)
        elif self.show_ok:
            print(f"ok    {what}", flush=True)
        return cond

    def verify(self):
        failed, self.failed = self.failed, []
        check(not failed, f"{len(failed)} expectations did not hold: {failed[:10]}")
