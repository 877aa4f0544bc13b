#!/usr/bin/env python3
"""scripts/long_functions.py [--max N] [--exclude GLOB ...] [--allow FILE] [PATH ...] - C functions longer than N lines.

Lists every function definition in the C files git tracks under PATH (relative to the repository root;
default: the whole repository; without git, the .c and .h files below it)
whose body, signature included, spans more than N lines (default 120), longest first, as
"LINES FILE:LINE NAME".  Exit status 1 when it lists any, 0 when none.  It reads the code as this
repository formats it (clang-format: a definition's "{" and "}" alone at column 0), not as a compiler
would; `--exclude 'server/grammar*'` leaves files out.  With --allow FILE (lines "LINES FILE NAME",
# comments), a listed function may be up to LINES long: it is reported as allowed and does not count,
unless it grew past LINES; the ctest build.long_functions runs it so.
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


def read_allow(path):
    """{(file, name): lines} from an allow file."""
    allow = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 3 or not parts[0].isdigit():
                sys.exit("%s:%d: want 'LINES FILE NAME', got %r" % (path, n, line))
            allow[(parts[1], parts[2])] = int(parts[0])
    return allow


def source_files(repo, paths):
    """The files git tracks under paths; without git, every file below them (hidden and build* folders left out)."""
    try:
        return subprocess.run(["git", "ls-files", "--", *paths], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              check=True, cwd=repo, universal_newlines=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
        for p in paths:
            for root, dirs, names in os.walk(os.path.join(repo, p)):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not d.startswith("build"))
                out += sorted(os.path.relpath(os.path.join(root, n), repo) for n in names)
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=120, help="longest allowed function in lines (default 120)")
    ap.add_argument("--exclude", action="append", default=[], help="leave out files matching this glob")
    ap.add_argument("--allow", help="file of 'LINES FILE NAME' lines: functions allowed up to LINES")
    ap.add_argument("paths", nargs="*", default=["."])
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    allow = read_allow(a.allow) if a.allow else {}
    files = source_files(repo, a.paths)
    rows = []
    for f in files:
        if not f.endswith((".c", ".h")) or any(fnmatch.fnmatch(f, g) for g in a.exclude):
            continue
        for first, last, name in functions(os.path.join(repo, f)):
            if last - first + 1 > a.max:
                rows.append((last - first + 1, "%s:%d" % (f, first), name))
    bad = 0
    for n, where, name in sorted(rows, reverse=True):
        limit = allow.get((where.split(":")[0], name))
        if limit is None:
            print(n, where, name)
            bad += 1
        elif n > limit:
            print(n, where, name, "(allowed up to %d: it grew)" % limit)
            bad += 1
        else:
            print(n, where, name, "(allowed up to %d)" % limit)
    print("%d function(s) over %d lines%s" % (bad, a.max, ", %d more allowed" % (len(rows) - bad) if allow else ""),
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
