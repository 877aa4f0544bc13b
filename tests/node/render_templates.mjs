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
//              ChatML, zephyr-7b-beta and Qwen2-Instruct), and the templates with
//              tools, copied from shared/models/chat-templates: Llama 3.1 / 3.2 / 3.3
//              Instruct, Qwen2.5-7B-Instruct, Qwen3-0.6B, Mistral-Nemo-Instruct-2407,
//              Mistral-Small-3.2-24B-Instruct-2506 and unsloth's Devstral-Small-2507.
//   Each case names the C family that renders it ("render").  The tool families
//   also render conversations with tools, assistant tool calls (arguments as
//   objects, as servers hand them to templates) and tool results.
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
  families.push({ name, render: name, source: `shared/models/tokenizers/${dir}/tokenizer_config.json`, template: cfg.chat_template,
                  bos: cfg.bos_token || "", eos: cfg.eos_token || "" });
}
for (const [name, bos, eos, render, tools] of [["llama2", "<s>", "</s>"], ["mistral", "<s>", "</s>"],
                                ["chatml", "", "<|im_end|>"], ["zephyr", "<s>", "</s>"],
                                ["qwen2", "", "<|im_end|>"],
                                ["llama3.1", "<|begin_of_text|>", "<|eot_id|>", "llama3.1", true],
                                ["llama3.2", "<|begin_of_text|>", "<|eot_id|>", "llama3.2", true],
                                ["llama3.3", "<|begin_of_text|>", "<|eot_id|>", "llama3.1", true],
                                ["qwen2.5", "", "<|im_end|>", "qwen2.5", true],
                                ["qwen3-tools", "", "<|im_end|>", "qwen3", true],
                                ["mistral-nemo", "<s>", "</s>", "mistral-nemo", true],
                                ["mistral-small-3.2", "<s>", "</s>", "mistral-small-3.2", true],
                                ["devstral", "<s>", "</s>", "devstral", true]]) {
  const file = name === "qwen3-tools" ? "qwen3" : name;
  families.push({ name, render: render || name, tools: !!tools, source: `tests/node/templates/${file}.jinja`,
                  template: fs.readFileSync(path.join(here, "templates", file + ".jinja"), "utf8"), bos, eos });
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

// tools and tool calls
const weather = { type: "function", function: { name: "get_weather", description: "Get the \"current\" weather",
  parameters: { type: "object", properties: { city: { type: "string", description: "City name" },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["city"], additionalProperties: false } } };
const search = { type: "function", function: { name: "search_web", description: "Search the web ✓",
  parameters: { type: "object", properties: { query: { type: "string" }, top_k: { type: "integer", minimum: 1, maximum: 10 },
    weights: { type: "array", items: { type: "number" } } }, required: ["query"] }, return: { type: "string" } } };
const noparams = { type: "function", function: { name: "now", description: "Time now" } };
const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: args } });
const AC = (c, calls) => ({ role: "assistant", content: c, tool_calls: calls });
const T = (id, c) => ({ role: "tool", tool_call_id: id, content: c });
const toolConversations = [
  [[weather, search], [U("What is the weather in Paris?")]],
  [[weather], [S("You are a bot."), U("Weather in Paris?"), AC("", [call("call00001", "get_weather", { city: "Paris", unit: "celsius" })]),
               T("call00001", "{\"temp\": 21, \"sky\": \"clear\"}")]],
  [[weather, search], [U("Paris and Rome?"), AC("Let me look.", [call("call00001", "get_weather", { city: "Paris" }),
                                                               call("call00002", "get_weather", { city: "Rome" })]),
                       T("call00001", "21"), T("call00002", "18"), A("21 in Paris, 18 in Rome."), U("thanks")]],
  [[search, noparams], [U("find it"), AC("", [call("abcDEF123", "search_web", { query: "ünï \"q\"\n", top_k: 3,
      weights: [1.5, 1e21, -0.00001, 0, 2.5e-7, 123456789012], extra: { a: [true, false, null], b: {} , c: [] } })]),
    T("abcDEF123", "résultat \"ok\"\nline2\ttab"), A("done")]],
  [null, [U("Weather?"), AC("", [call("call00001", "get_weather", { city: "Oslo" })]), T("call00001", "cold"), U("and now?")]],
  [[weather], [U("q"), AC("<think>\nI should call\n</think>\n\n", [call("call00003", "get_weather", { city: "Lima" })]),
               T("call00003", "warm")]],
  [[weather], [S("sys")]],
  [[weather], [U("bad id"), AC("", [call("x", "get_weather", { city: "Oslo" })])]],
];

// Llama 3.2's template prints today's date through strftime_now, which the
// engine defines (and a context cannot replace) from `new Date()`. The oracle is
// rendered on a fixed day, so that the committed file is reproducible on any
// day: the engine's clock is pinned to RENDER_DAY (noon UTC, the same calendar
// day in every time zone within 12 hours). The cases record that date, and the
// C test renders with it.
const RENDER_DAY = Date.UTC(2026, 10, 25, 12, 0, 0);
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) { if (args.length === 0) super(RENDER_DAY); else super(...args); }
  static now() { return RENDER_DAY; }
};
const today = new Template('{{ strftime_now("%d %b %Y") }}').render({});
const todayIso = new Template('{{ strftime_now("%Y-%m-%d") }}').render({});

const cases = [];
for (const f of families) {
  const tmpl = new Template(f.template);
  const runs = conversations.map((m) => [null, m]);
  if (f.tools) runs.push(...toolConversations);
  for (const [tools, messages] of runs) {
    for (const add_generation_prompt of [true, false]) {
      const c = { family: f.name, render: f.render, source: f.source, bos: f.bos, eos: f.eos, add_generation_prompt, messages };
      if (tools) c.tools = tools;
      if (f.template.includes("strftime_now")) c.date = f.template.includes('strftime_now("%Y-%m-%d")') ? todayIso : today;
      try {
        const ctx = { messages, bos_token: f.bos, eos_token: f.eos, add_generation_prompt };
        if (tools) ctx.tools = tools;
        c.expected = tmpl.render(ctx);
      } catch (e) {
        c.error = String(e.message || e);
      }
      cases.push(c);
    }
  }
}
fs.writeFileSync(out, JSON.stringify(cases, null, 1) + "\n");
console.log(`wrote ${cases.length} cases to ${out}`);
