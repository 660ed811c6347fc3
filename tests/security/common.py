"""What the security tests share (tests/security/run.py runs them): the
database, the roles, connections as each role, and small checks."""
import os
import sys
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
from fleet_driver import Failure, check, poll  # noqa: E402,F401

DB = "pg_claim_security"
ROLES = ["sec_worker_a", "sec_worker_b", "sec_other", "sec_attacker", "sec_monitor", "sec_reader", "sec_fleet",
         "sec_owner"]
# Two names with the same crc32, so the same advisory lock keys and slots.
COLLIDE = ("uablaijhsa", "pfcxpytzcn")


ADMIN = os.environ.get("PGC_SECURITY_DSN", "dbname=postgres")
PORTABLE = os.environ.get("PGC_SECURITY_PORTABLE")


def connect(role=None, db=DB):
    c = psycopg.connect(ADMIN + f" dbname={db}" + (f" user={role}" if role else ""), autocommit=True)
    c.add_notice_handler(lambda d: None)
    c.execute("SET statement_timeout = '20s'")
    return c


def expect_error(conn, stmt, state, what, params=None):
    """Runs stmt; Failure unless it ends in SQLSTATE state. Returns the error."""
    try:
        rows = conn.execute(stmt, params).fetchall()
    except psycopg.Error as e:
        check(e.diag.sqlstate == state,
              f"{what}: expected SQLSTATE {state}, got {e.diag.sqlstate}: {e.diag.message_primary}")
        return e
    raise Failure(f"{what}: expected SQLSTATE {state}, got a result: {rows[:3]}")


def one(conn, stmt, params=None):
    return conn.execute(stmt, params).fetchone()


def as_fleet(role):
    """A worker session that works as the fleet's common role (what
    ALTER ROLE worker SET role = 'sec_fleet' gives at login)."""
    c = connect(role)
    c.execute("SET ROLE sec_fleet")
    return c


def lease_of(conn, name, n=1, holder=None, ttl="30 seconds"):
    holder = holder or f"h:{conn.info.backend_pid}:{time.monotonic_ns()}"
    r = one(conn, "SELECT slot, token FROM claim_lease(%s, %s, %s, %s::interval)", (name, n, holder, ttl))
    check(r is not None, f"claim_lease({name!r}, {n}) by {conn.info.user} got no slot")
    return r[0], r[1], holder
