// tests/node/apis.mjs - the other APIs local-model clients speak, each through its
// official npm client, against a running tpserve (base URL ".../v1" in argv[2], API key
// in argv[3]):
//   @anthropic-ai/sdk  messages.create (streamed and not, a forced tool, a stop sequence),
//                      messages.countTokens, errors in Anthropic's shape (bad body, bad key)
//   openai             responses.create (streamed and not, a forced function tool, a JSON
//                      schema, previous_response_id and its eviction), errors
//   ollama             list, show, ps, version, chat (streamed and not), generate, errors
// Every answer is checked against the API's published shape (the field types the
// clients' TypeScript declarations give), and one greedy request gives the same text and
// token counts through chat completions, Messages, Responses and Ollama chat.
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
const model = "stories260K";
const prompt = "Once upon a time";
const N = 20;
let n = 0;
async function check(name, fn) {
  await fn();
  n++;
  console.log(`ok ${n} - ${name}`);
}
const isInt = (v) => Number.isInteger(v) && v >= 0;
// The forced tool: an enum keeps stories260K's call short and checkable.
const citySchema = { type: "object", properties: { city: { type: "string", enum: ["Paris", "Rome", "Oslo"] } },
                     required: ["city"], additionalProperties: false };

// ------------------------------------------------------------ the reference: chat completions
let ref;
await check("reference: chat completions, greedy", async () => {
  const r = await openai.chat.completions.create({ model, messages: [{ role: "user", content: prompt }],
                                                   max_tokens: N, temperature: 0 });
  ref = { text: r.choices[0].message.content, prompt_tokens: r.usage.prompt_tokens,
          completion_tokens: r.usage.completion_tokens };
  assert.equal(ref.completion_tokens, N);
  assert.ok(ref.text.length > 10);
});

await check("un-prefixed aliases answer like /v1/", async () => {
  const alias = new OpenAI({ baseURL: root, apiKey, maxRetries: 0 });
  const r = await alias.chat.completions.create({ model, messages: [{ role: "user", content: prompt }],
                                                  max_tokens: N, temperature: 0 });
  assert.equal(r.choices[0].message.content, ref.text);
  assert.ok((await alias.models.list()).data.length === 1);
});

// ------------------------------------------------------------ Anthropic Messages
await check("messages.create: a Message, same text and counts as chat completions", async () => {
  const m = await anthropic.messages.create({ model, max_tokens: N, temperature: 0,
                                              messages: [{ role: "user", content: prompt }] });
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, model);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, "text");
  assert.equal(m.content[0].text, ref.text);
  assert.equal(m.stop_reason, "max_tokens");
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.input_tokens, ref.prompt_tokens);
  assert.equal(m.usage.output_tokens, ref.completion_tokens);
});

await check("messages.create: system blocks and content blocks render like a string", async () => {
  const a = await anthropic.messages.create({ model, max_tokens: 8, temperature: 0, system: "Be brief.",
                                              messages: [{ role: "user", content: prompt }] });
  const b = await anthropic.messages.create({ model, max_tokens: 8, temperature: 0,
                                              system: [{ type: "text", text: "Be brief." }],
                                              messages: [{ role: "user", content: [{ type: "text", text: prompt }] }] });
  assert.equal(a.content[0].text, b.content[0].text);
  assert.equal(a.usage.input_tokens, b.usage.input_tokens);
  assert.ok(a.usage.input_tokens > ref.prompt_tokens);
});

await check("messages.create: stop_sequences -> stop_reason stop_sequence", async () => {
  const word = ref.text.trim().split(/\s+/)[2];
  const m = await anthropic.messages.create({ model, max_tokens: N, temperature: 0, stop_sequences: [word],
                                              messages: [{ role: "user", content: prompt }] });
  assert.equal(m.stop_reason, "stop_sequence");
  assert.equal(m.stop_sequence, word);
  assert.equal(m.content[0].text, ref.text.slice(0, ref.text.indexOf(word)));
});

await check("messages.stream: Anthropic's event order, text and usage", async () => {
  const stream = anthropic.messages.stream({ model, max_tokens: N, temperature: 0,
                                             messages: [{ role: "user", content: prompt }] });
  const types = [];
  let text = "";
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "content_block_delta") {
      assert.equal(ev.delta.type, "text_delta");
      text += ev.delta.text;
    }
  }
  const fin = await stream.finalMessage();
  assert.equal(text, ref.text);
  assert.equal(fin.content[0].text, ref.text);
  assert.equal(fin.stop_reason, "max_tokens");
  assert.equal(fin.usage.output_tokens, N);
  assert.equal(types[0], "message_start");
  assert.equal(types[1], "content_block_start");
  assert.deepEqual(types.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
  assert.ok(types.filter((t) => t === "content_block_delta").length >= 1);
});

await check("messages.create + stream: a forced tool -> tool_use with input under its schema", async () => {
  const req = { model, max_tokens: 64, temperature: 0, messages: [{ role: "user", content: "Where?" }],
                tools: [{ name: "get_weather", description: "weather", input_schema: citySchema }],
                tool_choice: { type: "tool", name: "get_weather" } };
  const m = await anthropic.messages.create(req);
  assert.equal(m.stop_reason, "tool_use");
  assert.equal(m.content.length, 1);
  const tu = m.content[0];
  assert.equal(tu.type, "tool_use");
  assert.match(tu.id, /^toolu_/);
  assert.equal(tu.name, "get_weather");
  assert.ok(citySchema.properties.city.enum.includes(tu.input.city), JSON.stringify(tu.input));
  assert.deepEqual(Object.keys(tu.input), ["city"]);
  const s = anthropic.messages.stream(req);
  let partial = "";
  for await (const ev of s) if (ev.type === "content_block_delta" && ev.delta.type === "input_json_delta")
    partial += ev.delta.partial_json;
  const fin = await s.finalMessage();
  assert.equal(fin.stop_reason, "tool_use");
  assert.deepEqual(fin.content[0].input, tu.input);
  assert.deepEqual(JSON.parse(partial), tu.input);
  const any = await anthropic.messages.create({ ...req, tool_choice: { type: "any" } });
  assert.equal(any.content[0].type, "tool_use");
});

await check("messages.countTokens == usage.input_tokens", async () => {
  const c = await anthropic.messages.countTokens({ model, system: "Be brief.",
                                                   messages: [{ role: "user", content: prompt }] });
  const m = await anthropic.messages.create({ model, max_tokens: 1, system: "Be brief.",
                                              messages: [{ role: "user", content: prompt }] });
  assert.ok(isInt(c.input_tokens) && c.input_tokens > 0);
  assert.equal(c.input_tokens, m.usage.input_tokens);
});

await check("messages errors: Anthropic's shape and status", async () => {
  const bad = [
    [{ model, messages: [{ role: "user", content: prompt }] }, /max_tokens/],                 // max_tokens absent
    [{ model, max_tokens: 5 }, /messages/],                                                     // messages absent
    [{ model, max_tokens: 5, messages: [{ role: "robot", content: "x" }] }, /role/],            // bad role
    [{ model, max_tokens: "5", messages: [{ role: "user", content: "x" }] }, /max_tokens/],    // wrong type
    [{ model, max_tokens: 5, temperature: 3, messages: [{ role: "user", content: "x" }] }, /temperature/],
    [{ model, max_tokens: 5, messages: [{ role: "user", content: "x" }], bogus: 1 }, /bogus/],
    [{ model, max_tokens: 5, messages: [{ role: "user", content: "x" }],                       // unknown tool
       tools: [{ name: "a", input_schema: citySchema }], tool_choice: { type: "tool", name: "nope" } }, /nope/],
  ];
  for (const [body, re] of bad) {
    await assert.rejects(anthropic.messages.create(body), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError, `${e}`);
      assert.equal(e.status, 400);
      assert.equal(e.error.type, "error");
      assert.equal(e.error.error.type, "invalid_request_error");
      assert.match(e.error.error.message, re);
      return true;
    });
  }
  const wrongKey = new Anthropic({ baseURL: root, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create({ model, max_tokens: 1, messages: [{ role: "user", content: "x" }] }),
                       (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 &&
                              e.error.error.type === "authentication_error");
});

// ------------------------------------------------------------ OpenAI Responses
function checkResponse(r) {
  assert.equal(r.object, "response");
  assert.match(r.id, /^resp_/);
  assert.ok(isInt(r.created_at));
  assert.ok(["completed", "incomplete"].includes(r.status));
  assert.ok(Array.isArray(r.output) && r.output.length === 1);
  assert.ok(isInt(r.usage.input_tokens) && isInt(r.usage.output_tokens));
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.ok(isInt(r.usage.input_tokens_details.cached_tokens));
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
}

await check("responses.create: same text and counts as chat completions", async () => {
  const r = await openai.responses.create({ model, input: prompt, max_output_tokens: N, temperature: 0 });
  checkResponse(r);
  assert.equal(r.status, "incomplete");
  assert.equal(r.incomplete_details.reason, "max_output_tokens");
  const item = r.output[0];
  assert.equal(item.type, "message");
  assert.equal(item.role, "assistant");
  assert.equal(item.content[0].type, "output_text");
  assert.equal(item.content[0].text, ref.text);
  assert.equal(r.output_text, ref.text);
  assert.equal(r.usage.input_tokens, ref.prompt_tokens);
  assert.equal(r.usage.output_tokens, ref.completion_tokens);
  const items = await openai.responses.create({ model, max_output_tokens: N, temperature: 0,
    input: [{ role: "user", content: [{ type: "input_text", text: prompt }] }] });
  assert.equal(items.output_text, ref.text);
});

await check("responses.create stream: typed events in order, sequence numbers, text", async () => {
  const stream = await openai.responses.create({ model, input: prompt, max_output_tokens: N, temperature: 0,
                                                 stream: true });
  const types = [];
  let text = "", seq = -1, done = null, last = null;
  for await (const ev of stream) {
    types.push(ev.type);
    assert.equal(ev.sequence_number, seq + 1);
    seq = ev.sequence_number;
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.output_text.done") done = ev.text;
    last = ev;
  }
  assert.deepEqual(types.slice(0, 4), ["response.created", "response.in_progress", "response.output_item.added",
                                       "response.content_part.added"]);
  assert.deepEqual(types.slice(-4), ["response.output_text.done", "response.content_part.done",
                                     "response.output_item.done", "response.incomplete"]);
  assert.equal(text, ref.text);
  assert.equal(done, ref.text);
  checkResponse(last.response);
  assert.equal(last.response.output[0].content[0].text, ref.text);
  assert.equal(last.response.usage.output_tokens, N);
});

await check("responses.create: instructions, a forced function tool (streamed and not)", async () => {
  const tools = [{ type: "function", name: "get_weather", description: "weather", parameters: citySchema,
                   strict: true }, { type: "web_search_preview" }];
  const req = { model, input: "Where?", instructions: "Call the tool.", max_output_tokens: 64, temperature: 0,
                tools, tool_choice: { type: "function", name: "get_weather" } };
  const r = await openai.responses.create(req);
  checkResponse(r);
  assert.equal(r.status, "completed");
  const fc = r.output[0];
  assert.equal(fc.type, "function_call");
  assert.equal(fc.name, "get_weather");
  assert.match(fc.call_id, /^call_/);
  const args = JSON.parse(fc.arguments);
  assert.ok(citySchema.properties.city.enum.includes(args.city));
  assert.equal(r.instructions, "Call the tool.");
  const stream = await openai.responses.create({ ...req, stream: true });
  let argsDone = null, deltas = "";
  for await (const ev of stream) {
    if (ev.type === "response.function_call_arguments.delta") deltas += ev.delta;
    if (ev.type === "response.function_call_arguments.done") argsDone = ev.arguments;
  }
  assert.equal(argsDone, fc.arguments);
  assert.equal(deltas, fc.arguments);
});

await check("responses.create: text.format json_schema gives a value of the schema", async () => {
  const r = await openai.responses.create({ model, input: prompt, max_output_tokens: 64, temperature: 0,
    text: { format: { type: "json_schema", name: "city", schema: citySchema, strict: true } } });
  assert.equal(r.status, "completed");
  const v = JSON.parse(r.output_text);
  assert.ok(citySchema.properties.city.enum.includes(v.city));
  assert.equal(r.text.format.type, "json_schema");
});

await check("responses: previous_response_id continues the conversation; eviction and unknown ids", async () => {
  const a = await openai.responses.create({ model, input: prompt, max_output_tokens: 6, temperature: 0 });
  const b = await openai.responses.create({ model, input: "And then", max_output_tokens: 6, temperature: 0,
                                            previous_response_id: a.id });
  const alone = await openai.responses.create({ model, input: "And then", max_output_tokens: 6, temperature: 0 });
  assert.equal(b.previous_response_id, a.id);
  // the second prompt holds the first turn, its reply and the new turn
  assert.ok(b.usage.input_tokens >= alone.usage.input_tokens + a.usage.input_tokens - 2,
            `${b.usage.input_tokens} vs ${alone.usage.input_tokens} + ${a.usage.input_tokens}`);
  const same = await fetch(`${baseURL}/responses/input_tokens`, { method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model, input: "And then", previous_response_id: a.id }) }).then((x) => x.json());
  assert.equal(same.object, "response.input_tokens");
  assert.equal(same.input_tokens, b.usage.input_tokens);
  const unstored = await openai.responses.create({ model, input: "x", max_output_tokens: 1, store: false });
  for (const id of [unstored.id, "resp_unknown"]) {
    await assert.rejects(openai.responses.create({ model, input: "x", max_output_tokens: 1, previous_response_id: id }),
                         (e) => e instanceof OpenAI.BadRequestError && e.param === "previous_response_id" &&
                                e.code === "previous_response_not_found");
  }
  const cap = Number(process.env.TP_RESPONSES_STORE || 256);
  for (let i = 0; i < cap; i++) await openai.responses.create({ model, input: "x", max_output_tokens: 1 });
  await assert.rejects(openai.responses.create({ model, input: "x", max_output_tokens: 1, previous_response_id: a.id }),
                       (e) => e instanceof OpenAI.BadRequestError && /evicted/.test(e.message) &&
                              e.code === "previous_response_not_found");
});

await check("responses errors: OpenAI's shape, the field named", async () => {
  const bad = [
    [{ model, max_output_tokens: 5 }, "input"],
    [{ model, input: 5 }, "input"],
    [{ model, input: "x", temperature: 9 }, "temperature"],
    [{ model, input: "x", bogus: true }, "bogus"],
    [{ model, input: "x", tools: [{ type: "function", name: "f", parameters: citySchema }],
       tool_choice: { type: "function", name: "nope" } }, "tool_choice"],
    [{ model, input: "x", text: { format: { type: "json_schema", name: "n", schema: { type: "object", minProperties: 1 } } } },
     "text.format.schema"],
    [{ model, input: "x", reasoning: { summary: "verbose" } }, "reasoning"],
    [{ model, input: "x", reasoning: { effort: "high" } }, "reasoning.effort"],
    [{ model, input: "x", client_metadata: "codex" }, "client_metadata"],
  ];
  for (const [body, param] of bad) {
    await assert.rejects(openai.responses.create(body), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${e}`);
      assert.equal(e.status, 400);
      assert.equal(e.type, "invalid_request_error");
      assert.equal(e.param, param);
      return true;
    });
  }
});

// ------------------------------------------------------------ Ollama
await check("ollama list / ps / show / version", async () => {
  const l = await ollama.list();
  assert.equal(l.models.length, 1);
  const m = l.models[0];
  assert.equal(typeof m.name, "string");
  assert.match(m.digest, /^[0-9a-f]{64}$/);
  assert.ok(m.size > 0);
  assert.equal(m.details.format, "gguf");
  assert.equal(typeof m.details.parameter_size, "string");
  const ps = await ollama.ps();
  assert.equal(ps.models[0].name, m.name);
  const sh = await ollama.show({ model: m.name });
  assert.equal(typeof sh.model_info["general.architecture"], "string");
  assert.ok(sh.capabilities.includes("completion"));
  await assert.rejects(ollama.show({ model: "no-such-model" }), (e) => e.status_code === 404 && /not found/.test(e.error));
  const noKey = new Ollama({ host: root });
  await assert.rejects(noKey.list(), (e) => e.status_code === 401 && /API key/.test(e.error));
  const v = await fetch(`${root}/api/version`, { headers: { authorization: `Bearer ${apiKey}` } }).then((x) => x.json());
  assert.match(v.version, /^\d+\.\d+\.\d+$/);
});

await check("ollama chat: same text and counts as chat completions, streamed and not", async () => {
  const req = { model, messages: [{ role: "user", content: prompt }], options: { temperature: 0, num_predict: N } };
  const r = await ollama.chat({ ...req, stream: false });
  assert.equal(r.message.role, "assistant");
  assert.equal(r.message.content, ref.text);
  assert.equal(r.done, true);
  assert.equal(r.done_reason, "length");
  assert.equal(r.prompt_eval_count, ref.prompt_tokens);
  assert.equal(r.eval_count, ref.completion_tokens);
  for (const k of ["total_duration", "prompt_eval_duration", "eval_duration", "load_duration"]) assert.ok(isInt(r[k]), k);
  assert.ok(!Number.isNaN(Date.parse(r.created_at)));
  const s = await ollama.chat({ ...req, stream: true });
  let text = "", last = null, parts = 0;
  for await (const p of s) {
    text += p.message.content;
    last = p;
    parts++;
  }
  assert.equal(text, ref.text);
  assert.equal(last.done, true);
  assert.equal(last.eval_count, N);
  assert.ok(parts >= 2);
});

await check("ollama generate: raw and templated, format json", async () => {
  const raw = await ollama.generate({ model, prompt, raw: true, stream: false, options: { temperature: 0, num_predict: 12 } });
  const cmpl = await openai.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
  assert.equal(raw.response, cmpl.choices[0].text);
  assert.equal(raw.eval_count, cmpl.usage.completion_tokens);
  assert.equal(raw.context.length, cmpl.usage.prompt_tokens + cmpl.usage.completion_tokens);
  const t = await ollama.generate({ model, prompt, stream: false, options: { temperature: 0, num_predict: N } });
  assert.equal(t.response, ref.text);
  const js = await ollama.generate({ model, prompt, stream: false, format: citySchema,
                                     options: { temperature: 0, num_predict: 64 } });
  assert.ok(citySchema.properties.city.enum.includes(JSON.parse(js.response).city));
});

await check("embeddings.create (base64 decoded by the client, and float) and ollama.embed agree", async () => {
  const inputs = ["Once upon a time", "a cat sat on the mat", "Once upon a time"];
  const a = await openai.embeddings.create({ model, input: inputs });            // the client asks for base64
  const b = await openai.embeddings.create({ model, input: inputs, encoding_format: "float" });
  assert.equal(a.object, "list");
  assert.equal(a.data.length, 3);
  assert.equal(a.usage.prompt_tokens, a.usage.total_tokens);
  assert.ok(a.usage.prompt_tokens > 6);
  const dot = (x, y) => x.reduce((s, v, i) => s + v * y[i], 0);
  for (let i = 0; i < 3; i++) {
    assert.equal(a.data[i].object, "embedding");
    assert.equal(a.data[i].index, i);
    const v = a.data[i].embedding, w = b.data[i].embedding;
    assert.equal(v.length, w.length);
    assert.ok(Math.abs(dot(v, v) - 1) < 1e-5);
    for (let k = 0; k < v.length; k++) assert.ok(Math.abs(v[k] - w[k]) < 1e-6);
  }
  assert.ok(dot(b.data[0].embedding, b.data[2].embedding) > 0.99999);    // same text, same vector
  assert.ok(dot(b.data[0].embedding, b.data[1].embedding) < 0.999);      // different text, different vector
  const o = await ollama.embed({ model, input: inputs });
  assert.equal(o.embeddings.length, 3);
  for (let k = 0; k < o.embeddings[1].length; k++) assert.ok(Math.abs(o.embeddings[1][k] - b.data[1].embedding[k]) < 1e-5);
  await assert.rejects(openai.embeddings.create({ model, input: "" }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === "input");
});

await check("ollama errors: {error} with the status", async () => {
  const bad = [
    [{ model, messages: [{ role: "user", content: "x" }], options: { num_ctx: 1 << 24 } }, /num_ctx/],
    [{ model, messages: [{ role: "user", content: "x" }], options: { mirostat: 2 } }, /mirostat/],
    [{ model, messages: [{ role: "user", content: "x" }], options: { temperature: "hot" } }, /temperature/],
    [{ model, messages: [{ role: "wizard", content: "x" }] }, /role/],
    [{ messages: [{ role: "user", content: "x" }] }, /model/],
  ];
  for (const [body, re] of bad) {
    await assert.rejects(ollama.chat({ ...body, stream: false }), (e) => {
      assert.equal(e.name, "ResponseError", `${e}`);
      assert.equal(e.status_code, 400);
      assert.match(e.error, re);
      return true;
    });
  }
});

console.log(`1..${n}`);
