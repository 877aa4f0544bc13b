// tests/node/render_templates.mjs - the chat-template oracle.
//
// Renders a fixed set of conversations with each reference Jinja template
// using @huggingface/jinja (the engine transformers.js uses; trim_blocks and
// lstrip_blocks like transformers) and writes
// tests/server/chat_expected.json, which tests/server/test_chat_template.c
// compares byte for byte with server/chat_template.c.
//   templates: llama3 + qwen3 from shared/models/tokenizers/*/tokenizer_config.json,
//              llama2, mistral, chatml, zephyr, qwen2 from tests/node/templates/*.jinja
//              (the published templates of Llama-2-chat, Mistral-7B-Instruct-v0.1,
//              ChatML, zephyr-7b-beta and Qwen2-Instruct).
// Usage: node render_templates.mjs [SHARED_MODELS_DIR [OUT.json]]   (default: regenerates the committed file)
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const shared = process.argv[2] || path.join(here, "../../../shared/models");
const out = process.argv[3] || path.join(here, "../server/chat_expected.json");

const families = [];
for (const [name, dir] of [["llama3", "llama3"], ["qwen3", "qwen3"]]) {
  const cfg = JSON.parse(fs.readFileSync(path.join(shared, "tokenizers", dir, "tokenizer_config.json"), "utf8"));
  families.push({ name, source: `shared/models/tokenizers/${dir}/tokenizer_config.json`, template: cfg.chat_template,
                  bos: cfg.bos_token || "", eos: cfg.eos_token || "" });
}
for (const [name, bos, eos] of [["llama2", "<s>", "</s>"], ["mistral", "<s>", "</s>"],
                                ["chatml", "", "<|im_end|>"], ["zephyr", "<s>", "</s>"],
                                ["qwen2", "", "<|im_end|>"]]) {
  families.push({ name, source: `tests/node/templates/${name}.jinja`,
                  template: fs.readFileSync(path.join(here, "templates", name + ".jinja"), "utf8"), bos, eos });
}

const S = (c) => ({ role: "system", content: c });
const U = (c) => ({ role: "user", content: c });
const A = (c) => ({ role: "assistant", content: c });
const conversations = [
  [U("Hello!")],
  [S("You are a helpful assistant."), U("What is 2+2?")],
  [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")],
  [S("Be brief."), U("  padded question \n"), A("  padded answer  "), U("again")],
  [U("multi\nline\n\ntext"), A("ok\n"), U("ünïcödé ✓ 日本語")],
  [U("Think first"), A("<think>\nreasoning here\n</think>\n\nThe answer."), U("and now?")],
  [U("q"), A("<think>\nlast reasoning\n</think>\n\nfinal")],
  [S("sys only")],
  [A("assistant first")],
  [U("a"), U("b")],
  [S("s1"), U("u1"), S("s2"), U("u2")],
  [U("")],
  [U("quotes \"double\" and 'single' and {{ braces }} and {% tags %}")],
  // reasoning_content on assistant turns (the qwen3 template renders it in a <think> block)
  [U("q1"), { role: "assistant", content: "a1", reasoning_content: "\nr1\n" }, U("q2"),
   { role: "assistant", content: "a2", reasoning_content: "r2" }],
  [U("q1"), { role: "assistant", content: "<think>ignored</think>a1", reasoning_content: "" }],
];

const cases = [];
for (const f of families) {
  const tmpl = new Template(f.template);
  for (const messages of conversations) {
    for (const add_generation_prompt of [true, false]) {
      const c = { family: f.name, source: f.source, bos: f.bos, eos: f.eos, add_generation_prompt, messages };
      try {
        c.expected = tmpl.render({ messages, bos_token: f.bos, eos_token: f.eos, add_generation_prompt });
      } catch (e) {
        c.error = String(e.message || e);
      }
      cases.push(c);
    }
  }
}
fs.writeFileSync(out, JSON.stringify(cases, null, 1) + "\n");
console.log(`wrote ${cases.length} cases to ${out}`);
