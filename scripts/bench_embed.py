#!/usr/bin/env python3
"""scripts/bench_embed.py URL [--pairs N] [--prompts N] [--key KEY]

What an embeddings call costs next to the prefill of its prompts, on a running
`tpserve serve` (URL like http://127.0.0.1:8080): N distinct prompts of about
37 tokens (new ones for each pair: no cached prefix) sent as one POST /v1/embeddings, and the same prompts as N concurrent
POST /v1/completions with max_tokens 1 (prefill, the last token's logits and one
sampled token).  The two alternate, --pairs times, in the order ABBA (embeddings first in
odd pairs, completions first in even ones), each with prompts of its own, so that
load from elsewhere on a shared machine lands on both; prints each
pair's seconds and the ratio of their seconds per prompt token read (completions'
tokens found in the prompt cache are not read), and the median ratio.  Standard library only.
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
    """n distinct prompts of about 37 tokens, opening with different words: none shares more than a
    token or two of prefix with another (salt: which set)"""
    out = []
    for i in range(n):
        w = [WORDS[(i * 7 + k * 3 + salt * 5) % len(WORDS)] for k in range(12)]
        out.append(f"{chr(65 + i % 26)}{i // 26}-{salt}: " + " ".join(w) + f" end {i * 37 % 101}.")
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
        res = [None] * len(ps)

        def one(i):
            res[i] = post(a.url, "/v1/completions", {"prompt": ps[i], "max_tokens": 1, "temperature": 0}, a.key)

        def embeddings():
            t0 = time.monotonic()
            e = post(a.url, "/v1/embeddings", {"input": ps, "encoding_format": "float"}, a.key)
            return time.monotonic() - t0, e["usage"]["prompt_tokens"]

        def completions():
            th = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
            t0 = time.monotonic()
            for t in th:
                t.start()
            for t in th:
                t.join()
            return time.monotonic() - t0

        # ABBA: even pairs embeddings first, odd pairs completions first (each on its own prompts: the
        # second of a pair gets new ones too, so neither reads the other's cache)
        if k % 2 == 0:
            te, n_tok = embeddings()
            ps = prompts(a.prompts, 100 + k)
            tc = completions()
        else:
            tc = completions()
            ps = prompts(a.prompts, 100 + k)
            te, n_tok = embeddings()
        c_tok = sum(r["usage"]["prompt_tokens"] for r in res)
        c_cached = sum(r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in res)
        # seconds per prompt token read (the cached ones were not)
        ratio = (te / n_tok) / (tc / max(1, c_tok - c_cached))
        ratios.append(ratio)
        print(f"pair {k + 1} ({'embeddings' if k % 2 == 0 else 'completions'} first): embeddings {te:.2f} s "
              f"({n_tok} tokens), completions {tc:.2f} s ({c_tok} tokens, {c_cached} from the cache), "
              f"ratio per token read {ratio:.2f}", flush=True)
    print(f"median ratio embeddings / completions (seconds per prompt token read): {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(ratios)} pairs)")


if __name__ == "__main__":
    main()
