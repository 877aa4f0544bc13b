// tests/node/conformance.mjs - the official `openai` npm client against a
// running tpserve (base URL in argv[2], API key in argv[3]).
// Checks: completion + chat, streaming and not; stop; seed reproducibility;
// logprobs; usage numbers equal token counts (logprobs entries and the
// streamed chunks); errors surface as openai.APIError with the right status.
import OpenAI from "openai";
import assert from "node:assert/strict";

const baseURL = process.argv[2];
const apiKey = process.argv[3] || "none";
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const model = "stories260K";
let n = 0;
async function check(name, fn) {
  await fn();
  n++;
  console.log(`ok ${n} - ${name}`);
}

await check("models.list + models.retrieve", async () => {
  const list = await client.models.list();
  assert.ok(list.data.length >= 1 && typeof list.data[0].id === "string");
  const m = await client.models.retrieve(list.data[0].id);
  assert.equal(m.id, list.data[0].id);
  await assert.rejects(client.models.retrieve("no-such-model"), (e) => e instanceof OpenAI.APIError && e.status === 404);
});

let greedy;
await check("completion, greedy, usage == logprobs entries", async () => {
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 24, temperature: 0, logprobs: 2 });
  assert.equal(r.object, "text_completion");
  greedy = r.choices[0].text;
  assert.ok(greedy.length > 10);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 24);
  assert.equal(r.choices[0].logprobs.tokens.length, r.usage.completion_tokens);
  assert.equal(r.choices[0].logprobs.tokens.join(""), greedy);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  for (const lp of r.choices[0].logprobs.token_logprobs) assert.ok(lp <= 0);
});

await check("completion, streaming == non-streaming, usage chunk", async () => {
  const stream = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 24, temperature: 0,
                                                   stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (c.choices.length) {
      text += c.choices[0].text;
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
      chunks++;
    }
  }
  assert.equal(text, greedy);
  assert.equal(finish, "length");
  assert.equal(usage.completion_tokens, 24);
  assert.ok(chunks >= 2);
});

await check("completion, stop string never emitted", async () => {
  const word = greedy.trim().split(/\s+/)[3];
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 24, temperature: 0, stop: [word] });
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.equal(r.choices[0].text, greedy.slice(0, greedy.indexOf(word)));
  assert.ok(!r.choices[0].text.includes(word));
});

await check("seed reproducibility (temperature 1)", async () => {
  const a = await client.completions.create({ model, prompt: "The dog", max_tokens: 30, temperature: 1, seed: 1234 });
  const b = await client.completions.create({ model, prompt: "The dog", max_tokens: 30, temperature: 1, seed: 1234 });
  const c = await client.completions.create({ model, prompt: "The dog", max_tokens: 30, temperature: 1, seed: 99 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.notEqual(a.choices[0].text, c.choices[0].text);
});

let chatText, chatFingerprint;
await check("chat, non-streaming, logprobs, usage", async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: "system", content: "Tell a story." },
                                                   { role: "user", content: "A cat" }],
                                                   max_tokens: 20, temperature: 0, logprobs: true, top_logprobs: 2 });
  assert.equal(r.object, "chat.completion");
  const ch = r.choices[0];
  assert.equal(ch.message.role, "assistant");
  chatText = ch.message.content;
  chatFingerprint = r.system_fingerprint;
  assert.equal(ch.logprobs.content.length, r.usage.completion_tokens);
  assert.equal(ch.logprobs.content.map((t) => t.token).join(""), chatText);
  assert.equal(ch.logprobs.content[0].top_logprobs.length, 2);
  assert.ok(Array.isArray(ch.logprobs.content[0].bytes));
});

await check("chat, streaming == non-streaming, usage == chunk tokens", async () => {
  const stream = await client.chat.completions.create({ model, messages: [{ role: "system", content: "Tell a story." },
                                                        { role: "user", content: "A cat" }],
                                                        max_tokens: 20, temperature: 0, stream: true, logprobs: true,
                                                        stream_options: { include_usage: true } });
  let text = "", role = null, finish = null, usage = null, ntok = 0, fps = new Set();
  for await (const c of stream) {
    fps.add(c.system_fingerprint);
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    const d = c.choices[0].delta;
    // the role comes first: on the first chunk, before any content
    if (role === null) assert.equal(d.role, "assistant", `first chunk ${JSON.stringify(c)}`);
    if (d.role) role = d.role;
    if (d.content) text += d.content;
    if (c.choices[0].logprobs) ntok += c.choices[0].logprobs.content.length;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(role, "assistant");
  assert.equal(text, chatText);
  assert.equal(fps.size, 1); // one fingerprint on every chunk, the non-streamed reply's
  assert.match([...fps][0], /^fp_[0-9a-f]{10}$/);
  assert.equal([...fps][0], chatFingerprint);
  assert.ok(finish === "length" || finish === "stop");
  assert.equal(usage.completion_tokens, ntok);
});

await check("errors are APIError with status and param", async () => {
  await assert.rejects(client.completions.create({ model, prompt: "x", max_tokens: -1 }),
                       (e) => e instanceof OpenAI.APIError && e.status === 400 && e.param === "max_tokens");
  await assert.rejects(client.chat.completions.create({ model, messages: [] }),
                       (e) => e instanceof OpenAI.APIError && e.status === 400 && e.param === "messages");
  await assert.rejects(client.completions.create({ model, prompt: "x", n: 2 }),
                       (e) => e instanceof OpenAI.APIError && e.status === 400);
  const bad = new OpenAI({ baseURL, apiKey: "wrong-key", maxRetries: 0 });
  if (apiKey !== "none")
    await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.APIError && e.status === 401);
});

console.log(`all ${n} conformance checks passed`);
