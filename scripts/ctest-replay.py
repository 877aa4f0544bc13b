#!/usr/bin/env python3
"""scripts/ctest-replay.py BUILD_DIR CTEST_LOG [-j N] [--no-cost] - how long `ctest -j N` takes in BUILD_DIR
with each entry's duration taken from CTEST_LOG (the output of an earlier ctest run: its
"Test #N: NAME ... Passed S sec" lines), by replaying ctest's scheduler (3.25) on BUILD_DIR's entries
and their properties as `ctest --show-only=json-v1` lists them:
  - fixture setups before the entries that require them; then entries in descending COST (with
    --no-cost: all 0, as a tree without COST properties and without Testing/Temporary/CTestCostData.txt),
    ties in registration order;
  - at most N at a time; a RUN_SERIAL entry starts only when nothing else runs and nothing starts
    beside it; an entry waits while another holds one of its RESOURCE_LOCKs; otherwise the first
    startable entry in that order starts.
Prints the replayed wall time, the summed durations and the slot-seconds left idle, then the entries
that ran alone.  Entries the log lacks count 0 s.  A way to see what a schedule change (COST,
RUN_SERIAL, RESOURCE_LOCK, -j) does before paying for a full CI run; it assumes the durations do
not change with what runs beside them.
"""
import argparse
import heapq
import json
import re
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build_dir")
    ap.add_argument("log")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--no-cost", action="store_true")
    a = ap.parse_args()
    dur = {}
    for line in open(a.log, errors="replace"):
        m = re.search(r"Test +#\d+: (\S+) .*?([0-9.]+) sec", line)
        if m:
            dur[m.group(1)] = float(m.group(2))
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=a.build_dir, capture_output=True, text=True,
                         check=True).stdout
    tests = json.loads(out)["tests"]
    info, setups_of = {}, {}
    for i, t in enumerate(tests):
        p = {x["name"]: x["value"] for x in t.get("properties", [])}
        info[t["name"]] = {"order": i, "dur": dur.get(t["name"], 0.0), "serial": bool(p.get("RUN_SERIAL")),
                           "locks": set(p.get("RESOURCE_LOCK", [])), "cost": 0.0 if a.no_cost else p.get("COST", 0.0),
                           "setup": set(p.get("FIXTURES_SETUP", [])), "needs": set(p.get("FIXTURES_REQUIRED", []))}
        for f in p.get("FIXTURES_SETUP", []):
            setups_of.setdefault(f, set()).add(t["name"])
    for n, x in info.items():
        x["deps"] = set().union(*[setups_of.get(f, set()) for f in x["needs"]]) if x["needs"] else set()
    pending = sorted(info, key=lambda n: (0 if info[n]["setup"] else 1, -info[n]["cost"], info[n]["order"]))
    t, running, done, held, serial_on, alone = 0.0, [], set(), set(), False, []
    busy = 0.0
    while pending or running:
        if not serial_on:
            for n in list(pending):
                if len(running) >= a.j or serial_on:
                    break
                x = info[n]
                if not x["deps"] <= done or (x["serial"] and running) or x["locks"] & held:
                    continue
                pending.remove(n)
                heapq.heappush(running, (t + x["dur"], n))
                held |= x["locks"]
                if x["serial"]:
                    serial_on = True
                    alone.append(n)
        if not running:
            print("replay: nothing can start (a lock or fixture that never frees)", file=sys.stderr)
            return 1
        end, n = heapq.heappop(running)
        busy += (end - t) * (len(running) + 1)
        t = end
        done.add(n)
        held -= info[n]["locks"]
        if info[n]["serial"]:
            serial_on = False
    total = sum(x["dur"] for x in info.values())
    print("replayed ctest -j%d wall %.0f s; entries summed %.0f s; idle slot-seconds %.0f" % (a.j, t, total, a.j * t - busy))
    print("alone (RUN_SERIAL), %.0f s: %s" % (sum(info[n]["dur"] for n in alone), " ".join(alone)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
