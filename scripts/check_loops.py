#!/usr/bin/env python3
"""check_loops.py — two classes of device-code loop that must not exist (a source scan).

1. A warp or block collective inside a loop whose trip count can differ between the threads of
   one warp: a loop whose start depends on the lane or the thread index
   (`for (i = lane; i < n; i += 32)`, `for (x = threadIdx.x; x < n; x += blockDim.x)`):
   when n is not a multiple of the stride, some lanes leave early, and a __shfl_sync /
   __ballot_sync / __match_any_sync / __syncwarp / __syncthreads (or a function whose name says it
   is a collective: *_warp(, *_warps(, *_block(, cub warp primitives) inside it is undefined
   behaviour: garbage values or a hang (hidden 2880 = 360 vectors of 8 did exactly that). Write
   such loops warp-uniformly instead: `for (base = 0; base < n; base += 32) { i = base + lane;
   ... if (i < n) ... }`.
2. A spin loop (`for (;;)`, `while (1)`, `while (true)`) in device code (include/*.cuh) that is not
   marked as bounded: every spin goes through the one bounded wait (core/signal.cuh) or falls back to
   it; the line must say `bounded:` and why in a comment. (Host code polls against deadlines too,
   e.g. host_nccl.h, but is not scanned for this.)

Scans include/ for both (and, with --all, tests/ and examples/ for the first: their host code may
poll in loops of its own). Exit 0: clean; 1: the findings are listed as file:line.
Usage: check_loops.py [--root DIR] [--all]
"""
import argparse
import pathlib
import re
import sys

FOR_INIT = re.compile(r"\bfor\s*\(\s*(?:[\w\s]+\s)?\w+\s*=\s*([^;]*);")
LANE_DEP = re.compile(r"\blane\b|\bepf_lane_id\s*\(\)|\bthreadIdx\.x\b|\blaneid\b")
COLLECTIVE = re.compile(
    r"__shfl\w*_sync\s*\(|__ballot_sync\s*\(|__match_\w+_sync\s*\(|__syncwarp\s*\(|__syncthreads\w*\s*\(|"
    r"__any_sync\s*\(|__all_sync\s*\(|__reduce_\w+_sync\s*\(|\b\w+_warps?\s*\(|\b\w+_block\s*\(|"
    r"\bWarpScan\b|\bWarpReduce\b|\bBlockScan\b|\bBlockReduce\b")
SPIN = re.compile(r"\bfor\s*\(\s*;\s*;\s*\)|\bwhile\s*\(\s*(1|true)\s*\)")


def strip_comments(text):
    """Blank out comments and string literals, keeping offsets and line breaks."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def loop_body(code, start):
    """The loop's body: from the end of the for(...) header to the matching brace (or ';')."""
    depth, i = 0, code.index("(", start)
    while i < len(code):
        if code[i] == "(":
            depth += 1
        elif code[i] == ")":
            depth -= 1
            if depth == 0:
                break
        i += 1
    j = i + 1
    while j < len(code) and code[j].isspace():
        j += 1
    if j < len(code) and code[j] == "{":
        depth, k = 0, j
        while k < len(code):
            if code[k] == "{":
                depth += 1
            elif code[k] == "}":
                depth -= 1
                if depth == 0:
                    return code[j:k + 1]
            k += 1
        return code[j:]
    k = code.find(";", j)
    return code[j:k + 1]


def scan(path, root, spins):
    text = path.read_text(encoding="utf-8", errors="replace")
    code = strip_comments(text)
    lines = text.split("\n")
    found = []
    for m in FOR_INIT.finditer(code):
        dep = LANE_DEP.search(m.group(1))
        if not dep:
            continue
        body = loop_body(code, m.start())
        c = COLLECTIVE.search(body)
        if c:
            line = code.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(root)}:{line}: warp/block collective `{c.group(0).strip()}` inside a "
                         f"loop that starts at the {dep.group(0)} (trip counts can differ between lanes)")
    for m in SPIN.finditer(code if spins else ""):
        line = code.count("\n", 0, m.start()) + 1
        if "bounded:" not in lines[line - 1]:
            found.append(f"{path.relative_to(root)}:{line}: spin loop without a `bounded:` comment on its line")
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--all", action="store_true", help="also scan tests/ and examples/")
    a = ap.parse_args()
    root = pathlib.Path(a.root)
    dirs = ["include"] + (["tests", "examples"] if a.all else [])
    files = [p for d in dirs for p in sorted((root / d).rglob("*")) if p.suffix in (".h", ".cuh", ".cu", ".c")]
    found = [f for p in files for f in scan(p, root, spins=p.is_relative_to(root / "include") and p.suffix == ".cuh")]
    for f in found:
        print(f)
    print(f"check_loops: {len(files)} files, {len(found)} finding(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
