"""The planted-overload attack's calls (test_plant.py): every function
called with valid arguments by each role, and each outcome judged against
the baseline and against the plants' traces."""
import re
import time
import zlib

import psycopg

import harness

from .calls import ALLOWED, fail, summarize
from .plant_setup import KEY_TABLES, N_SHARES, OWNER, STATEMENT_TIMEOUT_MS, connect, ident, polymorphic
from .values import valid

# ---------------------------------------------------------------------------
# Calls


class Caller:
    """One connection of one role; counts the planted functions that ran
    during each call (from the sequence, which no rollback undoes, and the
    warnings)."""

    def __init__(self, admin, db, role, label, probe=None):
        self.label = label
        self.conn = connect(admin, db, role)
        self.warnings = []
        self.conn.add_notice_handler(self.notice)
        self.conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        self.conn.execute("SET lock_timeout = '5s'")
        # a superuser's connection that reads the sequence; the caller's own
        # unless one is given (which stays open after close())
        self.own_probe = probe is None
        self.probe = connect(admin, db, None) if probe is None else probe

    def notice(self, d):
        if (d.message_primary or "").startswith("pg_claim planted ran"):
            self.warnings.append(d.message_primary)

    def hits(self):
        return self.probe.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM own.pl_hits").fetchone()[0]

    def call(self, stmt):
        """(outcome, rows or error message, planted warnings)"""
        self.warnings = []
        self.context = ""
        before = self.hits()
        try:
            rows = self.conn.execute(stmt).fetchall()
            outcome, detail = summarize(rows), rows
        except psycopg.Error as e:
            if self.conn.closed or self.conn.broken:
                raise
            outcome, detail = e.diag.sqlstate or "?", e.diag.message_primary
            self.context = e.diag.context or ""
        try:
            self.conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            pass
        ran = self.hits() - before
        if ran and self.probe.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone()[0]:
            # a planted function ran as a superuser: the owner is one now
            self.warnings.append(f"pg_claim planted ran: ESCALATION | current_user ? | session_user ? | "
                                 f"{OWNER} became a SUPERUSER during this call\n(see the captures)")
            self.probe.execute(f"ALTER ROLE {OWNER} NOSUPERUSER")
        return outcome, detail, ran, list(self.warnings)

    def close(self):
        self.conn.close()
        if self.own_probe:
            self.probe.close()


def cast(expr, ty):
    if polymorphic(ty) or ty == "internal":
        return expr
    return f"({expr})::{ty}"


def choose_calls(caller, fns):
    """The valid call of each function, chosen as the matrix chooses its base (calls.matrix)."""
    calls = []
    for fn in fns:
        if "internal" in fn.types:
            continue
        base = [valid(nm, ty, fn)[0] for nm, ty in zip(fn.names, fn.types)]
        for i, (nm, ty) in enumerate(zip(fn.names, fn.types)):
            for alt in valid(nm, ty, fn)[1:]:
                o = caller.call(fn.call_sql([cast(e, t) for e, t in zip(base, fn.types)]))[0]
                if o not in ALLOWED:
                    break
                base[i] = alt
        calls.append((fn, fn.call_sql([cast(e, t) for e, t in zip(base, fn.types)])))
    return calls


def comparable(fn, vol, outcome, detail):
    """What must be equal before and after planting: the outcome, and for
    immutable functions the rows themselves."""
    if vol == "i" and isinstance(detail, list):
        return (outcome, tuple(map(tuple, detail)))
    return (outcome,)


def judge_planted(ran, warnings, extschema, failures, what, report):
    """A planted function that ran: a capture unless the caller's own
    statement resolved to it in the extension's schema (its call stack has
    no frame but its own)."""
    direct, captured = [], {}
    escalated = any("ESCALATION" in w for w in warnings)
    warnings = [w for w in warnings if "ESCALATION" not in w]
    for w in warnings:
        parts = [x.strip() for x in w.replace("pg_claim planted ran:", "", 1).split("|", 3)]
        sig, cur = parts[0], parts[1].replace("current_user ", "")
        frames = [ln for ln in parts[3].splitlines() if ln.strip()]
        if len(frames) <= 1 and sig.startswith(extschema + "."):
            direct.append(sig)
        else:
            captured.setdefault(f"{sig} as {cur}", frames[1] if len(frames) > 1 else "")
    if captured:
        report.setdefault("captured", set()).update(k.split(" as ")[0] for k in captured)
        first = next(iter(captured.items()))
        fail(failures, f"{what}: CAPTURED: {len(warnings) - len(direct)} run(s) of planted functions: "
             f"{', '.join(sorted(captured))} (called from: {first[1][:200]})")
    if direct:
        report.setdefault("direct", []).append(f"{what}: the statement itself resolved to {direct[0]}")
        db = what.split("]")[0].lstrip("[")
        report.setdefault("direct_runs", {}).setdefault(db, 0)
        report["direct_runs"][db] += len(direct)
    if escalated and captured:
        fail(failures, f"{what}: {OWNER} BECAME A SUPERUSER through a captured call")
    elif escalated:
        # the caller (a superuser) called the owner's function itself
        report.setdefault("direct_escalation", []).append(f"{what}: {direct[0] if direct else '?'}")
    if ran and not warnings:
        fail(failures, f"{what}: {ran} planted function(s) ran (the sequence moved) without a warning reaching the caller")


def reset_state(c, extschema):
    """Every role's calls start from no leases and no failure records, so
    that each phase sees the same state (c: a superuser's connection, which
    may write the tables)."""
    for t in ("pg_claim_leases", "pg_claim_failures"):
        if c.execute("SELECT to_regclass(%s)", (f"{ident(extschema)}.{t}",)).fetchone()[0]:
            c.execute(f"DELETE FROM {ident(extschema)}.{t}")


# name -> the argument type lists of the extension's functions of that name
SIGNATURES = {}


def judge_ambiguous(message, context, called, extschema, failures, report, what):
    """A call that ended in 42725. Acceptable when the ambiguous function is
    in the extension's schema (the owner's duplicate there) and, for a call
    made inside the extension, when its argument types are exactly those of
    one of the extension's functions: a call with other argument types is
    one that a single better-matching overload would capture (hidden here
    only because many overloads make it ambiguous)."""
    if not in_extschema(message, extschema):
        fail(failures, f"{what}: 42725 outside the extension's schema: {message}")
        return
    m = re.search(r"function \S+?\.(\w+)\((.*)\) is not unique", message or "")
    nested = bool(context) or (m is not None and m.group(1) != called)
    if m and nested and m.group(2) not in SIGNATURES.get(m.group(1), set()):
        fail(failures, f"{what}: the extension calls {m.group(1)}({m.group(2)}), whose argument types are not "
             f"those of its own function (one better-matching overload would capture the call): {message}")
        return
    report.setdefault("ambiguous", []).append(f"{what}: {message}")


def in_extschema(message, extschema):
    """Whether an error names a function of the extension's schema."""
    return bool(re.search(r"function (" + re.escape(extschema) + "|" + re.escape(ident(extschema)) + r")\.\w+\(",
                          str(message or "")))


def run_calls(admin, db, extschema, roles, calls_of, baseline, failures, report, phase):
    with connect(admin, db, None) as probe:
        for label, role in roles:
            reset_state(probe, extschema)
            run_calls_as(admin, db, extschema, (label, role), probe, calls_of, baseline, failures, report, phase)


def run_calls_as(admin, db, extschema, who, probe, calls_of, baseline, failures, report, phase):
    label, role = who
    caller = Caller(admin, db, role, label, probe)
    try:
        for fn, vol, stmt in calls_of:
            what = f"[{db}] {phase}: {label}: {fn.signature}"
            outcome, detail, ran, warnings = caller.call(stmt)
            report["calls"] += 1
            if ran or warnings:
                judge_planted(ran, warnings, extschema, failures, what, report)
            if phase == "baseline":
                baseline[(label, fn.signature)] = comparable(fn, vol, outcome, detail)
                continue
            if outcome == "42725":
                judge_ambiguous(detail, caller.context, fn.name, extschema, failures, report, what)
                continue
            before = baseline.get((label, fn.signature))
            if outcome == "42723" and before and before[0] != "42723":
                # generated SQL refused to call a function that is not
                # the extension's own: a refusal, not a capture
                report.setdefault("refused_42723", []).append(f"{what}: {detail}")
                continue
            now = comparable(fn, vol, outcome, detail)
            direct = ran or warnings  # judged above: a capture failed already
            if before != now and not direct:
                fail(failures, f"{what}: outcome {now[0]} after planting, {before[0] if before else '?'} before"
                     + (f" ({str(detail)[:200]})" if outcome not in ("value", "rows", "NULL", "no rows") else ""))
    finally:
        caller.close()


def check_rolsuper(admin, failures, when):
    with harness.connect(conninfo=admin) as c:
        sup = c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone()[0]
        if sup:
            c.execute(f"ALTER ROLE {OWNER} NOSUPERUSER")
    if sup:
        fail(failures, f"{OWNER} is a SUPERUSER {when}")


def check_shares(admin, db, extschema, roles, failures, report):
    """my_items, slot_counts and notify_slot on varchar, character(n) and
    domain keys agree with zlib.crc32(key::text) % n."""
    ext = ident(extschema)
    with connect(admin, db, OWNER) as c:
        c.add_notice_handler(lambda d: None)
        c.execute("DROP TRIGGER IF EXISTS pl_notify ON public.pl_k_varchar")
        c.execute(f"CREATE TRIGGER pl_notify AFTER INSERT ON public.pl_k_varchar FOR EACH ROW "
                  f"EXECUTE FUNCTION {ext}.notify_slot('plk', '{N_SHARES}', 'k')")
    for label, role in roles:
        caller = Caller(admin, db, role, label)
        c = caller.conn
        try:
            for t in KEY_TABLES:
                what = f"[{db}] {label}: shares of {t}"
                keys = [r[0] for r in c.execute(f"SELECT k::text FROM public.{t}").fetchall()]
                expect = {}
                for k in keys:
                    expect.setdefault(zlib.crc32(k.encode()) % N_SHARES, set()).add(k)
                o, counts, ran, w = caller.call(f"SELECT slot, items FROM {ext}.slot_counts('public.{t}'::regclass, {N_SHARES})")
                report["calls"] += 1
                if ran or w:
                    judge_planted(ran, w, extschema, failures, what + " (slot_counts)", report)
                want = sorted((s, len(expect.get(s, ()))) for s in range(N_SHARES))
                if o == "42725":
                    judge_ambiguous(counts, caller.context, "slot_counts", extschema, failures, report,
                                    f"[{db}] shares: {label}: slot_counts on {t}")
                elif o == "42723":
                    report.setdefault("refused_42723", []).append(f"[{db}] shares: {label}: slot_counts on {t}: {counts}")
                elif o != "rows" or sorted(counts) != want:
                    fail(failures, f"{what}: slot_counts gave {counts if o in ('rows', 'value') else o + ' ' + str(counts)}, Python {want}")
                for s in range(N_SHARES):
                    o, rows, ran, w = caller.call(f"SELECT k::text FROM {ext}.my_items(NULL::public.{t}, {s}, {N_SHARES})")
                    report["calls"] += 1
                    if ran or w:
                        judge_planted(ran, w, extschema, failures, what + f" (my_items slot {s})", report)
                    got = {r[0] for r in rows} if isinstance(rows, list) else rows
                    if o == "42725":
                        judge_ambiguous(rows, caller.context, "my_items", extschema, failures, report,
                                        f"[{db}] shares: {label}: my_items on {t}")
                    elif o == "42723":
                        report.setdefault("refused_42723", []).append(f"[{db}] shares: {label}: my_items on {t}: {rows}")
                    elif got != expect.get(s, set()):
                        fail(failures, f"{what}: my_items slot {s} of {N_SHARES} gave {sorted(got) if isinstance(got, set) else got}, "
                             f"Python {sorted(expect.get(s, set()))}")
            # notify_slot: one notification per row, on its slot's channel
            what = f"[{db}] {label}: notify_slot on a varchar key"
            chans = {}
            for s in range(N_SHARES):
                ch = c.execute(f"SELECT {ext}.slot_channel('plk', {s})").fetchone()[0]
                chans[ch] = s
                c.execute(f"LISTEN {ident(ch)}")
            sent = {}
            for i in range(8):
                k = f"{label}-{i}"
                caller.warnings = []
                before = caller.hits()
                try:
                    c.execute("INSERT INTO public.pl_k_varchar VALUES (%s, 0)", (k,))
                    sent[k] = zlib.crc32(k.encode()) % N_SHARES
                except psycopg.Error as e:
                    if e.diag.sqlstate == "42725":
                        judge_ambiguous(e.diag.message_primary, e.diag.context, "notify_slot", extschema,
                                        failures, report, what)
                    else:
                        fail(failures, f"{what}: INSERT failed: {e.diag.sqlstate} {e.diag.message_primary}")
                ran = caller.hits() - before
                if ran or caller.warnings:
                    judge_planted(ran, list(caller.warnings), extschema, failures, what, report)
                report["calls"] += 1
            got = []
            deadline = time.monotonic() + 10
            while len(got) < len(sent) and time.monotonic() < deadline:
                for n in c.notifies(timeout=max(0.05, deadline - time.monotonic()), stop_after=len(sent) - len(got)):
                    got.append(chans.get(n.channel, n.channel))
            want = sorted(sent.values())
            if sorted(got, key=str) != sorted(want, key=str):
                fail(failures, f"{what}: notifications on slots {sorted(got, key=str)}, Python {want}")
        finally:
            caller.close()
