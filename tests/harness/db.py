"""Connections to the test server and small query helpers."""
import psycopg

from .core import Failure, check


def connect(dbname=None, conninfo="", notices=True, **kw):
    """An autocommit connection to database `dbname` (default: conninfo's, or
    postgres): on the server of PGHOST, PGPORT and PGUSER (scripts/test sets
    them), or of `conninfo`; keyword arguments (host, port, user,
    application_name, prepare_threshold, ...) override. notices=False drops
    the server's notices."""
    if dbname is None and not conninfo:
        dbname = "postgres"
    if dbname is not None:
        kw["dbname"] = dbname
    c = psycopg.connect(conninfo, autocommit=True, **kw)
    if not notices:
        quiet(c)
    return c


def quiet(conn):
    """Drops the server's notices on conn; returns conn."""
    conn.add_notice_handler(lambda d: None)
    return conn


def one(conn, stmt, params=None):
    """The first row of stmt."""
    return conn.execute(stmt, params).fetchone()


def expect_error(conn, stmt, state, what, params=None):
    """Runs stmt; Failure unless it ends in SQLSTATE `state` (one, or a tuple
    of them). Returns the error."""
    states = (state,) if isinstance(state, str) else tuple(state)
    try:
        rows = conn.execute(stmt, params).fetchall()
    except psycopg.Error as e:
        check(e.diag.sqlstate in states,
              f"{what}: expected SQLSTATE {'/'.join(states)}, got {e.diag.sqlstate}: {e.diag.message_primary}")
        return e
    raise Failure(f"{what}: expected SQLSTATE {'/'.join(states)}, got a result: {rows[:3]}")


def fresh_database(name, extension=True, **kw):
    """Database `name` dropped (its sessions ended) and created again, with
    pg_claim in it unless extension=False; keyword arguments as connect's."""
    with connect("postgres", **kw) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    if extension:
        with connect(name, **kw) as c:
            c.execute("SET client_min_messages = warning")
            c.execute("CREATE EXTENSION pg_claim")
