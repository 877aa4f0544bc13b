#!/usr/bin/env python3
"""scripts/bench_embed.py URL [--pairs N] [--prompts N] [--key KEY]

What an embeddings call costs next to the prefill of its prompts, on a running
`tpserve serve` (URL like http://127.0.0.1:8080): N distinct prompts of about
37 tokens (new ones for each pair: no cached prefix) sent as one POST /v1/embeddings, and the same prompts as N concurrent
POST /v1/completions with max_tokens 1 (prefill, the last token's logits and one
sampled token).  The two alternate (embeddings first, then completions, --pairs
times) so that load from elsewhere on a shared machine lands on both; prints each
pair's seconds and ratio, and the median ratio.  Standard library only.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

WORDS = ("river stone lantern orchard violet harbor meadow copper whistle marble canyon ember "
         "falcon glacier hollow island jasmine kettle ladder mirror nectar oyster pepper quartz").split()


def prompts(n, salt):
    """n distinct prompts of about 37 tokens; salt (the pair) opens each, so that no prompt of a pair
    shares a cached prefix with one of an earlier pair"""
    out = []
    for i in range(n):
        w = [WORDS[(i * 7 + k * 3 + salt) % len(WORDS)] for k in range(12)]
        out.append(f"{salt * 1000 + i} " + " ".join(w) + f" end {i * 37 % 101}.")
    return out


def post(url, path, body, key):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--key", default="none")
    a = ap.parse_args()
    ratios = []
    for k in range(a.pairs):
        ps = prompts(a.prompts, k + 1)
        t0 = time.monotonic()
        e = post(a.url, "/v1/embeddings", {"input": ps, "encoding_format": "float"}, a.key)
        te = time.monotonic() - t0
        n_tok = e["usage"]["prompt_tokens"]
        res = [None] * len(ps)

        def one(i):
            res[i] = post(a.url, "/v1/completions", {"prompt": ps[i], "max_tokens": 1, "temperature": 0}, a.key)

        th = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
        t0 = time.monotonic()
        for t in th:
            t.start()
        for t in th:
            t.join()
        tc = time.monotonic() - t0
        c_tok = sum(r["usage"]["prompt_tokens"] for r in res)
        c_cached = sum(r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in res)
        ratios.append(te / tc)
        print(f"pair {k + 1}: embeddings {te:.2f} s ({n_tok} tokens), completions {tc:.2f} s ({c_tok} tokens, "
              f"{c_cached} from the cache), ratio {te / tc:.2f}", flush=True)
    print(f"median ratio embeddings / completions: {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(ratios)} pairs)")


if __name__ == "__main__":
    main()
