"""The project layout of docs/architecture.md against the tree, and every
link between the project's pages.

Layout: the code block under "## Project layout" of docs/architecture.md
has one entry per line, its path first (a line that starts with spaces
continues the one before). The check fails when

- a listed path does not exist;
- a path named in an entry's description (a word that contains a slash and
  starts with a top-level directory) exists neither from the root nor
  inside the entry's directory;
- a top-level directory, a module of src/ (src/*.rs, src/*/), a package
  of clients/ or a root of tests/ (tests/*) exists that no entry lists
  (an entry lists its path and the directories above it).

What exists is what git sees (tracked, or untracked and not ignored: no
target/, node_modules/); outside a git checkout, the file system without
those.

Links: every Markdown link of README.md, CHANGELOG.md, CONTRIBUTING.md,
BENCHMARKS.md, docs/*.md and clients/*/README.md to a relative path must
reach an existing file or directory, and its #anchor a heading of the
target page (GitHub's rule: the heading's text in lower case, inline
markup removed, every character that is not a letter, a digit, a space, a
hyphen or an underscore dropped, spaces to hyphens; a repeated heading
gets -1, -2, ...). Links inside code are not links.

Quick start: the sql and python blocks of README.md's "## Quick start" are
those of clients/python/README.md's, which the libs-python layer runs as
written (clients/python/tests/test_server.py). Needs no server: one test
each.
"""
import os
import re
import subprocess

from harness import check, log

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ARCHITECTURE = "docs/architecture.md"
LIBRARY_README = "clients/python/README.md"
IGNORED = {".git", "target", "node_modules", "__pycache__"}


def existing_paths():
    """Every file of the tree (relative, '/'-separated) and every directory
    holding one, as git sees them."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True).stdout.decode()
        files = {f for f in out.split("\0") if f and os.path.exists(os.path.join(ROOT, f))}
    except (OSError, subprocess.CalledProcessError):
        files = set()
        for d, subdirs, names in os.walk(ROOT):
            subdirs[:] = [s for s in subdirs if s not in IGNORED]
            files.update(os.path.relpath(os.path.join(d, n), ROOT).replace(os.sep, "/") for n in names)
    dirs = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    return files, dirs


def layout_entries(text):
    """(line number, path, description) of each entry of the layout block."""
    m = re.search(r"^## Project layout\n(.*?)^```\n(.*?)^```", text, re.S | re.M)
    if not m:
        raise SystemExit(f"{ARCHITECTURE}: no code block under '## Project layout'")
    first = text[:m.start(2)].count("\n") + 1
    entries = []
    for i, line in enumerate(m.group(2).split("\n")):
        if not line.strip():
            continue
        if line[0] == " ":
            if not entries:
                raise SystemExit(f"{ARCHITECTURE}:{first + i}: a continuation line before any entry")
            entries[-1][2] += " " + line.strip()
            continue
        path, _, desc = line.partition(" ")
        entries.append([first + i, path, desc.strip()])
    return entries


def check_layout(files, dirs):
    text = open(os.path.join(ROOT, ARCHITECTURE), encoding="utf-8").read()
    entries = layout_entries(text)
    # an entry lists its path and every directory above it
    listed = {"/".join(e[1].rstrip("/").split("/")[:i]) for e in entries
              for i in range(1, e[1].rstrip("/").count("/") + 2)}
    top = {p.split("/")[0] for p in files | dirs}
    errors = []
    for line, path, desc in entries:
        where = f"{ARCHITECTURE}:{line}"
        p = path.rstrip("/")
        if path.endswith("/") and p not in dirs:
            errors.append(f"{where}: {path} is listed but is not a directory of the tree")
        elif not path.endswith("/") and p not in files:
            errors.append(f"{where}: {path} is listed but is not a file of the tree")
        for word in re.findall(r"[\w.-]+/[\w./-]*", desc):
            w = word.rstrip(".,;:)")
            here = p if path.endswith("/") else os.path.dirname(p)
            inside = f"{here}/{w}".rstrip("/") if here else w.rstrip("/")
            if w.split("/")[0] in top and not {w.rstrip("/"), inside} & (files | dirs):
                errors.append(f"{where}: the description of {path} names {w}, which does not exist")
    wanted = {d for d in dirs if "/" not in d and d not in IGNORED}
    wanted |= {p for p in files | dirs if re.fullmatch(r"src/[^/]+", p) and (p in dirs or p.endswith(".rs"))}
    wanted |= {p for p in dirs if re.fullmatch(r"clients/[^/]+", p)}
    wanted |= {p for p in files | dirs if re.fullmatch(r"tests/[^/]+", p)}
    for p in sorted(wanted - listed):
        kind = "directory" if p in dirs else "file"
        errors.append(f"{ARCHITECTURE}: the {kind} {p}{'/' if p in dirs else ''} exists but the project layout does not list it")
    return len(entries), errors


def slug(heading):
    """GitHub's anchor of a heading's text."""
    t = re.sub(r"`([^`]*)`", r"\1", heading)
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"<[^>]+>", "", t)
    t = "".join(c for c in t.strip().lower() if c.isalnum() or c in " -_")
    return t.replace(" ", "-")


def prose(text):
    """(line number, line) of each line of a Markdown text outside fenced
    code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
        elif m:
            fence = m.group(1)
        else:
            yield n, line


_anchors = {}


def anchors_of(path):
    """The anchors of a page's headings, repeated ones numbered as GitHub does."""
    if path not in _anchors:
        seen, found = {}, set()
        for _, line in prose(open(os.path.join(ROOT, path), encoding="utf-8").read()):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
        _anchors[path] = found
    return _anchors[path]


LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def pages(files):
    fixed = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md", "BENCHMARKS.md"]
    more = sorted(f for f in files if re.fullmatch(r"docs/[^/]+\.md|clients/[^/]+/README\.md", f))
    return [f for f in fixed if f in files] + more


def check_links(files, dirs):
    errors, count = [], 0
    for page in pages(files):
        base = os.path.dirname(page)
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        for n, line in prose(text):
            for target in LINK.findall(re.sub(r"(`+)(?:(?!\1).)+\1", "", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # http:, https:, mailto:
                count += 1
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(base, path)).replace(os.sep, "/") if path else page
                where = f"{page}:{n}"
                if dest.startswith("../") or (dest not in files and dest not in dirs):
                    errors.append(f"{where}: the link {target} leads to {dest}, which does not exist")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors_of(dest):
                    errors.append(f"{where}: the link {target}: {dest} has no heading with the anchor #{anchor}")
    return count, errors


def quick_start_blocks(path):
    """The ```sql and ```python blocks of a page's "## Quick start" section."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    m = re.search(r"^## Quick start\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        return None
    return re.findall(r"^```(sql|python)\n(.*?)^```", m.group(1), re.S | re.M)


def check_quick_start():
    ours, theirs = quick_start_blocks("README.md"), quick_start_blocks(LIBRARY_README)
    if not ours:
        return ["README.md: no sql or python block under '## Quick start'"]
    if ours != theirs:
        return [f"README.md: the quick start's sql and python blocks differ from {LIBRARY_README}'s, "
                "which the libs-python layer runs as written"]
    return []


def test_layout_lists_the_tree():
    files, dirs = existing_paths()
    entries, errors = check_layout(files, dirs)
    log(f"layout: {entries} entries of {ARCHITECTURE} against the tree, {len(errors)} failed")
    check(not errors, "\n".join(errors))


def test_links_and_anchors():
    files, dirs = existing_paths()
    links, errors = check_links(files, dirs)
    log(f"links: {links} relative links and anchors, {len(errors)} failed")
    check(not errors, "\n".join(errors))


def test_quick_start_is_the_librarys():
    errors = check_quick_start()
    check(not errors, "\n".join(errors))
