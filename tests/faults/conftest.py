"""The fault tests' servers (test_faults.py, test_soak.py), and the rule
that the fleet's last test, the drain and the check of the whole run, runs
whenever a test of the fleet does."""
import os

import pytest

from harness import check

from . import cluster as servers_module
from .cluster import DATA0, PGC_BIN, Cluster, Net, Server
from .fleet import setup_db

FINAL = "test_every_item_once"
BEFORE_THE_FLEET = ("test_cancels_and_timeouts", "test_lock_table_exhausted")
_deselected = []


def pytest_deselected(items):
    _deselected.extend(i for i in items if i.originalname == FINAL)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """After -k: the final test back when a test of the fleet is selected."""
    items = session.items
    fleet = [i for i in items if i.module.__name__.endswith("test_faults") and i.originalname not in BEFORE_THE_FLEET]
    if fleet and not any(i.originalname == FINAL for i in items) and _deselected:
        items.append(_deselected[0])


def selected(request, name):
    return any(item.originalname == name for item in request.session.items)


@pytest.fixture(scope="module")
def servers(workdir, request):
    """The layer's cluster (and the standbys a failover makes), its database;
    with the partition test, the network namespace and the proxy first."""
    check(PGC_BIN and DATA0, "PGC_BIN and FAULTS_DATA must be set (scripts/test and scripts/soak set them)")
    cluster = None
    try:
        if selected(request, "test_partition"):
            net = servers_module.NET = Net(workdir)
            net.up()
            with open(os.path.join(DATA0, "pg_hba.conf"), "a", encoding="utf-8") as f:
                f.write(f"host all all {net.subnet} trust\n")
            Server(DATA0, 0).pg_ctl("reload")
            target = os.path.join(workdir, "server.target")
            with open(target, "w", encoding="utf-8") as f:
                f.write(f"{net.host_addr} {os.environ['PGPORT']}")
            net.start_proxy(target)
        cluster = Cluster(workdir)
        setup_db(cluster)
        yield cluster
    finally:
        if servers_module.NET:
            servers_module.NET.down()
            servers_module.NET = None
        if cluster:
            cluster.cleanup()


