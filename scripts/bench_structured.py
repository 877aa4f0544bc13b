#!/usr/bin/env python3
"""scripts/bench_structured.py - decode cost of the response_format mask.

Starts `tpserve serve` on a model (one rank), then alternates rounds of
unconstrained and schema-constrained chat requests, N_SEQ at a time, so that
both see the same machine load; per round it records the server's CPU time
(utime + stime from /proc/PID/stat) and wall time per generated token.
Prints one row per round kind and concurrency with the medians, and the
constrained / unconstrained ratios from this one invocation.  A benchmark,
not a test (docs/structured-output.md, "Cost of the mask").

  scripts/bench_structured.py TPSERVE MODEL [--seqs 1,8] [--rounds 5]
                              [--max-tokens 64] [--threads 1]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {k: {"type": "string"} for k in ("title", "author", "summary", "genre")},
    "required": ["title", "author", "summary", "genre"],
    "additionalProperties": False,
}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post(port, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def run_round(port, pid, n_seq, constrained, max_tokens, seed0):
    tokens = [0] * n_seq

    def one(i):
        body = {"messages": [{"role": "user", "content": "Describe a book."}], "max_tokens": max_tokens,
                "temperature": 1.0, "seed": seed0 + i}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA}}
        else:
            body["ignore_eos"] = True
        tokens[i] = post(port, body)["usage"]["completion_tokens"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_seq)]
    c0, t0 = cpu_seconds(pid), time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c1, t1 = cpu_seconds(pid), time.monotonic()
    n = sum(tokens)
    return 1000 * (c1 - c0) / n, 1000 * (t1 - t0) / n, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tpserve")
    ap.add_argument("model")
    ap.add_argument("--seqs", default="1,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    seqs = [int(x) for x in a.seqs.split(",")]
    srv = subprocess.Popen([a.tpserve, "serve", "-m", a.model, "--port", "0", "--threads", str(a.threads),
                            "--parallel", str(max(seqs))], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    try:
        for line in srv.stdout:
            m = re.search(r"serving on http://[0-9.]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            sys.exit("tpserve serve did not start")
        threading.Thread(target=lambda: [None for _ in srv.stdout], daemon=True).start()
        run_round(port, srv.pid, 1, True, 8, 1)  # warm-up: builds the token trie
        print(f"{'seqs':>4} {'kind':>13} {'cpu ms/tok':>10} {'wall ms/tok':>11} {'tokens':>7}")
        for n_seq in seqs:
            res = {False: [], True: []}
            for r in range(a.rounds):
                for constrained in (False, True) if r % 2 == 0 else (True, False):
                    res[constrained].append(run_round(port, srv.pid, n_seq, constrained, a.max_tokens, 100 * r))
            med = {}
            for constrained in (False, True):
                cpu = statistics.median(x[0] for x in res[constrained])
                wall = statistics.median(x[1] for x in res[constrained])
                med[constrained] = (cpu, wall)
                kind = "schema" if constrained else "unconstrained"
                print(f"{n_seq:>4} {kind:>13} {cpu:>10.2f} {wall:>11.2f} {sum(x[2] for x in res[constrained]):>7}   rounds:",
                      " ".join(f"{x[0]:.1f}/{x[1]:.0f}" for x in res[constrained]))
            print(f"{n_seq:>4} {'ratio':>13} {med[True][0] / med[False][0]:>10.3f} {med[True][1] / med[False][1]:>11.3f}")
    finally:
        srv.terminate()
        srv.wait(timeout=30)


if __name__ == "__main__":
    main()
