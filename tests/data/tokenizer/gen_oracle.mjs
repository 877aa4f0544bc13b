// tests/data/tokenizer/gen_oracle.mjs - writes oracle.json: token ids of a
// wider corpus (Unicode, code, numbers, whitespace runs, emoji, CJK,
// combining marks, chat-template specials) from the Hugging Face tokenizers
// library (Rust, via the npm package @anush008/tokenizers), so the C test
// (tests/model/test_tokenizer.c, suite tokenizer_oracle) needs no node.
//
// Usage (install the oracle in a scratch directory, not in the repo):
//   mkdir -p /tmp/tok-oracle && (cd /tmp/tok-oracle && npm install @anush008/tokenizers@0.6.0)
//   ORACLE_DIR=/tmp/tok-oracle node tests/data/tokenizer/gen_oracle.mjs ../shared/models \
//       > tests/data/tokenizer/oracle.json
//
// Each case: input index, whether special tokens are parsed (HF always
// splits added tokens out; tpserve does so with parse_special=1), the ids
// (encode with addSpecialTokens=false, i.e. no BOS) and the HF decode with
// skipSpecialTokens=true (left out when it equals the input).
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const oracleDir = process.env.ORACLE_DIR || process.cwd();
const require = createRequire(path.join(path.resolve(oracleDir), 'noop.js'));
const { Tokenizer } = require('@anush008/tokenizers');
const shared = process.argv[2] || '../shared/models';

const para =
  'The quick brown fox jumps over the lazy dog. It\'s 2024-06-01, and we\'ve shipped v3.14.159 ' +
  '(build #8812) to 1,234,567 users! Ça coûte 12,50 € — naïve café. Zürich, Москва, 東京, 서울. ' +
  'if (x != 0) { return y / x; } // done\n\tfor i in range(100):\n\t\tprint(i ** 2)\n';
const inputs = [
  '', ' ', '  ', '\t\t', '\n', '\r\n', ' \n \n', 'a  \n\n  b', 'trailing spaces   ', '   leading',
  'Hello world', 'HELLO WORLD', "I'm you're he'll she'd it's we've THEY'RE DON'T I'M",
  '1', '12', '123', '1234', '12345678901234567890', '3.14159 2.71828 -42 +7 1e-9 0x1F 0b1010',
  '1,000,000 and 1 000 000 and 1_000_000', '½ ¼ ¾ ² ³ Ⅻ ⅷ ① ١٢٣ १२३ １２３',
  'Hello, world! How are you? (fine) [ok] {yes} <no> "quoted" \'single\'',
  '...!!!???---___===+++***&&&%%%$$$###@@@',
  '🦙🦙🦙 llama 🦙 emoji 😀😃😄 family 👨‍👩‍👧‍👦 flag 🇫🇷 skin 👍🏽 heart ❤️',
  '中文测试：你好，世界！今天天气很好。', '日本語のテキストとカタカナ、ひらがな。', '한국어 텍스트 테스트입니다.',
  'Ελληνικά κείμενα', 'Русский текст с ёлкой и ЁЖИКОМ', 'العربية نص تجريبي', 'עברית טקסט',
  'हिन्दी पाठ परीक्षण', 'ภาษาไทยทดสอบ', 'Tiếng Việt có dấu: Cửa Việt, Phường',
  'e\u0301 n\u0303 a\u0308 o\u0302\u0323 A\u030A Å Å é', '\u1100\u1161\u11A8 \uAC01',
  'ﬁ ﬂ Ⅸ ｆｕｌｌｗｉｄｔｈ ＡＢＣ', 'zero\u200bwidth\u200dj\u200coiner \u00a0nbsp \u2003em \u3000ideo',
  'def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n',
  '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
  '    indented\n        more\n\n\n\n    back', 'x=1;y=2;z=x+y*3/4-5%6^7|8&9~0', 'http://example.com/a/b?c=d&e=f#g',
  'mixed123abc456def 7up A1B2C3', 'snake_case camelCase PascalCase kebab-case SCREAMING_CASE',
  '\u0001\u001f\u007f control', '\u0085next \u2028line\u2029para \r\r\n\n\r end', ',  ,   ,\t, !\n\n! \u00a0\u00a0x',
  "a'b ' '' 'x 'S x'S isn't O'Neill", 'Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036b o\u0328\u0317\u0362',
  'ǅungla ǈ ʰʲ ˈstress ー々〆', '1٢3۴5߆6 ７8 𝟖9', 'Ꭰ𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 𐍈 𓀀', 'tab\tseparated\tvalues\t', "'s 'S 'll 'LL 'Ve 're's",
  para, para.repeat(12),
];
// Random strings over a pool of characters that stress the pre-tokenizer
// rules (contractions, optional prefix characters, digit runs, whitespace
// look-ahead, \r\n handling, marks, non-BMP letters), from a fixed seed.
let seed = 0x5eed1234;
const rand = () => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pool = [' ', ' ', ' ', '  ', '\n', '\r', '\t', '\u00a0', '\u3000', "'", "'", 's', 'S', 't', 'l', 'L', 're', 've',
  'm', 'd', 'a', 'Z', 'é', 'e\u0301', '\u0301', 'ß', 'ж', '中', '文', 'ア', 'ㄱ', 'ㅏ', '𝔘', '0', '1', '2', '3', '45',
  '6789', '٣', '½', 'Ⅻ', '.', ',', '!', '?', '-', '_', '(', ')', '"', '<', '>', '/', '\\', '$', '€', '+', '=', '#',
  '🦙', '👍🏽', '\u200d', '\u200b', '\u0085', '\u2028', '\u000b', '\u000c', 'x', 'Q', 'ǅ', 'ʰ', '\u1161'];
for (let i = 0; i < 200; i++) {
  let s = '';
  const n = 1 + Math.floor(rand() * 24);
  for (let j = 0; j < n; j++) s += pool[Math.floor(rand() * pool.length)];
  inputs.push(s);
}
const specialInputs = [
  '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n',
  '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n',
  '<s>[INST] Hello [/INST] Hi</s> after',
];
const tokenizers = [
  { name: 'llama3', dir: 'tokenizers/llama3' },
  { name: 'qwen3', dir: 'tokenizers/qwen3' },
  { name: 'mistral', dir: 'tokenizers/mistral-7b-v0.1' },
  { name: 'gpt2_regex', dir: 'tokenizers/llama3', variant: 'gpt2' },
  { name: 'gpt2_digits', dir: 'tokenizers/llama3', variant: 'gpt2_digits' },
  { name: 'spm_normalizer', dir: 'tokenizers/mistral-7b-v0.1', variant: 'spm_normalizer' },
];

const all = inputs.concat(specialInputs);
// Variants (the C test builds the same ones): the GPT-2 pre-tokenizer has no
// tokenizer file of its own here, so 'gpt2' is the Llama 3 vocabulary with a
// plain ByteLevel(use_regex) pre-tokenizer; 'spm_normalizer' is Mistral's
// vocabulary in the Llama 2 tokenizer.json style (Prepend + Replace
// normalizers instead of a Metaspace pre-tokenizer).
// 'gpt2_digits' puts Digits(individual_digits) first, as SmolLM does.
const makeVariant = (json, variant) => {
  const j = JSON.parse(json);
  if (variant.startsWith('gpt2'))
    j.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  if (variant === 'gpt2_digits')
    j.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, j.pre_tokenizer] };
  if (variant === 'spm_normalizer') { // Llama 2 / TinyLlama style: SentencePiece emulated by normalizers
    j.pre_tokenizer = null;
    j.normalizer = { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '\u2581' },
      { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] };
  }
  if (variant.startsWith('gpt2')) j.model.ignore_merges = false;
  return JSON.stringify(j);
};
const out = { generator: '@anush008/tokenizers 0.6.0 (HF tokenizers 0.22.2)', inputs: all, tokenizers: {} };
for (const tk of tokenizers) {
  const file = path.join(shared, tk.dir, 'tokenizer.json');
  const tok = tk.variant ? Tokenizer.fromString(makeVariant(fs.readFileSync(file, 'utf8'), tk.variant)) : Tokenizer.fromFile(file);
  const cases = [];
  for (let i = 0; i < all.length; i++) {
    const special = i >= inputs.length;
    const enc = await tok.encode(all[i], null, { addSpecialTokens: false });
    const ids = Array.from(enc.getIds());
    const text = await tok.decode(ids, true);
    const c = { input: i, ids };
    if (special) c.special = true;
    if (text !== all[i]) c.decoded = text; // absent: decodes back to the input
    cases.push(c);
  }
  out.tokenizers[tk.name] = { dir: tk.dir, variant: tk.variant || null, cases };
}
process.stdout.write(JSON.stringify(out) + '\n');
