#!/usr/bin/env python3
"""HTTP abuse test for `tpserve serve` (loopback only, bounded in count and time).

Starts real servers on models/stories260K.gguf and attacks their HTTP front:
slow clients (300 connections trickling header bytes), connections over the
per-address cap and over --max-connections, ambiguous or oversized framing,
half-closed clients, HEAD, a lower-case Bearer scheme, /metrics counting,
8 concurrent /tokenize with_pieces on 1 MiB bodies against the stated peak-RSS
bound, and the memory budget's 503.  Exit status 0 only when every check
passed; each failure is printed.

usage: http_abuse.py TPSERVE MODEL
"""
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time

from srv_util import wait_serving_port

TPSERVE, MODEL = sys.argv[1], sys.argv[2]
FAILS = []
KEY = "sekrit-key"
MIB = 1 << 20


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


class Server:
    def __init__(self, *flags):
        self.p = subprocess.Popen(
            [TPSERVE, "serve", "-m", MODEL, "--port", "0", "--threads", "1", "--api-key", KEY] + list(flags),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.port = wait_serving_port(self.p.stdout, 60)
        if self.port is None:
            self.stop()
            raise RuntimeError("server did not start")

    def vm(self, key):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return -1

    def sanitized(self):
        with open("/proc/%d/maps" % self.p.pid) as f:
            return "libasan" in f.read()

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        return self.p.returncode


def connect(port, src="127.0.0.1", timeout=10.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_all(s, timeout=10.0):
    """Read until the server closes (or timeout); returns (bytes, how) with how in closed|reset|timeout."""
    s.settimeout(timeout)
    out = b""
    end = time.time() + timeout
    try:
        while time.time() < end:
            b = s.recv(65536)
            if not b:
                return out, "closed"
            out += b
    except socket.timeout:
        return out, "timeout"
    except (ConnectionResetError, BrokenPipeError):
        return out, "reset"
    return out, "timeout"


def parse(raw):
    """First response in raw: (status, headers dict lower-case, body bytes); status -1 when none."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return -1, {}, b""
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    if not m:
        return -1, {}, b""
    h = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        h[k.strip().lower()] = v.strip()
    if "content-length" in h:
        body = rest[:int(h["content-length"])]
    elif h.get("transfer-encoding", "").lower() == "chunked":
        body, p = b"", 0
        while True:
            e = rest.find(b"\r\n", p)
            if e < 0:
                break
            n = int(rest[p:e].split(b";")[0], 16)
            if n == 0:
                break
            body += rest[e + 2:e + 2 + n]
            p = e + 2 + n + 2
    else:
        body = rest
    return int(m.group(1)), h, body


def request(port, method, path, body=None, headers=None, timeout=30.0, src="127.0.0.1"):
    hs = {"Host": "127.0.0.1", "Connection": "close", "Authorization": "Bearer " + KEY}
    if headers:
        hs.update(headers)
    data = b""
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hs["Content-Type"] = "application/json"
        hs["Content-Length"] = str(len(data))
    req = ("%s %s HTTP/1.1\r\n" % (method, path)) + "".join("%s: %s\r\n" % kv for kv in hs.items()) + "\r\n"
    s = connect(port, src, timeout)
    s.sendall(req.encode() + data)
    raw, _ = read_all(s, timeout)
    s.close()
    return parse(raw) + (raw,)


def metrics(port):
    st, _, body, _ = request(port, "GET", "/metrics")
    out = {}
    for m in re.finditer(r'tpserve_requests_total\{status="(\w+)"\} (\d+)', body.decode()):
        out[m.group(1)] = int(m.group(2))
    return out


def raw_case(port, data, shut_wr=False, timeout=5.0):
    s = connect(port, timeout=timeout)
    s.sendall(data)
    if shut_wr:
        s.shutdown(socket.SHUT_WR)
    raw, how = read_all(s, timeout)
    s.close()
    return raw, how


# ------------------------------------------------------------------ cases


def test_framing(port):
    auth = "Authorization: Bearer %s\r\n" % KEY
    hdr = "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + auth
    body = b'{"content":"hello"}'
    cases = [
        ("Transfer-Encoding with Content-Length", hdr + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
         b"0\r\n\r\n", 400),
        ("two Content-Length headers", hdr + "Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(body), len(body) + 1),
         body, 400),
        ("Content-Length -1", hdr + "Content-Length: -1\r\n\r\n", body, 400),
        ("Content-Length 1e23", hdr + "Content-Length: 1e23\r\n\r\n", body, 400),
        ("Transfer-Encoding gzip", hdr + "Transfer-Encoding: gzip\r\n\r\n", body, 400),
        ("Content-Length of 25 digits", hdr + "Content-Length: %s\r\n\r\n" % ("9" * 25), body, 413),
        ("HTTP/1.1 without Host", "GET /health HTTP/1.1\r\n\r\n", b"", 400),
        ("a 40 KiB header block", "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n\r\n" % ("p" * 40960), b"", 431),
    ]
    for name, head, b, want in cases:
        raw, how = raw_case(port, head.encode() + b)
        st, h, rb = parse(raw)
        n_status = len(re.findall(rb"HTTP/1\.[01] \d{3} ", raw))
        check(st == want and n_status == 1 and how == "closed",
              "%s: one %d answer, then the connection closes (got %d, %d status lines, %s)"
              % (name, want, st, n_status, how))
        check(rb.startswith(b'{"error"'), "%s: OpenAI-style JSON error body" % name)

    # a declared body over --max-body: 413 at once, no 100 Continue, no body byte needed
    t0 = time.time()
    raw, how = raw_case(port, (hdr + "Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (64 * MIB)).encode())
    st, _, _ = parse(raw)
    check(st == 413 and b"100 Continue" not in raw and time.time() - t0 < 2.0,
          "declared 64 MiB body: 413 in %.2f s without 100 Continue (got %d)" % (time.time() - t0, st))

    # a chunked body is not read past --max-body (2 MiB here): 413, and the client cannot push 64 MiB
    s = connect(port)
    s.sendall((hdr + "Transfer-Encoding: chunked\r\n\r\n").encode())
    chunk = b"%x\r\n" % (64 * 1024) + b"a" * (64 * 1024) + b"\r\n"
    sent, resp, err = 0, b"", None
    s.setblocking(False)
    end = time.time() + 20
    while time.time() < end and sent < 64 * MIB:
        r, w, _ = select.select([s], [s], [], 1.0)
        try:
            if r:
                b = s.recv(65536)
                if not b:
                    break
                resp += b
            elif w:
                sent += s.send(chunk)
        except (BrokenPipeError, ConnectionResetError) as e:
            err = e
            break
    s.setblocking(True)
    try:
        more, _ = read_all(s, 3)
        resp += more
    except OSError:
        pass
    s.close()
    st, _, _ = parse(resp)
    check(st == 413 and sent < 64 * MIB,
          "chunked body over --max-body: 413 after %.1f MiB sent (got %d, %s)" % (sent / MIB, st, err))

    # a client that shuts its write side after the request still gets the answer
    cb = json.dumps({"prompt": "Once upon", "max_tokens": 8, "temperature": 0}).encode()
    raw, how = raw_case(port, ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\n"
                               "Content-Length: %d\r\n\r\n" % (auth, len(cb))).encode() + cb, shut_wr=True, timeout=30)
    st, _, rb = parse(raw)
    ok = st == 200
    if ok:
        try:
            ok = json.loads(rb)["usage"]["completion_tokens"] == 8
        except (ValueError, KeyError):
            ok = False
    check(ok, "half-closed client gets its completion (status %d)" % st)

    # HEAD wherever GET works
    for path in ("/health", "/v1/models", "/metrics"):
        raw, how = raw_case(port, ("HEAD %s HTTP/1.1\r\nHost: x\r\n%sConnection: close\r\n\r\n" % (path, auth)).encode())
        st, h, rb = parse(raw)
        check(st == 200 and rb == b"" and "content-type" in h, "HEAD %s: 200, headers only (got %d)" % (path, st))

    # the Bearer scheme is case-insensitive; the key is not
    for scheme, want in (("bearer", 200), ("BEARER", 200), ("Bearer", 200)):
        st, _, _, _ = request(port, "GET", "/v1/models", headers={"Authorization": "%s %s" % (scheme, KEY)})
        check(st == want, "Authorization: %s KEY -> %d (got %d)" % (scheme, want, st))
    st, h, _, _ = request(port, "GET", "/v1/models", headers={"Authorization": "bearer " + KEY.upper()})
    check(st == 401 and "www-authenticate" in h, "wrong key -> 401 (got %d)" % st)


def test_metrics_once(port):
    m0 = metrics(port)
    # a stream dropped after its first event: one 499, no 200
    s = connect(port)
    b = json.dumps({"prompt": "Once", "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
                    "stream": True}).encode()
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (KEY, len(b))).encode() + b)
    got = s.recv(4096)
    s.close()
    n_metrics = 0
    m1 = m0
    for _ in range(100):
        m1 = metrics(port)
        n_metrics += 1
        if m1.get("499", 0) > m0.get("499", 0):
            break
        time.sleep(0.05)
    check(len(got) > 0 and m1.get("499", 0) - m0.get("499", 0) == 1
          and m1.get("200", 0) - m0.get("200", 0) == n_metrics,
          "dropped stream counted once, as 499 (499 +%d, 200 +%d for %d /metrics calls)"
          % (m1.get("499", 0) - m0.get("499", 0), m1.get("200", 0) - m0.get("200", 0), n_metrics))
    # a complete stream: one 200
    st, _, body, _ = request(port, "POST", "/v1/completions",
                             {"prompt": "Once", "max_tokens": 4, "temperature": 0, "stream": True})
    m2 = metrics(port)
    check(st == 200 and b"[DONE]" in body and m2.get("200", 0) - m1.get("200", 0) == 2
          and m2.get("499", 0) == m1.get("499", 0),
          "complete stream counted once, as 200 (200 +%d incl. the /metrics call)" % (m2.get("200", 0) - m1.get("200", 0)))


def test_trickle(port, header_timeout):
    """300 connections from 10 addresses trickle one header byte per second."""
    conns = []
    for i in range(300):
        try:
            conns.append(connect(port, "127.0.0.%d" % (2 + i % 10)))
        except OSError as e:
            check(False, "trickle connection %d: %s" % (i, e))
            break
    line = b"GET /health HTTP/1.1\r\nHost: x\r\n"
    for s in conns:
        s.setblocking(False)

    stop = threading.Event()
    closed = set()

    def trickle():
        k = 0
        while not stop.is_set():
            for idx, s in enumerate(conns):
                if idx in closed:
                    continue
                try:
                    s.send(line[k % len(line):k % len(line) + 1])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    closed.add(idx)
            k += 1
            stop.wait(1.0)

    th = threading.Thread(target=trickle)
    th.start()
    time.sleep(1.5)
    t0 = time.time()
    st, _, body, _ = request(port, "GET", "/health", timeout=5)
    dt = time.time() - t0
    check(st == 200 and dt < 1.0, "/health under 300 trickling connections: %d in %.3f s" % (st, dt))
    t0 = time.time()
    st, _, body, _ = request(port, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 8, "temperature": 0},
                             timeout=30)
    check(st == 200 and b'"choices"' in body,
          "completion under 300 trickling connections: %d in %.2f s" % (st, time.time() - t0))
    # the trickling connections are all cut once the header deadline passes
    deadline = time.time() + header_timeout + 4
    while time.time() < deadline and len(closed) < len(conns):
        for idx, s in enumerate(conns):
            if idx in closed:
                continue
            try:
                if s.recv(4096) == b"":
                    closed.add(idx)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed.add(idx)
        time.sleep(0.2)
    stop.set()
    th.join()
    check(len(closed) == len(conns), "trickling connections closed by the header deadline: %d of %d"
          % (len(closed), len(conns)))
    for s in conns:
        s.close()

    # per-address cap (32): 40 connections from one address, 8 are refused at once
    cs = [connect(port, "127.0.0.40") for _ in range(40)]
    time.sleep(0.5)
    n_closed = 0
    for s in cs:
        s.setblocking(False)
        try:
            if s.recv(16) == b"":
                n_closed += 1
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            n_closed += 1
    check(n_closed == 8, "per-address cap 32: %d of 40 connections from one address refused" % n_closed)
    st, _, _, _ = request(port, "GET", "/health", timeout=5)
    check(st == 200, "another address is served meanwhile (%d)" % st)
    for s in cs:
        s.close()


def test_tokenize_memory(srv):
    port = srv.port
    words = ["once", "upon", "a", "time", "there", "was", "little", "girl", "named", "lily", "she", "loved", "to",
             "play", "outside", "sun", "Tom", "dog", "happy", "\"q\"", "tab\t", "x\\y"]
    text, i = [], 0
    n = 0
    while n < MIB:
        w = words[(i * 7 + i // 3) % len(words)]
        text.append(w)
        n += len(w) + 1
        i += 1
    content = " ".join(text)[:MIB]
    body = json.dumps({"content": content, "with_pieces": True}).encode()
    # the oracle: ids without pieces, from a separate request
    st, _, rb, _ = request(port, "POST", "/tokenize", json.dumps({"content": content}).encode(), timeout=120)
    ids = json.loads(rb)["tokens"] if st == 200 else []
    check(st == 200 and len(ids) > 100000, "/tokenize of 1 MiB: %d, %d tokens" % (st, len(ids)))
    base = srv.vm("VmRSS")
    results = [None] * 8

    def worker(k):
        results[k] = request(port, "POST", "/tokenize", body, timeout=300)

    ths = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    ok = True
    for r in results:
        if r is None or r[0] != 200:
            ok = False
            continue
        toks = json.loads(r[2])["tokens"]
        ok = ok and [t["id"] for t in toks] == ids and all(isinstance(t["piece"], str) for t in toks)
    check(ok, "8 concurrent /tokenize with_pieces on 1 MiB: all 200 with the same ids as without pieces")
    hwm = srv.vm("VmHWM")
    if srv.sanitized():
        print("     peak RSS %.1f MiB over idle %.1f MiB; bound not checked under AddressSanitizer (its quarantine "
              "and shadow memory dominate RSS)" % (hwm / MIB, base / MIB))
        return
    # docs/http.md: each request in flight holds at most 10 x its body + 256 KiB, plus the scratch of the one
    # encode running at a time (<= 48 x its text), plus 16 MiB for thread stacks and allocator arenas
    bound = base + 8 * (10 * len(body) + 256 * 1024) + 48 * len(body) + 16 * MIB
    check(hwm <= bound, "peak RSS %.1f MiB <= bound %.1f MiB (idle %.1f MiB + 8 x (10 x %.2f MiB + 256 KiB) "
          "+ 48 x %.2f MiB + 16 MiB)" % (hwm / MIB, bound / MIB, base / MIB, len(body) / MIB, len(body) / MIB))
    print("     peak RSS %.1f MiB over idle %.1f MiB" % (hwm / MIB, base / MIB))


def test_limits(port):
    """A server with --max-connections 4, --max-body 256 KiB, --mem-budget 4 MiB, --body-timeout 2."""
    auth = "Authorization: Bearer %s\r\n" % KEY
    # budget: one 256 KiB request reserves 2.75 MiB; a second one does not fit in 4 MiB
    a = connect(port)
    pad = b'{"content":"hi"}' + b" " * (256 * 1024 - 16)
    a.sendall(("POST /tokenize HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n" % (auth, len(pad))).encode()
              + pad[:1000])
    time.sleep(0.3)
    st, h, body, _ = request(port, "POST", "/tokenize", pad)
    check(st == 503 and h.get("retry-after") == "1" and body.startswith(b'{"error"'),
          "second 256 KiB body over the 4 MiB budget: 503 with Retry-After (got %d)" % st)
    st, _, body, _ = request(port, "POST", "/tokenize", {"content": "hi"})
    check(st == 200, "a small body still fits the budget (%d)" % st)
    a.sendall(pad[1000:])
    raw, _ = read_all(a, 10)
    a.close()
    check(parse(raw)[0] == 200, "the held request completes (%d)" % parse(raw)[0])
    st, _, _, _ = request(port, "POST", "/tokenize", pad)
    check(st == 200, "budget released: the 256 KiB body is served now (%d)" % st)

    # connection limit: 4 kept-alive connections idle between requests make room for a new client
    idle = []
    for _ in range(4):
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while b"}" not in got:
            b = s.recv(4096)
            if not b:
                break
            got += b
        idle.append(s)
    st, _, _, _ = request(port, "GET", "/health", timeout=5)
    n_closed = sum(1 for s in idle if read_all(s, 0.5)[1] in ("closed", "reset"))
    check(st == 200 and n_closed == 1, "4 idle kept-alive connections at --max-connections 4: a new client is served "
          "(%d) and one idle connection is closed for it (%d)" % (st, n_closed))
    for s in idle:
        s.close()

    # connection limit: 4 connections sending bodies (not evictable), the 5th gets 503
    held = []
    for _ in range(4):
        s = connect(port)
        s.sendall(("POST /tokenize HTTP/1.1\r\nHost: x\r\n%sContent-Length: 100\r\n\r\n{" % auth).encode())
        held.append(s)
    time.sleep(0.3)
    st, h, body, _ = request(port, "GET", "/health", timeout=5)
    check(st == 503 and h.get("retry-after") == "1" and b"max-connections" in body,
          "over --max-connections with nothing to evict: 503 JSON with Retry-After (got %d)" % st)
    # the body deadline (2 s) cuts them
    t0 = time.time()
    n_cut = 0
    for s in held:
        raw, how = read_all(s, 6)
        n_cut += how in ("closed", "reset")
        s.close()
    check(n_cut == 4 and time.time() - t0 < 5, "stalled bodies cut by --body-timeout: %d of 4 in %.1f s"
          % (n_cut, time.time() - t0))
    st, _, _, _ = request(port, "GET", "/health", timeout=5)
    check(st == 200, "served again after the stalled bodies were cut (%d)" % st)


def main():
    t_start = time.time()
    srv = Server("--max-body", str(2 * MIB + 4096), "--header-timeout", "3", "--body-timeout", "5")
    try:
        test_framing(srv.port)
        test_metrics_once(srv.port)
        test_trickle(srv.port, 3)
        test_tokenize_memory(srv)
    finally:
        rc = srv.stop()
    check(rc == 0, "server exits cleanly (%s)" % rc)
    srv = Server("--max-connections", "4", "--max-body", str(256 * 1024), "--mem-budget", str(4 * MIB),
                 "--body-timeout", "2")
    try:
        test_limits(srv.port)
    finally:
        rc = srv.stop()
    check(rc == 0, "second server exits cleanly (%s)" % rc)
    print("%d failure(s) in %.1f s" % (len(FAILS), time.time() - t_start))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
