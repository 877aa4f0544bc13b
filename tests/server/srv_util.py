"""tests/server/srv_util.py - helpers shared by the Python server tests."""
import http.client
import json
import re
import select
import socket
import time

_SERVING = re.compile(r"serving on http://[^:]+:(\d+)")


def wait_serving_port(stream, timeout_s=60.0):
    """Read lines of a server's stdout until `serving on http://HOST:PORT`; the port, or None when the
    stream ends or timeout_s passes first."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        r, _, _ = select.select([stream], [], [], 1.0)
        if not r:
            continue
        line = stream.readline()
        if not line:
            return None
        m = _SERVING.search(line)
        if m:
            return int(m.group(1))
    return None


FAILS = []


def check(cond, what):
    """Print one check's outcome; a failed one is added to FAILS (the test's exit status)."""
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def request(port, path, body=None, timeout=60):
    """GET path, or POST body as JSON, on 127.0.0.1:port; (status, body text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if body is None:
            c.request("GET", path)
        else:
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def health(port):
    """(status, body) of /health; (0, the error) when the server does not answer."""
    try:
        return request(port, "/health", timeout=5)
    except OSError as e:
        return 0, str(e)


def wait_health(port, want, bound_s, need=None):
    """Poll /health every 20 ms until its status is want (and its body matches need); (ok, body, seconds)."""
    t0 = time.time()
    while time.time() - t0 < bound_s:
        st, body = health(port)
        if st == want and (need is None or re.search(need, body)):
            return True, body, time.time() - t0
        time.sleep(0.02)
    return False, "", time.time() - t0


def greedy(port, prompt, max_tokens=48, timeout=60):
    """(200, the greedy completion's text), or (status, error body)."""
    st, body = request(port, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
                       timeout=timeout)
    if st != 200:
        return st, body
    return st, json.loads(body)["choices"][0]["text"]


def metric(port, name):
    """The value of one /metrics line, -1 when absent."""
    _, body = request(port, "/metrics")
    m = re.search(r"^%s (\S+)$" % name, body, re.M)
    return float(m.group(1)) if m else -1
