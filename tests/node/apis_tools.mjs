// tests/node/apis_tools.mjs BASE_URL API_KEY
// Tool calls through the Anthropic Messages, OpenAI Responses and Ollama APIs, each through its
// official npm client, against a tpserve whose chat template has a tool format (Qwen3's Hermes
// <tool_call>) and that was started with `--logit-bias <tool_call id>+100` (TP_SERVE_ARGS): every
// request of every API is pushed into a call, so tool_choice "auto" (the default) makes one, under
// the tools' grammar, on a random-weight model.  The reference is chat completions on the same
// server, which the other APIs must match exactly:
//   - Messages: create -> tool_use blocks (id toolu_..., name, input == the call's arguments),
//     stop_reason tool_use; stream -> content_block_start tool_use + input_json_delta fragments that
//     concatenate to the arguments; disable_parallel_tool_use -> one call;
//   - Responses: create -> function_call items (call_id, name, arguments text == chat's);
//     stream -> response.output_item.added (function_call), response.function_call_arguments.delta
//     fragments, .done, response.output_item.done, sequence numbers in order;
//   - Ollama: chat -> message.tool_calls [{function: {name, arguments: object}}], streamed and not;
//   - tool turns in the history (tool_use / tool_result blocks, function_call /
//     function_call_output items, Ollama tool_calls + tool messages): the prompt has exactly the
//     tokens of the same conversation sent to chat completions (the template renders them alike),
//     and previous_response_id carries a function call.
// Every answer's shape is checked against the API's published types.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { Ollama } from "ollama";
import assert from "node:assert/strict";

const baseURL = process.argv[2];
const apiKey = process.argv[3] || "none";
const root = baseURL.replace(/\/v1$/, "");
const openai = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const anthropic = new Anthropic({ baseURL: root, apiKey, maxRetries: 0, timeout: 120000 });
const ollama = new Ollama({ host: root, headers: { Authorization: `Bearer ${apiKey}` } });
const model = "m";
let n = 0;
async function check(name, fn) {
  await fn();
  n++;
  console.log(`ok ${n} - ${name}`);
}

const weather = { type: "object", properties: { city: { type: "string", maxLength: 12 },
                                                 unit: { enum: ["celsius", "fahrenheit"] } },
                  required: ["city", "unit"], additionalProperties: false };
const search = { type: "object", properties: { query: { type: "string", maxLength: 16 } }, required: ["query"],
                 additionalProperties: false };
const chatTools = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city", parameters: weather } },
  { type: "function", function: { name: "search_web", description: "Search the web", parameters: search } },
];
const anthropicTools = chatTools.map((t) => ({ name: t.function.name, description: t.function.description,
                                               input_schema: t.function.parameters }));
const responsesTools = chatTools.map((t) => ({ type: "function", ...t.function }));
const question = "What is the weather in Paris?";
const MAX = 200;

async function chat(body) {
  const r = await fetch(`${baseURL}/chat/completions`, { method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model, tools: chatTools, temperature: 0, max_tokens: MAX, ...body }) });
  const j = await r.json();
  assert.equal(r.status, 200, JSON.stringify(j));
  return j;
}

// ------------------------------------------------------------ the reference
const tok = await fetch(`${root}/tokenize`, { method: "POST", headers: { "content-type": "application/json",
  authorization: `Bearer ${apiKey}` }, body: JSON.stringify({ content: "<tool_call>" }) }).then((x) => x.json());
assert.deepEqual(tok.tokens, [151657], "tests/server.cmake pushes token 151657 (<tool_call> of the Qwen3 vocabulary) " +
                 `with --logit-bias; this vocabulary has ${JSON.stringify(tok.tokens)}`);
let ref, refPar, refParFinish;
await check("reference: chat completions, auto, one call (the server's push)", async () => {
  const j = await chat({ messages: [{ role: "user", content: question }], parallel_tool_calls: false });
  assert.equal(j.choices[0].finish_reason, "tool_calls", JSON.stringify(j.choices[0]));
  const calls = j.choices[0].message.tool_calls;
  assert.equal(calls.length, 1);
  ref = { name: calls[0].function.name, args: calls[0].function.arguments, usage: j.usage, id: calls[0].id };
  assert.ok(["get_weather", "search_web"].includes(ref.name));
  JSON.parse(ref.args);
  const p = await chat({ messages: [{ role: "user", content: question }], max_tokens: 120 });
  refPar = p.choices[0].message.tool_calls || [];
  refParFinish = p.choices[0].finish_reason;
  assert.ok(refPar.length >= 2, JSON.stringify(p.choices[0]));
});

// ------------------------------------------------------------ Anthropic Messages
const mreq = { model, max_tokens: MAX, temperature: 0, tools: anthropicTools,
               tool_choice: { type: "auto", disable_parallel_tool_use: true },
               messages: [{ role: "user", content: question }] };
await check("messages.create, tool_choice auto: a tool_use block equal to chat's call", async () => {
  const m = await anthropic.messages.create(mreq);
  assert.equal(m.type, "message");
  assert.equal(m.stop_reason, "tool_use");
  assert.equal(m.stop_sequence, null);
  const uses = m.content.filter((b) => b.type === "tool_use");
  assert.equal(uses.length, 1, JSON.stringify(m.content));
  assert.match(uses[0].id, /^toolu_/);
  assert.equal(uses[0].name, ref.name);
  assert.deepEqual(uses[0].input, JSON.parse(ref.args));
  for (const b of m.content.filter((b) => b.type === "text")) assert.equal(typeof b.text, "string");
  assert.equal(m.usage.input_tokens, ref.usage.prompt_tokens);
  assert.equal(m.usage.output_tokens, ref.usage.completion_tokens);
  // no tool_choice: auto is the default with tools, and parallel calls are allowed (chat's parallel calls)
  const d = await anthropic.messages.create({ ...mreq, tool_choice: undefined, max_tokens: 120 });
  assert.equal(d.stop_reason, refParFinish === "length" ? "max_tokens" : "tool_use");
  assert.deepEqual(d.content.map((b) => [b.type, b.name, b.input]),
                   refPar.map((c) => ["tool_use", c.function.name, JSON.parse(c.function.arguments)]));
  assert.equal(new Set(d.content.map((b) => b.id)).size, d.content.length);
});

await check("messages.stream, auto: content_block_start tool_use + input_json_delta", async () => {
  const s = anthropic.messages.stream(mreq);
  const types = [];
  let partial = "", start = null, blockIndex = -1;
  for await (const ev of s) {
    types.push(ev.type);
    if (ev.type === "content_block_start" && ev.content_block.type === "tool_use") {
      start = ev.content_block;
      blockIndex = ev.index;
      assert.deepEqual(start.input, {});
    }
    if (ev.type === "content_block_delta" && ev.delta.type === "input_json_delta") {
      assert.equal(ev.index, blockIndex);
      partial += ev.delta.partial_json;
    }
  }
  const fin = await s.finalMessage();
  assert.ok(start, types.join(","));
  assert.match(start.id, /^toolu_/);
  assert.equal(start.name, ref.name);
  assert.equal(partial, ref.args);
  assert.ok(types.filter((t) => t === "content_block_delta").length >= 2, "arguments in one fragment");
  assert.equal(fin.stop_reason, "tool_use");
  const tu = fin.content.find((b) => b.type === "tool_use");
  assert.deepEqual(tu.input, JSON.parse(ref.args));
  assert.equal(types[0], "message_start");
  assert.deepEqual(types.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
});

// the same conversation with the call and its result, in chat completions' terms and in each API's
const result = "{\"temperature\": 21}";
const chatHistory = [{ role: "user", content: question },
                     { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
                       function: { name: "get_weather", arguments: "{\"city\": \"Paris\", \"unit\": \"celsius\"}" } }] },
                     { role: "tool", tool_call_id: "call_1", content: result },
                     { role: "user", content: "And tomorrow?" }];
let histTokens;
await check("tool turns in the history: the reference prompt", async () => {
  const j = await chat({ messages: chatHistory, max_tokens: 1 });
  histTokens = j.usage.prompt_tokens;
  const bare = await chat({ messages: [{ role: "user", content: question }], max_tokens: 1 });
  assert.ok(histTokens > bare.usage.prompt_tokens + 20, `${histTokens} vs ${bare.usage.prompt_tokens}`);
});

await check("messages: tool_use / tool_result blocks render as chat's tool turns (same prompt tokens)", async () => {
  const messages = [{ role: "user", content: question },
                    { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather",
                                                     input: { city: "Paris", unit: "celsius" } }] },
                    { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: result },
                                              { type: "text", text: "And tomorrow?" }] }];
  const c = await anthropic.messages.countTokens({ model, tools: anthropicTools, messages });
  assert.equal(c.input_tokens, histTokens);
  const m = await anthropic.messages.create({ ...mreq, messages });
  assert.equal(m.usage.input_tokens, histTokens);
  assert.equal(m.stop_reason, "tool_use");
  // tool_result content as text blocks, and a result for a tool_use of an earlier turn
  const blocks = structuredClone(messages);
  blocks[2].content[0].content = [{ type: "text", text: result }];
  assert.equal((await anthropic.messages.countTokens({ model, tools: anthropicTools, messages: blocks })).input_tokens,
               histTokens);
  await assert.rejects(anthropic.messages.create({ ...mreq, messages: [{ role: "user", content: [
    { type: "tool_use", id: "x", name: "get_weather", input: {} }] }] }),
    (e) => e.status === 400 && /tool_use/.test(e.error.error.message));
  await assert.rejects(anthropic.messages.create({ ...mreq, messages: [{ role: "user", content: [
    { type: "tool_result", tool_use_id: "x", content: [{ type: "image", source: {} }] }] }] }),
    (e) => e.status === 400 && /image/.test(e.error.error.message));
});

// ------------------------------------------------------------ OpenAI Responses
const rreq = { model, input: question, tools: responsesTools, max_output_tokens: MAX, temperature: 0,
               parallel_tool_calls: false };
let fc;
await check("responses.create, auto: a function_call item equal to chat's call", async () => {
  const r = await openai.responses.create(rreq);
  assert.equal(r.object, "response");
  assert.equal(r.status, "completed");
  const calls = r.output.filter((o) => o.type === "function_call");
  assert.equal(calls.length, 1, JSON.stringify(r.output));
  fc = calls[0];
  assert.match(fc.id, /^fc_/);
  assert.match(fc.call_id, /^call_/);
  assert.equal(fc.name, ref.name);
  assert.equal(fc.arguments, ref.args);
  assert.equal(fc.status, "completed");
  assert.equal(r.usage.input_tokens, ref.usage.prompt_tokens);
  assert.equal(r.usage.output_tokens, ref.usage.completion_tokens);
  assert.equal(r.tool_choice, "auto");
});

await check("responses stream, auto: output_item.added function_call, argument deltas, done", async () => {
  const stream = await openai.responses.create({ ...rreq, stream: true });
  let seq = -1, deltas = "", nDeltas = 0, added = null, argsDone = null, itemDone = null, last = null;
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, seq + 1);
    seq = ev.sequence_number;
    if (ev.type === "response.output_item.added" && ev.item.type === "function_call") {
      added = ev;
      assert.equal(ev.item.arguments, "");
      assert.equal(ev.item.status, "in_progress");
    }
    if (ev.type === "response.function_call_arguments.delta") {
      assert.equal(ev.item_id, added.item.id);
      assert.equal(ev.output_index, added.output_index);
      deltas += ev.delta;
      nDeltas++;
    }
    if (ev.type === "response.function_call_arguments.done") argsDone = ev;
    if (ev.type === "response.output_item.done" && ev.item.type === "function_call") itemDone = ev;
    last = ev;
  }
  assert.ok(added, "no function_call item announced");
  assert.equal(added.item.name, ref.name);
  assert.match(added.item.call_id, /^call_/);
  assert.ok(nDeltas >= 2, `${nDeltas} argument deltas`);
  assert.equal(deltas, ref.args);
  assert.equal(argsDone.arguments, ref.args);
  assert.equal(itemDone.item.arguments, ref.args);
  assert.equal(itemDone.item.status, "completed");
  assert.equal(last.type, "response.completed");
  const out = last.response.output.find((o) => o.type === "function_call");
  assert.equal(out.arguments, ref.args);
  assert.equal(out.call_id, added.item.call_id);
});

await check("responses: function_call / function_call_output items render as chat's tool turns", async () => {
  const input = [{ role: "user", content: question },
                 { type: "function_call", call_id: "call_1", name: "get_weather",
                   arguments: "{\"city\": \"Paris\", \"unit\": \"celsius\"}" },
                 { type: "function_call_output", call_id: "call_1", output: result },
                 { role: "user", content: "And tomorrow?" }];
  const r = await openai.responses.create({ ...rreq, input });
  assert.equal(r.usage.input_tokens, histTokens);
  const it = await fetch(`${baseURL}/responses/input_tokens`, { method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model, input, tools: responsesTools }) }).then((x) => x.json());
  assert.equal(it.input_tokens, histTokens);
  // previous_response_id carries the call: its output goes in the next request
  const first = await openai.responses.create(rreq);
  const call = first.output.find((o) => o.type === "function_call");
  const next = await openai.responses.create({ ...rreq, previous_response_id: first.id,
    input: [{ type: "function_call_output", call_id: call.call_id, output: result }] });
  assert.ok(next.usage.input_tokens > first.usage.input_tokens + 10);
  // GET /v1/responses/{id} gives the stored response; input_items its input; DELETE forgets it
  const got = await openai.responses.retrieve(first.id);
  assert.equal(got.id, first.id);
  assert.deepEqual(got.output, first.output);
  const items = await openai.responses.inputItems.list(next.id);
  assert.equal(items.data.length, 1);
  assert.equal(items.data[0].type, "function_call_output");
  assert.equal(items.data[0].call_id, call.call_id);
  const del = await fetch(`${baseURL}/responses/${first.id}`, { method: "DELETE",
    headers: { authorization: `Bearer ${apiKey}` } }).then((x) => x.json());
  assert.deepEqual(del, { id: first.id, object: "response", deleted: true });
  await assert.rejects(openai.responses.retrieve(first.id), (e) => e.status === 404);
});

// ------------------------------------------------------------ Ollama
await check("ollama chat with tools: message.tool_calls equal to chat's calls, streamed and not", async () => {
  const req = { model, messages: [{ role: "user", content: question }], tools: chatTools,
                options: { temperature: 0, num_predict: 120 } };
  const r = await ollama.chat({ ...req, stream: false });
  assert.equal(r.message.role, "assistant");
  assert.equal(r.done, true);
  const calls = r.message.tool_calls || [];
  assert.equal(calls.length, refPar.length, JSON.stringify(r.message));
  calls.forEach((c, i) => {
    assert.equal(c.function.name, refPar[i].function.name);
    assert.deepEqual(c.function.arguments, JSON.parse(refPar[i].function.arguments));
  });
  const s = await ollama.chat({ ...req, stream: true });
  const streamed = [];
  let last = null;
  for await (const p of s) {
    for (const c of p.message.tool_calls || []) streamed.push(c);
    last = p;
  }
  assert.equal(last.done, true);
  assert.deepEqual(streamed.map((c) => [c.function.name, c.function.arguments]),
                   calls.map((c) => [c.function.name, c.function.arguments]));
});

await check("ollama: tool_calls and tool messages in the history render as chat's tool turns", async () => {
  const messages = [{ role: "user", content: question },
                    { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather",
                                                                      arguments: { city: "Paris", unit: "celsius" } } }] },
                    { role: "tool", content: result, tool_name: "get_weather" },
                    { role: "user", content: "And tomorrow?" }];
  const r = await ollama.chat({ model, messages, tools: chatTools, stream: false, options: { num_predict: 1 } });
  // chat's reference has content null for the assistant turn; Ollama's "" renders the same in this template
  assert.equal(r.prompt_eval_count, histTokens);
});

console.log(`1..${n}`);
