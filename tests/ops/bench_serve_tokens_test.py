#!/usr/bin/env python3
"""tests/ops/bench_serve_tokens_test.py TPSERVE - `tpserve bench serve` counts tokens, not chunks.

A stand-in server on 127.0.0.1 streams /v1/completions as the real one can: chunked transfer encoding,
one server-sent event split across two HTTP chunks, and two tokens per event (their text merged, or
with logprobs two entries in logprobs.tokens), events 15 ms apart, then the usage chunk.  It records
when it sent each request's first and last event.  Oracle: the true time per output token of a
request = (last send - first send) / (tokens after the first event); bench serve's median TPOT must
be within 20% of the median of those, and its steady-state rate (one client: the tokens after the first
event over the request's event span) within 20% of the true rate (counting events as tokens gives half);
with and without --logprobs; without, every request is reported in requests_chunks_not_tokens, with none.
"""
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GAP_S = 0.015
sends = []  # (first send, last send, tokens after the first event)
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            out = json.dumps({"tokens": list(range(1, 33))}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        n = body["max_tokens"]
        logprobs = "logprobs" in body
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()

        def chunk(data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def event(obj):
            data = b"data: " + json.dumps(obj).encode() + b"\n\n"
            half = len(data) // 2  # one event in two HTTP chunks
            chunk(data[:half])
            chunk(data[half:])

        first = last = None
        for i in range(0, n, 2):
            choice = {"index": 0, "text": "ab", "finish_reason": None,
                      "logprobs": {"tokens": ["a", "b"]} if logprobs else None}
            event({"object": "text_completion", "choices": [choice]})
            last = time.monotonic()
            first = first or last
            time.sleep(GAP_S)
        event({"object": "text_completion", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        event({"object": "text_completion", "choices": [],
               "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8}})
        chunk(b"data: [DONE]\n\n")
        chunk(b"")
        with lock:
            sends.append((first, last, n - 2))


def run(tpserve, port, extra):
    sends.clear()
    out = subprocess.run([tpserve, "bench", "serve", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1",
                          "--rounds", "3", "--prompt-tokens", "8", "--gen-tokens", "16", "--json"] + extra,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    true = sorted((b - a) / k for a, b, k in sends)[len(sends) // 2] * 1e3
    print(extra, "tpot", rec["tpot_ms_median"], "true", round(true, 3), "mismatch", rec["requests_chunks_not_tokens"])
    assert rec["errors"] == 0 and rec["requests"] == 3, rec
    assert abs(rec["tpot_ms_median"] / true - 1) < 0.2, (rec, true)
    # one client: the steady window of a round is its request's [first, last] event
    steady = sum(k for a, b, k in sends) / sum(b - a for a, b, k in sends)
    print(extra, "steady t/s", rec["steady_agg_tps"], "true", round(steady, 1))
    assert abs(rec["steady_agg_tps"] / steady - 1) < 0.2, (rec, steady)
    return rec


def main():
    tpserve = sys.argv[1]
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    rec = run(tpserve, port, [])
    assert rec["tokens_counted_from"] == "usage" and rec["requests_chunks_not_tokens"] == 3, rec
    rec = run(tpserve, port, ["--logprobs"])
    assert rec["tokens_counted_from"] == "logprobs" and rec["requests_chunks_not_tokens"] == 0, rec
    srv.shutdown()
    print("PASS")


if __name__ == "__main__":
    main()
