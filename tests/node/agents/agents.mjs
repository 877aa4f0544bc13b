// tests/node/agents/agents.mjs BASE_URL API_KEY
// The OpenAI Agents SDK (@openai/agents) over tpserve's Responses API: an agent with one function
// tool runs a full tool round trip - the model calls the tool (modelSettings.toolChoice "required":
// a random-weight model does not choose a tool by itself; the SDK resets the choice to auto after
// the tool ran), the SDK runs it and sends its output back as a function_call_output item, and the
// model produces a final answer.  Checked: the tool ran exactly once with arguments valid under its
// zod schema, the run's items are [tool call, tool output, message] in that order with matching call
// ids, the final output is the text of the last response, and the same holds when the run streams.
// Needs a server whose chat template renders tool turns (synth:qwen3).
import { Agent, run, tool, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } from "@openai/agents";
import OpenAI from "openai";
import { z } from "zod";
import assert from "node:assert/strict";

const baseURL = process.argv[2];
const apiKey = process.argv[3] || "none";
setTracingDisabled(true);
setDefaultOpenAIClient(new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 }));
setOpenAIAPI("responses");

const cities = ["Paris", "Rome", "Oslo"];
const seen = [];
const getWeather = tool({
  name: "get_weather",
  description: "The weather in a city",
  parameters: z.object({ city: z.enum(cities) }),
  execute: async ({ city }) => {
    seen.push(city);
    return `It is sunny in ${city}, 21 degrees.`;
  },
});
const agent = new Agent({
  name: "weather",
  instructions: "Answer questions about the weather; call get_weather first.",
  model: "m",
  tools: [getWeather],
  modelSettings: { toolChoice: "required", temperature: 0, maxTokens: 600 },
});

let n = 0;
function checkRun(result, what) {
  assert.equal(seen.length, 1, `${what}: the tool ran ${seen.length} times`);
  assert.ok(cities.includes(seen[0]), `${what}: ${seen[0]}`);
  const kinds = result.newItems.map((i) => i.type);
  assert.deepEqual(kinds, ["tool_call_item", "tool_call_output_item", "message_output_item"], `${what}: ${kinds}`);
  const call = result.newItems[0].rawItem, out = result.newItems[1].rawItem;
  assert.equal(call.type, "function_call");
  assert.equal(call.name, "get_weather");
  assert.deepEqual(JSON.parse(call.arguments), { city: seen[0] });
  assert.equal(out.type, "function_call_result");
  assert.equal(out.callId, call.callId);
  assert.equal(typeof result.finalOutput, "string");
  assert.equal(result.rawResponses.length, 2, `${what}: ${result.rawResponses.length} model calls`);
  const last = result.rawResponses[1];
  const text = last.output.filter((o) => o.type === "message").flatMap((o) => o.content).map((c) => c.text).join("");
  assert.equal(result.finalOutput, text);
  for (const r of result.rawResponses) assert.ok(r.usage.inputTokens > 0 && r.usage.outputTokens > 0);
  // the second request holds the call and its output: a longer prompt
  assert.ok(last.usage.inputTokens > result.rawResponses[0].usage.inputTokens + 10);
  console.log(`ok ${++n} - ${what}: get_weather(${seen[0]}) -> ${JSON.stringify(result.finalOutput.slice(0, 40))}`);
}

checkRun(await run(agent, "What is the weather in Paris?", { maxTurns: 4 }), "run");
seen.length = 0;
const streamed = await run(agent, "What is the weather in Rome?", { maxTurns: 4, stream: true });
let events = 0;
for await (const ev of streamed) events++;
await streamed.completed;
assert.ok(events > 4, `${events} stream events`);
checkRun(streamed, "run, streamed");
console.log(`1..${n}`);
