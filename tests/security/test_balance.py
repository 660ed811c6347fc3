"""The weights of claim_leases' balance (docs/leases.md, "Balancing"), played
by another role (the layer `security`).

A slot's weight steers where the planner moves slots, so only the lease's
own holder role, with the lease's current token, may set it (and the same
for fenced_batches, which lets a lighter holder take the slot between two
batches without waiting for the batch in hand): another role,
even one that knows the token, changes nothing and learns nothing (not even
whether the slot is wanted), and cannot shift work by reporting on its own
fleet's name either.
"""
from .common import as_fleet, check, connect, one


def weights(conn, name):
    return conn.execute("SELECT slot, backlog FROM pg_claim_leases WHERE name = %s ORDER BY slot",
                        (name,)).fetchall()


def fenced(conn, name):
    return [r[0] for r in conn.execute("SELECT slot FROM pg_claim_leases WHERE name = %s AND fenced_batches"
                                       " ORDER BY slot", (name,)).fetchall()]


def test_other_role_cannot_set_a_lease_weight():
    """report_backlog with another role's lease and its true token returns
    NULL and stores nothing, neither a weight nor fenced_batches; the owner
    role's report with the same token stores both; a wrong token of the
    owner role stores nothing."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    held = a.execute("SELECT slot, token FROM claim_leases('sec_weights', 2, 'wa')").fetchall()
    check(len(held) == 2, f"the only member holds {len(held)} of 2 slots")
    (s0, t0), (s1, t1) = held
    with connect() as admin:
        before = weights(admin, "sec_weights")
        got = one(o, "SELECT report_backlog('sec_weights', %s, %s, 1000000, fenced_batches => true)", (s0, t0))[0]
        check(got is None, f"another role's report with the true token answered {got!r}, not NULL")
        check(weights(admin, "sec_weights") == before,
              f"another role's report changed a weight: {before} -> {weights(admin, 'sec_weights')}")
        check(fenced(admin, "sec_weights") == [], "another role's report set fenced_batches")
        got = one(o, "SELECT report_backlog('sec_weights', %s, %s, NULL, fenced_batches => true)", (s0, t0))[0]
        check(got is None and fenced(admin, "sec_weights") == [],
              f"another role's report of no weight answered {got!r} or set fenced_batches")
        got = one(a, "SELECT report_backlog('sec_weights', %s, %s, 7, fenced_batches => true)", (s1, t1))[0]
        check(got == [], f"the owner's report answered {got!r}, not an empty array (no slot wanted)")
        check(dict(weights(admin, "sec_weights")).get(s1) == 7, "the owner's report did not store its weight")
        check(fenced(admin, "sec_weights") == [s1], "the owner's report did not store fenced_batches")
        got = one(a, "SELECT report_backlog('sec_weights', %s, %s, 9)", (s1, t1 - 1))[0]
        check(got is None, f"a wrong token's report answered {got!r}, not NULL")
        check(dict(weights(admin, "sec_weights")).get(s1) == 7, "a wrong token's report changed the weight")
        check(fenced(admin, "sec_weights") == [s1], "a wrong token's report cleared fenced_batches")


def test_wanted_slots_go_only_to_their_holder_role():
    """A report answers the wanted slots of the lease's holder (every slot of
    it that another live holder wants, whichever slot reported): to the
    owner role, with the true token of any of them; another role with the
    same true token learns nothing (NULL), not even which slots are wanted."""
    a, b, o = as_fleet("sec_worker_a"), as_fleet("sec_worker_b"), connect("sec_other")
    held = a.execute("SELECT slot, token FROM claim_leases('sec_wanted', 4, 'wa')").fetchall()
    check(len(held) == 4, f"the only member holds {len(held)} of 4 slots")
    for s, t in held:
        one(a, "SELECT report_backlog('sec_wanted', %s, %s, 100)", (s, t))
    with connect() as admin:  # past the damping: the slots changed hands a minute ago
        admin.execute("UPDATE pg_claim_leases SET acquired_at = acquired_at - interval '1 minute'"
                      " WHERE name = 'sec_wanted'")
    got = b.execute("SELECT slot FROM claim_leases('sec_wanted', 4, 'wb')").fetchall()
    check(got == [], f"the joiner took {got} at once (every slot is held and weighed)")
    with connect() as admin:
        marked = [r[0] for r in admin.execute("SELECT slot FROM pg_claim_leases WHERE name = 'sec_wanted'"
                                              " AND wanted_by = 'wb' ORDER BY slot").fetchall()]
    check(marked, "the joiner marked none of the heavy holder's slots")
    for s, t in held:
        got = one(a, "SELECT report_backlog('sec_wanted', %s, %s, NULL)", (s, t))[0]
        check(got == marked, f"the holder's report of slot {s} answered {got!r}, not the wanted {marked}")
        got = one(o, "SELECT report_backlog('sec_wanted', %s, %s, NULL)", (s, t))[0]
        check(got is None, f"another role's report with the true token of slot {s} answered {got!r}, not NULL")
