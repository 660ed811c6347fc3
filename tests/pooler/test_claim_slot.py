"""claim_slot (and dynamic groups) through the transaction-mode pooler, as
docs/claiming.md ("Connection poolers") says; and the docs show the
library workers of the fleets verbatim."""
import os
import re

from harness import check, log, poll

from .common import HERE, ROOT, admin, direct, pool_size, pooled

# --------------------------------------------------------------------------
# The documented worker loops are the tested ones.

def test_docs_show_the_library_workers_verbatim():
    """The handlers and Workers of fleet.py and fleet.js are shown verbatim."""
    doc = open(os.path.join(ROOT, "docs", "leases.md"), encoding="utf-8").read()
    for file, lang in (("fleet.py", "python"), ("fleet.js", "js")):
        src = open(os.path.join(HERE, file), encoding="utf-8").read()
        m = re.search(r"^(?:#|//) docs/leases\.md: begin\n(.*?)^(?:#|//) docs/leases\.md: end\n",
                      src, re.S | re.M)
        check(m, f"{file}: no docs/leases.md markers")
        check(f"```{lang}\n{m.group(1)}```" in doc,
              f"docs/leases.md does not show the worker of tests/pooler/{file} verbatim")
    log("docs/leases.md shows the library workers of fleet.py and fleet.js verbatim")


# --------------------------------------------------------------------------
# 1. claim_slot (and dynamic groups) through the transaction-mode pooler

class ServerChooser:
    """One client per server connection of the pool, each keeping one server connection of the pool busy with
    an open transaction; only(i) lets server connection pids[i] alone go free,
    so the next statement of any other client of the pool runs there."""

    def __init__(self):
        self.pins = [pooled() for _ in range(pool_size())]
        self.pids = [self._pin(c) for c in self.pins]
        self.free = None
        check(len(set(self.pids)) == pool_size(), f"pinned server connections are not distinct: {self.pids}")

    @staticmethod
    def _pin(c):
        c.execute("BEGIN")
        return c.execute("SELECT pg_backend_pid()").fetchone()[0]

    def only(self, i):
        if self.free is not None:  # the one free server connection is taken again
            check(self._pin(self.pins[self.free]) == self.pids[self.free], "re-pinning a server connection")
        self.pins[i].execute("COMMIT")
        self.free = i
        return self.pids[i]

    def close(self):
        for i, c in enumerate(self.pins):
            if i != self.free and not c.closed:
                c.execute("COMMIT")  # else PgBouncer closes the server connection with the client
            c.close()


def run_on(client, server, sql):
    """One statement of `client`, which must run on server connection `server`."""
    *row, pid = client.execute(f"{sql}, pg_backend_pid()").fetchone()
    check(pid == server, f"{sql!r} ran on server connection {pid}, not {server}")
    return row[0] if len(row) == 1 else row


def test_claim_slot_through_pooler():
    log(f"claim_slot through PgBouncer (pool_mode = transaction, {pool_size()} server connections):")
    name = "pooler_demo"
    srv = ServerChooser()
    a, b = pooled(), pooled()
    try:
        s0 = srv.only(0)
        slot = run_on(a, s0, f"SELECT claim_slot('{name}', 1)")
        check(slot == 0, f"A's claim_slot: {slot}")
        log(f"  client A: claim_slot('{name}', 1) = 0, run by server connection {s0}")
        s1 = srv.only(1)
        mine, again = run_on(a, s1, f"SELECT my_slot('{name}'), claim_slot('{name}', 1)")
        check(mine is None and again is None,
              f"A's next statement on another server connection: my_slot {mine}, claim_slot {again}")
        log(f"  client A, next statement, on server connection {s1}: my_slot = NULL, and claim_slot"
            f" = NULL (its own claim, held by {s0}, makes it a standby)")
        srv.only(0)
        mine, again = run_on(b, s0, f"SELECT my_slot('{name}'), claim_slot('{name}', 1)")
        check(mine == 0 and again == 0, f"B on {s0}: my_slot {mine}, claim_slot {again}")
        log(f"  client B, which never claimed, on server connection {s0}: my_slot = 0 and"
            f" claim_slot = 0: B and A both \"hold\" the only slot of n = 1")

        # dynamic groups: session advisory locks too
        group = "pooler_group"
        parts = run_on(a, s0, f"SELECT claim_partitions('{group}', 8)")
        check(parts == list(range(8)), f"A's claim_partitions: {parts}")
        srv.only(1)
        mine, again = run_on(a, s1, f"SELECT my_partitions('{group}'), claim_partitions('{group}', 8)")
        check(mine == [] and again == [], f"A on {s1}: my_partitions {mine}, claim_partitions {again}")
        srv.only(0)
        theirs = run_on(b, s0, f"SELECT my_partitions('{group}')")
        check(theirs == list(range(8)), f"B on {s0}: my_partitions {theirs}")
        log(f"  dynamic groups alike: A's claim_partitions('{group}', 8) = all 8 on {s0}; A's next"
            f" statement on {s1}: my_partitions = {{}} and claim_partitions = {{}}; B on {s0}:"
            " my_partitions = all 8")
        run_on(b, s0, f"SELECT group_leave('{group}')")
        srv.only(1)
        run_on(a, s1, f"SELECT group_leave('{group}')")
    finally:
        srv.close()
        a.close()
        b.close()
    pids = srv.pids
    # the clients are gone; the claim is not
    with direct() as d:
        holders = d.execute("SELECT slot, pid FROM slot_holders(%s)", (name,)).fetchall()
        check(holders == [(0, pids[0])], f"after both clients disconnected: slot_holders {holders}")
        (standby,) = d.execute("SELECT claim_slot(%s, 1, '0')", (name,)).fetchone()
        check(standby is None, f"a direct standby got slot {standby} of a claim whose clients are gone")
        log(f"  A and B disconnected: slot 0 is still held by server connection {pids[0]}"
            " (slot_holders), a standby's claim_slot gets NULL")
        # only ending the server connection frees it (PgBouncer: server_idle_timeout, 600 s by default)
        d.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        poll(lambda: d.execute("SELECT claim_slot(%s, 1, '0')", (name,)).fetchone()[0] == 0, 10,
             "the slot to free when its server connection ends")
        d.execute("SELECT release_slot(%s)", (name,))
        poll(lambda: all(r["remote_pid"] != pids[0] for r in admin("SHOW SERVERS")), 10,
             "PgBouncer to drop the terminated server connection")
        log(f"  pg_terminate_backend({pids[0]}) freed it: a direct standby's claim_slot got slot 0")
    # leases through the same pool: one statement each, any server connection
    with pooled() as a, pooled() as b:
        la = a.execute("SELECT slot, token FROM claim_lease('pooler_demo_lease', 1, 'A', '10 s')").fetchone()
        lb = b.execute("SELECT slot, token FROM claim_lease('pooler_demo_lease', 1, 'B', '10 s')").fetchone()
        check(la is not None and la[0] == 0 and lb is None, f"leases through the pool: A {la}, B {lb}")
        renewed = a.execute("SELECT renew_lease('pooler_demo_lease', 0, %s, '10 s') IS NOT NULL",
                            (la[1],)).fetchone()[0]
        released = a.execute("SELECT release_lease('pooler_demo_lease', 0, %s)", (la[1],)).fetchone()[0]
        check(renewed and released, "A's renew_lease and release_lease through the pool")
        log("  leases through the same pool: A claim_lease = slot 0, B = no row (standby),"
            " A renews and releases it from whichever server connection runs the statement")
