#!/usr/bin/env python3
"""Outage of `tpserve serve` when a worker is lost (docs/recovery.md).

usage: scripts/bench_recovery.py TPSERVE MODEL [--ranks N] [--victim R] [--scenarios kill,stop,replan]
                                  [--repeat K]

Starts `tpserve launch -n N --restart 100 -- tpserve serve -m MODEL` on
127.0.0.1 (TP_COMM_TIMEOUT_MS=3000), keeps one greedy streaming client
busy, and per scenario prints the outage: from the last token streamed
before the fault to the first token streamed after the recovery.  The
worker hit is --victim (default the last one, N-1).
  kill   SIGKILL the worker; launch restarts it (backoff 250 ms), the
         new process loads its slice and joins the next group epoch.
  stop   SIGSTOP the worker for 5 s (past the 3 s op timeout), then
         SIGCONT: the group re-forms with the same process; the outage
         includes the 5 s stop, so "over the stop" is printed too.
  replan a group of its own with --on-rank-loss replan --replan-after 1:
         SIGSTOP the worker for good (a laptop asleep); after the op
         timeout (3 s) and --replan-after (1 s) the survivors re-plan and
         load their new slices; "over the wait" excludes those 4 s.  The
         stopped worker is then woken: it is told it was left out.
It also prints the worker's own load time (a world-of-one `tpserve
generate -n 1` of the same model: start, load, one token), the yardstick
of the target: outage <= load time + 2 s.
"""
import argparse
import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time


LOG = []  # (arrival time, line) of launch's stderr: where an outage's time goes


def read_log(stream):
    for line in stream:
        LOG.append((time.time(), line.rstrip("\n")))


def log_after(t0, pattern):
    """Seconds from t0 to the first log line after t0 matching pattern, or None."""
    for t, line in list(LOG):
        if t >= t0 and re.search(pattern, line):
            return t - t0
    return None


def phases(t_fault, t_first_tok):
    """'detected +a s, group re-formed +b s, first token +c s' from the log, relative to the fault."""
    det = log_after(t_fault, r"server: lost rank")
    ref = log_after(t_fault, r"server: group re-(formed|planned)")
    f = lambda v: "+%.2f s" % v if v is not None else "?"
    return "detected %s, group re-formed %s, first token %s" % (f(det), f(ref), f(t_first_tok - t_fault))


def start_group(tpserve, model, n, extra=()):
    env = dict(os.environ, TP_COMM_TIMEOUT_MS="3000")
    p = subprocess.Popen([tpserve, "launch", "-n", str(n), "--restart", "100", "--", tpserve, "serve", "-m", model,
                          "--port", "0", "--parallel", "2"] + list(extra), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE,
                         text=True, env=env, start_new_session=True)
    threading.Thread(target=read_log, args=(p.stderr,), daemon=True).start()
    t0 = time.time()
    while time.time() - t0 < 600:
        r, _, _ = select.select([p.stdout], [], [], 1.0)
        if r:
            line = p.stdout.readline()
            if not line:
                break
            m = re.search(r"serving on http://[^:]+:(\d+)", line)
            if m:
                threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
                return p, int(m.group(1))
    p.kill()
    sys.exit("the group did not start")


def rank_pid(launch_pid, rank):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launch_pid:
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                if ("TP_RANK=%d" % rank).encode() in f.read().split(b"\0"):
                    return int(pid)
        except (OSError, ValueError, IndexError):
            pass
    return None


class Streamer:
    """One client streaming greedy tokens back to back; keeps (time, ok) per token / failure."""

    def __init__(self, port):
        self.port, self.stop, self.events, self.lock = port, False, [], threading.Lock()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def mark(self, kind):
        with self.lock:
            self.events.append((time.time(), kind))

    def run(self):
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
                           "stream": True})
        while not self.stop:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                r = c.getresponse()
                if r.status != 200:
                    r.read()
                    self.mark("fail")
                    time.sleep(0.02)
                    continue
                for raw in r:
                    if self.stop:
                        break
                    line = raw.decode("utf-8", "replace").strip()
                    if line.startswith("data: {"):
                        self.mark("fail" if '"error"' in line[:20] else "tok")
                c.close()
            except OSError:
                self.mark("fail")
                time.sleep(0.02)

    def outage_since(self, t_fault, bound_s):
        """(last token before t_fault, first token after a failure that follows it), waiting up to bound_s."""
        t0 = time.time()
        while time.time() - t0 < bound_s:
            with self.lock:
                ev = list(self.events)
            before = [t for t, k in ev if k == "tok" and t <= t_fault]
            fails = [t for t, k in ev if k == "fail" and t >= t_fault]
            if before and fails:
                after = [t for t, k in ev if k == "tok" and t > fails[0]]
                if after:
                    return before[-1], after[0]
            time.sleep(0.05)
        return None


def load_time(tpserve, model):
    t0 = time.time()
    subprocess.run([tpserve, "generate", "-m", model, "-p", "Once", "-n", "1"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return time.time() - t0


def replan_once(a, k):
    p, port = start_group(a.tpserve, a.model, a.ranks, ["--on-rank-loss", "replan", "--replan-after", "1"])
    s = Streamer(port)
    try:
        time.sleep(2.5)  # every rank's memory figures reach rank 0
        pid = rank_pid(p.pid, a.victim)
        t_fault = time.time()
        os.kill(pid, signal.SIGSTOP)
        got = s.outage_since(t_fault, 180)
        if not got:
            print("replan #%d: no recovery within 180 s" % (k + 1), flush=True)
        else:
            out = got[1] - got[0]
            print("replan #%d: outage %.2f s  (%.2f s over the 3 s op timeout + 1 s --replan-after), %d -> %d ranks; %s" %
                  (k + 1, out, out - 4, a.ranks, a.ranks - 1, phases(t_fault, got[1])), flush=True)
        os.kill(pid, signal.SIGCONT)
        time.sleep(1)
    finally:
        s.stop = True
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tpserve")
    ap.add_argument("model")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--scenarios", default="kill,stop,replan")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--victim", type=int, default=-1, help="the worker to fault (default the last)")
    a = ap.parse_args()
    if a.victim < 0:
        a.victim = a.ranks - 1
    if not 1 <= a.victim < a.ranks:
        sys.exit("--victim %d: want a worker, 1..%d" % (a.victim, a.ranks - 1))
    lt = load_time(a.tpserve, a.model)
    print("model %s, %d ranks, faults on rank %d; worker load time (world-of-one generate -n 1): %.2f s; target outage <= %.2f s" %
          (os.path.basename(a.model), a.ranks, a.victim, lt, lt + 2), flush=True)
    scenarios = a.scenarios.split(",")
    for k in range(a.repeat if "replan" in scenarios else 0):
        replan_once(a, k)
    scenarios = [sc for sc in scenarios if sc != "replan"]
    if not scenarios:
        return
    p, port = start_group(a.tpserve, a.model, a.ranks)
    s = Streamer(port)
    try:
        time.sleep(2)
        for sc in scenarios:
            for k in range(a.repeat):
                pid = rank_pid(p.pid, a.victim)
                t_fault = time.time()
                if sc == "kill":
                    os.kill(pid, signal.SIGKILL)
                elif sc == "stop":
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(5)
                    os.kill(pid, signal.SIGCONT)
                else:
                    sys.exit("unknown scenario %s" % sc)
                got = s.outage_since(t_fault, 120)
                if not got:
                    print("%-5s #%d: no recovery within 120 s" % (sc, k + 1), flush=True)
                    continue
                out = got[1] - got[0]
                extra = "  (%.2f s over the 5 s stop)" % (out - 5) if sc == "stop" else ""
                print("%-5s #%d: outage %.2f s%s%s; %s" % (sc, k + 1, out, extra,
                                                            "" if sc != "kill" or out <= lt + 2 else "  ABOVE TARGET",
                                                            phases(t_fault, got[1])), flush=True)
                time.sleep(3)  # the new worker runs past launch's 2 s start-up window (backoff back to 250 ms)
    finally:
        s.stop = True
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)


if __name__ == "__main__":
    main()
