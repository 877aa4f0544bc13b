// tests/node/think_e2e.mjs - <think> replies of the qwen3 chat family split into
// reasoning_content and content, end to end (run by run_structured.sh on synth:qwen3).
//
// logit_bias steers a random-weight Qwen3-vocabulary model towards <think>, </think>
// and two words; over 16 seeds the streamed deltas (reasoning_content, content) add up
// to the non-streamed message of the same seed, finish_reason agrees, and a reply that
// opens with <think> has reasoning_content ending before the first </think>.
// Then with tools and tool_choice "auto" (bias on <think>, </think> and <tool_call>):
// a <tool_call> inside the reasoning is reasoning, one after </think> is a call
// that parses under its schema; reasoning_content, content and the call's
// streamed fragments add up to the non-streamed message.
// Usage: node think_e2e.mjs BASE_URL API_KEY
const [base, key] = process.argv.slice(2);
const THINK = 151667, END_THINK = 151668;
let failures = 0;
const fail = (m) => { console.log("FAIL: " + m); failures++; };
const post = (body) => fetch(base + "/chat/completions", {
  method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + key }, body: JSON.stringify(body) });

const bias = { [THINK]: 100, [END_THINK]: 100, 9707: 100, 1879: 100 };
let seen = 0;
for (let seed = 1; seed <= 16; seed++) {
  const body = { messages: [{ role: "user", content: "Think, then answer." }], max_tokens: 24, temperature: 1, seed, logit_bias: bias };
  const r = await post(body);
  if (r.status !== 200) { fail(`seed ${seed}: status ${r.status} ${await r.text()}`); continue; }
  const ch = (await r.json()).choices[0];
  const m = ch.message;
  const sr = await post({ ...body, stream: true });
  const text = await sr.text();
  let content = "", reasoning = "", finish = null, done = false, first = true;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ")) continue;
    if (line === "data: [DONE]") { done = true; continue; }
    const c = JSON.parse(line.slice(6)).choices?.[0];
    if (!c) continue;
    // the first chunk carries the role, also when the reply opens with reasoning
    if (first && c.delta?.role !== "assistant") fail(`seed ${seed}: first chunk without role: ${JSON.stringify(c)}`);
    first = false;
    if (c.finish_reason) finish = c.finish_reason;
    content += c.delta?.content || "";
    reasoning += c.delta?.reasoning_content || "";
  }
  if (!done) fail(`seed ${seed}: stream without [DONE]`);
  if (content !== m.content) fail(`seed ${seed}: streamed content ${JSON.stringify(content)} != ${JSON.stringify(m.content)}`);
  if (reasoning !== (m.reasoning_content ?? "")) fail(`seed ${seed}: streamed reasoning ${JSON.stringify(reasoning)} != ${JSON.stringify(m.reasoning_content)}`);
  if (finish !== ch.finish_reason) fail(`seed ${seed}: finish ${finish} != ${ch.finish_reason}`);
  if (m.reasoning_content !== undefined) {
    seen++;
    if (m.reasoning_content.includes("</think>")) fail(`seed ${seed}: </think> inside reasoning_content`);
    if (seed <= 3) console.log(`seed ${seed}: ${JSON.stringify(m)}`);
  }
}
console.log(`think e2e: ${seen} of 16 replies opened with <think>`);
if (seen === 0) fail("no reply opened with <think> (the bias should make some)");

// ---- reasoning, then tool calls (tool_choice auto)
const root = base.replace(/\/v1$/, "");
const tk = await (await fetch(`${root}/tokenize`, { method: "POST", headers: { "content-type": "application/json", authorization: "Bearer " + key },
  body: JSON.stringify({ content: "<tool_call>" }) })).json();
const TOOL_CALL = tk.tokens?.[0];
const params = { type: "object", properties: { city: { type: "string", maxLength: 10 }, days: { type: "integer" } }, required: ["city", "days"], additionalProperties: false };
const tools = [{ type: "function", function: { name: "forecast", description: "Weather forecast", parameters: params } }];
const checkArgs = (a) => { try { const v = JSON.parse(a); return typeof v.city === "string" && v.city.length <= 10 && Number.isInteger(v.days) && Object.keys(v).length === 2; } catch { return false; } };
let both = 0;
for (let seed = 1; seed <= 16; seed++) {
  const body = { messages: [{ role: "user", content: "Think, then call a tool." }], max_tokens: 64, temperature: 1, seed, tools,
                 tool_choice: "auto", parallel_tool_calls: false, logit_bias: { [THINK]: 100, [END_THINK]: 100, [TOOL_CALL]: 100 } };
  const r = await post(body);
  if (r.status !== 200) { fail(`tools seed ${seed}: status ${r.status} ${await r.text()}`); continue; }
  const ch = (await r.json()).choices[0];
  const m = ch.message;
  const sr = await post({ ...body, stream: true });
  let content = "", reasoning = "", finish = null, calls = [], first = true;
  for (const line of (await sr.text()).split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const c = JSON.parse(line.slice(6)).choices?.[0];
    if (!c) continue;
    if (first && c.delta?.role !== "assistant") fail(`tools seed ${seed}: first chunk without role: ${JSON.stringify(c)}`);
    first = false;
    if (c.finish_reason) finish = c.finish_reason;
    content += c.delta?.content || "";
    reasoning += c.delta?.reasoning_content || "";
    for (const tc of c.delta?.tool_calls || []) {
      const t = (calls[tc.index] ??= { name: "", arguments: "" });
      t.name += tc.function?.name || "";
      t.arguments += tc.function?.arguments || "";
    }
  }
  const what = `tools seed ${seed} ${JSON.stringify(m)}`;
  if (finish !== ch.finish_reason) fail(`${what}: streamed finish ${finish} != ${ch.finish_reason}`);
  if (reasoning !== (m.reasoning_content ?? "")) fail(`${what}: streamed reasoning ${JSON.stringify(reasoning)}`);
  if (content !== (m.content ?? "")) fail(`${what}: streamed content ${JSON.stringify(content)}`);
  if ((m.reasoning_content ?? "").includes("</think>")) fail(`${what}: </think> inside reasoning_content`);
  const mc = m.tool_calls || [];
  if (JSON.stringify(mc.map((c) => [c.function.name, c.function.arguments])) !== JSON.stringify(calls.map((c) => [c.name, c.arguments])))
    fail(`${what}: streamed calls ${JSON.stringify(calls)}`);
  for (const c of mc) if (c.function.name !== "forecast" || !checkArgs(c.function.arguments)) fail(`${what}: invalid call`);
  if (mc.length > 0 && ch.finish_reason !== "tool_calls") fail(`${what}: finish ${ch.finish_reason} with calls`);
  if (m.reasoning_content !== undefined && mc.length > 0) {
    both++;
    if (both <= 2) console.log(`tools seed ${seed}: ${JSON.stringify(m)}`);
  }
}
console.log(`think + tools: ${both} of 16 replies reasoned, then called`);
if (both === 0) fail("no reply reasoned and then called a tool (the bias should make some)");
if (failures) process.exit(1);
