"""The weights of claim_leases' balance (docs/leases.md, "Balancing"), played
by another role (the layer `security`).

A slot's weight steers where the planner moves slots, so only the lease's
own holder role, with the lease's current token, may set it: another role,
even one that knows the token, changes nothing and learns nothing (not even
whether the slot is wanted), and cannot shift work by reporting on its own
fleet's name either.
"""
from .common import as_fleet, check, connect, one


def weights(conn, name):
    return conn.execute("SELECT slot, backlog FROM pg_claim_leases WHERE name = %s ORDER BY slot",
                        (name,)).fetchall()


def test_other_role_cannot_set_a_lease_weight():
    """report_backlog with another role's lease and its true token returns
    NULL and stores nothing; the owner role's report with the same token
    stores its weight; a wrong token of the owner role stores nothing."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    held = a.execute("SELECT slot, token FROM claim_leases('sec_weights', 2, 'wa')").fetchall()
    check(len(held) == 2, f"the only member holds {len(held)} of 2 slots")
    (s0, t0), (s1, t1) = held
    with connect() as admin:
        before = weights(admin, "sec_weights")
        got = one(o, "SELECT report_backlog('sec_weights', %s, %s, 1000000)", (s0, t0))[0]
        check(got is None, f"another role's report with the true token answered {got!r}, not NULL")
        check(weights(admin, "sec_weights") == before,
              f"another role's report changed a weight: {before} -> {weights(admin, 'sec_weights')}")
        got = one(a, "SELECT report_backlog('sec_weights', %s, %s, 7)", (s1, t1))[0]
        check(got is False, f"the owner's report answered {got!r}, not false")
        check(dict(weights(admin, "sec_weights")).get(s1) == 7, "the owner's report did not store its weight")
        got = one(a, "SELECT report_backlog('sec_weights', %s, %s, 9)", (s1, t1 - 1))[0]
        check(got is None, f"a wrong token's report answered {got!r}, not NULL")
        check(dict(weights(admin, "sec_weights")).get(s1) == 7, "a wrong token's report changed the weight")
