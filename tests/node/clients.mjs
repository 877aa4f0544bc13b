// tests/node/clients.mjs BASE_URL API_KEY
// Agent frameworks from the npm registry against a live tpserve; every
// structured reply must come back parsed and valid under its zod schema:
//   - Vercel AI SDK (ai + @ai-sdk/openai-compatible): generateObject in tool
//     mode (the provider's default: a forced tool call) and in json mode with
//     structured outputs (response_format json_schema); streamText with a tool
//     and toolChoice "required" (streamed tool call, its arguments parsed);
//   - LangChain JS (@langchain/openai): withStructuredOutput (a named forced
//     tool call) and bindTools with tool_choice "required".
// Exit status 0 only when everything held.
import { generateObject, streamText, tool } from "ai";
import { createOpenAICompatible, OpenAICompatibleChatLanguageModel } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";
import { z } from "zod";

const [base, key] = process.argv.slice(2);
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

const Recipe = z.object({
  title: z.string().max(20),
  servings: z.number().int(),
  vegan: z.boolean(),
  steps: z.array(z.string().max(12)).min(1).max(3),
  difficulty: z.enum(["easy", "hard"]),
});

const provider = createOpenAICompatible({ name: "tpserve", baseURL: base, apiKey: key });
const structured = new OpenAICompatibleChatLanguageModel("m", {}, {
  provider: "tpserve.chat",
  url: ({ path }) => base + path,
  headers: () => ({ Authorization: `Bearer ${key}` }),
  supportsStructuredOutputs: true,
  defaultObjectGenerationMode: "json",
});

for (let seed = 1; seed <= 3; seed++) {
  await check(`ai generateObject tool mode seed ${seed}`, async () => {
    const r = await generateObject({ model: provider.chatModel("m"), schema: Recipe, prompt: "A recipe.", seed, maxTokens: 400 });
    assert(Recipe.safeParse(r.object).success, JSON.stringify(r.object));
  });
  await check(`ai generateObject json_schema mode seed ${seed}`, async () => {
    const r = await generateObject({ model: structured, schema: Recipe, prompt: "A recipe.", seed, maxTokens: 400 });
    assert(Recipe.safeParse(r.object).success, JSON.stringify(r.object));
  });
  await check(`ai streamText tool required seed ${seed}`, async () => {
    const seen = [];
    const r = streamText({
      model: provider.chatModel("m"),
      prompt: "Save a recipe.",
      seed,
      maxTokens: 400,
      toolChoice: "required",
      tools: { save_recipe: tool({ description: "store a recipe", parameters: Recipe }) },
    });
    for await (const part of r.fullStream) {
      if (part.type === "tool-call") seen.push(part);
      if (part.type === "error") throw part.error;
    }
    assert(seen.length === 1 && seen[0].toolName === "save_recipe", JSON.stringify(seen));
    assert(Recipe.safeParse(seen[0].args).success, JSON.stringify(seen[0].args));
    assert((await r.finishReason) === "tool-calls", await r.finishReason);
  });
}

const chat = new ChatOpenAI({ model: "m", apiKey: key, configuration: { baseURL: base }, maxTokens: 400, temperature: 1 });
for (let seed = 1; seed <= 3; seed++) {
  await check(`langchain withStructuredOutput seed ${seed}`, async () => {
    const r = await chat.withStructuredOutput(Recipe, { name: "recipe" }).invoke("A recipe.", { seed });
    assert(Recipe.safeParse(r).success, JSON.stringify(r));
  });
  await check(`langchain bindTools required seed ${seed}`, async () => {
    const m = chat.bindTools([{ type: "function", function: { name: "save_recipe", description: "store", parameters: {
      type: "object", properties: { title: { type: "string", maxLength: 20 }, servings: { type: "integer" } },
      required: ["title", "servings"], additionalProperties: false } } }], { tool_choice: "required" });
    const r = await m.invoke("Save a recipe.", { seed });
    assert(r.tool_calls?.length === 1 && r.tool_calls[0].name === "save_recipe", JSON.stringify(r.tool_calls));
    const a = r.tool_calls[0].args;
    assert(typeof a.title === "string" && a.title.length <= 20 && Number.isInteger(a.servings), JSON.stringify(a));
  });
}
console.log(`${passed} client checks passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
