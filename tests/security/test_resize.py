"""The online resize of a lease fleet (docs/leases.md, "Resizing"), played
by another role and by planted look-alikes (the layer `security`).

resize_fleet gives back every lease of a name and changes its n, so only a
role with the privileges of the role whose workers hold the fleet may run
it; fleet_n tells any role that may claim the name the fleet's n and
nothing else; neither runs a function a role planted.
"""
import psycopg

from .common import Failure, as_fleet, check, connect, expect_error, one
from .test_owner import SEARCH_PATH_PLANTS, plant_all


def fence_ok(conn, name, slot, token):
    """Whether fence passes (False: PC001) in conn's open transaction."""
    try:
        conn.execute("SELECT fence(%s, %s, %s)", (name, slot, token))
        return True
    except psycopg.Error as e:
        check(e.diag.sqlstate == "PC001", f"fence failed with {e.diag.sqlstate}, not PC001: {e.diag.message_primary}")
        return False


def test_other_role_cannot_resize_another_fleet():
    """Another role's resize_fleet of a live fleet fails (42501, naming both
    roles) and changes nothing: the fleet's n stays, its members' tokens
    still pass fence. A member of the fleet's role resizes it: the old n back,
    the old tokens fail fence (PC001), and a call with the old n gets PC002."""
    a, o, b = as_fleet("sec_worker_a"), connect("sec_other"), as_fleet("sec_worker_b")
    held = a.execute("SELECT slot, token FROM claim_leases('sec_resize', 4, 'wa')").fetchall()
    check(len(held) == 4, f"the only member holds {len(held)} of 4 slots")
    e = expect_error(o, "SELECT resize_fleet('sec_resize', 8)", "42501", "another role's resize")
    check("sec_fleet" in e.diag.message_primary and "sec_other" in e.diag.message_primary,
          f"the refusal does not name both roles: {e.diag.message_primary}")
    check(one(a, "SELECT fleet_n('sec_resize')")[0] == 4, "another role's refused resize changed n")
    slot, token = held[0]
    a.execute("BEGIN")
    check(fence_ok(a, "sec_resize", slot, token), "after another role's refused resize a token fails fence")
    a.execute("COMMIT")
    check(one(b, "SELECT resize_fleet('sec_resize', 8)")[0] == 4, "a member of the fleet's role cannot resize it")
    a.execute("BEGIN")
    check(not fence_ok(a, "sec_resize", slot, token), "an old token passes fence after the resize")
    a.execute("ROLLBACK")
    expect_error(a, "SELECT * FROM claim_leases('sec_resize', 4, 'wa')", "PC002", "a member's call with the old n")
    check(len(a.execute("SELECT * FROM claim_leases('sec_resize', 8, 'wa')").fetchall()) == 8,
          "the member does not follow with the new n")
    a.execute("SELECT * FROM claim_leases('sec_resize', 8, 'wa', max => 0)").fetchall()


def test_fleet_n_reveals_only_n():
    """fleet_n, called by another role, returns the fleet's n, one integer:
    no holder, token or role; lease_holders still shows it no token."""
    a, o = as_fleet("sec_worker_a"), connect("sec_other")
    tokens = {t for _, t in a.execute("SELECT slot, token FROM claim_leases('sec_resize_n', 3, 'wa')").fetchall()}
    check(len(tokens) == 3, f"the member holds {len(tokens)} of 3 slots")
    cur = o.execute("SELECT * FROM fleet_n('sec_resize_n')")
    rows = cur.fetchall()
    check(rows == [(3,)] and len(cur.description) == 1, f"fleet_n showed another role {rows}, not [(3,)]")
    seen = {t for _, t in o.execute("SELECT slot, token FROM lease_holders('sec_resize_n')").fetchall()}
    check(not (seen & tokens), "another role sees the fleet's tokens")
    a.execute("SELECT * FROM claim_leases('sec_resize_n', 3, 'wa', max => 0)").fetchall()


# The internal functions and helpers the resize reaches, each planted in att
# with argument types a non-exact call would take.
RESIZE_PLANTS = SEARCH_PATH_PLANTS + [
    "pg_claim_leases_resize(oid, text, integer)",
    "pg_claim_fleet_n(oid, text)",
    "pg_claim_leases_refuse_resized(text, integer, integer)",
    "pg_claim_leases_foreign_owner(oid, text, timestamp with time zone)",
    "pg_claim_need_read_committed(text)",
    "pg_claim_need_read_committed(character varying)",
    "resize_fleet(text, integer)",
    "fleet_n(text)",
]


def test_resize_runs_no_planted_look_alikes():
    """A role that can create in a schema earlier in a superuser's
    search_path plants look-alikes of resize_fleet's helpers and internal
    functions there; the superuser's resize_fleet and fleet_n (schema
    qualified) and a claim_leases refused with PC002 never run them, and the
    role gains nothing."""
    plant_all(connect("sec_attacker"), "att", RESIZE_PLANTS)
    su = connect()
    su.execute("SET search_path = att, public")
    try:
        su.execute("SELECT * FROM public.claim_leases('sec_su_rz', 2, 'su:1')").fetchall()
        check(one(su, "SELECT public.resize_fleet('sec_su_rz', 3)")[0] == 2, "the superuser's resize lost the old n")
        check(one(su, "SELECT public.fleet_n('sec_su_rz')")[0] == 3, "fleet_n does not show the new n")
        expect_error(su, "SELECT * FROM public.claim_leases('sec_su_rz', 2, 'su:1')", "PC002",
                     "the superuser's claim_leases with the old n")
        su.execute("SELECT * FROM public.claim_leases('sec_su_rz', 3, 'su:1', max => 0)").fetchall()
    except psycopg.Error as e:
        raise Failure(f"a superuser's call failed with {e.diag.sqlstate}: {e.diag.message_primary}")
    finally:
        ran = su.execute("SELECT sig, cur FROM att.ran").fetchall()
        sup = one(su, "SELECT rolsuper FROM pg_roles WHERE rolname = 'sec_attacker'")[0]
        su.execute("ALTER ROLE sec_attacker NOSUPERUSER")
        su.close()
    check(not sup, f"sec_attacker became a SUPERUSER through a planted function (ran: {ran[:5]})")
    check(not ran, f"planted functions ran in the superuser's calls: {sorted(set(ran))[:8]}")
