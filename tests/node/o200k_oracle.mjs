// tests/node/o200k_oracle.mjs - the o200k tokenizer oracle (tiktoken's o200k_base).
//
// Writes into OUTDIR:
//   tokenizer.json        the gpt-oss tokenizer as Hugging Face writes it, built from the tiktoken
//                         package's o200k_base ranks: byte-level vocab (id = rank), merges derived
//                         from the ranks the way transformers' TikTokenConverter derives them (every
//                         split of a token into two tokens, ordered by the merged token's rank), the
//                         o200k regex as a Split pre-tokenizer, and the harmony special tokens
//                         (<|startoftext|> 199998 ... <|call|> 200012, <|reserved_N|> up to 201087)
//   tokenizer_config.json bos/eos/pad as gpt-oss has them
//   corpus.json           [{text, ids, special}]: a seeded mixed-script corpus (Latin with case
//                         runs and contractions, CJK, Hangul, Arabic and Devanagari with their
//                         marks, emoji sequences, digit runs, whitespace runs, code, random valid
//                         UTF-8 from long-assigned blocks) encoded by tiktoken: encode_ordinary
//                         when special is false, and with the harmony specials allowed when true
// tests/model/test_o200k.c compares tpserve's tokenizer with these ids.
// Usage: node o200k_oracle.mjs OUTDIR [N_TEXTS]   exits 77 when the tiktoken package is missing.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const outDir = process.argv[2];
const nTexts = Number(process.argv[3] || 3000);
if (!outDir) {
  console.error("usage: node o200k_oracle.mjs OUTDIR [N_TEXTS]");
  process.exit(2);
}
let tiktoken, base;
try {
  tiktoken = await import("tiktoken");
  const require = createRequire(import.meta.url);
  base = require("tiktoken/encoders/o200k_base.json");
} catch (e) {
  console.log("SKIP: the tiktoken npm package is not installed (cd tests/node && npm install)");
  process.exit(77);
}

// ---------------------------------------------------------------- vocabulary
// bpe_ranks: lines "<ignored> <first rank> <base64 token> <base64 token> ..."
const ranks = []; // rank -> Buffer
for (const line of base.bpe_ranks.split("\n")) {
  if (!line) continue;
  const parts = line.split(" ");
  const off = Number(parts[1]);
  for (let i = 2; i < parts.length; i++) ranks[off + i - 2] = Buffer.from(parts[i], "base64");
}
const nRanks = ranks.length; // 199998
const rankOf = new Map();
ranks.forEach((b, r) => rankOf.set(b.toString("latin1"), r));

// GPT-2 byte map (bytes_to_unicode)
const byteToCp = new Array(256);
{
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  let n = 0;
  for (let b = 0; b < 256; b++) byteToCp[b] = bs.includes(b) ? b : 256 + n++;
}
const bl = (latin1) => { let s = ""; for (let i = 0; i < latin1.length; i++) s += String.fromCodePoint(byteToCp[latin1.charCodeAt(i)]); return s; };

const vocab = {};
const merges = [];
for (let r = 0; r < nRanks; r++) {
  const t = ranks[r].toString("latin1");
  vocab[bl(t)] = r;
  if (t.length < 2) continue;
  const local = [];
  for (let i = 1; i < t.length; i++) {
    const a = t.slice(0, i), b = t.slice(i);
    if (rankOf.has(a) && rankOf.has(b)) local.push([a, b]);
  }
  local.sort((x, y) => rankOf.get(x[0]) - rankOf.get(y[0]) || rankOf.get(x[1]) - rankOf.get(y[1]));
  for (const [a, b] of local) merges.push([bl(a), bl(b)]);
}

const harmony = { "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
                  "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008,
                  "<|call|>": 200012 };
const specials = {};
for (let id = 199998; id <= 201087; id++) specials[`<|reserved_${id}|>`] = id;
for (const [k, v] of Object.entries(specials)) if (Object.values(harmony).includes(v)) delete specials[k];
Object.assign(specials, harmony);
const added = Object.entries(specials).sort((a, b) => a[1] - b[1])
  .map(([content, id]) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));

const tokJson = {
  version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: base.pat_str }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: null,
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges },
};
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(tokJson));
fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify({
  bos_token: "<|startoftext|>", eos_token: "<|return|>", pad_token: "<|endoftext|>", add_bos_token: false }));

// -------------------------------------------------------------------- corpus
let seed = 0x9e3779b9 >>> 0;
const rnd = () => { seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0; return seed / 4294967296; };
const ri = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));
const pick = (a) => a[Math.floor(rnd() * a.length)];
const cps = (lo, hi, n) => { let s = ""; for (let i = 0; i < n; i++) s += String.fromCodePoint(ri(lo, hi)); return s; };

const words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "WORLD", "CamelCase",
  "iPhone", "McDonald", "XMLHttpRequest", "naïve", "café", "Straße", "ſtraße", "Ærøskøbing", "ÉCOLE", "Ǆemal", "ǅemal",
  "Ωmega", "αβγ", "ΣΊΣΥΦΟΣ", "Москва", "ПРИВЕТ", "Привет", "שלום", "ǈubljana", "ﬁnance", "Ⅻth", "x²", "H₂O"];
const contractions = ["don't", "I'M", "we'll", "it'S", "'ll", "o'clock", "they're", "YOU'VE", "she'd", "can'T",
  "rock'n'roll", "'s", "isn'ſ", "l'été", "Ma'am", "we've'd"];
const code = ["int main(void) {\n    return 0;\n}\n", "def f(x):\n\treturn x**2 # square\n",
  "const a = [1, 2, 3].map((x) => x * 2);", "https://example.com/a/b?c=d&e=f#g", "/* comment */ // line\n",
  "if (a != b && c <= d) { x += 1; }", "<div class=\"x\">&amp;</div>", "SELECT * FROM t WHERE id = 42;",
  "path/to/file.txt\n\n", "a/b/c//d///", "!!!\n\n", "...\r\n", "#!/bin/sh\nset -eu\n", "{\"key\": [true, null]}",
  "x = y / z\n/", "::std::vector<int>", "$HOME/.config", "λx.x", "==> ===", "--flag=value"];
const spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000", "\u2003",
  " \t \n", "\n\n\n   ", "    ", "\u200b", "\u0085"];
const emoji = () => pick([
  () => String.fromCodePoint(ri(0x1f600, 0x1f64f)),
  () => String.fromCodePoint(ri(0x1f300, 0x1f5ff)) + "\ufe0f",
  () => "\u{1f468}\u200d\u{1f469}\u200d\u{1f467}",
  () => String.fromCodePoint(ri(0x1f44a, 0x1f450)) + String.fromCodePoint(ri(0x1f3fb, 0x1f3ff)),
  () => String.fromCodePoint(ri(0x1f1e6, 0x1f1ff), ri(0x1f1e6, 0x1f1ff)),
  () => "❤️", () => "✓", () => "★☆",
])();
// long-assigned blocks only (the oracle's and our Unicode versions may differ on recent additions)
const blocks = [[0x20, 0x7e], [0xa0, 0x24f], [0x250, 0x2af], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff],
  [0x591, 0x5f4], [0x600, 0x6ff], [0x900, 0x97f], [0x980, 0x9fb], [0xe01, 0xe5b], [0x1100, 0x11ff],
  [0x1e00, 0x1eff], [0x2000, 0x206f], [0x2070, 0x209c], [0x20a0, 0x20b5], [0x2100, 0x218b], [0x2190, 0x23ff],
  [0x2460, 0x24ff], [0x2500, 0x27bf], [0x3000, 0x30ff], [0x3131, 0x318e], [0x4e00, 0x9fa5], [0xac00, 0xd7a3],
  [0xff01, 0xffee], [0x10400, 0x1044f], [0x1d400, 0x1d7ff], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f]];
const randomUtf8 = (n) => { let s = ""; for (let i = 0; i < n; i++) { const b = pick(blocks); s += String.fromCodePoint(ri(b[0], b[1])); } return s; };

const segment = () => {
  switch (ri(0, 13)) {
  case 0: return pick(words);
  case 1: return pick(contractions);
  case 2: return cps(0x4e00, 0x9fa5, ri(1, 12));                         // Han
  case 3: return cps(0x3041, 0x3096, ri(1, 8)) + cps(0x30a1, 0x30fa, ri(0, 6)); // kana
  case 4: return cps(0xac00, 0xd7a3, ri(1, 8));                          // Hangul
  case 5: { let s = ""; for (let i = ri(1, 6); i > 0; i--) s += cps(0x0621, 0x064a, 1) + (rnd() < 0.4 ? cps(0x064b, 0x0652, 1) : ""); return s; }
  case 6: { let s = ""; for (let i = ri(1, 6); i > 0; i--) s += cps(0x0905, 0x0939, 1) + (rnd() < 0.5 ? cps(0x093e, 0x094d, 1) : ""); return s; }
  case 7: return emoji();
  case 8: { let s = ""; const n = ri(1, 14); for (let i = 0; i < n; i++) s += String(ri(0, 9)); return rnd() < 0.2 ? cps(0x0660, 0x0669, ri(1, 5)) : s; }
  case 9: return pick(spaces);
  case 10: return pick(code);
  case 11: return randomUtf8(ri(1, 10));
  case 12: return pick(words).toUpperCase() + pick(["'s", "'LL", "'Re", "'d", "'t", "'ve", "'M"]);
  default: return pick([",", ".", "!", "?", ";", ":", "-", "—", "…", "«", "»", "(", ")", "\"", "'", "/", "//", "@", "#"]);
  }
};
const joiner = () => pick(["", " ", " ", " ", "\n", "  ", ""]);

const enc = tiktoken.get_encoding("o200k_base");
const encH = new tiktoken.Tiktoken(base.bpe_ranks, specials, base.pat_str);
const corpus = [];
for (let i = 0; i < nTexts; i++) {
  let text = "";
  const n = ri(1, 40);
  for (let j = 0; j < n; j++) text += segment() + joiner();
  corpus.push({ text, ids: Array.from(enc.encode_ordinary(text)), special: false });
}
// long runs: digits, whitespace, one repeated letter, a long word
corpus.push({ text: "1234567890".repeat(50), special: false });
corpus.push({ text: " ".repeat(300) + "x" + "\n".repeat(100) + "\t".repeat(50) + " y", special: false });
corpus.push({ text: "a".repeat(2000), special: false });
corpus.push({ text: "Supercalifragilisticexpialidocious".repeat(20), special: false });
corpus.push({ text: "", special: false });
for (const c of corpus) if (!c.ids) c.ids = Array.from(enc.encode_ordinary(c.text));

// harmony conversations: special tokens parsed, near-misses left as text
const harmonyTexts = [
  "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>",
  "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
  "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
  "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\": 21}<|end|>",
  "<|reserved_200017|><|endoftext|><|startoftext|>",
  "not special: <|start <|end|x> <|chan nel|> |> <| <||>",
  "<|start|><|start|><|message|><|message|>",
];
for (let i = 0; i < 200; i++) {
  let text = "";
  const n = ri(1, 12);
  for (let j = 0; j < n; j++) text += rnd() < 0.3 ? pick(Object.keys(specials)) : segment();
  harmonyTexts.push(text);
}
for (const text of harmonyTexts) corpus.push({ text, ids: Array.from(encH.encode(text, "all")), special: true });
enc.free();
encH.free();
fs.writeFileSync(path.join(outDir, "corpus.json"), JSON.stringify(corpus));
const bytes = corpus.reduce((a, c) => a + Buffer.byteLength(c.text), 0);
console.log(`o200k oracle: ${nRanks} ranks, ${merges.length} merges, ${added.length} specials; ` +
            `${corpus.length} texts, ${bytes} bytes, ${corpus.reduce((a, c) => a + c.ids.length, 0)} tokens`);
