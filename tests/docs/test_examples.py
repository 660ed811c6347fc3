"""Every ```sql example of README.md, CHANGELOG.md and docs/*.md runs as written.

Needs a running cluster with pg_claim installed (PGHOST/PGPORT, as
scripts/test sets them). For each file, in a fresh database of its own
(docs_<file>): CREATE EXTENSION pg_claim, the fixtures of tests/docs/fixtures.sql
that name the file (the example outbox and the other tables the examples
assume), then the file's ```sql blocks in order on one connection
(psycopg 3, autocommit: a block's BEGIN ... COMMIT is its own), statement by
statement, so that a claim, a LISTEN or a SET of one block holds in the next
as in a psql session.

The line just before a fence may mark its block:

  <!-- not run: REASON -->   not runnable as written (a psql transcript with
                             its output, a signature, client placeholders such
                             as $1 or $ids, several sessions, an outside
                             service): skipped and counted, with the reason
  <!-- run alone -->         runs in a new empty database of its own (CREATE
                             EXTENSION pg_claim first unless the block creates
                             it): the installation itself, or a block that
                             creates the example outbox again

A statement followed on the next line by a comment `-- ERROR:  message` (and
optionally `-- HINT:  hint`) must fail with that message (and hint), as psql
would print them; every other statement must succeed. psql's meta-commands
(\\gset, \\c, ...) are not available: a block that needs them is not runnable.

When a plain ``` block follows a ```sql block directly, it is the output of
the block's last statement as psql prints it (aligned, TimeZone UTC; the
footer '(N rows)' may be left out), and must be what the server returns.

A block that creates an extension not installed on this server (postgres_fdw
on some builds) is skipped with the later blocks of its database.

Each file is a test (test_examples[FILE]) that logs one line (blocks run,
failed, skipped with their reasons) and fails with its failures.

    python3 -m pytest tests/docs/test_examples.py                        # every file
    python3 -m pytest tests/docs/test_examples.py --doc docs/claiming.md  # some files
    python3 -m pytest tests/docs/test_examples.py --keep ...              # leave the databases
"""
import difflib
import os
import re

import psycopg
import pytest

import harness
from harness import log

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(HERE, "fixtures.sql")
STATEMENT_TIMEOUT = "60s"
VERBOSE = False  # each statement's first rows, with pytest -vv
ROLE_COMMENT = "created by tests/docs/test_examples.py"

FENCE = re.compile(r"^( *)```sql\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.+?)\s*-->\s*$")
RUN_ALONE = re.compile(r"^\s*<!--\s*run alone\s*-->\s*$")
MARKER = re.compile(r"^\s*<!--\s*(not run|run alone)\b")
CREATES_EXTENSION = re.compile(r"\bCREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?pg_claim\b", re.I)
EXTENSIONS = re.compile(r"\bCREATE\s+EXTENSION\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)
EXPECTED = re.compile(r"^\s*--\s*(ERROR|HINT):\s+(.*?)\s*$")
PLACEHOLDER = re.compile(r"\$[A-Za-z_0-9]+")


class Block:
    def __init__(self, path, line, text, skip=None, alone=False, output=None):
        self.path, self.line, self.text, self.skip, self.alone = path, line, text, skip, alone
        self.output = output  # the psql output shown right after the block, if any


def blocks_of(path):
    """The ```sql blocks of a Markdown file, in order, with their markers."""
    lines = open(os.path.join(ROOT, path), encoding="utf-8").read().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        j = i + 1
        while j < len(lines) and not re.match(r"^ *```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise SystemExit(f"{path}:{i + 1}: a ```sql block that does not end")
        text = "\n".join(l[indent:] if l[:indent].strip() == "" else l for l in lines[i + 1:j])
        prev = lines[i - 1] if i > 0 else ""
        skip = NOT_RUN.match(prev)
        if MARKER.match(prev) and not (skip or RUN_ALONE.match(prev)):
            raise SystemExit(f"{path}:{i}: a marker that is neither '<!-- not run: REASON -->' nor '<!-- run alone -->'")
        output = None
        if j + 1 < len(lines) and re.match(r"^ *```\s*$", lines[j + 1]):
            k = j + 2
            while k < len(lines) and not re.match(r"^ *```\s*$", lines[k]):
                k += 1
            output = [l[indent:] for l in lines[j + 2:k]]
        found.append(Block(path, i + 1, text, skip.group(1) if skip else None, bool(RUN_ALONE.match(prev)), output))
        i = j + 1
    return found


def statements(text):
    """The statements of a block: (sql, the line of the block it ends on), split
    at semicolons outside quotes, comments and dollar quotes. A statement's
    trailing comment on its last line stays with it."""
    out, start, i, n = [], 0, 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c in "'\"":
            escapes = c == "'" and i > 0 and text[i - 1] in "eE" and not (i > 1 and (text[i - 2].isalnum() or text[i - 2] == "_"))
            i += 1
            while i < n:
                if escapes and text[i] == "\\":
                    i += 2
                    continue
                if text[i] == c:
                    if text[i + 1:i + 2] == c:
                        i += 2
                        continue
                    break
                i += 1
            i += 1
        elif c == "$":
            m = re.match(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$", text[i:])
            if m and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
                end = text.find(m.group(0), i + len(m.group(0)))
                i = n if end < 0 else end + len(m.group(0))
            else:
                i += 1
        elif c == ";":
            eol = text.find("\n", i)
            eol = n if eol < 0 else eol
            rest = text[i + 1:eol].strip()
            end = eol if not rest or rest.startswith("--") else i + 1
            out.append((text[start:end], text.count("\n", 0, i)))
            start = i = end
        else:
            i += 1
    rest = text[start:]
    if re.sub(r"--[^\n]*", "", rest).strip():
        out.append((rest, text.count("\n")))
    return out


def expectation(block_lines, end_line):
    """The error (message, hint) the lines after a statement's last line say it
    raises, as psql prints them; None when they say nothing."""
    msg = hint = None
    for line in block_lines[end_line + 1:]:
        m = EXPECTED.match(line)
        if not m:
            break
        if m.group(1) == "ERROR" and msg is None:
            msg = m.group(2)
        elif m.group(1) == "HINT" and msg is not None:
            hint = m.group(2)
    return (msg, hint) if msg is not None else None


def connect(dbname):
    c = harness.connect(dbname, application_name="docs examples")
    c.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
    c.execute("SET TimeZone = 'UTC'")  # as the outputs in the docs show them
    return c


def fresh_database(name, extension=True):
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    c = connect(name)
    if extension:
        c.execute("CREATE EXTENSION pg_claim")
    return c


def drop_database(name):
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def load_fixtures():
    """fixtures.sql: the cluster's roles (-- roles: and -- leftover roles:
    lines) and sections that each begin with '-- for: FILE...'."""
    roles, leftover, sections, cur = [], [], [], None
    for line in open(FIXTURES, encoding="utf-8"):
        m = re.match(r"^-- (roles|leftover roles|for):\s*(.*)$", line)
        if m and m.group(1) == "roles":
            roles += m.group(2).split()
        elif m and m.group(1) == "leftover roles":
            leftover += m.group(2).split()
        elif m:
            cur = (m.group(2).split(), [])
            sections.append(cur)
        elif cur and line.startswith("-- include: "):
            cur[1].append(open(os.path.join(ROOT, line[len("-- include: "):].strip()), encoding="utf-8").read())
        elif cur:
            cur[1].append(line)
    return roles, leftover, [(files, "".join(sql)) for files, sql in sections]


# the types psql aligns to the right
NUMERIC_TYPES = {20, 21, 23, 26, 28, 29, 700, 701, 790, 1700, 5069}


def psql_aligned(res):
    """A result as psql prints it in its default aligned format, lines
    right-stripped, with its footer."""
    cols = [res.fname(i).decode() for i in range(res.nfields)]
    rows = [[(res.get_value(r, i) or b"").decode() for i in range(res.nfields)] for r in range(res.ntuples)]
    right = [res.ftype(i) in NUMERIC_TYPES for i in range(res.nfields)]
    w = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(cols)]
    out = [" " + " | ".join(" " * ((w[i] - len(h)) // 2) + h + " " * ((w[i] - len(h) + 1) // 2)
                            for i, h in enumerate(cols)),
           "+".join("-" * (x + 2) for x in w)]
    for r in rows:
        out.append(" " + " | ".join(v.rjust(w[i]) if right[i] else v.ljust(w[i]) for i, v in enumerate(r)))
    out.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return [l.rstrip() for l in out]


def output_differs(block, res):
    """None when the output shown after the block is the last statement's
    result as psql prints it (the footer '(N rows)' may be left out), else
    the difference."""
    want = [l.rstrip() for l in block.output]
    while want and not want[-1]:
        want.pop()
    if res is None or res.nfields == 0:
        return "the last statement returns no rows, but the example shows an output"
    got = psql_aligned(res)
    if not (want and re.match(r"^\(\d+ rows?\)$", want[-1])):
        got.pop()
    if got == want:
        return None
    diff = difflib.unified_diff(want, got, "the example", "the server", lineterm="")
    return "the output differs:\n" + "\n".join("    " + l for l in diff)


def where(block, end_line=None):
    return f"{block.path}:{block.line + 1 + (end_line or 0)}"


def run_block(c, block):
    """Runs a block on connection c; None, or why it failed."""
    lines = block.text.split("\n")
    res = None
    stmts = statements(block.text)
    for k, (sql, end_line) in enumerate(stmts):
        if re.match(r"^\s*\\", re.sub(r"--[^\n]*", "", sql).strip() or "x"):
            return f"{where(block, end_line)}: a psql meta-command: mark the block <!-- not run: ... -->"
        # the lines after a statement speak of it when it ends its line
        last_on_line = k + 1 == len(stmts) or stmts[k + 1][1] != end_line
        want = expectation(lines, end_line) if last_on_line else None
        try:
            cur = c.execute(sql)
            res = cur.pgresult
            if VERBOSE:
                rows = cur.fetchmany(3) if cur.description else cur.statusmessage
                print(f"  {where(block, end_line)}: {sql.strip().splitlines()[-1].strip()}\n    -> {rows}")
            if want:
                return f"{where(block, end_line)}: succeeded, but the example says it fails with ERROR:  {want[0]}"
        except psycopg.Error as e:
            d = e.diag
            if want and d.message_primary == want[0] and (want[1] is None or d.message_hint == want[1]):
                continue
            got = f"ERROR:  {d.message_primary} ({d.sqlstate})"
            if want and d.message_primary == want[0]:
                return f"{where(block, end_line)}: the hint differs:\n    doc:    HINT:  {want[1]}\n    server: HINT:  {d.message_hint}"
            if want:
                return f"{where(block, end_line)}: fails otherwise than the example says:\n    doc:    ERROR:  {want[0]}\n    server: {got}"
            why = f"{where(block, end_line)}: {got}"
            if d.message_hint:
                why += f"\n    HINT:  {d.message_hint}"
            why += "\n    in: " + "\n        ".join(sql.strip().split("\n"))
            if d.sqlstate == "42601" and PLACEHOLDER.search(re.sub(r"\$([A-Za-z_]\w*)?\$.*?\$\1\$", "", sql, flags=re.S)):
                why += "\n    (a client placeholder: mark the block <!-- not run: ... -->)"
            return why
    if block.output is not None:
        why = output_differs(block, res)
        if why:
            return f"{where(block)}: {why}"
    return None


def reset(c):
    if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        c.execute("ROLLBACK")


def run_file(path, fixtures, keep):
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0].lower())
    db = f"docs_{stem}"
    blocks = blocks_of(path)
    ran, skipped, failures, dbs = 0, [], [], [db]
    # a file whose blocks create the extension themselves starts without it
    own = any(CREATES_EXTENSION.search(b.text) for b in blocks if not (b.skip or b.alone))
    c = fresh_database(db, extension=not own)
    missing = None  # an extension not installed here, which a block of this database needed
    try:
        available = {e for (e,) in c.execute("SELECT name FROM pg_available_extensions")}
        for files, sql in fixtures:
            if path in files:
                c.execute(sql)
        for i, b in enumerate(blocks, 1):
            if b.skip:
                skipped.append(b.skip)
                continue
            need = [e for e in EXTENSIONS.findall(b.text) if e.lower() not in available]
            if need or (missing and not b.alone):
                if need and not b.alone:
                    missing = need[0]
                skipped.append(f"needs {need[0] if need else missing}, not installed here")
                continue
            ran += 1
            if b.alone:
                alone = f"{db}_{i}"
                dbs.append(alone)
                with fresh_database(alone, extension=not CREATES_EXTENSION.search(b.text)) as a:
                    why = run_block(a, b)
            else:
                why = run_block(c, b)
                reset(c)
            if why:
                failures.append(why)
    finally:
        c.close()
        if not keep:
            for d in dbs:
                drop_database(d)
    return ran, skipped, failures


def doc_files(config):
    """The files of --doc (relative to the checkout), or README.md,
    CHANGELOG.md and docs/*.md."""
    given = [os.path.relpath(os.path.abspath(f), ROOT) for f in config.getoption("--doc") or []]
    for f in given:
        if not os.path.isfile(os.path.join(ROOT, f)) or f.startswith(".."):
            raise pytest.UsageError(f"docs: no file {f} in the repository")
    return given or ["README.md", "CHANGELOG.md"] + sorted(
        os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))


def pytest_generate_tests(metafunc):
    if "doc" in metafunc.fixturenames:
        metafunc.parametrize("doc", doc_files(metafunc.config))


@pytest.fixture(scope="module")
def fixtures(request):
    """The fixtures of fixtures.sql, and the roles they name: made for the
    module (those an earlier run left dropped first), dropped after it
    unless --keep."""
    global VERBOSE
    VERBOSE = request.config.getoption("verbose") > 1
    os.chdir(ROOT)
    roles, leftover, fixtures = load_fixtures()
    with connect("postgres") as c:
        have = {r for (r,) in c.execute("SELECT rolname FROM pg_roles")}
        for r in leftover:
            if r in have:
                try:
                    c.execute(f"DROP ROLE {r}")
                except psycopg.Error as e:
                    pytest.fail(f"docs: cannot drop the role {r} an earlier run left: {e.diag.message_primary}")
        # roles of an earlier run that did not end are this run's too
        ours = {r for (r,) in c.execute(
            "SELECT rolname FROM pg_roles WHERE shobj_description(oid, 'pg_authid') = %s", (ROLE_COMMENT,))}
        created = [r for r in roles if r not in have or r in ours]
        for r in created:
            if r not in have:
                c.execute(f"CREATE ROLE {r} NOLOGIN")
                c.execute(f"COMMENT ON ROLE {r} IS '{ROLE_COMMENT}'")
    yield fixtures
    if not request.config.getoption("--keep"):
        with connect("postgres") as c:
            for r in created + leftover:
                if c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (r,)).fetchone():
                    try:
                        c.execute(f"DROP ROLE {r}")
                    except psycopg.Error as e:
                        log(f"docs: role {r} left: {e.diag.message_primary}")


def test_examples(doc, fixtures, request):
    ran, skipped, failed = run_file(doc, fixtures, request.config.getoption("--keep"))
    line = f"{doc}: {ran} run, {len(failed)} failed, {len(skipped)} skipped"
    if skipped:
        reasons = {}
        for s in skipped:
            reasons[s] = reasons.get(s, 0) + 1
        line += " (skipped: " + "; ".join(s + (f" x{k}" if k > 1 else "") for s, k in reasons.items()) + ")"
    log(line)
    harness.check(not failed, "\n".join("FAILED " + why for why in failed))
