"""The servers the Citus lease fleet adds to the layer's three (tests/citus/lease.py):
PgBouncer in front of the coordinator, and a worker node started mid-run.
Both are started and stopped with scripts/lib.sh's own functions
(pgc_pgbouncer_start, pgc_cluster_start), in the layer's work area."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lib(script, **env):
    """stdout of `script` run by bash after sourcing scripts/lib.sh (PostgreSQL 15)."""
    out = subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/lib.sh" --pg 15\n{script}'],
                         env=dict(os.environ, **{k: str(v) for k, v in env.items()}),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/lib.sh: {script.split()[0]} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return out.stdout.strip()


class Servers:
    """A context: what it starts is stopped and removed at its end."""

    def __init__(self):
        self.poolers, self.clusters = [], []

    def pooler(self, port, pool):
        """PgBouncer in transaction mode with `pool` server connections in
        front of the server on `port`; its port."""
        out = lib(f'pgc_pgbouncer_start {int(pool)} >&2\necho "$PGC_POOLER_PORT ${{PGC_POOLERS[-1]}}"',
                  PGPORT=port)
        pooler_port, d = out.split(" ", 1)
        self.poolers.append(d)
        return int(pooler_port)

    def citus_node(self, name):
        """A new cluster of the layer's installation with Citus preloaded, as
        pgc_citus_start starts the layer's own (which overlaid Citus on it); its port."""
        out = lib(f"pgc_cluster_start {name} \"shared_preload_libraries = 'citus'\""
                  f" 'citus.enable_stat_counters = on' 2>/dev/null\n"
                  f'echo "$PGPORT ${{PGC_CLUSTERS[-1]}}"')
        port, d = out.split(" ", 1)
        self.clusters.append(d)
        return int(port)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        for d in self.poolers:
            lib('pgc_pgbouncer_stop_dir "$D"; rm -rf "$D"', D=d)
        for d in self.clusters:
            lib('pgc_cluster_stop_dir "$D"; rm -rf "$D"', D=d)
