#!/usr/bin/env python3
"""Rank-loss recovery of `tpserve launch --restart` + `tpserve serve` (real
ranks on 127.0.0.1, bounded in time; exit status 0 only when every check
passed, each failure is printed).

usage: recovery_test.py TPSERVE MODEL SCENARIO N_RANKS
  kill    SIGKILL rank 1 mid-stream under load from 4 streaming
          clients: the requests in flight end with an error naming the rank
          (SSE error event or 503), requests queued during the recovery
          complete with the greedy output of before, nothing hangs or is
          lost, /health goes 503 (naming the rank) then 200, /metrics counts
          the loss, the recovery and the failed requests.  With 2 ranks the
          server decodes speculatively with the model as its own draft
          sharded over both ranks (--draft-placement sharded: most of the
          steps the kill can land in are draft steps), the oracle is plain
          decoding, and the replacement rank loads its draft slice again.
  stop    SIGSTOP the last worker for 1 s (shorter than the 3 s op timeout:
          no loss, every stream completes) then for 6 s (longer: a loss, the
          same process is re-admitted after SIGCONT, not replaced).
  repeat  SIGKILL rank 1 twenty times in a row, each time waiting for the
          group to re-form and checking the greedy output: no hang, rank 0
          RSS flat within 5% between the 2nd and the 20th recovery.
  rank0   SIGKILL rank 0: launch ends at once with a non-zero status and
          no rank is left running.
  mpi     `launch --backend mpi`: SIGKILL rank 1: the job ends non-zero within 15 s and the log says
          why (an MPI job cannot re-form in place; the scheduler restarts it).
  replan  --on-rank-loss replan, 3 ranks from a hostfile: 3 -> 2 -> 1 with the same greedy text.
  nofit   --on-rank-loss replan where the survivors cannot hold the model: the group waits, says why.
  blame   for each worker position in turn: SIGSTOP it under load (then SIGCONT), then SIGKILL it: every
          503 of /health during the fault names that rank, never a survivor (in a ring the stopped rank's
          neighbours time out as rank 0 does, docs/recovery.md "Which rank is named").
  hand    ranks started by hand (no launcher) from a hostfile: SIGKILL
          rank 1, start a replacement by hand: it joins the next epoch and
          the output is the same; then SIGKILL rank 0: the worker (TP_REJOIN=1)
          exits non-zero once its rejoin window ends.
The oracle for "same output" is the greedy completion of the same prompts
taken from the same server before any fault.
"""
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

from srv_util import FAILS, check, free_port, greedy, health, metric, request, wait_health, wait_serving_port

TPSERVE, MODEL, SCENARIO, N_RANKS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
PROMPTS = ["Once upon a time", "The little dog", "One day, Lily went"]
SHARDED_DRAFT = SCENARIO == "kill" and N_RANKS == 2
DRAFT_ARGS = ["--spec", "draft", "--draft-model", MODEL, "--draft-placement", "sharded", "--draft-max", "4"]


def spec_greedy(port, prompt, speculative):
    """(status, text, drafted tokens or -1) of a greedy completion with "speculative" set."""
    st, body = request(port, "/v1/completions", {"prompt": prompt, "max_tokens": 48, "temperature": 0,
                                                 "speculative": speculative})
    if st != 200:
        return st, body, -1
    j = json.loads(body)
    return st, j["choices"][0]["text"], j["usage"].get("speculative", {}).get("drafted", -1)




class Group:
    """`tpserve launch -n N --restart 100 -- tpserve serve ...` with a 3 s op timeout."""

    def __init__(self, n):
        env = dict(os.environ, TP_COMM_TIMEOUT_MS="3000", TP_COMM_CONNECT_TIMEOUT_MS="20000")
        # under AddressSanitizer freed memory would sit in its quarantine and grow the RSS: reuse it at
        # once, so the RSS check sees leaks only (ignored by builds without ASan)
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=0").lstrip(":")
        self.log = open("recovery_%s_%d.log" % (SCENARIO, n), "w")
        self.p = subprocess.Popen(
            [TPSERVE, "launch", "-n", str(n), "--restart", "100", "--", TPSERVE, "serve", "-m", MODEL, "--port", "0",
             "--threads", "1", "--parallel", "4", "--recover-wait", "30"] + (DRAFT_ARGS if SHARDED_DRAFT else []),
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, start_new_session=True)
        self.port = wait_serving_port(self.p.stdout, 60)
        if self.port is None:
            self.stop()
            raise RuntimeError("the group did not start (see the log)")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for _ in self.p.stdout:
            pass

    def rank_pid(self, rank):
        """pid of the child of launch that runs TP_RANK=rank."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.p.pid:
                    continue
                with open("/proc/%s/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
                if ("TP_RANK=%d" % rank).encode() in env:
                    return int(pid)
            except (OSError, ValueError, IndexError):
                continue
        return None

    def rss_kib(self, pid):
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        """SIGTERM to rank 0: it shuts the group down; launch's status is then 0 only when every rank
        exited 0 (a sanitizer report at exit fails its rank)."""
        r0 = self.rank_pid(0)
        if self.p.poll() is None and r0:
            os.kill(r0, signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                pass
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.log.close()
        return self.p.returncode










class Clients:
    """4 threads streaming long greedy completions until stopped; every
    request's outcome is recorded: ok / error (SSE error event) / refused
    (an HTTP error status) / hang (no end within 60 s)."""

    def __init__(self, port):
        self.port, self.stop_evt, self.lock = port, threading.Event(), threading.Lock()
        self.outcomes = []           # (outcome, message)
        self.streaming = [threading.Event() for _ in range(4)]
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(4)]
        for t in self.threads:
            t.start()

    def _one(self, i):
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                "stream": True}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                return "refused", "%d %s" % (r.status, r.read().decode("utf-8", "replace"))
            finished = done = False
            err = None
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                j = json.loads(data)
                if "error" in j:
                    err = j["error"].get("message", "")
                    continue
                self.streaming[i].set()
                if j["choices"][0].get("finish_reason"):
                    finished = True
            if err is not None:
                return "error", err
            return ("ok", "") if finished and done else ("cut", "stream ended without finish_reason/[DONE]")
        except OSError as e:
            return "hang", str(e)
        finally:
            c.close()

    def _run(self, i):
        while not self.stop_evt.is_set():
            out = self._one(i)
            with self.lock:
                self.outcomes.append(out)
            if out[0] != "ok":
                time.sleep(0.05)

    def finish(self):
        self.stop_evt.set()
        for t in self.threads:
            t.join(90)
        return not any(t.is_alive() for t in self.threads)




def scenario_kill(g, ref):
    victim = 1  # with 3 ranks a middle one: the survivor above it must link to its replacement
    pid = g.rank_pid(victim)
    check(pid is not None, "found rank %d's process" % victim)
    cl = Clients(g.port)
    for ev in cl.streaming:
        ev.wait(30)
    time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    ok, body, _ = wait_health(g.port, 503, 10, r"rank %d" % victim)
    check(ok, "/health answered 503 naming rank %d after the kill: %s" % (victim, body[:160]))
    # once rank 0 is re-forming the group (before that, a request gets 503 at once naming the silent rank),
    # requests sent wait in the queue and complete after the recovery
    ok, body, _ = wait_health(g.port, 503, 10, r"waiting for rank %d|reloading" % victim)
    check(ok, "/health says the group is re-forming: %s" % body[:120])
    queued = {}

    def q(k):
        queued[k] = greedy(g.port, PROMPTS[k], timeout=90)

    qt = [threading.Thread(target=q, args=(k,)) for k in range(len(PROMPTS))]
    for t in qt:
        t.start()
    ok, _, secs = wait_health(g.port, 200, 60)
    check(ok, "/health back to 200 after %.2f s" % secs)
    for t in qt:
        t.join(90)
    check(not any(t.is_alive() for t in qt), "requests queued during the recovery ended")
    for k in range(len(PROMPTS)):
        check(queued.get(k) == (200, ref[k]), "queued request %d completed after the recovery with the greedy text "
              "of before (%s)" % (k, str(queued.get(k))[:120]))
    time.sleep(1.0)  # the clients run on the re-formed group for a while
    check(cl.finish(), "every client thread ended (no request hangs)")
    kinds = [o[0] for o in cl.outcomes]
    print("client outcomes: %s" % {k: kinds.count(k) for k in set(kinds)}, flush=True)
    check("hang" not in kinds and "cut" not in kinds, "no stream hung or ended without an error or finish")
    lost = [m for k, m in cl.outcomes if k in ("error", "refused") and ("rank %d" % victim) in m]
    check(len(lost) >= 1, "a request in flight ended with an error naming rank %d (%s)" %
          (victim, lost[0][:140] if lost else "none"))
    other = [m for k, m in cl.outcomes if k in ("error", "refused") and ("rank %d" % victim) not in m]
    check(not other, "every request that failed named rank %d (%s)" % (victim, other[0][:140] if other else "all"))
    check(kinds[-4:].count("ok") >= 1 and kinds.count("ok") >= 1, "streams complete again after the recovery")
    for k in range(len(PROMPTS)):
        check(greedy(g.port, PROMPTS[k]) == (200, ref[k]), "greedy output of prompt %d after the recovery equals "
              "before" % k)
    check(metric(g.port, "tpserve_rank_losses_total") == 1, "/metrics: one rank loss")
    check(metric(g.port, "tpserve_recoveries_total") == 1, "/metrics: one recovery")
    check(metric(g.port, "tpserve_recovery_seconds_total") > 0, "/metrics: recovery seconds counted")
    check(metric(g.port, "tpserve_requests_failed_by_rank_loss_total") >= 1, "/metrics: requests failed by the loss")


def scenario_stop(g, ref):
    victim = N_RANKS - 1
    pid = g.rank_pid(victim)
    # short stop: below the op timeout, nothing is lost
    cl = Clients(g.port)
    for ev in cl.streaming:
        ev.wait(30)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(1.0)
    os.kill(pid, signal.SIGCONT)
    time.sleep(1.0)
    check(cl.finish(), "short stop: every client thread ended")
    kinds = [o[0] for o in cl.outcomes]
    print("short stop outcomes: %s" % {k: kinds.count(k) for k in set(kinds)}, flush=True)
    check(not [k for k in kinds if k in ("error", "hang", "cut")], "short stop: no stream failed")
    check(metric(g.port, "tpserve_rank_losses_total") == 0, "short stop: no rank loss")
    ok, _, _ = wait_health(g.port, 200, 10)
    check(ok, "short stop: /health 200")
    # long stop: past the op timeout the rank is lost; after SIGCONT the same process rejoins
    cl = Clients(g.port)
    for ev in cl.streaming:
        ev.wait(30)
    os.kill(pid, signal.SIGSTOP)
    ok, body, _ = wait_health(g.port, 503, 10, r"waiting for rank %d" % victim)
    check(ok, "long stop: /health 503 'waiting for rank %d': %s" % (victim, body[:160]))
    time.sleep(3.0)
    os.kill(pid, signal.SIGCONT)
    ok, _, secs = wait_health(g.port, 200, 40)
    check(ok, "long stop: /health 200 %.2f s after SIGCONT" % secs)
    time.sleep(1.0)
    check(cl.finish(), "long stop: every client thread ended")
    kinds = [o[0] for o in cl.outcomes]
    print("long stop outcomes: %s" % {k: kinds.count(k) for k in set(kinds)}, flush=True)
    check("hang" not in kinds and "cut" not in kinds, "long stop: no stream hung")
    check(g.rank_pid(victim) == pid, "long stop: the stopped process was re-admitted (same pid %d)" % pid)
    check(metric(g.port, "tpserve_rank_losses_total") == 1, "long stop: one rank loss")
    check(metric(g.port, "tpserve_recoveries_total") == 1, "long stop: one recovery")
    for k in range(len(PROMPTS)):
        check(greedy(g.port, PROMPTS[k]) == (200, ref[k]), "long stop: greedy output of prompt %d equals before" % k)


NAMED = [r"rank (\d+) has not answered", r"waiting for rank (\d+) to rejoin", r"reloading: rank (\d+) rejoined",
         r"re-planning without rank (\d+)"]


def named_ranks(body):
    """The ranks a /health 503 body names as the missing one (not ranks quoted in the failure's detail)."""
    return {int(m) for pat in NAMED for m in re.findall(pat, body)}


def watch_health(port, stop_evt, seen):
    """Poll /health every 20 ms until stop_evt; add every 503 body's named ranks to seen."""
    while not stop_evt.is_set():
        st, body = health(port)
        if st == 503:
            seen.update(named_ranks(body))
        time.sleep(0.02)


def scenario_blame(g, ref):
    for victim in range(1, N_RANKS):
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            what = "%s of rank %d of %d" % ("SIGSTOP" if sig == signal.SIGSTOP else "SIGKILL", victim, N_RANKS)
            pid = g.rank_pid(victim)
            if not check(pid is not None, "%s: found its process" % what):
                return
            cl = Clients(g.port)
            for ev in cl.streaming:
                ev.wait(30)
            seen, stop_evt = set(), threading.Event()
            wt = threading.Thread(target=watch_health, args=(g.port, stop_evt, seen))
            wt.start()
            os.kill(pid, sig)
            ok, body, _ = wait_health(g.port, 503, 15, r"waiting for rank \d+ to rejoin|reloading")
            check(ok, "%s: /health says the group re-forms: %s" % (what, body[:160]))
            if sig == signal.SIGSTOP:
                time.sleep(0.5)
                os.kill(pid, signal.SIGCONT)
            ok, _, secs = wait_health(g.port, 200, 40)
            check(ok, "%s: /health 200 again (%.2f s)" % (what, secs))
            stop_evt.set()
            wt.join(10)
            check(cl.finish(), "%s: every client thread ended" % what)
            kinds = [o[0] for o in cl.outcomes]
            check("hang" not in kinds and "cut" not in kinds, "%s: no stream hung" % what)
            check(seen == {victim}, "%s: every 503 of /health named rank %d (named: %s)" % (what, victim, sorted(seen)))
            if sig == signal.SIGSTOP:
                check(g.rank_pid(victim) == pid, "%s: the stopped process was re-admitted" % what)
            check(greedy(g.port, PROMPTS[victim % len(PROMPTS)]) == (200, ref[victim % len(PROMPTS)]),
                  "%s: greedy output equals before" % what)
            # no wait for the supervisor's 2 s start-up window: a killed rank is not faulted again
    check(metric(g.port, "tpserve_rank_losses_total") == 2 * (N_RANKS - 1),
          "/metrics: %d rank losses" % (2 * (N_RANKS - 1)))


def proc_age_s(pid):
    """Seconds since process pid started (/proc), 0 when unknown."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def scenario_repeat(g, ref):
    r0 = g.rank_pid(0)
    rss = []
    for i in range(20):
        pid = g.rank_pid(1)
        if not check(pid is not None, "kill %d: rank 1 is running" % (i + 1)):
            return
        os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        while metric(g.port, "tpserve_recoveries_total") < i + 1 and time.time() - t0 < 60:
            time.sleep(0.02)
        ok, _, _ = wait_health(g.port, 200, 10)
        secs = time.time() - t0
        if not check(ok and metric(g.port, "tpserve_recoveries_total") == i + 1,
                     "kill %d: the group re-formed, /health 200 (%.2f s)" % (i + 1, secs)):
            return
        got = greedy(g.port, PROMPTS[i % len(PROMPTS)])
        if not check(got == (200, ref[i % len(PROMPTS)]), "kill %d: greedy output equals before" % (i + 1)):
            return
        rss.append(g.rss_kib(r0))
        # let the new worker run past the supervisor's 2 s start-up window, so the restart backoff stays short
        pid = g.rank_pid(1)
        age = proc_age_s(pid) if pid else 0.0
        time.sleep(max(0.0, 2.1 - age))
    print("rank 0 RSS (KiB) after each recovery: %s" % rss, flush=True)
    check(rss[-1] <= rss[1] * 1.05, "rank 0 RSS flat within 5%% from the 2nd to the 20th recovery (%d -> %d KiB)" %
          (rss[1], rss[-1]))
    check(metric(g.port, "tpserve_recoveries_total") == 20, "/metrics: 20 recoveries")


def scenario_rank0(g, ref):
    workers = [g.rank_pid(r) for r in range(1, N_RANKS)]
    t0 = time.time()
    os.kill(g.rank_pid(0), signal.SIGKILL)
    try:
        rc = g.p.wait(20)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc is not None and rc != 0, "launch ended with a non-zero status (%s) %.2f s after rank 0 was killed" %
          (rc, time.time() - t0))
    time.sleep(0.2)
    left = [w for w in workers if w and os.path.exists("/proc/%d" % w) and
            open("/proc/%d/stat" % w).read().rsplit(")", 1)[1].split()[0] != "Z"]
    check(not left, "no worker left running (%s)" % left)




def scenario_hand(_g, _ref):
    hf = os.path.abspath("recovery_hand_%d.json" % os.getpid())
    ports = [free_port(), free_port()]
    with open(hf, "w") as f:
        json.dump({"version": 1, "hosts": [{"host": "127.0.0.1", "ips": ["127.0.0.1"], "port": p} for p in ports]}, f)
    log = open("recovery_hand.log", "w")
    base = dict(os.environ, TP_WORLD_SIZE="2", TP_HOSTFILE=hf, TP_COMM_TIMEOUT_MS="3000",
                TP_COMM_CONNECT_TIMEOUT_MS="4000")
    base.pop("TP_LISTEN_FD", None)

    def start(rank, extra):
        env = dict(base, TP_RANK=str(rank), **extra)
        return subprocess.Popen([TPSERVE, "serve", "-m", MODEL, "--port", "0", "--threads", "1", "--parallel", "2",
                                 "--recover-wait", "2"],
                                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=log, text=True,
                                env=env)

    r0 = start(0, {})
    w = start(1, {"TP_REJOIN": "1"})
    procs = [r0, w]
    try:
        port = wait_serving_port(r0.stdout, 60)
        if not check(port is not None, "hand-started group of 2 is serving"):
            return
        ok, _, _ = wait_health(port, 200, 30)
        ref = [greedy(port, p)[1] for p in PROMPTS]
        w.kill()
        w.wait()
        ok, body, _ = wait_health(port, 503, 10, r"rank 1")
        check(ok, "/health 503 naming rank 1 after the kill: %s" % body[:120])
        ok, body, _ = wait_health(port, 503, 10, r"waiting for rank 1")
        # nobody replaces it for a while: a queued request gets 503 + Retry-After after --recover-wait 2
        t0 = time.time()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", "/v1/completions", json.dumps({"prompt": "Once", "max_tokens": 8}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read().decode()
        waited = time.time() - t0
        check(r.status == 503 and r.getheader("Retry-After") is not None and "--recover-wait" in body and
              "rank 1" in body and 1.5 <= waited <= 10,
              "a request queued during the recovery got 503 + Retry-After after %.1f s (--recover-wait 2): %s" %
              (waited, body[:160]))
        c.close()
        check(metric(port, "tpserve_requests_recover_wait_expired_total") == 1, "hand: /metrics one expired request")
        w2 = start(1, {})  # a replacement started by hand, as a scheduler would
        procs.append(w2)
        ok, _, secs = wait_health(port, 200, 30)
        check(ok, "the replacement started by hand joined: /health 200 after %.2f s" % secs)
        for k in range(len(PROMPTS)):
            check(greedy(port, PROMPTS[k]) == (200, ref[k]), "hand: greedy output of prompt %d equals before" % k)
        check(metric(port, "tpserve_recoveries_total") == 1, "hand: /metrics one recovery")
        # rank 0 dies: a worker that would rejoin gives up after its window and exits non-zero
        w3 = start(1, {"TP_REJOIN": "1"})
        procs.append(w3)
        w2.kill()
        w2.wait()
        ok, _, _ = wait_health(port, 200, 30)
        check(ok, "hand: a rejoin-enabled replacement joined")
        t0 = time.time()
        r0.kill()
        r0.wait()
        try:
            rc = w3.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc is not None and rc != 0, "hand: after rank 0 died the worker exited with status %s in %.1f s" %
              (rc, time.time() - t0))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.close()
        os.unlink(hf)


class HandGroup:
    """N ranks started by hand from a hostfile (no launcher, so a killed worker stays gone); rank 0 gets
    rank0_args, workers worker_args and TP_REJOIN=1."""

    def __init__(self, n, rank0_args, worker_args, tag):
        self.hf = os.path.abspath("recovery_%s_%d.json" % (tag, os.getpid()))
        with open(self.hf, "w") as f:
            json.dump({"version": 1, "hosts": [{"host": "127.0.0.1", "ips": ["127.0.0.1"], "port": free_port()}
                                               for _ in range(n)]}, f)
        self.log = open("recovery_%s.log" % tag, "w")
        self.n, self.rank0_args, self.worker_args = n, rank0_args, worker_args
        # a surviving worker tries to rejoin for TP_COMM_CONNECT_TIMEOUT_MS in all: longer than the scenario
        self.base = dict(os.environ, TP_WORLD_SIZE=str(n), TP_HOSTFILE=self.hf, TP_COMM_TIMEOUT_MS="3000",
                         TP_COMM_CONNECT_TIMEOUT_MS="60000")
        self.base.pop("TP_LISTEN_FD", None)
        self.procs = [self.start(r) for r in range(n)]
        self.port = None
        t0 = time.time()
        r0 = self.procs[0]
        while self.port is None and time.time() - t0 < 60:
            r, _, _ = select.select([r0.stdout], [], [], 1.0)
            if r:
                line = r0.stdout.readline()
                if not line:
                    break
                m = re.search(r"serving on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
        if self.port is not None:
            threading.Thread(target=lambda: [None for _ in r0.stdout], daemon=True).start()

    def start(self, rank):
        env = dict(self.base, TP_RANK=str(rank))
        if rank:
            env["TP_REJOIN"] = "1"
        return subprocess.Popen([TPSERVE, "serve", "-m", MODEL, "--port", "0", "--threads", "1", "--parallel", "4",
                                 "--recover-wait", "60"] + (self.rank0_args if rank == 0 else self.worker_args),
                                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=self.log,
                                text=True, env=env)

    def stop(self):
        """SIGTERM to rank 0; True when every process still in the group exited 0."""
        ok = True
        r0 = self.procs[0]
        if r0.poll() is None:
            r0.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                ok = False
        self.log.close()
        os.unlink(self.hf)
        return ok


def cluster_consistent(body):
    """'' when a /v1/cluster answer describes one group (its rank list as long as n_ranks, the shares summing
    to 1, the q-head and vocab ranges tiling the model), else what is wrong."""
    j = json.loads(body)
    if j.get("state") == "loading":
        return ""
    ranks, m = j.get("ranks", []), j.get("model", {})
    if len(ranks) != j.get("n_ranks"):
        return "%d ranks listed, n_ranks %s" % (len(ranks), j.get("n_ranks"))
    total = sum(r["share"]["fraction"] for r in ranks)
    if abs(total - 1.0) > 1e-6:
        return "shares sum to %f" % total
    for key, n in (("q_heads", m.get("n_head")), ("vocab", m.get("n_vocab"))):
        at = 0
        for r in ranks:
            b, e = r["share"][key]
            if b != at or e < b:
                return "%s ranges do not tile [0, %s): %s" % (key, n, [x["share"][key] for x in ranks])
            at = e
        if at != n:
            return "%s ranges end at %d, not %s" % (key, at, n)
    return ""


def poll_cluster(port, stop_evt, out):
    """GET /v1/cluster back to back until stop_evt; out: [answers, [problems]]."""
    while not stop_evt.is_set():
        try:
            st, body = request(port, "/v1/cluster", timeout=10)
        except OSError as e:
            out[1].append("no answer: %s" % e)
            continue
        out[0] += 1
        why = cluster_consistent(body) if st == 200 else "status %d" % st
        if why:
            out[1].append(why)
        time.sleep(0.005)


def cluster_ranks(port):
    st, body = request(port, "/v1/cluster")
    return len(json.loads(body).get("ranks", [])) if st == 200 else -1


def scenario_replan(_g, _ref):
    """--on-rank-loss replan, 3 ranks from a hostfile: SIGKILL the middle one; after --replan-after 2 s rank 0 and
    the last worker (renumbered 2 -> 1) re-plan over 2 ranks, load their new slices, and serve the same greedy
    text; requests queued meanwhile complete; the killed rank started again is refused as left out (exit 88)."""
    if not check(N_RANKS >= 3, "replan runs on 3 ranks or more (a survivor besides rank 0 to hold)"):
        return
    g = HandGroup(N_RANKS, ["--on-rank-loss", "replan", "--replan-after", "2"], [], "replan_%d" % N_RANKS)
    clean = False
    try:
        if not check(g.port is not None, "hand-started group of %d with --on-rank-loss replan is serving" % N_RANKS):
            return
        ok, _, _ = wait_health(g.port, 200, 30)
        check(ok and metric(g.port, "tpserve_ranks") == N_RANKS, "healthy with %d ranks" % N_RANKS)
        ref = [greedy(g.port, p)[1] for p in PROMPTS]
        time.sleep(1.5)  # every rank's memory figures reach rank 0 with the pings
        victim = 1
        # /v1/cluster read back to back through the loss and the re-plan: every answer one group
        cl_stop, cl_out = threading.Event(), [0, []]
        cl_thread = threading.Thread(target=poll_cluster, args=(g.port, cl_stop, cl_out), daemon=True)
        cl_thread.start()
        t_kill = time.time()
        g.procs[victim].kill()
        g.procs[victim].wait()
        ok, body, _ = wait_health(g.port, 503, 10, r"waiting for rank %d" % victim)
        check(ok, "/health 503 waiting for rank %d: %s" % (victim, body[:160]))
        queued = {}

        def q(k):
            queued[k] = greedy(g.port, PROMPTS[k], timeout=90)

        qt = [threading.Thread(target=q, args=(k,)) for k in range(len(PROMPTS))]
        for t in qt:
            t.start()
        # The survivors load stories260K's slices in milliseconds, between two of wait_health's 20 ms polls: one
        # survivor is held (SIGSTOP) so that rank 0's re-plan waits for it to re-form the group, and /health says
        # so for as long as it is held; SIGCONT, and the re-plan completes.
        held = g.procs[2]
        held.send_signal(signal.SIGSTOP)
        try:
            ok, body, _ = wait_health(g.port, 503, 20, r"re-planning without rank %d .*are re-forming the group" % victim)
        finally:
            held.send_signal(signal.SIGCONT)
        check(ok, "/health says the survivors re-plan (a survivor held): %s" % body[:200])
        ok, _, _ = wait_health(g.port, 200, 40)
        secs = time.time() - t_kill
        check(ok and secs < 40, "/health 200 again %.2f s after the kill (re-planned)" % secs)
        for t in qt:
            t.join(90)
        check(not any(t.is_alive() for t in qt), "requests queued during the re-plan ended")
        for k in range(len(PROMPTS)):
            check(queued.get(k) == (200, ref[k]), "queued request %d completed with the greedy text of before (%s)" %
                  (k, str(queued.get(k))[:100]))
        cl_stop.set()
        cl_thread.join(30)
        check(cl_out[0] > 10 and not cl_out[1], "/v1/cluster during the re-plan: %d answers, each one consistent "
              "group (%s)" % (cl_out[0], cl_out[1][:3]))
        check(metric(g.port, "tpserve_ranks") == N_RANKS - 1, "/metrics: %d ranks now" % (N_RANKS - 1))
        check(cluster_ranks(g.port) == N_RANKS - 1, "/v1/cluster lists %d ranks" % (N_RANKS - 1))
        check(metric(g.port, "tpserve_replans_total") == 1 and metric(g.port, "tpserve_recoveries_total") == 1,
              "/metrics: one re-plan, one recovery")
        for k in range(len(PROMPTS)):
            check(greedy(g.port, PROMPTS[k]) == (200, ref[k]), "greedy output of prompt %d on %d ranks equals the "
                  "output on %d" % (k, N_RANKS - 1, N_RANKS))
        # the dropped rank comes back (restarted by a scheduler): refused as left out, the group goes on
        back = g.start(victim)
        try:
            rc = back.wait(30)
        except subprocess.TimeoutExpired:
            back.kill()
            rc = back.wait()
        check(rc == 88, "the left-out rank started again exits with status 88 (left out), got %s" % rc)
        st, _ = health(g.port)
        check(st == 200 and greedy(g.port, PROMPTS[0]) == (200, ref[0]), "the group still serves after that")
        if N_RANKS >= 3:
            # a second loss on 2 ranks: rank 0 alone holds the model (2 -> 1)
            t_kill = time.time()
            g.procs[-1].kill()
            g.procs[-1].wait()
            ok, body, _ = wait_health(g.port, 503, 10, r"waiting for rank 1")
            check(ok, "second loss: /health 503 waiting for rank 1: %s" % body[:120])
            ok, _, _ = wait_health(g.port, 200, 40)
            secs = time.time() - t_kill
            check(ok and metric(g.port, "tpserve_ranks") == 1 and metric(g.port, "tpserve_replans_total") == 2,
                  "second loss: rank 0 alone serves the model %.2f s after the kill" % secs)
            for k in range(len(PROMPTS)):
                check(greedy(g.port, PROMPTS[k]) == (200, ref[k]), "greedy output of prompt %d on 1 rank equals "
                      "before" % k)
    finally:
        g.procs[victim].returncode = 0 if g.procs[victim].returncode == -9 else g.procs[victim].returncode
        clean = g.stop()
    check(clean, "SIGTERM to rank 0: every rank left in the group exited")
    r0 = g.procs[0].returncode
    check(r0 == 0, "rank 0 exited 0 (got %s)" % r0)


def scenario_nofit(_g, _ref):
    """--on-rank-loss replan where the survivors cannot hold the model (every worker offers 1 KiB, --mem-limit):
    rank 1 stopped (SIGSTOP) past the op timeout is lost; the group waits for it and /health says why; after
    SIGCONT the same process rejoins and the output is the same."""
    g = HandGroup(N_RANKS, ["--on-rank-loss", "replan", "--replan-after", "1"], ["--mem-limit", "1K"],
                  "nofit_%d" % N_RANKS)
    try:
        if not check(g.port is not None, "hand-started group of %d is serving" % N_RANKS):
            return
        ok, _, _ = wait_health(g.port, 200, 30)
        ref = [greedy(g.port, p)[1] for p in PROMPTS]
        time.sleep(1.5)
        victim = 1
        g.procs[victim].send_signal(signal.SIGSTOP)
        ok, body, _ = wait_health(g.port, 503, 20, r"not re-planning without it: rank \d+ would need [0-9.]+ MiB .*"
                                  r"offers 0\.0 MiB \(--mem-limit\)")
        check(ok, "/health says the survivors cannot hold the model: %s" % body[:300])
        time.sleep(3.0)
        st, body = health(g.port)
        # the stopped rank, not a survivor whose own collective timed out and left as rank 0's did
        check(st == 503 and named_ranks(body) == {victim} and
              metric(g.port, "tpserve_ranks") == N_RANKS and metric(g.port, "tpserve_replans_total") == 0,
              "still waiting with %d ranks, no re-plan: %s" % (N_RANKS, body[:120]))
        g.procs[victim].send_signal(signal.SIGCONT)
        ok, _, secs = wait_health(g.port, 200, 30)
        check(ok, "the stopped rank rejoined after SIGCONT: /health 200 after %.2f s" % secs)
        check(metric(g.port, "tpserve_replans_total") == 0 and metric(g.port, "tpserve_ranks") == N_RANKS,
              "/metrics: no re-plan, %d ranks" % N_RANKS)
        for k in range(len(PROMPTS)):
            check(greedy(g.port, PROMPTS[k]) == (200, ref[k]), "nofit: greedy output of prompt %d equals before" % k)
    finally:
        clean = g.stop()
    check(clean, "SIGTERM to rank 0: every rank exited")
    check(all(p.returncode == 0 for p in g.procs), "every rank exited 0 (%s)" % [p.returncode for p in g.procs])


def scenario_mpi(_g, _ref):
    """--backend mpi: an MPI job cannot re-form in place; a killed worker ends the job quickly, non-zero, and
    rank 0 says why (the scheduler restarts the job)."""
    log = open("recovery_mpi.log", "w+")
    env = dict(os.environ, TP_COMM_TIMEOUT_MS="3000")
    p = subprocess.Popen([TPSERVE, "launch", "-n", "2", "--backend", "mpi", "--", TPSERVE, "serve", "-m", MODEL,
                          "--port", "0", "--threads", "1", "--parallel", "2"], stdout=log, stderr=log, text=True,
                         env=env, start_new_session=True)
    try:
        port = None
        t0 = time.time()
        while port is None and time.time() - t0 < 60 and p.poll() is None:
            log.flush()
            log.seek(0)
            text = log.read()
            if "not built with MPI" in text or "mpirun: not found" in text or "cannot run 'mpirun'" in text:
                print("skip: no MPI here")
                return 77
            m = re.search(r"serving on http://[^:]+:(\d+)", text)
            port = int(m.group(1)) if m else None
            time.sleep(0.1)
        if not check(port is not None, "mpi: 2 ranks serving under mpirun"):
            return 0
        ref = greedy(port, PROMPTS[0])
        check(ref[0] == 200, "mpi: a greedy completion")
        victim = None
        for pid in os.listdir("/proc"):
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    env_b = f.read().split(b"\0")
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if b"OMPI_COMM_WORLD_RANK=1" in env_b and len(cmd) > 1 and cmd[1] == b"serve":
                victim = int(pid)
        if not check(victim is not None, "mpi: found rank 1"):
            return 0
        t0 = time.time()
        os.kill(victim, signal.SIGKILL)
        try:
            rc = p.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        secs = time.time() - t0
        check(rc is not None and rc != 0 and secs < 15, "mpi: the job ended non-zero (%s) %.1f s after the kill" %
              (rc, secs))
        log.flush()
        log.seek(0)
        text = log.read()
        # rank 0 says it cannot re-form when it sees the failure first; mpirun names the rank when it kills
        # the job first
        check(re.search(r"cannot re-form in place|process rank 1 .*exited on signal 9", text) is not None,
              "mpi: the log says why the job ended (rank 1 killed / cannot re-form in place)")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
    return 0


def main():
    if not os.path.exists(MODEL):
        print("skip: %s not found" % MODEL)
        return 77
    if SCENARIO == "mpi":
        rc = scenario_mpi(None, None)
        if rc == 77:
            return 77
        if FAILS:
            print("%d check(s) failed; log in recovery_mpi.log" % len(FAILS))
        return 1 if FAILS else 0
    if SCENARIO in ("hand", "replan", "nofit"):
        {"hand": scenario_hand, "replan": scenario_replan, "nofit": scenario_nofit}[SCENARIO](None, None)
        if FAILS:
            print("%d check(s) failed; rank logs in recovery_%s*.log" % (len(FAILS), SCENARIO))
        return 1 if FAILS else 0
    g = Group(N_RANKS)
    try:
        ok, _, _ = wait_health(g.port, 200, 30)
        check(ok, "group of %d ranks is healthy" % N_RANKS)
        # the oracle: plain decoding (a sharded draft's server decodes speculatively unless told not to)
        ref = [spec_greedy(g.port, p, False)[1] if SHARDED_DRAFT else greedy(g.port, p)[1] for p in PROMPTS]
        {"kill": scenario_kill, "stop": scenario_stop, "repeat": scenario_repeat,
         "rank0": scenario_rank0, "blame": scenario_blame}[SCENARIO](g, ref)
        if SCENARIO != "rank0":
            st, _ = health(g.port)
            check(st == 200, "/health 200 at the end")
        if SHARDED_DRAFT:
            # the collectives of one request alone (since-start ratio x generated tokens, before and after): each
            # sharded draft pass is a step on both ranks (12 collectives for this 5-layer model), ~4 passes per 5
            # tokens with the model as its own draft, so ~12 per generated token (~2.4 were they left out)
            def colls():
                return metric(g.port, "tpserve_collectives_per_token") * metric(g.port, "tpserve_generated_tokens_total")
            c0, n0 = colls(), metric(g.port, "tpserve_generated_tokens_total")
            st, text, drafted = spec_greedy(g.port, PROMPTS[0], True)
            dn = metric(g.port, "tpserve_generated_tokens_total") - n0
            cpt = (colls() - c0) / dn if dn > 0 else -1
            check(cpt > 8, "/metrics counts the sharded draft's collectives (%.2f per generated token of one "
                  "request)" % cpt)
            check(st == 200 and text == ref[0] and drafted > 0, "after the recovery the sharded draft drafts again "
                  "and the reply equals plain decoding (%s drafted, %s)" % (drafted, str(text)[:80]))
            with open(g.log.name) as f:
                log = f.read()
            check("sharded over the ranks" in log, "the server logged its draft model sharded over the ranks")
            check(len(re.findall(r"rank 1/2: draft model \S+ sharded", log)) >= 2,
                  "rank 1's replacement loaded its slice of the draft model")
    finally:
        rc = g.stop()
    if SCENARIO == "rank0":
        check(rc is not None, "launch ended (status %s)" % rc)
    else:
        check(rc == 0, "SIGTERM to rank 0: every rank shut down cleanly, launch status %s" % rc)
    if FAILS:
        print("%d check(s) failed; launch log in %s" % (len(FAILS), os.path.abspath(g.log.name)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
