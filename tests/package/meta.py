#!/usr/bin/env python3
"""Checks META.json against the PGXN Meta Spec 1.0.0 (https://pgxn.org/spec/):
the required keys and the type and form of every key it uses, and that the
versions agree with Cargo.toml and with the default_version of a built
control file.

    tests/package/meta.py META.json CONTROL_FILE

Prints one line and exits 0 when it validates; lists every problem and exits 1
otherwise."""
import json
import os
import re
import sys

SEMVER = r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z][0-9A-Za-z-]*)?"
LICENSES = {
    "agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd", "freebsd",
    "gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1", "lgpl_3_0", "mit",
    "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5", "postgresql", "qpl_1_0", "ssleay",
    "sun", "zlib", "open_source", "restricted", "unrestricted", "unknown",
}
PHASES = {"configure", "build", "runtime", "test", "develop"}
RELATIONS = {"requires", "recommends", "suggests", "conflicts"}
TOP = {
    "name", "abstract", "maintainer", "license", "provides", "meta-spec", "version",
    "description", "generated_by", "tags", "no_index", "prereqs", "release_status", "resources",
}
REQUIRED = ["name", "abstract", "maintainer", "license", "provides", "meta-spec", "version"]

problems = []


def bad(path, what):
    problems.append(f"{path}: {what}")


def is_str(v, path, minlen=1):
    if not isinstance(v, str) or len(v) < minlen:
        bad(path, f"must be a string of at least {minlen} character(s), not {v!r}")
        return False
    return True


def term(v, path):
    # at least two characters, no slash, backslash, whitespace or control character
    if is_str(v, path, 2) and re.search(r"[/\\\s\x00-\x1f\x7f]", v):
        bad(path, f"{v!r} is not a term (no slash, backslash, whitespace or control character)")


def tag(v, path):
    if is_str(v, path) and (len(v) > 255 or re.search(r"[/\\\x00-\x1f\x7f]", v)):
        bad(path, f"{v!r} is not a tag (at most 255 characters, no slash, backslash or control character)")


def semver(v, path):
    if is_str(v, path) and not re.fullmatch(SEMVER, v):
        bad(path, f"{v!r} is not a semantic version (MAJOR.MINOR.PATCH)")


def version_range(v, path):
    if v == 0 or v == "0":
        return
    if not isinstance(v, str) or not all(
        re.fullmatch(r"\s*(==|!=|>=|<=|>|<)?\s*" + SEMVER + r"\s*", part) for part in v.split(",")
    ):
        bad(path, f"{v!r} is not a version range")


def url(v, path):
    if is_str(v, path) and not re.match(r"[a-z][a-z0-9+.-]*://", v):
        bad(path, f"{v!r} is not a URL")


def obj(v, path, allowed=None, required=()):
    if not isinstance(v, dict):
        bad(path, f"must be an object, not {type(v).__name__}")
        return False
    for k in required:
        if k not in v:
            bad(path, f"lacks the required key {k!r}")
    if allowed is not None:
        for k in v:
            if k not in allowed and not k.lower().startswith("x_"):
                bad(f"{path}.{k}", "is not a key of the spec (custom keys start with x_)")
    return True


def validate(meta, root):
    if not obj(meta, "META.json", TOP, REQUIRED):
        return
    if "name" in meta:
        term(meta["name"], "name")
    if "version" in meta:
        semver(meta["version"], "version")
    for k in ("abstract", "description", "generated_by"):
        if k in meta:
            is_str(meta[k], k)
    m = meta.get("maintainer")
    if isinstance(m, list):
        if not m:
            bad("maintainer", "an empty list")
        for i, x in enumerate(m):
            is_str(x, f"maintainer[{i}]")
    elif m is not None:
        is_str(m, "maintainer")
    lic = meta.get("license")
    if isinstance(lic, str):
        if lic not in LICENSES:
            bad("license", f"{lic!r} is not a license name of the spec")
    elif isinstance(lic, list):
        for i, x in enumerate(lic):
            if x not in LICENSES:
                bad(f"license[{i}]", f"{x!r} is not a license name of the spec")
    elif isinstance(lic, dict):
        for k, v in lic.items():
            url(v, f"license.{k}")
    elif lic is not None:
        bad("license", "must be a string, a list or an object")
    if "provides" in meta and obj(meta["provides"], "provides"):
        if not meta["provides"]:
            bad("provides", "names no extension")
        for ext, p in meta["provides"].items():
            term(ext, f"provides key {ext!r}")
            if obj(p, f"provides.{ext}", {"file", "version", "abstract", "docfile"}, ("file", "version")):
                if "version" in p:
                    semver(p["version"], f"provides.{ext}.version")
                for k in ("file", "docfile"):
                    if k in p and is_str(p[k], f"provides.{ext}.{k}") and not os.path.isfile(os.path.join(root, p[k])):
                        bad(f"provides.{ext}.{k}", f"{p[k]!r} is not a file of the distribution")
                if "abstract" in p:
                    is_str(p["abstract"], f"provides.{ext}.abstract")
    if "meta-spec" in meta and obj(meta["meta-spec"], "meta-spec", {"version", "url"}, ("version",)):
        if meta["meta-spec"].get("version") != "1.0.0":
            bad("meta-spec.version", "must be 1.0.0")
        if "url" in meta["meta-spec"]:
            url(meta["meta-spec"]["url"], "meta-spec.url")
    if "release_status" in meta and meta["release_status"] not in ("stable", "testing", "unstable"):
        bad("release_status", f"{meta['release_status']!r} is not stable, testing or unstable")
    if "tags" in meta:
        if not isinstance(meta["tags"], list) or not meta["tags"]:
            bad("tags", "must be a non-empty list")
        else:
            for i, t in enumerate(meta["tags"]):
                tag(t, f"tags[{i}]")
    if "no_index" in meta and obj(meta["no_index"], "no_index", {"file", "directory"}):
        for k, v in meta["no_index"].items():
            for i, x in enumerate(v if isinstance(v, list) else [v]):
                is_str(x, f"no_index.{k}[{i}]")
    if "prereqs" in meta and obj(meta["prereqs"], "prereqs", PHASES):
        for phase, rels in meta["prereqs"].items():
            if obj(rels, f"prereqs.{phase}", RELATIONS):
                for rel, deps in rels.items():
                    if obj(deps, f"prereqs.{phase}.{rel}"):
                        for name, rng in deps.items():
                            term(name, f"prereqs.{phase}.{rel} key {name!r}")
                            version_range(rng, f"prereqs.{phase}.{rel}.{name}")
    if "resources" in meta and obj(meta["resources"], "resources", {"homepage", "bugtracker", "repository"}):
        r = meta["resources"]
        if "homepage" in r:
            url(r["homepage"], "resources.homepage")
        if "bugtracker" in r and obj(r["bugtracker"], "resources.bugtracker", {"web", "mailto"}):
            if "web" in r["bugtracker"]:
                url(r["bugtracker"]["web"], "resources.bugtracker.web")
        if "repository" in r and obj(r["repository"], "resources.repository", {"url", "web", "type"}):
            for k in ("url", "web"):
                if k in r["repository"]:
                    url(r["repository"][k], f"resources.repository.{k}")


def main():
    path, control = sys.argv[1], sys.argv[2]
    root = os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        meta = json.load(f)
    validate(meta, root)
    with open(os.path.join(root, "Cargo.toml")) as f:
        cargo = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)
    with open(control) as f:
        default = re.search(r"^default_version\s*=\s*'([^']*)'", f.read(), re.M).group(1)
    versions = {"META.json version": meta.get("version"), "Cargo.toml": cargo, f"{control} default_version": default}
    versions.update({f"provides.{e}.version": p.get("version") for e, p in meta.get("provides", {}).items() if isinstance(p, dict)})
    if len(set(versions.values())) != 1:
        bad("version", "the versions differ: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if problems:
        print(f"{path} does not validate as PGXN Meta Spec 1.0.0:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"META.json validates (PGXN Meta Spec 1.0.0), version {cargo} as in Cargo.toml and the control file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
