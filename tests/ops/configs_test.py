#!/usr/bin/env python3
"""tests/ops/configs_test.py - the deployment examples in configs/ are valid and agree with the binary.

  configs_test.py REPO_DIR TPSERVE_BINARY

Checks:
  * every configs/hostfile*.json parses, has version 1, and every host has a non-empty "ips" list and an
    integer port in 1..65535, with no two ranks on the same ip:port (what comm/hostfile.c requires);
  * configs/k8s/*.yaml parse as YAML; the MPIJob is kubeflow.org/v2beta1 with a Launcher whose command is
    `mpirun ... -np N ... tpserve SUBCOMMAND ...` where N equals the Worker replicas, workers are kept on
    different nodes (required pod anti-affinity on kubernetes.io/hostname whose selector matches the worker
    pod labels), the model volume is mounted; the Service selects worker 0 and targets the port given to
    tpserve with --port;
  * every tpserve flag in the manifest is accepted by the binary: the options listed by
    `tpserve SUBCOMMAND --help` (long and short names, and whether they take a value) must include every
    flag used, and each value-taking flag must be followed by a value.
Exit 77 (ctest skip) when PyYAML is missing (apt-get install python3-yaml).
"""
import glob
import json
import os
import re
import subprocess
import sys

SKIP = 77


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check_hostfiles(repo):
    files = sorted(glob.glob(os.path.join(repo, "configs", "hostfile*.json")))
    if len(files) < 4:
        fail("expected at least 4 hostfile examples in configs/, found %d" % len(files))
    for path in files:
        name = os.path.basename(path)
        try:
            doc = json.load(open(path))
        except ValueError as e:
            fail("%s is not valid JSON: %s" % (name, e))
        hosts = doc.get("hosts") if isinstance(doc, dict) else doc
        if isinstance(doc, dict) and doc.get("version", 1) != 1:
            fail("%s: version must be 1" % name)
        if not isinstance(hosts, list) or not hosts:
            fail("%s: needs a non-empty \"hosts\" list" % name)
        seen = set()
        for i, h in enumerate(hosts):
            ips = h.get("ips")
            if not isinstance(ips, list) or not ips or not all(isinstance(x, str) and x for x in ips):
                fail("%s: hosts[%d].ips must be a non-empty list of addresses" % (name, i))
            port = h.get("port")
            if not isinstance(port, int) or not 1 <= port <= 65535:
                fail("%s: hosts[%d].port must be an integer in 1..65535" % (name, i))
            if (ips[0], port) in seen:
                fail("%s: duplicate %s:%d" % (name, ips[0], port))
            seen.add((ips[0], port))
            if not isinstance(h.get("host"), str) or not h["host"]:
                fail("%s: hosts[%d].host (ssh destination for tpserve launch) is missing" % (name, i))
    print("ok: %d hostfiles" % len(files))


def help_options(tpserve, sub):
    """{"--name": takes_value, "-x": takes_value} from `tpserve SUB --help`."""
    p = subprocess.run([tpserve, sub, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    out = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        fail("`tpserve %s --help` exited %d: %s" % (sub, p.returncode, out.strip()[:300]))
    opts = {}
    for line in out.splitlines():
        # "  -m, --model FILE     help" / "      --json           help" (metavars are upper case)
        m = re.match(r"^\s+(?:-(\w), )?--([A-Za-z0-9][A-Za-z0-9_-]*)(?:[ =]([A-Z]\S*))?", line)
        if not m:
            continue
        takes = bool(m.group(3))
        opts["--" + m.group(2)] = takes
        if m.group(1):
            opts["-" + m.group(1)] = takes
    if not opts:
        fail("`tpserve %s --help` lists no options" % sub)
    return opts


def check_tpserve_args(tpserve, args, where):
    if not args:
        fail("%s: no tpserve subcommand" % where)
    sub, rest = args[0], args[1:]
    opts = help_options(tpserve, sub)
    used = {}
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            break
        if a.startswith("-") and len(a) > 1 and not re.match(r"^-\d", a):
            name, _, inline = a.partition("=")
            if name not in opts:
                fail("%s: `tpserve %s` does not accept %s (its --help lists: %s)"
                     % (where, sub, name, " ".join(sorted(opts))))
            if opts[name] and not inline:
                if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                    fail("%s: %s needs a value" % (where, name))
                used[name] = rest[i + 1]
                i += 1
            else:
                used[name] = inline or True
        else:
            fail("%s: unexpected positional argument %r to tpserve %s" % (where, a, sub))
        i += 1
    print("ok: %s: tpserve %s %s" % (where, sub, " ".join(sorted(used))))
    return used


def check_k8s(repo, tpserve):
    try:
        import yaml
    except ImportError:
        print("SKIP: PyYAML is not installed (apt-get install python3-yaml)")
        sys.exit(SKIP)
    docs = []
    for path in sorted(glob.glob(os.path.join(repo, "configs", "k8s", "*.yaml"))):
        try:
            docs += [(os.path.basename(path), d) for d in yaml.safe_load_all(open(path)) if d]
        except yaml.YAMLError as e:
            fail("%s is not valid YAML: %s" % (path, e))
    jobs = [(f, d) for f, d in docs if d.get("kind") == "MPIJob"]
    svcs = [(f, d) for f, d in docs if d.get("kind") == "Service"]
    if len(jobs) != 1 or len(svcs) != 1:
        fail("want exactly one MPIJob and one Service in configs/k8s, found %d and %d" % (len(jobs), len(svcs)))
    fname, job = jobs[0]
    if job.get("apiVersion") != "kubeflow.org/v2beta1":
        fail("%s: apiVersion %r, want kubeflow.org/v2beta1" % (fname, job.get("apiVersion")))
    specs = job["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    worker_spec = specs["Worker"]["template"]
    replicas = specs["Worker"]["replicas"]
    if job["spec"].get("slotsPerWorker") != 1:
        fail("%s: slotsPerWorker must be 1 (one rank per node)" % fname)

    cmd = [str(x) for x in launcher.get("command", []) + launcher.get("args", [])]
    if not cmd or cmd[0] != "mpirun":
        fail("%s: the launcher must run mpirun, runs %r" % (fname, cmd[:1]))
    if "tpserve" not in cmd:
        fail("%s: the launcher command does not run tpserve" % fname)
    t = cmd.index("tpserve")
    mpi = cmd[1:t]
    if "-np" not in mpi or int(mpi[mpi.index("-np") + 1]) != replicas:
        fail("%s: mpirun -np must equal the Worker replicas (%d)" % (fname, replicas))
    used = check_tpserve_args(tpserve, cmd[t + 1:], fname + " launcher")
    env = [mpi[i + 1] for i in range(len(mpi) - 1) if mpi[i] == "-x"]
    if "TP_BACKEND=mpi" not in env and used.get("--backend") != "mpi":
        fail("%s: under mpirun tpserve needs the mpi backend (mpirun -x TP_BACKEND=mpi)" % fname)
    if used.get("--host") != "0.0.0.0":
        fail("%s: rank 0 must listen on 0.0.0.0 (--host) to be reachable through the Service" % fname)
    port = int(used.get("--port", 8080))

    # placement: one worker per node
    labels = worker_spec["metadata"]["labels"]
    pod = worker_spec["spec"]
    terms = pod.get("affinity", {}).get("podAntiAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", [])
    if not any(term.get("topologyKey") == "kubernetes.io/hostname"
               and all(labels.get(k) == v for k, v in term["labelSelector"]["matchLabels"].items())
               for term in terms):
        fail("%s: workers need a required podAntiAffinity on kubernetes.io/hostname matching their labels" % fname)
    for c in pod.get("topologySpreadConstraints", []):
        if not all(labels.get(k) == v for k, v in c["labelSelector"]["matchLabels"].items()):
            fail("%s: a topologySpreadConstraint does not select the worker pods" % fname)
    # model volume
    mounts = pod["containers"][0].get("volumeMounts", [])
    vols = {v["name"] for v in pod.get("volumes", [])}
    model_dir = os.path.dirname(used.get("-m", used.get("--model", "")))
    if not any(m["mountPath"] == model_dir and m["name"] in vols for m in mounts):
        fail("%s: the model directory %r is not a mounted volume on the workers" % (fname, model_dir))
    if not any(p.get("containerPort") == port for p in pod["containers"][0].get("ports", [])):
        fail("%s: workers do not declare containerPort %d" % (fname, port))

    sname, svc = svcs[0]
    sel = svc["spec"]["selector"]
    want = {"training.kubeflow.org/job-name": job["metadata"]["name"],
            "training.kubeflow.org/job-role": "worker",
            "training.kubeflow.org/replica-index": "0"}
    if sel != want:
        fail("%s: selector %r must pick rank 0, i.e. %r" % (sname, sel, want))
    if not any(p.get("targetPort") == port for p in svc["spec"]["ports"]):
        fail("%s: no port targets %d (tpserve --port)" % (sname, port))
    print("ok: MPIJob %d ranks, Service -> rank 0 port %d" % (replicas, port))


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    repo, tpserve = sys.argv[1], sys.argv[2]
    check_hostfiles(repo)
    check_k8s(repo, tpserve)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
