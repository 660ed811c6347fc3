"""The fleet-wide cap (docs/leases.md, "Capping a fleet"), played by another
role, by a role that squats holders, and by planted look-alikes (the layer
`security`).

cap_fleet decides which of a fleet's workers may hold slots, so only a role
with the privileges of the role whose workers hold the fleet (and of the
role that set its cap) may change it; fleet_cap tells any role the number
and nothing else; the caps' table is no role's to write; and a capped fleet
runs no function a role planted.
"""
import psycopg

from .common import Failure, as_fleet, check, connect, expect_error, one
from .test_owner import SEARCH_PATH_PLANTS, plant_all


def live_holders(conn, name):
    return {h for (h,) in conn.execute("SELECT DISTINCT holder FROM lease_holders(%s) WHERE NOT expired", (name,))}


def test_other_role_cannot_cap_or_uncap():
    """Another role's cap_fleet of a live fleet fails (42501, naming both
    roles), so does its removal of the fleet's cap: the fleet keeps its cap,
    its holders keep their slots. A member of the fleet's role changes it."""
    a, b, o = as_fleet("sec_worker_a"), as_fleet("sec_worker_b"), connect("sec_other")
    try:
        a.execute("SELECT * FROM claim_leases('sec_cap', 4, 'wa')").fetchall()
        check(one(a, "SELECT cap_fleet('sec_cap', 1)")[0] is None, "a new fleet had a cap")
        e = expect_error(o, "SELECT cap_fleet('sec_cap', 4)", "42501", "another role's cap")
        check("sec_fleet" in e.diag.message_primary and "sec_other" in e.diag.message_primary,
              f"the refusal does not name both roles: {e.diag.message_primary}")
        expect_error(o, "SELECT cap_fleet('sec_cap', NULL)", "42501", "another role's removal of the cap")
        check(one(o, "SELECT fleet_cap('sec_cap')")[0] == 1, "another role's refused call changed the cap")
        # the other member of the fleet's role waits as a standby
        b.execute("SELECT * FROM claim_leases('sec_cap', 4, 'wb')").fetchall()
        a.execute("SELECT * FROM claim_leases('sec_cap', 4, 'wa')").fetchall()
        check(live_holders(a, "sec_cap") == {"wa"}, f"the cap of 1 let {live_holders(a, 'sec_cap')} hold slots")
        check(one(b, "SELECT cap_fleet('sec_cap', 2)")[0] == 1, "a member of the fleet's role cannot change the cap")
    finally:
        for c, h in ((a, "wa"), (b, "wb")):
            c.execute("SELECT * FROM claim_leases('sec_cap', 4, %s, max => 0)", (h,)).fetchall()
        one(a, "SELECT cap_fleet('sec_cap', NULL)")


def test_cap_cannot_be_taken_by_squatting_members():
    """Another role cannot take a capped fleet's places: its claim_leases
    under the fleet's name is refused (42501) before it becomes a member,
    so it is never ranked among the active members, and the fleet's own
    holder keeps its slots."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    try:
        a.execute("SELECT * FROM claim_leases('sec_cap_sq', 4, 'wa')").fetchall()
        one(a, "SELECT cap_fleet('sec_cap_sq', 1)")
        for h in ("squat1", "wa"):
            expect_error(o, f"SELECT * FROM claim_leases('sec_cap_sq', 4, '{h}')", "42501",
                         f"another role's claim_leases as {h}")
        check(len(a.execute("SELECT * FROM claim_leases('sec_cap_sq', 4, 'wa')").fetchall()) == 4,
              "the fleet's holder lost slots to another role's calls")
        members = one(a, "SELECT count(*) FROM lease_holders('sec_cap_sq') WHERE holder LIKE 'squat%'")[0]
        check(members == 0, "another role's squatter holds a lease of the capped fleet")
    finally:
        a.execute("SELECT * FROM claim_leases('sec_cap_sq', 4, 'wa', max => 0)").fetchall()
        one(a, "SELECT cap_fleet('sec_cap_sq', NULL)")


def test_caps_table_is_no_roles_to_write():
    """No role but the extension's own functions reads or writes the caps'
    table: SELECT, INSERT, UPDATE and DELETE by another role fail (42501)."""
    o = connect("sec_other")
    for stmt in ("SELECT * FROM pg_claim_lease_caps",
                 "INSERT INTO pg_claim_lease_caps VALUES ('sec_cap_t', 1, 0, now())",
                 "UPDATE pg_claim_lease_caps SET cap = 100",
                 "DELETE FROM pg_claim_lease_caps"):
        expect_error(o, stmt, "42501", f"another role's {stmt.split()[0]} on the caps' table")


# The internal functions and helpers a capped claim_leases and cap_fleet
# reach, each planted in att with argument types a non-exact call would take.
CAP_PLANTS = SEARCH_PATH_PLANTS + [
    "pg_claim_leases_cap(oid, text, integer)",
    "pg_claim_fleet_cap(oid, text)",
    "pg_claim_leases_active(text, text, integer, timestamp with time zone)",
    "pg_claim_leases_foreign_owner(oid, text, timestamp with time zone)",
    "pg_claim_fleet_may_change(oid, oid)",
    "cap_fleet(text, integer)",
    "fleet_cap(text)",
]


def test_cap_runs_no_planted_look_alikes():
    """A role that can create in a schema earlier in a superuser's
    search_path plants look-alikes of the cap's helpers and internal
    functions there; the superuser's cap_fleet, fleet_cap and the capped
    fleet's claim_leases (schema qualified) never run them, and the role
    gains nothing."""
    plant_all(connect("sec_attacker"), "att", CAP_PLANTS)
    su = connect()
    su.execute("SET search_path = att, public")
    try:
        su.execute("SELECT * FROM public.claim_leases('sec_su_cap', 2, 'su:1')").fetchall()
        check(one(su, "SELECT public.cap_fleet('sec_su_cap', 1)")[0] is None, "a new fleet had a cap")
        check(one(su, "SELECT public.fleet_cap('sec_su_cap')")[0] == 1, "fleet_cap does not show the cap")
        check(su.execute("SELECT * FROM public.claim_leases('sec_su_cap', 2, 'su:2')").fetchall() == [],
              "a standby of a fleet capped at 1 holds slots")
        for h in ("su:1", "su:2"):
            su.execute("SELECT * FROM public.claim_leases('sec_su_cap', 2, %s, max => 0)", (h,)).fetchall()
        su.execute("SELECT public.cap_fleet('sec_su_cap', NULL)")
    except psycopg.Error as e:
        raise Failure(f"a superuser's call failed with {e.diag.sqlstate}: {e.diag.message_primary}")
    finally:
        ran = su.execute("SELECT sig, cur FROM att.ran").fetchall()
        sup = one(su, "SELECT rolsuper FROM pg_roles WHERE rolname = 'sec_attacker'")[0]
        su.execute("ALTER ROLE sec_attacker NOSUPERUSER")
        su.close()
    check(not sup, f"sec_attacker became a SUPERUSER through a planted function (ran: {ran[:5]})")
    check(not ran, f"planted functions ran in the superuser's calls: {sorted(set(ran))[:8]}")
