#!/usr/bin/env python3
"""check_doc_snippets.py — every code block in the docs is compiled code (STYLE.md §9).

Checks every fenced code block of README.md, docs/*.md and docs/dev/**/*.md (the engineering notes,
e.g. the performance log; docs/api/ is generated from the headers by gen_api_docs.py and checked by
its --check mode):
  * a block fenced as sh / bash / shell / console / cmake / text (shell commands, CMake, diagrams,
    program output) is accepted as it is;
  * any other block (c, cuda, cpp, or no language) must directly follow a line
        <!-- snippet: <path from the repo root>#<name> -->
    and equal, verbatim after removing the common indentation, the region of that file between the
    lines containing `example-begin <name>` and `example-end <name>` (in a // or /* */ comment).
    The regions live in compiled sources (examples/, tests/), so a snippet that stops compiling
    fails the build, and a snippet edited in the docs alone fails this check.
Usage: check_doc_snippets.py [--root DIR]      exit 0: all good; 1: the problems are listed.
"""
import argparse
import pathlib
import re
import sys
import textwrap

FREE = {"sh", "bash", "shell", "console", "cmake", "text"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
SNIP = re.compile(r"^\s*<!--\s*snippet:\s*([^#\s]+)#([\w.-]+)\s*-->\s*$")


def region(path, name):
    lines = path.read_text(encoding="utf-8").split("\n")
    begin = [i for i, l in enumerate(lines) if re.search(r"example-begin\s+" + re.escape(name) + r"\b", l)]
    end = [i for i, l in enumerate(lines) if re.search(r"example-end\s+" + re.escape(name) + r"\b", l)]
    if len(begin) != 1 or len(end) != 1 or end[0] <= begin[0]:
        return None
    body = "\n".join(lines[begin[0] + 1:end[0]])
    return [l.rstrip() for l in textwrap.dedent(body).split("\n")]


def blocks(text):
    """yield (line number, language, body lines, the previous non-blank line)"""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[:3]):
            j += 1
        prev = ""
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0:
            prev = lines[k]
        body = [l.rstrip() for l in textwrap.dedent("\n".join(lines[start + 1:j])).split("\n")]
        yield start + 1, lang, body, prev
        i = j + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    root = pathlib.Path(ap.parse_args().root)
    docs = [root / "README.md"] + sorted((root / "docs").glob("*.md")) + sorted((root / "docs" / "dev").rglob("*.md"))
    problems, nfree, nsnip = [], 0, 0
    for doc in docs:
        rel = doc.relative_to(root)
        for line, lang, body, prev in blocks(doc.read_text(encoding="utf-8")):
            m = SNIP.match(prev)
            if lang in FREE and not m:
                nfree += 1
                continue
            if not m:
                problems.append(f"{rel}:{line}: ```{lang or '(no language)'} block is neither a shell/cmake/text "
                                f"block nor preceded by <!-- snippet: path#name -->")
                continue
            src = root / m.group(1)
            if not src.is_file():
                problems.append(f"{rel}:{line}: snippet source {m.group(1)} does not exist")
                continue
            want = region(src, m.group(2))
            if want is None:
                problems.append(f"{rel}:{line}: no single example-begin/end {m.group(2)} region in {m.group(1)}")
                continue
            while want and not want[-1]:
                want.pop()
            got = list(body)
            while got and not got[-1]:
                got.pop()
            if got != want:
                diff = next((i for i in range(max(len(got), len(want)))
                             if i >= len(got) or i >= len(want) or got[i] != want[i]), 0)
                problems.append(f"{rel}:{line}: block differs from {m.group(1)}#{m.group(2)} at its line {diff + 1}:\n"
                                f"    doc:    {got[diff] if diff < len(got) else '(end)'}\n"
                                f"    source: {want[diff] if diff < len(want) else '(end)'}")
                continue
            nsnip += 1
    for p in problems:
        print(p)
    print(f"check_doc_snippets: {len(docs)} files, {nsnip} compiled snippets, {nfree} shell/cmake/text blocks, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
