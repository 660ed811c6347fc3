"""The promises of docs/security.md, each checked by playing the attacker
(the layer `security`; `portable` runs them on the portable edition).

Against the cluster of scripts/test (a superuser; or PGC_SECURITY_DSN, a
keyword/value connection string to a maintenance database). The tests work
in their own database, pg_claim_security, owned by the role sec_owner (not a
superuser), which installs pg_claim itself (the trusted install), and with
the roles below, all dropped and created again once for the run: one run at
a time per cluster.

    sec_owner      owns the database, installed the extension
    sec_fleet      NOLOGIN; the fleet's common role (docs/security.md)
    sec_worker_a   LOGIN, member of sec_fleet
    sec_worker_b   LOGIN, member of sec_fleet
    sec_other      LOGIN, another role that can connect (a member of nothing)
    sec_attacker   LOGIN, owns schema att, which is first in a superuser's
                   search_path in one test
    sec_monitor    LOGIN, member of pg_monitor
    sec_reader     LOGIN

Each test is named after the promise it checks (test_<promise>); its
docstring is the promise as docs/security.md states it.

With PGC_SECURITY_PORTABLE=FILE, sec_owner installs the portable edition
(docs/portable.md) from FILE into the schema public instead of the
extension (the layer `portable` runs it so, on a server without pg_claim's
files): the tests of NOT_PORTABLE, promises that do not apply to it, are
skipped, each with its reason, and those of PORTABLE_ONLY run.
"""
import pytest

from harness import connect as harness_connect

from .common import ADMIN, DB, PORTABLE, check, connect, one

ROLES = {"sec_owner": "LOGIN", "sec_fleet": "NOLOGIN", "sec_worker_a": "LOGIN IN ROLE sec_fleet",
         "sec_worker_b": "LOGIN IN ROLE sec_fleet", "sec_other": "LOGIN", "sec_attacker": "LOGIN",
         "sec_monitor": "LOGIN IN ROLE pg_monitor", "sec_reader": "LOGIN"}

# The promises of docs/security.md that do not apply to the portable
# edition (docs/portable.md, "Security"), and why.
NOT_PORTABLE = {
    "test_colliding_name_refused_by_group_join":
        "the portable edition has no dynamic groups (group_join, claim_partitions)",
    "test_owner_plants_in_extension_schema_never_run":
        "the installing role owns every function of the portable edition and so may replace any of them; "
        "no function runs with rights it does not have, so a plant of its own gains it nothing",
}
# The promises only the portable edition makes (its SECURITY DEFINER
# functions callable by every role).
PORTABLE_ONLY = {"test_portable_definer_functions_act_for_the_session_role",
                 "test_portable_internal_functions_closed"}


def pytest_collection_modifyitems(items):
    for item in items:
        if PORTABLE and item.name in NOT_PORTABLE:
            item.add_marker(pytest.mark.skip(reason=f"n/a to the portable edition: {NOT_PORTABLE[item.name]}"))
        elif not PORTABLE and item.name in PORTABLE_ONLY:
            item.add_marker(pytest.mark.skip(reason="the portable edition's own promise (PGC_SECURITY_PORTABLE)"))


def drop_database():
    with harness_connect(conninfo=ADMIN, notices=False) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


@pytest.fixture(scope="session", autouse=True)
def security_database(roles):
    """The database and the roles, for every test of the directory."""
    drop_database()
    with harness_connect(conninfo=ADMIN, notices=False) as c:
        roles(c, ROLES)
        c.execute(f"CREATE DATABASE {DB} OWNER sec_owner")
    with connect("sec_owner") as c:
        if PORTABLE:
            c.execute("SET search_path = public")
            with open(PORTABLE, encoding="utf-8") as f:
                c.execute(f.read())
            c.execute("RESET search_path")
            owner = one(c, "SELECT proowner::regrole::text FROM pg_proc "
                           "WHERE proname = 'pg_claim_portable_version'")[0]
            super_ = one(c, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0]
            check(owner == "sec_owner" and not super_, f"the portable edition belongs to {owner}, not sec_owner")
        else:
            c.execute("CREATE EXTENSION pg_claim")
            owner = one(c, "SELECT extowner::regrole::text FROM pg_extension WHERE extname = 'pg_claim'")[0]
            check(owner == "sec_owner", f"the extension belongs to {owner}, not sec_owner")
        c.execute("CREATE TABLE public.jobs (id varchar(20) PRIMARY KEY, v integer)")
        c.execute("INSERT INTO public.jobs SELECT 'job' || g, g FROM generate_series(1, 40) g")
        c.execute("GRANT SELECT, INSERT ON public.jobs TO PUBLIC")
    with connect() as c:
        c.execute("CREATE SCHEMA att AUTHORIZATION sec_attacker")
    yield
    drop_database()
