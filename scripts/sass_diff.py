#!/usr/bin/env python3
"""sass_diff.py — compare the SASS of two builds of the same translation unit, kernel by kernel.

For device refactors that must not change the generated code (a helper pulled out of two copies
of a loop, a renamed variable), and for checking what a change did before a GPU can time it.

    scripts/sass_diff.py BASE NEW [--kernel PREFIX] [--show N]

BASE / NEW: cubins or executables (any file cuobjdump reads), or `cuobjdump -sass` text dumps.
Per kernel it prints one verdict:
  IDENTICAL       the same instructions, registers and branch targets included;
  SAME-MULTISET   the same instructions with registers renamed and reordered (scheduling only);
  DIFF            instructions only in BASE / only in NEW (counts after register renaming).
--kernel PREFIX: also list the differing instructions of the kernels whose mangled name starts
with PREFIX (at most --show N of each side, default 40).

Needs cuobjdump and nvdisasm on PATH for binary inputs (the CUDA toolkit's, or PyPI's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, whose nvidia/cu13/bin holds them).
Build both sides the same way, e.g.:
    nvcc -O3 -DNDEBUG -arch=sm_90 -cubin -I include -I tests/common -std=c++17 -o new.cubin tests/bench/bench_ll.cu
"""
import argparse
import re
import subprocess
import sys
from collections import Counter


def sass_text(path):
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"\x7fELF":
        return subprocess.run(["cuobjdump", "-sass", path], check=True, capture_output=True, text=True).stdout
    with open(path) as f:
        return f.read()


def kernels(text, normalize):
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        m = re.search(r"/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if cur and m:
            ins = m.group(1)
            if normalize:
                ins = re.sub(r"\bU?R\d+\b", "R", ins)
                ins = re.sub(r"\bU?P\d\b", "P", ins)
                ins = re.sub(r"0x[0-9a-f]+", "#", ins)
            out[cur].append(ins)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--kernel", default=None)
    ap.add_argument("--show", type=int, default=40)
    a = ap.parse_args()
    tb, tn = sass_text(a.base), sass_text(a.new)
    rb, rn = kernels(tb, False), kernels(tn, False)
    nb, nn = kernels(tb, True), kernels(tn, True)
    changed = 0
    for k in sorted(set(rb) | set(rn)):
        if k not in rb or k not in rn:
            print(f"{'ONLY-BASE' if k in rb else 'ONLY-NEW':13} {k}")
            changed += 1
            continue
        if rb[k] == rn[k]:
            print(f"{'IDENTICAL':13} {k} ({len(rb[k])} instructions)")
            continue
        cb, cn = Counter(nb[k]), Counter(nn[k])
        if cb == cn:
            print(f"{'SAME-MULTISET':13} {k} ({len(rb[k])} instructions)")
            continue
        changed += 1
        only_b, only_n = cb - cn, cn - cb
        print(f"{'DIFF':13} {k} ({len(rb[k])} -> {len(rn[k])} instructions; "
              f"{sum(only_b.values())} only in base, {sum(only_n.values())} only in new)")
        if a.kernel and k.startswith(a.kernel):
            for side, c in (("-", only_b), ("+", only_n)):
                for ins, n in c.most_common(a.show):
                    print(f"    {side} {n:3d} x {ins}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
