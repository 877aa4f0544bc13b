#!/usr/bin/env python3
"""`tpserve launch --hostfile --restart` over ssh (tests/ops/fake_ssh.sh stands in for ssh: the same
arguments, the command run with sh on 127.0.0.1).  Exit status 0 only when every check passed.

usage: launch_restart_test.py REPO TPSERVE

  restart  2 ranks: SIGKILL the worker under one streaming client; the launcher restarts it through
           ssh (its message names the rank and the signal), the new process gets the cluster token
           through stdin again (it is in no command line), the group re-forms in a new epoch,
           /health goes 503 then 200 and the greedy output equals the output before; then rank 0's
           SIGTERM ends the job with status 0 and no rank left.
  replan   3 ranks, rank 0 with --on-rank-loss replan --replan-after 2: the host of rank 1 goes
           down (the stand-in answers 255, as ssh does for an unreachable host) and rank 1 is
           killed: the launcher's restarts fail, rank 0 re-plans over ranks 0 and 2 and serves the
           same greedy text; the host comes back and the launcher's next restart of rank 1 is told
           it was left out (exit 88): the launcher does not restart it again and the job goes on.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from srv_util import FAILS, check, free_port, greedy, health, metric, request, wait_health  # noqa: E402

REPO, TPSERVE = sys.argv[1], sys.argv[2]
MODEL = os.path.join(REPO, "models", "stories260K.gguf")
FAKE_SSH = os.path.join(REPO, "tests", "ops", "fake_ssh.sh")
PROMPTS = ["Once upon a time", "The little dog"]
















def descendants(root):
    """pids below root (any depth)."""
    kids = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(pid))
        except (OSError, ValueError, IndexError):
            pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        for k in kids.get(p, []):
            out.append(k)
            todo.append(k)
    return out


def rank_pid(launcher, rank):
    """The tpserve serve process of TP_RANK=rank under the launcher."""
    for pid in descendants(launcher.pid):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if ("TP_RANK=%d" % rank).encode() in env and len(cmd) > 1 and cmd[1] == b"serve":
            return pid
    return None


class Launch:
    def __init__(self, work, n, rank0_extra, tag, restarts):
        self.hf = os.path.join(work, "hosts_%s.json" % tag)
        names = ["alpha", "beta", "gamma", "delta"][:n]
        with open(self.hf, "w") as f:
            json.dump({"version": 1, "hosts": [{"host": h, "ips": ["127.0.0.1"], "port": free_port()}
                                               for h in names]}, f)
        self.down = os.path.join(work, "down")
        env = dict(os.environ, TP_LAUNCH_SSH=FAKE_SSH, TP_COMM_TIMEOUT_MS="3000",
                   TP_COMM_CONNECT_TIMEOUT_MS="30000", FAKE_SSH_DOWN=self.down)
        env.pop("TP_CLUSTER_TOKEN", None)
        # rank 0 gets the extra flags through a wrapper: launch runs one command on every rank
        wrap = os.path.join(work, "serve_%s.sh" % tag)
        with open(wrap, "w") as f:
            f.write("#!/bin/sh\nif [ \"$TP_RANK\" = 0 ]; then exec \"$@\" %s; else exec \"$@\"; fi\n" %
                    " ".join(rank0_extra))
        os.chmod(wrap, 0o755)
        self.log = open(os.path.join(work, "launch_%s.log" % tag), "w+")
        self.p = subprocess.Popen([TPSERVE, "launch", "--hostfile", self.hf, "--restart", str(restarts), "--", wrap, TPSERVE,
                                   "serve", "-m", MODEL, "--port", "0", "--threads", "1", "--parallel", "2"],
                                  stdout=self.log, stderr=self.log, text=True, env=env,
                                  start_new_session=True)
        # the ranks' output, prefixed, and the launcher's own messages, in one file
        self.port = None
        t0 = time.time()
        while self.port is None and time.time() - t0 < 60 and self.p.poll() is None:
            m = re.search(r"\[rank 0 alpha\] tpserve: serving on http://[^:]+:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
            time.sleep(0.1)

    def text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        r0 = rank_pid(self.p, 0)
        if r0 and self.p.poll() is None:
            os.kill(r0, signal.SIGTERM)
        try:
            rc = self.p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            rc = self.p.wait()
        return rc


def scenario_restart(work):
    g = Launch(work, 2, [], "restart", 3)
    try:
        if not check(g.port is not None, "launch --hostfile over ssh: 2 ranks serving"):
            return
        ok, _, _ = wait_health(g.port, 200, 30)
        ref = [greedy(g.port, p, 40, 90) for p in PROMPTS]
        check(all(r[0] == 200 for r in ref), "greedy reference taken")
        old = rank_pid(g.p, 1)
        if not check(old is not None, "found rank 1's serve process"):
            return
        os.kill(old, signal.SIGKILL)
        ok, body, _ = wait_health(g.port, 503, 10, r"rank 1")
        check(ok, "/health 503 naming rank 1: %s" % body[:120])
        ok, _, _ = wait_health(g.port, 200, 30)
        check(ok, "/health 200 again: the launcher restarted rank 1 through ssh and it rejoined")
        new = rank_pid(g.p, 1)
        check(new is not None and new != old, "rank 1 is a new process (%s -> %s)" % (old, new))
        log = g.text()
        check(re.search(r"rank 1 was killed by signal 9 \(Killed\); restarting it in 0\.25 s \(restart 1 of 3\)", log)
              is not None, "the launcher said it restarts rank 1 after 0.25 s")
        tok = None
        if new:
            with open("/proc/%d/environ" % new, "rb") as f:
                for kv in f.read().split(b"\0"):
                    if kv.startswith(b"TP_CLUSTER_TOKEN="):
                        tok = kv.split(b"=", 1)[1]
        check(tok is not None and len(tok) == 64, "the restarted rank has the 64-hex-digit cluster token")
        leaked = []
        for pid in descendants(g.p.pid):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if tok and tok in f.read():
                        leaked.append(pid)
            except OSError:
                pass
        check(not leaked and tok.decode() not in log, "the token is in no command line and no output")
        for k, p in enumerate(PROMPTS):
            check(greedy(g.port, p, 40, 90) == ref[k], "greedy output of prompt %d after the restart equals before" % k)
        check(metric(g.port, "tpserve_recoveries_total") == 1, "/metrics: one recovery")
    finally:
        rc = g.stop()
    check(rc == 0, "SIGTERM to rank 0 ended the job with status 0 (got %s)" % rc)
    check(not descendants(g.p.pid), "no rank left")


def scenario_replan(work):
    g = Launch(work, 3, ["--on-rank-loss", "replan", "--replan-after", "2"], "replan", 100)
    try:
        if not check(g.port is not None, "launch --hostfile over ssh: 3 ranks serving"):
            return
        ok, _, _ = wait_health(g.port, 200, 30)
        ref = [greedy(g.port, p, 40, 90) for p in PROMPTS]
        time.sleep(1.5)  # the ranks' memory figures reach rank 0
        open(g.down + ".beta", "w").close()  # rank 1's host is unreachable from now on
        os.kill(rank_pid(g.p, 1), signal.SIGKILL)
        ok, _, _ = wait_health(g.port, 503, 10, r"rank 1")
        ok, _, _ = wait_health(g.port, 200, 40)
        check(ok and metric(g.port, "tpserve_ranks") == 2 and metric(g.port, "tpserve_replans_total") == 1,
              "rank 0 re-planned over ranks 0 and 2 while the launcher could not restart rank 1")
        for k, p in enumerate(PROMPTS):
            check(greedy(g.port, p, 40, 90) == ref[k], "greedy output of prompt %d on 2 ranks equals before" % k)
        os.unlink(g.down + ".beta")  # the host is back: the launcher's next restart is refused as left out
        t0 = time.time()
        while time.time() - t0 < 40 and "was left out of the group" not in g.text():
            time.sleep(0.2)
        log = g.text()
        check("rank 1 was left out of the group (rank 0 re-planned without it); not restarting it" in log,
              "the launcher left rank 1 out after it exited 88")
        st, _ = health(g.port)
        check(st == 200 and g.p.poll() is None and greedy(g.port, PROMPTS[0], 40, 90) == ref[0],
              "the job goes on serving on 2 ranks")
    finally:
        if os.path.exists(g.down + ".beta"):
            os.unlink(g.down + ".beta")
        rc = g.stop()
    check(rc == 0, "SIGTERM to rank 0 ended the job with status 0 (got %s)" % rc)


def main():
    if not os.path.exists(MODEL):
        print("skip: %s not found" % MODEL)
        return 77
    with tempfile.TemporaryDirectory() as work:
        scenario_restart(work)
        scenario_replan(work)
        if FAILS:
            for name in sorted(os.listdir(work)):
                if name.startswith("launch_"):
                    print("---- %s (last 40 lines)" % name)
                    print("".join(open(os.path.join(work, name)).readlines()[-40:]))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
