#!/usr/bin/env python3
"""scripts/long_functions.py [--max N] [--exclude GLOB ...] [PATH ...] - C functions longer than N lines.

Lists every function definition in the C files git tracks under PATH (relative to the repository root;
default: the whole repository)
whose body, signature included, spans more than N lines (default 120), longest first, as
"LINES FILE:LINE NAME".  Exit status 1 when it lists any, 0 when none.  It reads the code as this
repository formats it (clang-format: a definition's "{" and "}" alone at column 0), not as a compiler
would; `--exclude 'server/grammar*'` leaves files out.
"""
import argparse
import fnmatch
import os
import re
import subprocess
import sys


def functions(path):
    """(first line, last line, name) of each top-level function definition in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i] != "{":
            i += 1
            continue
        # the signature: the lines above, back to a blank line, a comment end, a "}" or a ";"
        j = i - 1
        while j > 0 and lines[j - 1].strip() and not re.match(r"^(\}|.*;\s*$|.*\*/\s*$|#)", lines[j - 1]):
            j -= 1
        sig = " ".join(l.strip() for l in lines[j:i])
        m = re.search(r"(\w+)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*$", sig)
        k = i + 1
        while k < len(lines) and not lines[k].startswith("}"):
            k += 1
        if m and "=" not in sig.split("(")[0]:
            out.append((j + 1, k + 1, m.group(1)))
        i = k + 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=120, help="longest allowed function in lines (default 120)")
    ap.add_argument("--exclude", action="append", default=[], help="leave out files matching this glob")
    ap.add_argument("paths", nargs="*", default=["."])
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = subprocess.run(["git", "ls-files", "--", *a.paths], stdout=subprocess.PIPE, check=True, cwd=repo,
                           universal_newlines=True).stdout.split()
    rows = []
    for f in files:
        if not f.endswith((".c", ".h")) or any(fnmatch.fnmatch(f, g) for g in a.exclude):
            continue
        for first, last, name in functions(os.path.join(repo, f)):
            if last - first + 1 > a.max:
                rows.append((last - first + 1, "%s:%d" % (f, first), name))
    for n, where, name in sorted(rows, reverse=True):
        print(n, where, name)
    print("%d function(s) over %d lines" % (len(rows), a.max), file=sys.stderr)
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())
