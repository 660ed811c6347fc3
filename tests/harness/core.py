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
