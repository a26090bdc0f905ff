#!/usr/bin/env python3
"""check_library_rules.py — two rules of the public headers (ctest test_library_rules, label compile).

1. Build options live in one place. Every overridable macro of include/ (an `#ifndef EPF_X` whose
   next line is `#define EPF_X`) is defined in include/epfuse/config.h and documented (its name in
   backticks) in docs/config.md. An experiment switch in a block header fails this check.
2. The ready-made kernels are public blocks. A ready-made kernel header (include/**/kernels*.cuh)
   uses private `epf__` names only for its own launch plumbing: names defined in a ready-made
   kernel header, or the host helpers every launcher shares (HOST_PLUMBING). A kernel that reaches
   into a block's private body fails this check.

Usage: check_library_rules.py [--root DIR]   (exit 1 and one line per violation)
       check_library_rules.py --self-test    (plants one violation of each rule in a copy of the
                                              tree and checks that both are found)
"""
import argparse
import pathlib
import re
import shutil
import sys
import tempfile

CONFIG_H = "include/epfuse/config.h"
CONFIG_DOC = "docs/config.md"
# host-side helpers of every launcher (CUDA status mapping, name checks): plumbing, not block bodies
HOST_PLUMBING = {"epf__cuda_ok", "epf__cuda_status", "epf__check_prefix"}

OVERRIDABLE = re.compile(r"^[ \t]*#[ \t]*ifndef[ \t]+(EPF_\w+)[ \t]*\n[ \t]*#[ \t]*define[ \t]+\1\b", re.M)
DEFINES = [
    re.compile(r"^#[ \t]*define[ \t]+(epf__\w+)", re.M),                 # macro
    re.compile(r"^(?![#/ \t*])[^\n;{}]*?\b(epf__\w+)[ \t]*\(", re.M),      # top-level function
    re.compile(r"}[ \t]*(epf__\w+)[ \t]*;"),                              # typedef struct {...} name;
    re.compile(r"^typedef\b[^\n;]*\b(epf__\w+)[ \t]*;", re.M),             # typedef x name;
    re.compile(r"__shared__[ \t]+\w+[ \t]+(epf__\w+)"),                    # kernel-local shared array
]
USE = re.compile(r"\bepf__\w+\b")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def headers(root):
    inc = root / "include"
    return sorted(p for p in inc.rglob("*") if p.suffix in (".h", ".cuh") and p.is_file())


def check_macros(root):
    problems = []
    cfg = root / CONFIG_H
    doc = (root / CONFIG_DOC).read_text() if (root / CONFIG_DOC).exists() else ""
    for p in headers(root):
        rel = p.relative_to(root).as_posix()
        for m in OVERRIDABLE.finditer(p.read_text()):
            name = m.group(1)
            if name.endswith(("_H", "_CUH", "_H_", "_CUH_")):  # include guards
                continue
            line = p.read_text().count("\n", 0, m.start()) + 1
            if p != cfg:
                problems.append(f"{rel}:{line}: overridable macro {name} outside {CONFIG_H} (tuning constants and "
                                f"options live there; an experiment belongs on a branch)")
            elif not re.search(r"`" + name + r"[`(]", doc):
                problems.append(f"{rel}:{line}: overridable macro {name} is not documented in {CONFIG_DOC}")
    return problems


def check_kernels(root):
    defined = {}  # name -> set of files defining it
    texts = {}
    for p in headers(root):
        t = strip_comments(p.read_text())
        texts[p] = t
        for rx in DEFINES:
            for m in rx.finditer(t):
                defined.setdefault(m.group(1), set()).add(p)
    kernels = [p for p in texts if p.name.startswith("kernels") and p.suffix == ".cuh"]
    problems = []
    for p in kernels:
        rel = p.relative_to(root).as_posix()
        seen = set()
        for m in USE.finditer(texts[p]):
            name = m.group(0)
            if name in seen or name in HOST_PLUMBING:
                continue
            seen.add(name)
            where = defined.get(name, set())
            if not where or any(q.name.startswith("kernels") for q in where):
                continue
            line = texts[p].count("\n", 0, m.start()) + 1
            homes = ", ".join(sorted(q.relative_to(root).as_posix() for q in where))
            problems.append(f"{rel}:{line}: ready-made kernel uses {name}, a private body of {homes}: "
                            f"call the public block (or make it one)")
    return problems


def run(root):
    return check_macros(root) + check_kernels(root)


def self_test(root):
    ok = True
    with tempfile.TemporaryDirectory() as d:
        copy = pathlib.Path(d) / "tree"
        shutil.copytree(root / "include", copy / "include")
        shutil.copytree(root / "docs", copy / "docs", ignore=shutil.ignore_patterns("img", "*.csv"))
        if run(copy):
            print("self-test: the unmodified tree already fails", file=sys.stderr)
            return False
        kern = sorted((copy / "include").rglob("kernels*.cuh"))
        blocks = [p for p in sorted((copy / "include").rglob("*.cuh")) if not p.name.startswith("kernels")
                  and p.name != "epfuse.cuh"]
        # plant 1: an experiment switch in a block header
        b = blocks[0]
        b.write_text(b.read_text() + "\n#ifndef EPF_PLANTED_SWITCH\n#define EPF_PLANTED_SWITCH 0\n#endif\n")
        # plant 2: a ready-made kernel header calling a private block body
        private = None
        for p in blocks:
            m = re.search(r"^EPF_DEVICE_INLINE[^\n(]*\b(epf__\w+)\s*\(", p.read_text(), re.M)
            if m:
                private = m.group(1)
                break
        k = kern[0]
        k.write_text(k.read_text() + f"\nstatic void planted(void) {{ (void)&{private}; }}\n")
        found = run(copy)
        want = ["EPF_PLANTED_SWITCH", private]
        for w in want:
            if not any(w in f for f in found):
                print(f"self-test: the planted violation {w} was not found", file=sys.stderr)
                ok = False
        print(f"self-test: planted EPF_PLANTED_SWITCH in {b.name} and a call of {private} in {k.name}: "
              f"{'both found' if ok else 'MISSED'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    root = a.root.resolve()
    if a.self_test:
        return 0 if self_test(root) else 1
    problems = run(root)
    for p in problems:
        print(p)
    print(f"check_library_rules: {len(headers(root))} headers, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
