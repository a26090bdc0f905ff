#!/usr/bin/env python3
"""gen_api_docs.py — one reference page per public header, generated from the header itself.

The public headers are the host C headers and epfuse.cuh at the top of include/epfuse/, the
primitives in core/, and each module's headers (route/ quant/ ht/ ll/: the declaration header
<module>.cuh and the launchers kernels.cuh); not the bodies in <module>/impl/ and not the
forwarding headers kept at the paths of before. For each it writes docs/api/<path>.md with
  * the header's top-of-file manual (what it is / does NOT do / usage / options / contents), and
    the manual of each impl/ part it includes,
  * every public type (typedef struct / enum epf_..._t) with every field and its comment, and the
    comment directly above it, in file order (the header, then its impl/ parts),
  * every public function (epf_ prefix, not the private epf__) with its signature and the contract
    comment directly above it, in file order (a declaration header's prototypes come first),
plus docs/api/README.md, an index. The headers stay the single source: edit them, then rerun this.
Usage:
  gen_api_docs.py            (re)write docs/api/
  gen_api_docs.py --check    exit 1 if docs/api/ differs from what the headers give (a CTest, label compile)
  --rev HEAD                 read the committed headers (when others have uncommitted header edits)
"""
import argparse
import pathlib
import re
import subprocess
import sys

REV = None  # --rev: read the headers of a git revision instead of the working tree


def read(path):
    if REV is None:
        return path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT).as_posix()
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{REV}:{rel}"], check=True, capture_output=True,
                          text=True).stdout


def exists(path):
    if REV is None:
        return path.is_file()
    rel = path.relative_to(ROOT).as_posix()
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{REV}:{rel}"], capture_output=True).returncode == 0


MODULE_DIRS = ("core", "route", "quant", "ht", "ll")


def list_headers(root):
    """the public headers: top level, core/*, <module>/* (not impl/, detail/ or forwarding headers)"""
    inc = root / "include/epfuse"
    if REV is None:
        names = [p.relative_to(inc).as_posix() for p in inc.rglob("*")]
    else:
        names = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "--name-only", f"{REV}:include/epfuse"],
                               check=True, capture_output=True, text=True).stdout.split()
    out = []
    for n in names:
        parts = n.split("/")
        if not n.endswith((".h", ".cuh")) or len(parts) > 2 or (len(parts) == 2 and parts[0] not in MODULE_DIRS):
            continue
        if "forwarding header" in read(inc / n).split("\n")[0]:
            continue
        out.append(inc / n)
    return sorted(out, key=lambda p: (p.relative_to(inc).as_posix().count("/"), p.relative_to(inc).as_posix()))

ROOT = None
QUALIFIERS = r"(?:EPF_CAPI_FN|EPF_DEVICE_INLINE|EPF_HOST_DEVICE_INLINE|EPF_HD|EPF_INLINE|static\s+inline|static\s+__device__|__device__)"
FUNC = re.compile(r"^" + QUALIFIERS + r"\s+[^;{=]*?\b(epf_[a-z0-9_]+)\s*\(")


def manual(lines):
    if not lines or not lines[0].lstrip().startswith("/*"):
        return ""
    out = []
    for l in lines:
        end = "*/" in l
        l = l.split("*/")[0]
        l = re.sub(r"^\s*/\*\s?", "", l)
        l = re.sub(r"^ \*( |$)", "", l)
        out.append(l.rstrip())
        if end:
            break
    return "\n".join(out).strip("\n")


def comment_above(lines, i):
    """the /* ... */ block (or // lines) ending on the line just above line i"""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        return ""
    if j < 0:
        return ""
    if lines[j].strip().endswith("*/"):
        k = j
        while k >= 0 and "/*" not in lines[k]:
            k -= 1
        if k < 0:
            return ""
        body = []
        for l in lines[k:j + 1]:
            l = re.sub(r"^\s*/\*\s?", "", l)
            l = l.replace("*/", "")
            l = re.sub(r"^\s*\*( |$)", "", l)
            body.append(l.rstrip())
        return "\n".join(body).strip("\n")
    if lines[j].strip().startswith("//"):
        k = j
        while k >= 0 and lines[k].strip().startswith("//"):
            k -= 1
        return "\n".join(re.sub(r"^\s*//\s?", "", l) for l in lines[k + 1:j + 1])
    return ""


def functions(lines):
    out = []
    for i, l in enumerate(lines):
        m = FUNC.match(l)
        if not m or m.group(1).startswith("epf__"):
            continue
        sig = []
        for l2 in lines[i:i + 12]:
            sig.append(l2.rstrip())
            if "{" in l2 or l2.rstrip().endswith(";"):
                break
        text = " ".join(s.strip() for s in sig)
        text = re.sub(r"\s*\{.*$", "", text).rstrip(";").strip()
        text = re.sub(r"\s+", " ", text)
        out.append((m.group(1), text + ";", comment_above(lines, i)))
    return out


TYPE_START = re.compile(r"^typedef\s+(struct|enum|union)\s+(epf_[a-z0-9_]+)\s*\{")
TYPE_END = re.compile(r"^\}\s*(epf_[a-z0-9_]+_t)\s*;")


def types(lines):
    """every public typedef struct/enum: (name, its definition verbatim, the comment above it)"""
    out = []
    i = 0
    while i < len(lines):
        m = TYPE_START.match(lines[i])
        if not m or m.group(2).startswith("epf__"):
            i += 1
            continue
        j = i
        while j < len(lines) and not TYPE_END.match(lines[j]):
            j += 1
        if j == len(lines):
            break
        name = TYPE_END.match(lines[j]).group(1)
        out.append((name, "\n".join(l.rstrip() for l in lines[i:j + 1]), comment_above(lines, i)))
        i = j + 1
    return out


def page(root, header):
    rel = header.relative_to(root).as_posix()
    name = header.relative_to(root / "include/epfuse").as_posix()
    up = "../" * (name.count("/") + 2)  # from docs/api/<name>.md to the repository root
    lines = read(header).split("\n")
    md = [f"# `{name}`", "",
          f"<!-- generated by scripts/gen_api_docs.py from {rel}; do not edit: edit the header and rerun -->", "",
          f"Source: [`{rel}`]({up}{rel}). Contract tags (`[collective:block]`, `[smem-reuse]`, ...) are "
          f"defined in [concepts.md]({up}docs/concepts.md).", "", "## Manual", "", "```text", manual(lines), "```", ""]
    funcs = functions(lines)
    typs = types(lines)
    parts = []
    for inc in re.findall(r'^#include "(impl/[^"]+)"', "\n".join(lines), re.M):  # the bodies, by part
        d = header.parent / inc
        if exists(d):
            dl = read(d).split("\n")
            parts.append((inc, manual(dl)))
            funcs += functions(dl)
            typs += types(dl)
    if parts:
        md += ["## Parts", ""]
        for inc, man in parts:
            md += [f"### `{name.rsplit('/', 1)[0]}/{inc}`", "", "```text", man, "```", ""]
    if typs:
        md += ["## Types", ""]
        for name, body, com in typs:
            md += [f"### `{name}`", ""]
            if com:
                md += ["```text", com, "```", ""]
            md += ["```c", body, "```", ""]
    md += ["## Functions", ""]
    if not funcs:
        md += ["(no public functions: types and macros only; see the manual above)", ""]
    seen = set()
    for name, sig, com in funcs:
        if name in seen:  # #if / #else variants: document the first
            continue
        seen.add(name)
        md += [f"### `{name}`", "", "```text", sig, "```", ""]
        if com:
            md += ["```text", com, "```", ""]
        else:
            md += ["(no contract comment above the definition; see the manual)", ""]
    return "\n".join(md).rstrip("\n") + "\n", len(seen), len(typs)


def generate(root):
    headers = list_headers(root)
    files, index = {}, ["# API reference", "",
                        "<!-- generated by scripts/gen_api_docs.py; do not edit -->", "",
                        "One page per public header (the host C headers, epfuse.cuh, core/, and each module's "
                        "declaration header and launchers; a module's impl/ parts are read through its header), "
                        "generated from the header's manual, every public type "
                        "with its fields, and the contract comment above each public function "
                        "(`python3 scripts/gen_api_docs.py`; CTest `test_api_docs` fails when these pages are "
                        "stale).", "", "| header | public types | public functions |", "| --- | ---: | ---: |"]
    for h in headers:
        text, n, nt = page(root, h)
        name = h.relative_to(root / "include/epfuse").as_posix()
        files[name + ".md"] = text
        index.append(f"| [`{name}`]({name}.md) | {nt} | {n} |")
    files["README.md"] = "\n".join(index) + "\n"
    return files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--rev", help="read the headers of this git revision (e.g. HEAD) instead of the working tree")
    a = ap.parse_args()
    global REV, ROOT
    root = ROOT = pathlib.Path(a.root)
    REV = a.rev
    out = root / "docs/api"
    files = generate(root)
    if a.check:
        stale = [n for n, t in files.items() if not (out / n).is_file() or (out / n).read_text(encoding="utf-8") != t]
        extra = [p.relative_to(out).as_posix() for p in out.rglob("*.md")
                 if p.relative_to(out).as_posix() not in files] if out.is_dir() else []
        for n in stale:
            print(f"docs/api/{n}: stale or missing")
        for n in extra:
            print(f"docs/api/{n}: no such header any more")
        print(f"gen_api_docs --check: {len(files)} pages, {len(stale) + len(extra)} out of date"
              + (" (run: python3 scripts/gen_api_docs.py)" if stale or extra else ""))
        return 1 if stale or extra else 0
    out.mkdir(parents=True, exist_ok=True)
    for p in out.rglob("*.md"):  # pages of headers that are gone (or moved)
        if p.relative_to(out).as_posix() not in files:
            p.unlink()
    for n, t in files.items():
        (out / n).parent.mkdir(parents=True, exist_ok=True)
        (out / n).write_text(t, encoding="utf-8")
    print(f"gen_api_docs: wrote {len(files)} pages to docs/api/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
