#!/usr/bin/env python3
"""check_modules.py — private names stay in their module; public bodies are declared in its header.

include/epfuse/ is laid out by module:
  core/    the primitives (ptx, team, signal, nccl) and the row helpers that HT and LL share
  route/   the route passes and their launchers      quant/  MXFP8 / per-128 FP8
  ht/      high-throughput dispatch and combine      ll/     low-latency dispatch and combine
and the host C headers at the top level (config.h, plan.h, ...). A private name (a function,
macro or type spelled epf__* or EPF__*) is its module's own business: a file of module X may use
the private names of X, of core/ and of the top-level C headers (the base every module stands on),
and no other. When another module needs one, it becomes public (an epf_ name with a contract) or
moves down into core/. The launchers (<module>/kernels.cuh) are part of their module.

Files that define nothing are not scanned for uses either: the umbrella epfuse.cuh and the
forwarding headers kept at the paths of before (they only include). Comments and string literals
are ignored.

Second rule: a module's declaration header (route/route.cuh, quant/quant.cuh, ht/ht.cuh,
ll/ll.cuh) is what a kernel writer reads, so every public function (epf_*) defined in
<module>/impl/ has its prototype there, and its contract comment sits above that prototype, not
above the definition (a definition in impl/ has no comment block directly above it).
Exit 0: clean; 1: each finding listed as file:line.
Usage: check_modules.py [--root DIR]
"""
import argparse
import collections
import pathlib
import re
import sys

MODULES = ("core", "route", "quant", "ht", "ll")
BASE = "(top level)"  # the host C headers
SHARED = ("core", BASE)  # whose private names every module may use

PRIVATE = re.compile(r"\b(epf__\w+|EPF__\w+)\b")
QUAL = r"(?:EPF_\w+|static|inline|__device__|__host__|__global__|__forceinline__|__noinline__)"
PUBLIC_DEF = re.compile(r"^(?:EPF_DEVICE_INLINE|EPF_HD|EPF_HOST_DEVICE_INLINE|EPF_INLINE|EPF__DEVICE_NOINLINE)\s+"
                        r"[^;{=()]*?\b(epf_[a-z0-9]\w*)\s*\(")
DEF_FUNC = re.compile(r"^" + QUAL + r"(?:\s+" + QUAL + r")*\s+[^;{=()]*?\b(epf__\w+)\s*\(", re.M)
DEF_MACRO = re.compile(r"^\s*#\s*define\s+(epf__\w+|EPF__\w+)\b", re.M)
DEF_TYPE = re.compile(r"^\}\s*(epf__\w+)\s*;|^typedef\s+[^;{]*?\b(epf__\w+)\s*;|^(?:typedef\s+)?(?:struct|enum|union)\s+(epf__\w+)\b",
                      re.M)


def strip(text):
    """blank out comments and string / character literals, keeping line breaks"""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(text[i])
            i += 1
            continue
        out.append("".join(c if c == "\n" else " " for c in text[i:j]))
        i = j
    return "".join(out)


def module_of(rel):
    """rel: path under include/epfuse; its module, BASE for a top-level C header, None when not scanned"""
    parts = rel.parts
    if len(parts) > 1:
        return parts[0] if parts[0] in MODULES else None  # detail/: forwarding headers only
    return BASE if rel.suffix == ".h" else None  # epfuse.cuh and the forwarding .cuh of before


def scan(root):
    inc = root / "include/epfuse"
    files = sorted(p for p in inc.rglob("*") if p.suffix in (".h", ".cuh"))
    code, owner = {}, collections.defaultdict(set)
    for p in files:
        rel = p.relative_to(inc)
        mod = module_of(rel)
        if mod is None:
            continue
        code[p] = (rel, mod, strip(p.read_text(encoding="utf-8")))
        text = code[p][2]
        for m in DEF_FUNC.finditer(text):
            owner[m.group(1)].add((mod, rel))
        for m in DEF_MACRO.finditer(text):
            owner[m.group(1)].add((mod, rel))
        for m in DEF_TYPE.finditer(text):
            owner[next(g for g in m.groups() if g)].add((mod, rel))
    findings = []
    for p, (rel, mod, text) in code.items():
        seen = set()
        for ln, line in enumerate(text.split("\n"), 1):
            for m in PRIVATE.finditer(line):
                name = m.group(1)
                defs = owner.get(name)
                if not defs or name in seen:
                    continue  # not defined in include/ (a parameter, a local macro of a test), or reported
                mods = {d[0] for d in defs}
                if mod in mods or mods & set(SHARED):
                    continue
                seen.add(name)
                where = ", ".join(sorted(f"include/epfuse/{d[1].as_posix()}" for d in defs))
                findings.append(f"include/epfuse/{rel.as_posix()}:{ln}: {name} is private to "
                                f"{'/'.join(sorted(mods))}/ ({where}); this file is in {mod}/")
    return len(code), findings


def check_declarations(root):
    """every public function defined in <module>/impl/ is declared in <module>/<module>.cuh, with
    its contract there and no comment block directly above the definition"""
    inc = root / "include/epfuse"
    findings = []
    for mod in MODULES:
        decl = inc / mod / f"{mod}.cuh"
        if not decl.is_file():
            continue
        declared = set()
        for line in strip(decl.read_text(encoding="utf-8")).split("\n"):
            m = PUBLIC_DEF.match(line)
            if m:
                declared.add(m.group(1))
        for p in sorted((inc / mod / "impl").glob("*.cuh")):
            lines = p.read_text(encoding="utf-8").split("\n")
            rel = p.relative_to(root).as_posix()
            for i, line in enumerate(lines):
                m = PUBLIC_DEF.match(line)
                if not m:
                    continue
                name = m.group(1)
                if name not in declared:
                    findings.append(f"{rel}:{i + 1}: {name} is public but not declared in include/epfuse/{mod}/{mod}.cuh")
                elif i > 0 and lines[i - 1].rstrip().endswith("*/"):
                    findings.append(f"{rel}:{i + 1}: {name} has a comment above its definition; its contract belongs "
                                    f"above its prototype in include/epfuse/{mod}/{mod}.cuh")
    return findings


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    a = ap.parse_args()
    n, findings = scan(pathlib.Path(a.root))
    decls = check_declarations(pathlib.Path(a.root))
    for f in findings + decls:
        print(f)
    print(f"check_modules: {n} files, {len(findings)} private name(s) used outside their module, "
          f"{len(decls)} public definition(s) of impl/ not declared with their contract in the module header")
    return 1 if findings or decls else 0


if __name__ == "__main__":
    sys.exit(main())
