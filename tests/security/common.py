"""What the security tests share: the database, the roles, connections as
each role, and small checks. The database and roles are made once for the
layer (conftest.py)."""
import os
import time

from harness import Failure, check, connect as harness_connect, expect_error, one, poll  # noqa: F401

DB = "pg_claim_security"
# Two names with the same crc32, so the same advisory lock keys and slots.
COLLIDE = ("uablaijhsa", "pfcxpytzcn")
# The functions of the dynamic groups, which the portable edition leaves out.
GROUPS = ("group_join(", "claim_partitions(")

ADMIN = os.environ.get("PGC_SECURITY_DSN", "dbname=postgres")
PORTABLE = os.environ.get("PGC_SECURITY_PORTABLE")


def connect(role=None, db=DB):
    """A connection to the test database, as `role` (default: the admin's
    superuser), notices dropped, statements limited to 20 s."""
    c = harness_connect(db, conninfo=ADMIN, notices=False, **({"user": role} if role else {}))
    c.execute("SET statement_timeout = '20s'")
    return c


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


def fleet_row(conn, name):
    return conn.execute("SELECT tbl::text, n, pending, owner::text FROM public.pg_claim_fleets WHERE name = %s",
                        (name,)).fetchall()
