#!/usr/bin/env python3
"""tests/model/gptoss_ref.py - an independent float64 NumPy reference of gpt-oss.

Written from the published architecture (OpenAI's gpt-oss reference implementation
gpt_oss/torch/model.py and the Hugging Face GptOss modeling code), not from tpserve's C:
it reads the GGUF file itself (its own parser and its own F32 / F16 / Q8_0 / MXFP4
decoders, MXFP4 from the OCP Microscaling spec: E2M1 codes times 2^(E8M0 - 127)), then
runs greedy decoding in float64 with the model's exact weights.

  block   x += o_proj(attn(rmsnorm(x) * attn_norm)) + o_bias
          x += moe(rmsnorm(x) * post_attention_norm)
  attn    q, k, v = linear + bias; RoPE on halves (NeoX) with YaRN inverse frequencies
          (ntk_alpha = beta_slow, ntk_beta = beta_fast, no rounding of the ramp ends) and
          cos / sin scaled by the concentration 0.1 ln(factor) + 1; scores q.k / sqrt(head_dim);
          a learned sink logit per head joins the softmax and is dropped after it;
          the even layers see only the last `sliding_window` positions (i - j < window)
  moe     router logits = linear + bias; the top-k by logit; weights = softmax of those k;
          expert(x) = down(swiglu(gate(x) + bg, up(x) + bu)) + bd with
          swiglu(g, u) = min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)

Usage: gptoss_ref.py MODEL.gguf --prompt 1,2,3 (--steps N | --force 4,5,6) [--logits-out FILE]
--steps: prints the N greedy token ids after the prompt, space separated.
--force: teacher forcing: feeds the given tokens after the prompt and prints, for each,
"GAP:MARGIN": how far its logit is below the largest one where it was chosen (0 when it is the
argmax), and the smallest gap over all layers between the k-th and the (k+1)-th router logit in
the step that produced those logits (how near the router came to another choice of experts).
--logits-out writes the logits after the last prompt token as float64 little-endian.
"""
import argparse
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- GGUF

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.d = data
        self.o = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.o)[0]
        self.o += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.o:self.o + n].decode("utf-8", "replace")
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et = self.take("<I")
            n = self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALAR[t])


def read_gguf(path):
    data = open(path, "rb").read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise SystemExit("not a GGUF file")
    r.o = 4
    r.take("<I")
    n_t = r.take("<Q")
    n_kv = r.take("<Q")
    kv = {}
    for _ in range(n_kv):
        k = r.string()
        t = r.take("<I")
        kv[k] = r.value(t)
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.take("<I")
        ne = [r.take("<Q") for _ in range(nd)]
        typ = r.take("<I")
        off = r.take("<Q")
        infos.append((name, ne, typ, off))
    align = kv.get("general.alignment", 32)
    base = (r.o + align - 1) // align * align
    tensors = {}
    for name, ne, typ, off in infos:
        tensors[name] = decode(data, base + off, ne, typ)
    return kv, tensors


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def decode(data, off, ne, typ):
    n = int(np.prod(ne))
    shape = tuple(reversed(ne))  # ne[0] is the fastest-moving dimension
    if typ == 0:  # F32
        v = np.frombuffer(data, "<f4", n, off).astype(np.float64)
    elif typ == 1:  # F16
        v = np.frombuffer(data, "<f2", n, off).astype(np.float64)
    elif typ == 8:  # Q8_0: fp16 scale, 32 int8
        nb = n // 32
        raw = np.frombuffer(data, np.uint8, nb * 34, off).reshape(nb, 34)
        d = raw[:, :2].copy().view("<f2").astype(np.float64)
        q = raw[:, 2:].copy().view(np.int8).astype(np.float64)
        v = (q * d).reshape(n)
    elif typ == 39:  # MXFP4: E8M0 exponent byte, then 16 bytes of E2M1 nibbles (low: element j, high: j + 16)
        nb = n // 32
        raw = np.frombuffer(data, np.uint8, nb * 17, off).reshape(nb, 17)
        scale = np.ldexp(1.0, raw[:, 0].astype(np.int64) - 127)[:, None]
        lo = E2M1[raw[:, 1:] & 0x0F]
        hi = E2M1[raw[:, 1:] >> 4]
        v = (np.concatenate([lo, hi], axis=1) * scale).reshape(n)
    else:
        raise SystemExit("tensor type %d not handled by the reference" % typ)
    return v.reshape(shape)


# ---------------------------------------------------------------- model


class Model:
    def __init__(self, path):
        kv, t = read_gguf(path)
        a = kv["general.architecture"]
        if a != "gpt-oss":
            raise SystemExit("architecture %s is not gpt-oss" % a)
        g = lambda k, d=None: kv.get(a + "." + k, d)  # noqa: E731
        self.t = t
        self.n_layer = g("block_count")
        self.n_head = g("attention.head_count")
        self.n_kv = g("attention.head_count_kv")
        self.hd = g("attention.key_length", g("embedding_length") // self.n_head)
        self.eps = g("attention.layer_norm_rms_epsilon", 1e-5)
        self.k = g("expert_used_count")
        self.window = g("attention.sliding_window", 0)
        theta = g("rope.freq_base")
        factor = g("rope.scaling.factor", 1.0) if g("rope.scaling.type") == "yarn" else 1.0
        orig = g("rope.scaling.original_context_length", 4096)
        beta_fast = g("rope.scaling.yarn_beta_fast", 32.0)
        beta_slow = g("rope.scaling.yarn_beta_slow", 1.0)
        # OpenAI reference RotaryEmbedding._compute_concentration_and_inv_freq
        freq = theta ** (np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        if factor > 1.0:
            self.conc = 0.1 * np.log(factor) + 1.0
            d_half = self.hd / 2
            low = d_half * np.log(orig / (beta_fast * 2 * np.pi)) / np.log(theta)
            high = d_half * np.log(orig / (beta_slow * 2 * np.pi)) / np.log(theta)
            interp = 1.0 / (factor * freq)
            extrap = 1.0 / freq
            ramp = (np.arange(d_half) - low) / (high - low)
            mask = 1 - np.clip(ramp, 0, 1)
            self.inv_freq = interp * (1 - mask) + extrap * mask
        else:
            self.conc = 1.0
            self.inv_freq = 1.0 / freq
        self.cache = [([], []) for _ in range(self.n_layer)]
        self.pos = 0

    def w(self, name):
        return self.t[name]

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x) + self.eps) * w

    def rope(self, x, pos):  # x: (heads, hd); halves rotate together
        ang = pos * self.inv_freq
        c, s = np.cos(ang) * self.conc, np.sin(ang) * self.conc
        h = self.hd // 2
        x1, x2 = x[:, :h], x[:, h:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=1)

    def attention(self, l, x):
        p = "blk.%d." % l
        q = (self.w(p + "attn_q.weight") @ x + self.w(p + "attn_q.bias")).reshape(self.n_head, self.hd)
        k = (self.w(p + "attn_k.weight") @ x + self.w(p + "attn_k.bias")).reshape(self.n_kv, self.hd)
        v = (self.w(p + "attn_v.weight") @ x + self.w(p + "attn_v.bias")).reshape(self.n_kv, self.hd)
        q, k = self.rope(q, self.pos), self.rope(k, self.pos)
        ks, vs = self.cache[l]
        ks.append(k)
        vs.append(v)
        K, V = np.stack(ks), np.stack(vs)  # (n_pos, n_kv, hd)
        n = len(ks)
        first = 0
        if self.window > 0 and l % 2 == 0:  # sliding layers: the even ones (HF layer_types)
            first = max(0, n - self.window)
        sinks = self.w(p + "attn_sinks.weight")
        group = self.n_head // self.n_kv
        out = np.zeros((self.n_head, self.hd))
        for h in range(self.n_head):
            kh = h // group
            sc = K[first:, kh, :] @ q[h] / np.sqrt(self.hd)
            allv = np.concatenate([sc, [sinks[h]]])
            e = np.exp(allv - allv.max())
            pr = e / e.sum()
            out[h] = pr[:-1] @ V[first:, kh, :]
        return self.w(p + "attn_output.weight") @ out.reshape(-1) + self.w(p + "attn_output.bias")

    def moe(self, l, x):
        p = "blk.%d." % l
        logits = self.w(p + "ffn_gate_inp.weight") @ x + self.w(p + "ffn_gate_inp.bias")
        order = np.argsort(-logits, kind="stable")  # ties: the lower index first
        sel = order[: self.k]
        # how near the router was to picking another expert set (reported with --force)
        self.router_margin = min(self.router_margin, float(logits[order[self.k - 1]] - logits[order[self.k]]))
        e = np.exp(logits[sel] - logits[sel].max())
        wts = e / e.sum()
        y = np.zeros_like(x)
        for j, ex in enumerate(sel):
            gt = self.w(p + "ffn_gate_exps.weight")[ex] @ x + self.w(p + "ffn_gate_exps.bias")[ex]
            up = self.w(p + "ffn_up_exps.weight")[ex] @ x + self.w(p + "ffn_up_exps.bias")[ex]
            gt = np.minimum(gt, 7.0)
            up = np.clip(up, -7.0, 7.0)
            h = gt / (1.0 + np.exp(-1.702 * gt)) * (up + 1.0)
            y += wts[j] * (self.w(p + "ffn_down_exps.weight")[ex] @ h + self.w(p + "ffn_down_exps.bias")[ex])
        return y

    def step(self, tok):
        self.router_margin = float("inf")
        x = self.w("token_embd.weight")[tok].copy()
        for l in range(self.n_layer):
            p = "blk.%d." % l
            x = x + self.attention(l, self.rmsnorm(x, self.w(p + "attn_norm.weight")))
            x = x + self.moe(l, self.rmsnorm(x, self.w(p + "post_attention_norm.weight")))
        self.pos += 1
        x = self.rmsnorm(x, self.w("output_norm.weight"))
        return self.w("output.weight") @ x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--force")
    ap.add_argument("--logits-out")
    a = ap.parse_args()
    m = Model(a.model)
    prompt = [int(t) for t in a.prompt.split(",")]
    for t in prompt:
        logits = m.step(t)
    if a.logits_out:
        logits.astype("<f8").tofile(a.logits_out)
    out = []
    if a.force:
        for t in [int(x) for x in a.force.split(",")]:
            out.append("%.9g:%.9g" % (float(np.max(logits)) - float(logits[t]), m.router_margin))
            logits = m.step(t)
        print(" ".join(out))
        return 0
    for _ in range(a.steps):
        nxt = int(np.argmax(logits))
        out.append(nxt)
        logits = m.step(nxt)
    print(" ".join(str(t) for t in out))


if __name__ == "__main__":
    sys.exit(main())
