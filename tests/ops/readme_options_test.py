#!/usr/bin/env python3
"""tests/ops/readme_options_test.py REPO TPSERVE - the commands README.md names in its prose.

The README's shell blocks run as written in ops.readme (tests/ops/readme_test.sh).  Its prose also names
commands and options in inline code (`tpserve launch --restart 10 -- tpserve serve ...`,
`serve --on-rank-loss replan`, `--kv-type q8_0`) that cannot run as written.  For each of those: the command
exists, every option it names is in that command's --help (a lone option: in some command's), and a value
given in lower case (`replan`, `tensor|expert|auto`) is one of the choices that option's help line names.
"""
import re
import subprocess
import sys

REPO, TPSERVE = sys.argv[1], sys.argv[2]
COMMANDS = ("serve", "launch", "generate", "info", "plan", "shard", "synth", "bench")
BENCHES = ("comm", "gen", "serve", "nodes", "kernels")
SSH_LAUNCH = ("launch", "--hostfile", "FILE")  # `tpserve launch --hostfile FILE --help`: the ssh launcher's
FAILS = []


def fail(msg):
    print("FAIL " + msg, flush=True)
    FAILS.append(msg)


HELP = {}


def help_options(cmd):
    """{"--name": help line} of `tpserve CMD --help` (CMD a tuple of words), or None when it fails."""
    if cmd in HELP:
        return HELP[cmd]
    p = subprocess.run([TPSERVE, *cmd, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    opts = None
    if p.returncode == 0:
        opts = {}
        for line in p.stdout.decode("utf-8", "replace").splitlines():
            m = re.match(r"^\s+(?:-(\w), )?--([A-Za-z0-9][A-Za-z0-9_-]*)", line)
            if m:
                opts["--" + m.group(2)] = line
                if m.group(1):
                    opts["-" + m.group(1)] = line
    HELP[cmd] = opts
    return opts


def choice_word(v):
    return re.fullmatch(r"[a-z][a-z0-9_.]*(\|[a-z][a-z0-9_.]*)*", v) is not None


def check_value(where, name, value, lines):
    """A lower-case value must be named, as a word, on one of the option's help lines."""
    if not choice_word(value):
        return
    for alt in value.split("|"):
        if not any(re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(alt), l) for l in lines):
            fail("%s: %s %s: '%s' is not among the choices its --help names: %s"
                 % (where, name, value, alt, " / ".join(l.strip() for l in lines)))


def check_command(where, words):
    """words: a command line after `tpserve` (may end in `...`); an inner command after `--` is checked too."""
    if not words or words[0] not in COMMANDS:
        return 0
    cmd, rest = (words[0],), words[1:]
    if cmd == ("bench",):
        if not rest or rest[0] not in BENCHES:
            fail("%s: `tpserve bench` needs one of %s" % (where, ", ".join(BENCHES)))
            return 1
        cmd, rest = ("bench", rest[0]), rest[1:]
    if cmd == ("launch",) and "--hostfile" in rest[:rest.index("--") if "--" in rest else len(rest)]:
        cmd = SSH_LAUNCH  # the ssh launcher's own options
    opts = help_options(cmd)
    if opts is None:
        fail("%s: `tpserve %s --help` fails" % (where, " ".join(cmd[:2])))
        return 1
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            inner = rest[i + 1:]
            if inner and inner[0] == "tpserve":
                inner = inner[1:]
            return 1 + check_command(where, inner)
        if a.startswith("-") and len(a) > 1 and not re.match(r"^-\d", a):
            name = a.partition("=")[0]
            if name not in opts:
                fail("%s: `tpserve %s` has no option %s (its --help lists: %s)"
                     % (where, " ".join(cmd[:2]), name, " ".join(sorted(opts))))
            elif i + 1 < len(rest) and not rest[i + 1].startswith("-"):
                check_value(where, name, rest[i + 1], [opts[name]])
        i += 1
    return 1


def check_lone_option(where, words):
    """`--kv-type q8_0`: an option of some command (a value: one of its choices there)."""
    name = words[0].partition("=")[0]
    lines = []
    for c in COMMANDS:
        for cmd in ([("bench", b) for b in BENCHES] if c == "bench" else [(c,), SSH_LAUNCH] if c == "launch"
                    else [(c,)]):
            opts = help_options(cmd) or {}
            if name in opts:
                lines.append(opts[name])
    if not lines:
        fail("%s: no tpserve command has the option %s" % (where, name))
    elif len(words) > 1:
        check_value(where, name, words[1], lines)


def main():
    n_cmd = n_opt = 0
    fenced = False
    with open(REPO + "/README.md", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for span in re.findall(r"`([^`]+)`", line):
                where = "README.md:%d `%s`" % (lineno, span)
                words = span.split()
                if "<" in span or not words:
                    continue
                if words[0] == "tpserve":
                    if len(words) > 1 and words[1] not in COMMANDS and words[1] not in ("--help", "-h"):
                        fail("%s: tpserve has no command %s" % (where, words[1]))
                    n_cmd += check_command(where, words[1:])
                elif words[0] in COMMANDS and len(words) > 1 and words[1].startswith("-"):
                    n_cmd += check_command(where, words)
                elif re.match(r"^--?[A-Za-z]", words[0]):
                    check_lone_option(where, words)
                    n_opt += 1
    print("%d commands and %d options named in README.md's prose checked against --help; %d problem(s)"
          % (n_cmd, n_opt, len(FAILS)))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
