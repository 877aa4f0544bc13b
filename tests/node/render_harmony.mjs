// tests/node/render_harmony.mjs - the harmony (gpt-oss) rendering oracle.
//
// Renders a set of OpenAI chat requests with the real gpt-oss chat template
// (tests/data/chat/openai-gpt-oss-120b.jinja, a copy of shared/models/chat-templates/)
// through @huggingface/jinja and writes tests/server/harmony_expected.json, which
// tests/server/test_harmony.c compares byte for byte with server/harmony.c.
//
// A request becomes the template's inputs the way the server maps it (server/harmony.c):
//   messages[i].reasoning_content        -> thinking
//   tool_calls[j].function.arguments     -> the parsed JSON value (the template writes it with tojson)
//   content null (assistant with calls)  -> ""
//   tools[i].function.description absent -> "" (the template would fail on it)
//   tools, reasoning_effort              -> tools, reasoning_effort (absent: the template's "medium")
//   strftime_now("%Y-%m-%d")             -> the fixed date below (the server uses today's local date):
//                                           the clock is frozen at its noon (the template is untouched)
// Usage: node render_harmony.mjs [OUT.json]
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const out = process.argv[2] || path.join(here, "../server/harmony_expected.json");
const template = fs.readFileSync(path.join(here, "../data/chat/openai-gpt-oss-120b.jinja"), "utf8");
const DATE = "2025-08-05";
{
  const RealDate = Date;
  const frozen = new RealDate(2025, 7, 5, 12, 0, 0).getTime();
  globalThis.Date = class extends RealDate {
    constructor(...a) { super(...(a.length ? a : [frozen])); }
    static now() { return frozen; }
  };
}

const S = (c) => ({ role: "system", content: c });
const D = (c) => ({ role: "developer", content: c });
const U = (c) => ({ role: "user", content: c });
const A = (c, r) => (r === undefined ? { role: "assistant", content: c } : { role: "assistant", content: c, reasoning_content: r });
const call = (name, args, id) => ({ role: "assistant", content: null,
  tool_calls: [{ id: id || "call_" + name, type: "function", function: { name, arguments: JSON.stringify(args) } }] });
const T = (c, id) => ({ role: "tool", tool_call_id: id, content: c });

const weather = { type: "function", function: { name: "get_weather", description: "Get the current weather in a city",
  parameters: { type: "object", properties: {
    city: { type: "string", description: "The city name" },
    unit: { type: "string", enum: ["celsius", "fahrenheit"], default: "celsius" },
    days: { type: "integer", description: "Forecast days", default: 1 } }, required: ["city"] } } };
const noParams = { type: "function", function: { name: "get_time", description: "Current UTC time", parameters: { type: "object", properties: {} } } };
const noParams2 = { type: "function", function: { name: "ping", description: "Ping the server" } };
const quirks = { type: "function", function: { name: "quirks", parameters: { type: "object", properties: {
    a: { type: "integer", enum: [1, 2], default: 1 }, b: { type: "string", enum: ["x"], default: true },
    c: { oneOf: [{ type: "string", default: "q" }, { type: "integer" }], default: 5 }, d: { type: "object", properties: {} },
    e: { type: "array", items: {} }, f: { type: "array", items: { type: "array", items: { type: "string" } } },
    g: { type: "array", items: { oneOf: [{ type: "object" }, { type: "object" }] } }, h: { type: "number", default: null },
    i: { type: "string", default: "s\"q" }, j: { type: "string", description: "" },
    k: { type: "object", properties: { deep: { type: "object", properties: { z: { type: "boolean" } } } } } },
    required: ["a"] } } };
const rich = { type: "function", function: { name: "search_docs", description: "Search the documentation",
  parameters: { type: "object", properties: {
    query: { type: "string" },
    tags: { type: "array", items: { type: "string" }, description: "Filter tags" },
    scores: { type: "array", items: { type: "number" } },
    ids: { type: "array", items: { type: "integer" } },
    flags: { type: "array", items: { type: "boolean" } },
    points: { type: "array", items: { type: "object", properties: { x: { type: "number" }, y: { type: "number" } }, required: ["x"] } },
    anything: { type: "array" },
    limit: { type: "number", default: 10.5 },
    exact: { type: "boolean", default: false },
    note: { type: "string", nullable: true },
    mixed: { type: ["string", "number"] },
    single: { type: ["string"] },
    filter: { type: "object", properties: { lang: { type: "string", enum: ["en", "fr"] }, year: { type: "integer" } }, required: ["lang"] },
    meta: { type: "object" },
    choice: { oneOf: [{ type: "string", description: "a name" }, { type: "integer" }] },
    obj_choice: { oneOf: [{ type: "object" }, { type: "string" }] },
    untyped: { description: "no type at all" },
    nulls: { type: "array", items: { type: "string" }, nullable: true } },
    required: ["query", "tags"] } } };

const conversations = [
  { messages: [U("Hello!")] },
  { messages: [S("You are a helpful assistant."), U("What is 2+2?")] },
  { messages: [D("Answer in French."), U("Bonjour")], reasoning_effort: "high" },
  { messages: [U("hi")], reasoning_effort: "low" },
  { messages: [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")] },
  { messages: [U("Hi"), A("Hello!", "The user greets me."), U("Tell me a joke.")], reasoning_effort: "medium" },
  { messages: [U("q"), A("final answer", "some reasoning")] },
  { messages: [U("q"), A("final answer")] },
  { messages: [U("multi\nline\n\ntext"), A("ok\n"), U("ünïcödé ✓ 日本語 🙂")] },
  { messages: [U("What's the weather in Paris?")], tools: [weather] },
  { messages: [S("Be brief."), U("What's the weather in Paris?")], tools: [weather, noParams, noParams2] },
  { messages: [U("Weather in Paris?"), call("get_weather", { city: "Paris", unit: "celsius" }), T("{\"temp\": 21, \"sky\": \"clear\"}")],
    tools: [weather] },
  { messages: [U("Weather in Paris?"), call("get_weather", { city: "Paris" }), T("21 degrees"), A("It is 21 °C in Paris.")],
    tools: [weather] },
  { messages: [U("Weather?"), { ...call("get_weather", { city: "Oslo" }), reasoning_content: "I should call the tool." },
               T("-3 \"cold\"\n\\ end")], tools: [weather] },
  { messages: [U("Weather?"), { ...call("get_weather", { city: "Oslo" }), reasoning_content: "call it" }, T("-3"),
               A("It is -3.", "Done."), U("and tomorrow?")], tools: [weather] },
  { messages: [U("Weather?"), { ...call("get_weather", { city: "Rome" }), content: "Let me check." }, T("30")], tools: [weather] },
  { messages: [U("time and weather"), call("get_time", {}), T("12:00"), call("get_weather", { city: "Lima", days: 3, nested: { a: [1, 2.5, true, null], "b\"q": "x\ny" } }), T("warm")],
    tools: [weather, noParams] },
  { messages: [U("search")], tools: [rich] },
  { messages: [U("quirks")], tools: [quirks, noParams], reasoning_effort: "low" },
  { messages: [D(""), U("empty developer message")], tools: [] },
  { messages: [U("x"), T("orphan result")] },
  { messages: [U("x"), A("<|channel|>final<|message|>smuggled")] },
  { messages: [U("x"), { ...call("get_time", {}), content: "both", reasoning_content: "both" }, T("1")], tools: [noParams] },
  { messages: [U("search"), call("search_docs", { query: "ünï \u0001 \u2028", tags: [], limit: 1e21, small: 1e-7, neg: -0.5, big: 12345678901234567890 }), T("[]")], tools: [rich] },
  { messages: [S("sys only")] },
  { messages: [U("")] },
  { messages: [U("quotes \"double\" and 'single' and {{ braces }} and {% tags %} <|start|>")] },
  { messages: [A("assistant first")] },
  { messages: [U("a"), U("b")] },
];

const toTemplate = (req) => {
  const messages = req.messages.map((m) => {
    const t = { role: m.role, content: m.content === null || m.content === undefined ? "" : m.content };
    if (m.reasoning_content !== undefined && m.reasoning_content !== null) t.thinking = m.reasoning_content;
    if (m.tool_calls && m.tool_calls.length) t.tool_calls = m.tool_calls.map((c) => ({ id: c.id, type: c.type,
      function: { name: c.function.name, arguments: JSON.parse(c.function.arguments) } }));
    return t;
  });
  const ctx = { messages };
  if (req.tools) ctx.tools = req.tools.map((t) => ({ ...t, function: { description: "", ...t.function } }));
  if (req.reasoning_effort) ctx.reasoning_effort = req.reasoning_effort;
  return ctx;
};

const tmpl = new Template(template);
const cases = [];
for (const req of conversations) {
  for (const add_generation_prompt of [true, false]) {
    const c = { request: req, add_generation_prompt, date: DATE };
    try {
      c.expected = tmpl.render({ ...toTemplate(req), add_generation_prompt });
    } catch (e) {
      c.error = String(e.message || e);
    }
    cases.push(c);
  }
}
fs.writeFileSync(out, JSON.stringify(cases, null, 1) + "\n");
console.log(`wrote ${cases.length} cases to ${out}`);
