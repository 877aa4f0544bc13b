// tests/node/harmony_e2e.mjs - a gpt-oss-format server end to end (run by run_harmony.sh).
//
// The server runs a random-weight model whose vocabulary is o200k with the harmony
// special tokens and whose chat template is the real gpt-oss one.  Checked:
//   prompt   usage.prompt_tokens of conversations (developer instructions, tools,
//            reasoning_effort, tool calls and results, reasoning in the history) equals
//            the number of tiktoken o200k ids of the real template's rendering by
//            @huggingface/jinja (today's date, as the server renders it)
//   replies  with logit_bias steering the random model towards the harmony tokens and a
//            few words, over several seeds: the streamed deltas (reasoning_content, content,
//            tool_calls announced once then their arguments) add up to the non-streamed
//            message of the same seed, finish_reason agrees, and the stream ends with [DONE];
//            a call's arguments are generated under the tool's schema (they parse and validate)
//   forced   tool_choice "required" and a named function (two tools, streamed and not, several
//            seeds): usage.prompt_tokens is the template's rendering plus
//            "<|channel|>commentary to=functions." by tiktoken; one call of a listed function
//            (the named one) whose arguments validate, finish "tool_calls", streamed = not streamed
//   refusals reasoning_effort out of range, a second system message
// Usage: node harmony_e2e.mjs BASE_URL API_KEY
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const here = path.dirname(fileURLToPath(import.meta.url));
const [base, key] = process.argv.slice(2);
let tiktoken, o200k;
try {
  tiktoken = await import("tiktoken");
  o200k = createRequire(import.meta.url)("tiktoken/encoders/o200k_base.json");
} catch {
  console.log("SKIP: the tiktoken npm package is not installed");
  process.exit(77);
}
const specials = { "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
                   "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012 };
const enc = new tiktoken.Tiktoken(o200k.bpe_ranks, specials, o200k.pat_str);
const tmpl = new Template(fs.readFileSync(path.join(here, "../data/chat/openai-gpt-oss-120b.jinja"), "utf8"));
let failures = 0;
const fail = (m) => { console.log("FAIL: " + m); failures++; };

async function post(body) {
  const r = await fetch(base + "/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + key },
    body: JSON.stringify(body) });
  return { status: r.status, text: await r.text() };
}

// ------------------------------------------------------------------ prompts
const weather = { type: "function", function: { name: "get_weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer", default: 1 } }, required: ["city"] } } };
const toTemplate = (req) => ({
  messages: req.messages.map((m) => {
    const t = { role: m.role, content: m.content ?? "" };
    if (m.reasoning_content != null) t.thinking = m.reasoning_content;
    if (m.tool_calls?.length) t.tool_calls = m.tool_calls.map((c) => ({ function: { name: c.function.name, arguments: JSON.parse(c.function.arguments) } }));
    return t;
  }),
  ...(req.tools ? { tools: req.tools } : {}),
  ...(req.reasoning_effort ? { reasoning_effort: req.reasoning_effort } : {}),
  add_generation_prompt: true,
});
const prompts = [
  { messages: [{ role: "user", content: "Hello there! ünïcödé 日本語 🙂" }] },
  { messages: [{ role: "developer", content: "Answer in French." }, { role: "user", content: "What's 2+2?" }], reasoning_effort: "high" },
  { messages: [{ role: "user", content: "Weather in Paris?" },
               { role: "assistant", content: null, reasoning_content: "Call the tool.",
                 tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Paris\"}" } }] },
               { role: "tool", tool_call_id: "c1", content: "{\"temp\": 21}" }],
    tools: [weather], reasoning_effort: "low" },
  { messages: [{ role: "user", content: "hi" }, { role: "assistant", content: "Hello!", reasoning_content: "greet" },
               { role: "user", content: "and now?" }], tools: [weather], tool_choice: "auto" },
];
for (const [i, req] of prompts.entries()) {
  const want = enc.encode(tmpl.render(toTemplate(req)), "all").length;
  const r = await post({ ...req, max_tokens: 1, temperature: 0 });
  if (r.status !== 200) { fail(`prompt ${i}: status ${r.status} ${r.text}`); continue; }
  const got = JSON.parse(r.text).usage.prompt_tokens;
  if (got !== want) fail(`prompt ${i}: prompt_tokens ${got}, tiktoken of the template's rendering ${want}`);
}

// ------------------------------------------------------------------ replies
const bias = {};
for (const t of ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>"]) bias[specials[t]] = 100;
for (const t of ["<|return|>", "<|call|>"]) bias[specials[t]] = 97;
for (const w of ["analysis", "final", "commentary", " to=functions.get_weather", "assistant", " json", "{\"", "city", "\":\"",
                 "Paris", "\"}", " The", " answer", " is", " 4", "."])
  for (const id of enc.encode(w)) bias[id] = 100;

async function stream(body) {
  const r = await fetch(base + "/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + key },
    body: JSON.stringify({ ...body, stream: true }) });
  const text = await r.text();
  const out = { content: "", reasoning: "", calls: [], finish: null, done: false, roles: 0, status: r.status };
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ")) continue;
    const d = line.slice(6);
    if (d === "[DONE]") { out.done = true; continue; }
    const j = JSON.parse(d);
    const ch = j.choices?.[0];
    if (!ch) continue;
    if (ch.finish_reason) out.finish = ch.finish_reason;
    const dl = ch.delta || {};
    if (dl.role) out.roles++;
    if (dl.content) out.content += dl.content;
    if (dl.reasoning_content) out.reasoning += dl.reasoning_content;
    for (const c of dl.tool_calls || []) {
      if (c.id) {
        if (c.index !== out.calls.length) fail(`call announced with index ${c.index}, expected ${out.calls.length}`);
        out.calls.push({ id: c.id, name: c.function.name, arguments: c.function.arguments || "" });
      } else {
        const k = out.calls[c.index];
        if (!k) fail(`arguments for unannounced call ${c.index}`);
        else k.arguments += c.function.arguments;
      }
    }
  }
  return out;
}

const seen = { reasoning: 0, content: 0, calls: 0, valid_calls: 0 };
for (let seed = 1; seed <= 8; seed++) {
  const body = { messages: [{ role: "user", content: "What is 2+2? Also the weather in Paris." }], tools: [weather],
                 max_tokens: 120, temperature: 1, seed, logit_bias: bias, reasoning_effort: "medium" };
  const r = await post(body);
  if (r.status !== 200) { fail(`seed ${seed}: status ${r.status} ${r.text}`); continue; }
  const ch = JSON.parse(r.text).choices[0];
  const m = ch.message;
  const s = await stream(body);
  if (s.status !== 200 || !s.done || s.roles !== 1) fail(`seed ${seed}: stream status ${s.status} done ${s.done} roles ${s.roles}`);
  const mcontent = m.content ?? "";
  if (s.content !== mcontent) fail(`seed ${seed}: streamed content ${JSON.stringify(s.content)} != ${JSON.stringify(mcontent)}`);
  if (s.reasoning !== (m.reasoning_content ?? "")) fail(`seed ${seed}: streamed reasoning ${JSON.stringify(s.reasoning)} != ${JSON.stringify(m.reasoning_content)}`);
  const mc = (m.tool_calls || []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments }));
  const sc = s.calls.map((c) => ({ ...c, arguments: c.arguments.trim() }));
  if (JSON.stringify(sc) !== JSON.stringify(mc)) fail(`seed ${seed}: streamed calls ${JSON.stringify(sc)} != ${JSON.stringify(mc)}`);
  if (s.finish !== ch.finish_reason) fail(`seed ${seed}: finish ${s.finish} != ${ch.finish_reason}`);
  if (mc.length && ch.finish_reason !== "tool_calls" && ch.finish_reason !== "length") fail(`seed ${seed}: calls but finish ${ch.finish_reason}`);
  // a body addressed to functions.get_weather is generated under its parameters schema
  for (const c of mc) {
    if (c.name !== "get_weather") continue;
    let a = null;
    try { a = JSON.parse(c.arguments); } catch { /* below */ }
    if (!a || typeof a !== "object" || typeof a.city !== "string" || (a.days !== undefined && !Number.isInteger(a.days)))
      fail(`seed ${seed}: auto call with invalid arguments ${JSON.stringify(c)}`);
    else seen.valid_calls++;
  }
  if (m.reasoning_content) seen.reasoning++;
  if (mcontent) seen.content++;
  if (mc.length) seen.calls++;
}
console.log(`replies: ${JSON.stringify(seen)} (of 8 seeds with reasoning, content, tool calls)`);
if (seen.reasoning + seen.content + seen.calls === 0) fail("no reply had any reasoning, content or tool call");

// ----------------------------------------------------------------- forced calls
const clock = { type: "function", function: { name: "world.clock-2", description: "Time in a zone",
  parameters: { type: "object", properties: { zone: { type: "string", maxLength: 20 }, h24: { type: "boolean" } }, required: ["zone", "h24"],
                additionalProperties: false } } };
const validArgs = {
  get_weather: (a) => typeof a.city === "string" && (a.days === undefined || Number.isInteger(a.days)), // more keys allowed
  "world.clock-2": (a) => typeof a.zone === "string" && a.zone.length <= 20 && typeof a.h24 === "boolean" && Object.keys(a).length === 2,
};
let n_forced = 0;
for (const [ci, choice] of ["required", { type: "function", function: { name: "world.clock-2" } }].entries()) {
  const base_req = { messages: [{ role: "user", content: "What time is it in Tokyo?" }], tools: [weather, clock], tool_choice: choice };
  const want = enc.encode(tmpl.render(toTemplate(base_req)) + "<|channel|>commentary to=functions.", "all").length;
  for (let seed = 1; seed <= 4; seed++) {
    const body = { ...base_req, max_tokens: 80, temperature: 1, seed: seed + 10 * ci };
    const r = await post(body);
    const what = `forced ${JSON.stringify(choice)} seed ${seed}`;
    if (r.status !== 200) { fail(`${what}: status ${r.status} ${r.text}`); continue; }
    const j = JSON.parse(r.text), ch = j.choices[0], calls = ch.message.tool_calls || [];
    if (j.usage.prompt_tokens !== want) fail(`${what}: prompt_tokens ${j.usage.prompt_tokens}, want ${want}`);
    if (ch.finish_reason !== "tool_calls" || calls.length !== 1) { fail(`${what}: ${r.text}`); continue; }
    const c = calls[0];
    if (typeof choice === "object" && c.function.name !== choice.function.name) fail(`${what}: called ${c.function.name}`);
    let args = null;
    try { args = JSON.parse(c.function.arguments); } catch { /* below */ }
    if (!validArgs[c.function.name] || !args || !validArgs[c.function.name](args)) { fail(`${what}: invalid call ${JSON.stringify(c)}`); continue; }
    const s = await stream(body);
    const sc = s.calls.map((k) => [k.name, k.arguments]);
    if (!s.done || s.finish !== "tool_calls" || JSON.stringify(sc) !== JSON.stringify([[c.function.name, c.function.arguments]]))
      fail(`${what}: streamed ${JSON.stringify(s)} vs ${JSON.stringify(c)}`);
    else n_forced++;
  }
}
console.log(`forced calls: ${n_forced} of 8 valid`);

// ----------------------------------------------------------------- refusals
for (const [body, param] of [
  [{ messages: [{ role: "user", content: "x" }], reasoning_effort: "maximal" }, "reasoning_effort"],
  [{ messages: [{ role: "user", content: "x" }, { role: "system", content: "late" }] }, "messages"],
]) {
  const r = await post(body);
  const p = r.status === 400 ? JSON.parse(r.text).error?.param : null;
  if (r.status !== 400 || p !== param) fail(`${JSON.stringify(body)}: status ${r.status} param ${p}, want 400 ${param}`);
}
enc.free();
if (failures) process.exit(1);
console.log("harmony e2e: ok");
