// tests/node/tools.mjs BASE_URL API_KEY
// tool_choice "auto" against a live tpserve whose chat template has a tool
// format; TP_TOOLS_MARKER is a token that starts a call in that format
// ("<tool_call>" for Hermes / Qwen3; "{" for Llama 3.1, whose calls are a
// reply that starts with JSON: the schemas bound every string, so the push
// on "{" cannot run away inside one); TP_TOOLS_PARALLEL=0 for formats with
// one call per reply (Llama 3.1).  A random-weight model
// rarely starts a call by itself, so most checks push it with logit_bias on
// the marker token; from there the server's grammar must make a call that
// parses into a listed function with arguments valid under its schema (ajv).
//   - non-streamed: one call, finish "tool_calls", content null; sampled seeds;
//     parallel_tool_calls true: several calls, distinct ids;
//   - streamed (raw SSE): the call's first delta has index, id, type and name
//     with empty arguments, later deltas only argument bytes (more than one),
//     and their concatenation equals the non-streamed arguments (greedy);
//   - without the push: a plain answer (or valid calls), never an error;
//     tool_choice "none": no calls; the call sent back in the history with
//     a tool result is accepted;
//   - clients: the openai client's stream helper (its own delta assembly),
//     the Vercel AI SDK streamText with tools (toolChoice auto, streamed
//     tool-call deltas), LangChain bindTools (invoke and stream).
// Exit status 0 only when everything held.
import Ajv from "ajv";
import OpenAI from "openai";
import { streamText, tool, jsonSchema } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";

const [base, key] = process.argv.slice(2);
const marker = process.env.TP_TOOLS_MARKER || "<tool_call>";
const root = base.replace(/\/v1$/, "");
let failures = 0, passed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
  } catch (e) {
    failures++;
    console.log(`FAIL: ${name}: ${e?.stack || e}`);
  }
}
const assert = (c, msg) => {
  if (!c) throw new Error(msg);
};
const H = { "content-type": "application/json", authorization: `Bearer ${key}` };

const tok = await (await fetch(`${root}/tokenize`, { method: "POST", headers: H, body: JSON.stringify({ content: marker }) })).json();
if (tok.tokens?.length !== 1) {
  console.log(`FAIL: ${marker} is not one token of this vocabulary: ${JSON.stringify(tok)}`);
  process.exit(1);
}
const push = { [tok.tokens[0]]: 100 };

const weather = { type: "object", properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["celsius", "fahrenheit"] } },
                  required: ["city", "unit"], additionalProperties: false };
const search = { type: "object", properties: { query: { type: "string", maxLength: 16 }, top_k: { type: "integer" },
                 exact: { type: "boolean" } }, required: ["query", "top_k", "exact"], additionalProperties: false };
const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city", parameters: weather } },
  { type: "function", function: { name: "search_web", description: "Search the web", parameters: search } },
];
const ajv = new Ajv({ strict: false });
const validators = { get_weather: ajv.compile(weather), search_web: ajv.compile(search) };
const messages = [{ role: "user", content: "What is the weather in Paris?" }];

function checkCall(c, what) {
  assert(c?.type === "function" && typeof c.id === "string" && c.id.length > 0, `${what}: call ${JSON.stringify(c)}`);
  const v = validators[c.function?.name];
  assert(v, `${what}: unknown function ${c.function?.name}`);
  let args;
  try {
    args = JSON.parse(c.function.arguments);
  } catch (e) {
    throw new Error(`${what}: arguments not JSON: ${c.function.arguments}`);
  }
  assert(v(args), `${what}: invalid arguments ${c.function.arguments}: ${ajv.errorsText(v.errors)}`);
  return args;
}

async function chat(body) {
  const r = await fetch(`${base}/chat/completions`, { method: "POST", headers: H, body: JSON.stringify({ messages, tools, ...body }) });
  const j = await r.json();
  assert(r.status === 200, `HTTP ${r.status} ${JSON.stringify(j)}`);
  return j;
}

// Raw SSE: the deltas as sent, and the calls they assemble to.
async function chatStream(body) {
  const r = await fetch(`${base}/chat/completions`, { method: "POST", headers: H,
    body: JSON.stringify({ messages, tools, ...body, stream: true }) });
  assert(r.status === 200, `HTTP ${r.status}`);
  const text = await r.text();
  const deltas = [], calls = [];
  let content = "", finish = null, first = true;
  for (const ev of text.split("\n\n")) {
    if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
    const j = JSON.parse(ev.slice(6));
    assert(!j.error, `stream error ${JSON.stringify(j.error)}`);
    assert(/^fp_[0-9a-f]{10}$/.test(j.system_fingerprint), `system_fingerprint ${j.system_fingerprint}`);
    const ch = j.choices?.[0];
    if (!ch) continue;
    // the first chunk carries the role before anything else, also when the reply opens with a call
    assert(!first || ch.delta?.role === "assistant", `first chunk without role: ${JSON.stringify(ch)}`);
    first = false;
    if (ch.delta?.content) content += ch.delta.content;
    if (ch.finish_reason) finish = ch.finish_reason;
    for (const d of ch.delta?.tool_calls || []) {
      deltas.push(d);
      if (!calls[d.index]) {
        assert(d.id && d.type === "function" && d.function?.name && d.function.arguments === "",
               `first delta of call ${d.index} lacks id/type/name: ${JSON.stringify(d)}`);
        calls[d.index] = { id: d.id, type: "function", function: { name: d.function.name, arguments: "" } };
      } else {
        assert(!d.id && !d.function?.name, `later delta repeats id/name: ${JSON.stringify(d)}`);
        calls[d.index].function.arguments += d.function.arguments;
      }
    }
  }
  return { deltas, calls, content, finish };
}

// ------------------------------------------------------------ raw HTTP
let greedy;
await check("auto, pushed, greedy: one valid call", async () => {
  const j = await chat({ logit_bias: push, temperature: 0, max_tokens: 300, parallel_tool_calls: false });
  const m = j.choices[0].message;
  assert(j.choices[0].finish_reason === "tool_calls", `finish ${j.choices[0].finish_reason}`);
  assert(m.content === null, `content ${JSON.stringify(m.content)}`);
  assert(m.tool_calls?.length === 1, JSON.stringify(m.tool_calls));
  checkCall(m.tool_calls[0], "greedy");
  greedy = m.tool_calls[0];
});
await check("auto, pushed, greedy, streamed: fragments equal the non-streamed call", async () => {
  const s = await chatStream({ logit_bias: push, temperature: 0, max_tokens: 300, parallel_tool_calls: false });
  assert(s.finish === "tool_calls", `finish ${s.finish}`);
  assert(s.calls.length === 1, JSON.stringify(s.calls));
  checkCall(s.calls[0], "streamed");
  assert(s.deltas.length >= 3, `arguments arrived in ${s.deltas.length - 1} fragment(s)`);
  assert(s.calls[0].function.name === greedy.function.name && s.calls[0].function.arguments === greedy.function.arguments,
         `stream ${JSON.stringify(s.calls[0])} vs ${JSON.stringify(greedy)}`);
});
for (let seed = 1; seed <= 3; seed++) {
  await check(`auto, pushed, sampled seed ${seed}`, async () => {
    const j = await chat({ logit_bias: push, temperature: 1, seed, max_tokens: 300, parallel_tool_calls: false });
    assert(j.choices[0].finish_reason === "tool_calls", `finish ${j.choices[0].finish_reason}`);
    checkCall(j.choices[0].message.tool_calls[0], `seed ${seed}`);
  });
}
if (process.env.TP_TOOLS_PARALLEL !== "0") await check("auto, pushed, parallel calls", async () => {
  const j = await chat({ logit_bias: push, temperature: 0, max_tokens: 400 });
  const calls = j.choices[0].message.tool_calls || [];
  assert(calls.length >= 2, `${calls.length} calls: ${JSON.stringify(j.choices[0])}`);
  calls.forEach((c, i) => checkCall(c, `parallel call ${i}`));
  assert(new Set(calls.map((c) => c.id)).size === calls.length, "call ids repeat");
  const s = await chatStream({ logit_bias: push, temperature: 0, max_tokens: 400 });
  for (let i = 0; i < calls.length; i++)
    assert(s.calls[i]?.function.arguments === calls[i].function.arguments, `streamed call ${i} differs`);
});
await check("auto without a push: text or valid calls", async () => {
  for (let seed = 1; seed <= 2; seed++) {
    const j = await chat({ temperature: 1, seed, max_tokens: 24 });
    const ch = j.choices[0];
    assert(["stop", "length", "tool_calls"].includes(ch.finish_reason), ch.finish_reason);
    if (ch.message.tool_calls) ch.message.tool_calls.forEach((c) => checkCall(c, "unpushed"));
    else assert(typeof ch.message.content === "string", JSON.stringify(ch.message));
  }
});
await check("tool_choice none: no calls", async () => {
  const j = await chat({ tool_choice: "none", logit_bias: push, temperature: 0, max_tokens: 16 });
  assert(!j.choices[0].message.tool_calls && j.choices[0].finish_reason !== "tool_calls", JSON.stringify(j.choices[0]));
});
await check("the call and its result in the history", async () => {
  const hist = [...messages, { role: "assistant", content: null, tool_calls: [greedy] },
                { role: "tool", tool_call_id: greedy.id, content: "{\"temp\": 21}" }];
  const r = await fetch(`${base}/chat/completions`, { method: "POST", headers: H,
    body: JSON.stringify({ messages: hist, tools, max_tokens: 8, temperature: 0 }) });
  const j = await r.json();
  assert(r.status === 200, `HTTP ${r.status} ${JSON.stringify(j)}`);
  assert(j.usage.prompt_tokens > 100, `prompt of ${j.usage.prompt_tokens} tokens: tools and history not rendered?`);
});

// ------------------------------------------------------------ clients
const client = new OpenAI({ baseURL: base, apiKey: key });
await check("openai stream helper assembles the call", async () => {
  const stream = client.beta.chat.completions.stream({ model: "m", messages, tools, logit_bias: push, temperature: 0,
                                                       max_tokens: 300, parallel_tool_calls: false });
  let nArgs = 0;
  stream.on("tool_calls.function.arguments.delta", () => nArgs++);
  const fin = await stream.finalChatCompletion();
  const m = fin.choices[0].message;
  assert(fin.choices[0].finish_reason === "tool_calls", fin.choices[0].finish_reason);
  assert(m.tool_calls?.length === 1 && nArgs >= 2, `${nArgs} argument deltas, ${JSON.stringify(m.tool_calls)}`);
  checkCall(m.tool_calls[0], "openai stream");
  assert(m.tool_calls[0].function.arguments === greedy.function.arguments, "differs from the non-streamed call");
});

const provider = createOpenAICompatible({ name: "tpserve", baseURL: base, apiKey: key });
for (let seed = 1; seed <= 2; seed++) {
  await check(`ai streamText with tools (auto) seed ${seed}`, async () => {
    const seen = [];
    let nDelta = 0;
    const r = streamText({
      model: provider.chatModel("m"),
      prompt: "What is the weather in Paris?",
      seed,
      maxTokens: 300,
      toolCallStreaming: true,
      tools: {
        get_weather: tool({ description: "Weather in a city", parameters: jsonSchema(weather) }),
        search_web: tool({ description: "Search the web", parameters: jsonSchema(search) }),
      },
      providerOptions: { tpserve: { logit_bias: push, parallel_tool_calls: false } },
    });
    for await (const part of r.fullStream) {
      if (part.type === "tool-call") seen.push(part);
      if (part.type === "tool-call-delta") nDelta++;
      if (part.type === "error") throw part.error;
    }
    assert(seen.length === 1 && validators[seen[0].toolName], JSON.stringify(seen));
    assert(validators[seen[0].toolName](seen[0].args), JSON.stringify(seen[0].args));
    assert(nDelta >= 2, `${nDelta} tool-call deltas`);
    assert((await r.finishReason) === "tool-calls", await r.finishReason);
  });
}

const lc = new ChatOpenAI({ model: "m", apiKey: key, configuration: { baseURL: base }, maxTokens: 300, temperature: 1,
                            modelKwargs: { logit_bias: push, parallel_tool_calls: false } });
for (let seed = 1; seed <= 2; seed++) {
  await check(`langchain bindTools (auto) invoke seed ${seed}`, async () => {
    const r = await lc.bindTools(tools).invoke("What is the weather in Paris?", { seed });
    assert(r.tool_calls?.length === 1 && validators[r.tool_calls[0].name], JSON.stringify(r.tool_calls));
    assert(validators[r.tool_calls[0].name](r.tool_calls[0].args), JSON.stringify(r.tool_calls[0].args));
  });
  await check(`langchain bindTools (auto) stream seed ${seed}`, async () => {
    let acc, n = 0;
    for await (const chunk of await lc.bindTools(tools).stream("What is the weather in Paris?", { seed })) {
      acc = acc ? acc.concat(chunk) : chunk;
      if (chunk.tool_call_chunks?.length) n++;
    }
    assert(n >= 2 && acc.tool_calls?.length === 1, `${n} chunks, ${JSON.stringify(acc?.tool_calls)}`);
    assert(validators[acc.tool_calls[0].name]?.(acc.tool_calls[0].args), JSON.stringify(acc.tool_calls[0]));
  });
}

console.log(`${passed} tool checks passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
