"""Leases belong to roles (docs/security.md "Leases"): another role can
neither read, renew, release, fence nor take a live lease or fleet of a
name; a fleet shares it through a common role."""
import psycopg

import harness

from .common import ADMIN, DB, as_fleet, check, connect, expect_error, lease_of, one, poll


# Leases belong to roles (docs/security.md "Leases")


def test_other_role_cannot_read_lease_token():
    """Another role sees a lease's slot and expiry in lease_holders and
    slot_status, but not its holder or token."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, holder = lease_of(a, "sec_read", 2)
    rows = o.execute("SELECT slot, holder, token FROM lease_holders('sec_read')").fetchall()
    check(rows, "lease_holders shows another role no row at all (it should show the slot)")
    check(all(r[1] is None and r[2] is None for r in rows),
          f"lease_holders shows another role the holder and token: {rows}")
    rows = o.execute("SELECT slot, state, holder, token FROM slot_status('sec_read', 2)").fetchall()
    check(all(r[3] is None and (r[2] is None or r[2] != holder) for r in rows),
          f"slot_status shows another role the holder and token: {rows}")
    # a session claim's token (my_token) likewise
    s = as_fleet("sec_worker_a")
    check(one(s, "SELECT claim_slot('sec_read_s', 2)")[0] is not None, "claim_slot got no slot")
    stoken = one(s, "SELECT my_token('sec_read_s')")[0]
    rows = o.execute("SELECT slot, state, token FROM slot_status('sec_read_s', 2) WHERE token IS NOT NULL").fetchall()
    check(not rows, f"slot_status shows another role the token {stoken} of a session claim: {rows}")
    s.close()
    # the fleet's own members do see them
    b = as_fleet("sec_worker_b")
    rows = b.execute("SELECT holder, token FROM lease_holders('sec_read') WHERE slot = %s", (slot,)).fetchall()
    check(rows == [(holder, token)], f"a member of the fleet role does not see the fleet's lease: {rows}")


def test_other_role_cannot_renew_with_stolen_token():
    """renew_lease with another role's slot and current token extends
    nothing (NULL)."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, _ = lease_of(a, "sec_renew", 1, ttl="10 seconds")
    before = one(a, "SELECT expires_at FROM lease_holders('sec_renew') WHERE slot = %s", (slot,))[0]
    r = one(o, "SELECT renew_lease('sec_renew', %s, %s, '1 day')", (slot, token))[0]
    check(r is None, f"another role renewed the lease with the stolen token until {r}")
    after = one(a, "SELECT expires_at FROM lease_holders('sec_renew') WHERE slot = %s", (slot,))[0]
    check(after == before, f"the lease's expiry moved from {before} to {after}")


def test_other_role_cannot_release_with_stolen_token():
    """release_lease with another role's current token releases nothing
    (false)."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, holder = lease_of(a, "sec_release", 1)
    r = one(o, "SELECT release_lease('sec_release', %s, %s)", (slot, token))[0]
    check(r is False, f"release_lease by another role with the stolen token returned {r}")
    rows = a.execute("SELECT holder, token FROM lease_holders('sec_release') WHERE slot = %s", (slot,)).fetchall()
    check(rows == [(holder, token)], f"the lease changed after another role's release: {rows}")


def test_other_role_cannot_fence_with_stolen_token():
    """fence with another role's current token raises PC001, as with a
    wrong token; lease_valid is false."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, _ = lease_of(a, "sec_fence", 1)
    expect_error(o, "SELECT fence('sec_fence', %s, %s)", "PC001", "fence by another role with the stolen token",
                 (slot, token))
    r = one(o, "SELECT lease_valid('sec_fence', %s, %s)", (slot, token))[0]
    check(r is False, f"lease_valid by another role with the stolen token returned {r}")
    # the owner's fleet still passes
    a.execute("SELECT fence('sec_fence', %s, %s)", (slot, token))


def test_other_role_cannot_claim_live_lease_of_another_fleet():
    """While a lease of a name is live, a role without the privileges of its
    owner role cannot claim the name (42501, naming the role), not even with
    the fleet's holder text."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    slot, token, holder = lease_of(a, "sec_steal", 2)
    e = expect_error(o, "SELECT * FROM claim_lease('sec_steal', 2, 'intruder')", "42501",
                     "claim_lease of a name another role leases")
    check("sec_fleet" in (e.diag.message_primary or "") + (e.diag.message_detail or ""),
          f"the refusal does not name the owner role sec_fleet: {e.diag.message_primary}")
    expect_error(o, "SELECT * FROM claim_lease('sec_steal', 2, %s)", "42501",
                 "claim_lease with the other fleet's holder text", (holder,))
    rows = a.execute("SELECT holder, token FROM lease_holders('sec_steal') WHERE slot = %s", (slot,)).fetchall()
    check(rows == [(holder, token)], f"the fleet's lease changed: {rows}")


def test_other_role_cannot_join_or_shrink_another_fleet():
    """While a claim_leases fleet of a name is live, a role without the
    privileges of its owner role cannot join it (42501, naming the role),
    not even with a member's holder text, and cannot make a member give its
    slots back (max => 0 with the member's holder text); the fleet's leases
    and tokens are unchanged."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    holder = f"h:{a.info.backend_pid}:elastic"
    held = a.execute("SELECT slot, token FROM claim_leases('sec_elastic', 4, %s)", (holder,)).fetchall()
    check(len(held) == 4, f"the only member of the fleet holds {len(held)} of 4 slots")
    e = expect_error(o, "SELECT * FROM claim_leases('sec_elastic', 4, 'intruder')", "42501",
                     "claim_leases joining another role's fleet")
    check("sec_fleet" in (e.diag.message_primary or ""),
          f"the refusal does not name the owner role sec_fleet: {e.diag.message_primary}")
    expect_error(o, "SELECT * FROM claim_leases('sec_elastic', 4, %s, max => 0)", "42501",
                 "claim_leases with a member's holder text and max => 0", (holder,))
    expect_error(o, "SELECT * FROM claim_lease('sec_elastic', 4, 'intruder')", "42501",
                 "claim_lease of a name a claim_leases fleet of another role leases")
    after = a.execute("SELECT slot, token FROM lease_holders('sec_elastic') WHERE NOT expired ORDER BY slot").fetchall()
    check(after == held, f"the fleet's leases changed: {held} -> {after}")


def test_expired_lease_can_be_taken_by_another_role():
    """An expired (or released) slot can be taken by any role allowed to
    claim."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    lease_of(a, "sec_expired", 1, ttl="200 milliseconds")

    def take():
        try:
            return one(o, "SELECT slot FROM claim_lease('sec_expired', 1, 'other:1')")
        except psycopg.errors.InsufficientPrivilege:
            return None
    poll(take, 10, "another role to take the expired lease")


def test_fleet_shares_name_through_common_role():
    """Workers that log in as different roles share a name through a common
    role: as sec_fleet, worker b sees, renews and fences worker a's lease."""
    with harness.connect(conninfo=ADMIN + f" dbname={DB}") as c:
        c.execute("ALTER ROLE sec_worker_a IN DATABASE pg_claim_security SET role = 'sec_fleet'")
        c.execute("ALTER ROLE sec_worker_b IN DATABASE pg_claim_security SET role = 'sec_fleet'")
    try:
        a, b = connect("sec_worker_a"), connect("sec_worker_b")
        check(one(a, "SELECT current_user")[0] == "sec_fleet", "ALTER ROLE ... SET role did not apply at login")
        slot, token, _ = lease_of(a, "sec_shared", 2)
        s2, t2, _ = lease_of(b, "sec_shared", 2)
        check(s2 != slot, f"both workers got slot {slot}")
        r = one(b, "SELECT renew_lease('sec_shared', %s, %s)", (slot, token))[0]
        check(r is not None, "a worker of the same fleet role could not renew the fleet's lease")
        b.execute("SELECT fence('sec_shared', %s, %s)", (slot, token))
    finally:
        with harness.connect(conninfo=ADMIN + f" dbname={DB}") as c:
            c.execute("ALTER ROLE sec_worker_a IN DATABASE pg_claim_security RESET role")
            c.execute("ALTER ROLE sec_worker_b IN DATABASE pg_claim_security RESET role")
