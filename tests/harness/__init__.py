"""The helpers every Python test of pg_claim shares (pytest, tests/conftest.py
makes them importable as `harness`): connections, checks and polling with a
deadline, the server's pg_ctl and PgBouncer, and worker processes that report
events as JSON lines. Each is defined here once."""
from .core import Expectations, Failure, check, log, poll
from .db import connect, expect_error, fresh_database, one, quiet
from .fleet import Producer, WorkerProcess, check_processing_log, failure_state, stop_all
from .server import PgBouncer, Server, as_postgres, free_port

__all__ = ["Expectations", "Failure", "check", "log", "poll", "connect", "expect_error", "fresh_database", "one", "quiet", "WorkerProcess",
           "Producer", "check_processing_log", "failure_state", "stop_all", "PgBouncer", "Server", "as_postgres", "free_port"]
