"""Names never share slots in silence: two names with the same crc32 (the
same advisory lock keys) are refused by the second claim."""
import zlib

from .common import COLLIDE, check, connect, expect_error, one


# Names never share slots in silence


def collide_setup():
    check(zlib.crc32(COLLIDE[0].encode()) == zlib.crc32(COLLIDE[1].encode()), "the two names do not collide")


def refused_collision(conn, stmt, what):
    e = expect_error(conn, stmt, "42710", what)
    msg = (e.diag.message_primary or "") + " " + (e.diag.message_detail or "")
    check(COLLIDE[0] in msg and COLLIDE[1] in msg, f"{what}: the message does not name both names: {msg}")
    check((e.diag.message_hint or "").strip(), f"{what}: no hint")


def first_claim_of_collide():
    """The first name is taken (and so registered) once; idempotent."""
    c = connect("sec_worker_a")
    r = one(c, "SELECT claim_slot(%s, 2)", (COLLIDE[0],))[0]
    check(r is not None, f"claim_slot({COLLIDE[0]!r}) got no slot")
    c.close()


def test_colliding_name_refused_by_claim_slot():
    """A name whose crc32 equals a name already used is refused by
    claim_slot and claim_slots with 42710, naming both names."""
    collide_setup()
    first_claim_of_collide()
    c = connect("sec_worker_b")
    refused_collision(c, f"SELECT claim_slot('{COLLIDE[1]}', 2)", "claim_slot of the colliding name")
    refused_collision(c, f"SELECT claim_slots('{COLLIDE[1]}', 2, 1)", "claim_slots of the colliding name")


def test_colliding_name_refused_by_claim_lease():
    """claim_lease refuses a name whose crc32 equals a name already used
    (42710, naming both)."""
    collide_setup()
    first_claim_of_collide()
    c = connect("sec_other")
    refused_collision(c, f"SELECT * FROM claim_lease('{COLLIDE[1]}', 2, 'h:1')", "claim_lease of the colliding name")


def test_colliding_name_refused_by_group_join():
    """group_join and claim_partitions refuse a name whose crc32 equals a
    name already used (42710, naming both)."""
    collide_setup()
    first_claim_of_collide()
    c = connect("sec_other")
    refused_collision(c, f"SELECT group_join('{COLLIDE[1]}')", "group_join of the colliding name")
    refused_collision(c, f"SELECT claim_partitions('{COLLIDE[1]}', 4)", "claim_partitions of the colliding name")
