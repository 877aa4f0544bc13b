// tests/node/structured.mjs BASE_URL API_KEY [quick]
// response_format against a live tpserve, validated by ajv (the oracle):
//   - a corpus of >= 100 JSON schemas covering every supported keyword and
//     nesting, each at temperature 1 with several seeds (streamed and not),
//     plus greedy and logit_bias variants: every reply must parse and
//     validate, finish "stop", and, streamed, reassemble to the same kind;
//   - json_object: every reply parses to an object;
//   - unsupported keywords: 400 naming the keyword, param response_format.json_schema.schema;
//   - forced tool calls (tool_choice "required" / named), streamed and not:
//     one call of a listed function whose arguments validate, finish "tool_calls";
//     malformed tools refused; tool_choice "auto" (the default with tools) and tool
//     calls in the history refused for templates without a tool format, accepted
//     for those with one (TP_STRUCT_TOOLS=1: tests/node/tools.mjs checks them);
//   - the openai client's beta.chat.completions.parse with zod (response_format
//     and a zodFunction tool).
// Every reply must finish ("stop" / "tool_calls") valid: near the end of
// max_tokens the server only allows tokens that leave the value closable in
// the tokens left, so not even a reply that hits max_tokens is cut (100%).
// Requests run 4 at a time (continuous batching: each sequence its own automaton).
// Exit status 0 only when everything held.
import Ajv from "ajv";
import { isIPv4, isIPv6 } from "node:net";
import OpenAI from "openai";
import { zodResponseFormat, zodFunction } from "openai/helpers/zod";
import { z } from "zod";

const [base, key] = process.argv.slice(2);
const seeds = Number(process.env.TP_STRUCT_SEEDS || 3);
// TP_STRUCT_VARIANTS=sampled: only the seeded temperature-1 replies per schema, not the greedy and
// logit_bias ones (vocabulary-independent paths, run on stories260K at 1 and 2 ranks)
const sampledOnly = process.env.TP_STRUCT_VARIANTS === "sampled";
const maxTokens = Number(process.env.TP_STRUCT_MAX_TOKENS || 400);
let failures = 0;
const fail = (msg) => {
  failures++;
  console.log("FAIL: " + msg);
};

// ------------------------------------------------------------ the corpus
const leaves = {
  str: { type: "string" },
  str_max: { type: "string", maxLength: 12 },
  str_range: { type: "string", minLength: 2, maxLength: 8 },
  num: { type: "number" },
  int: { type: "integer" },
  bool: { type: "boolean" },
  nul: { type: "null" },
  enum_str: { enum: ["red", "green", "blue"] },
  enum_mixed: { enum: [1, 2.5, "x", null, true, { k: [1] }] },
  const_str: { const: "fixed" },
  const_num: { type: "integer", const: 42 },
  nullable: { type: ["string", "null"], maxLength: 10 },
  int_or_bool: { type: ["integer", "boolean"] },
  any_of: { anyOf: [{ type: "integer" }, { type: "string", maxLength: 5 }, { type: "null" }] },
  arr_int: { type: "array", items: { type: "integer" }, maxItems: 4 },
  arr_str: { type: "array", items: { type: "string", maxLength: 6 }, minItems: 1, maxItems: 3 },
  anything: {},
  title_desc: { type: "string", maxLength: 20, title: "T", description: "annotations are accepted" },
  pat_code: { type: "string", pattern: "^[A-Z]{3}-\\d{2,4}(?:-[a-z]+)?$" },
  pat_search: { type: "string", pattern: "ab|c[0-9]", maxLength: 12 },
  fmt_datetime: { type: "string", format: "date-time" },
  fmt_email: { type: "string", format: "email", maxLength: 32 },
  fmt_ip: { anyOf: [{ type: "string", format: "ipv4" }, { type: "string", format: "ipv6" }] },
};
const schemas = [];
for (const [n, l] of Object.entries(leaves)) {
  schemas.push([`leaf_${n}`, l]);
  schemas.push([`req_${n}`, { type: "object", properties: { v: l }, required: ["v"], additionalProperties: false }]);
  schemas.push([
    `opt_${n}`,
    { type: "object", properties: { id: { type: "integer" }, v: l }, required: ["id"], additionalProperties: false },
  ]);
  schemas.push([`arr_${n}`, { type: "array", items: l, minItems: 1, maxItems: 3 }]);
  schemas.push([
    `nest_${n}`,
    {
      type: "object",
      properties: {
        inner: { type: "object", properties: { v: l, ok: { type: "boolean" } }, required: ["v", "ok"], additionalProperties: false },
        list: { type: "array", items: { type: "object", properties: { v: l }, required: ["v"], additionalProperties: false }, maxItems: 2 },
      },
      required: ["inner", "list"],
      additionalProperties: false,
    },
  ]);
  schemas.push([
    `ref_${n}`,
    {
      $defs: { item: l },
      type: "object",
      properties: { a: { $ref: "#/$defs/item" }, b: { type: "array", items: { $ref: "#/$defs/item" }, maxItems: 2 } },
      required: ["a", "b"],
      additionalProperties: false,
    },
  ]);
  schemas.push([
    `union_${n}`,
    {
      anyOf: [
        { type: "object", properties: { a: l }, required: ["a"], additionalProperties: false },
        { type: "object", properties: { b: { type: "integer" } }, required: ["b"], additionalProperties: false },
      ],
    },
  ]);
}
schemas.push([
  "recursive_tree",
  {
    $defs: {
      node: {
        type: "object",
        properties: {
          name: { type: "string", maxLength: 8 },
          children: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 },
        },
        required: ["name", "children"],
        additionalProperties: false,
      },
    },
    $ref: "#/$defs/node",
  },
]);
schemas.push([
  "additional_typed",
  { type: "object", properties: { id: { type: "integer" } }, required: ["id"], additionalProperties: { type: "boolean" } },
]);
schemas.push([
  "definitions_kw",
  { definitions: { p: { type: "integer" } }, type: "object", properties: { p: { $ref: "#/definitions/p" } }, required: ["p"], additionalProperties: false },
]);
schemas.push([
  "many_props",
  {
    type: "object",
    properties: Object.fromEntries(["alpha", "beta", "gamma", "delta", "alphabet", "be"].map((k) => [k, { type: "integer" }])),
    required: ["alpha", "beta", "gamma", "delta", "alphabet", "be"],
    additionalProperties: false,
  },
]);
schemas.push([
  "formats_all",
  {
    type: "object",
    properties: Object.fromEntries(["date", "time", "date-time", "uuid", "email", "ipv4", "ipv6"].map((f) => [f, { type: "string", format: f }])),
    required: ["date", "time", "date-time", "uuid", "email", "ipv4", "ipv6"],
    additionalProperties: false,
  },
]);
schemas.push([
  "patterns_mixed",
  {
    type: "object",
    properties: {
      word: { type: "string", pattern: "^\\w+$", minLength: 2, maxLength: 6 },
      phone: { type: "string", pattern: "^\\+?\\d{1,3}[ -]?\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}$" },
      hex: { type: ["string", "null"], pattern: "^#(?:[0-9a-fA-F]{3}){1,2}$" },
      free: { type: "string", pattern: "[^a-z\\s]{2}" },
    },
    required: ["word", "phone", "hex", "free"],
    additionalProperties: false,
  },
]);
schemas.push([
  "escaped_names",
  { type: "object", properties: { 'say "hi"': { type: "boolean" }, "back\\slash": { type: "null" }, "é": { const: "ü" } }, required: ['say "hi"', "back\\slash", "é"], additionalProperties: false },
]);

const unsupported = [
  ["minimum", { type: "integer", minimum: 3 }],
  ["uri", { type: "object", properties: { e: { type: "string", format: "uri" } } }],
  ["int32", { type: "integer", format: "int32" }],
  ["oneOf", { oneOf: [{ type: "string" }, { type: "integer" }] }],
  ["allOf", { allOf: [{ type: "string" }] }],
  ["not", { not: { type: "string" } }],
  ["\\1", { type: "string", pattern: "^(a)\\1$" }],
  ["(?=", { type: "string", pattern: "^(?=a)\\w+$" }],
  ["\\p", { type: "string", pattern: "^\\p{L}+$" }],
  ["patternProperties", { type: "object", patternProperties: { "^x": { type: "integer" } } }],
  ["prefixItems", { type: "array", prefixItems: [{ type: "integer" }] }],
  ["uniqueItems", { type: "array", uniqueItems: true }],
  ["multipleOf", { type: "number", multipleOf: 2 }],
  ["if", { if: { type: "string" }, then: { maxLength: 3 } }],
  ["maxProperties", { type: "object", maxProperties: 2 }],
];

// ------------------------------------------------------------ requests
async function post(body) {
  const r = await fetch(`${base}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify(body),
  });
  if (!body.stream || r.status !== 200) {
    const j = await r.json();
    const m = j.choices?.[0]?.message;
    return { status: r.status, json: j, content: m?.content, tool_calls: m?.tool_calls, finish: j.choices?.[0]?.finish_reason };
  }
  const text = await r.text();
  let content = "", finish = null, tool_calls;
  for (const ev of text.split("\n\n")) {
    if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
    const j = JSON.parse(ev.slice(6));
    if (j.error) return { status: 500, json: j };
    const ch = j.choices?.[0];
    if (ch?.delta?.content) content += ch.delta.content;
    for (const tc of ch?.delta?.tool_calls || []) {
      tool_calls ??= [];
      const t = (tool_calls[tc.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
      if (tc.id) t.id = tc.id;
      if (tc.function?.name) t.function.name += tc.function.name;
      if (tc.function?.arguments) t.function.arguments += tc.function.arguments;
    }
    if (ch?.finish_reason) finish = ch.finish_reason;
  }
  return { status: 200, content, finish, tool_calls };
}

function rf(schema, name) {
  return { type: "json_schema", json_schema: { name, schema, strict: true } };
}

let n_length = 0;
const ajv = new Ajv({ strict: false, allErrors: true });
// the formats checked by code written for this test (not by the server's patterns)
const isDate = (s) => {
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
  if (!m) return false;
  const d = new Date(0);
  d.setUTCFullYear(+m[1], +m[2] - 1, +m[3]); // (Date.UTC maps years 0-99 to 1900-1999)
  return d.getUTCFullYear() === +m[1] && d.getUTCMonth() === +m[2] - 1 && d.getUTCDate() === +m[3];
};
const isTime = (s) => {
  const m = /^(\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:[zZ]|([+-])(\d{2}):(\d{2}))$/.exec(s);
  return !!m && +m[1] < 24 && +m[2] < 60 && +m[3] < 60 && (m[5] === undefined || (+m[6] < 24 && +m[7] < 60));
};
const isEmail = (s) => {
  const at = s.split("@");
  if (at.length !== 2) return false;
  const atom = /^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+$/;
  const labels = at[1].split(".");
  return at[0].split(".").every((p) => atom.test(p)) && labels.length >= 2 &&
    labels.every((l) => l.length <= 63 && /^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?$/.test(l)) && /^[A-Za-z]{2,}$/.test(labels.at(-1));
};
ajv.addFormat("date", isDate);
ajv.addFormat("time", isTime);
ajv.addFormat("date-time", (s) => {
  const i = s.search(/[Tt]/);
  return i > 0 && isDate(s.slice(0, i)) && isTime(s.slice(i + 1));
});
ajv.addFormat("uuid", (s) => s.length === 36 && [8, 13, 18, 23].every((i) => s[i] === "-") && /^[0-9a-fA-F]{32}$/.test(s.replaceAll("-", "")));
ajv.addFormat("email", isEmail);
ajv.addFormat("ipv4", isIPv4);
ajv.addFormat("ipv6", isIPv6);
const jobs = [];
let n_checked = 0;
for (const [name, schema] of schemas) {
  const validate = ajv.compile(schema);
  const variants = [];
  for (let s = 1; s <= seeds; s++) variants.push({ seed: s * 7919 + name.length, temperature: 1.0, stream: s % 2 === 0 });
  if (!sampledOnly) {
    variants.push({ temperature: 0, stream: false, tag: "greedy" });
    // logit_bias: ban the byte-fallback / piece tokens of the first few ids; the mask keeps what remains valid
    variants.push({ seed: 5, temperature: 1.0, stream: true, logit_bias: { 13: -100, 29: 5, 100: -100 }, tag: "bias" });
  }
  for (const v of variants) {
    jobs.push(async () => {
      const body = {
        model: "m",
        messages: [{ role: "user", content: "Tell me a story as JSON." }],
        max_tokens: maxTokens,
        response_format: rf(schema, name),
        ...v,
      };
      delete body.tag;
      const r = await post(body);
      const what = `${name} ${JSON.stringify(v)}`;
      if (r.status !== 200) return fail(`${what}: HTTP ${r.status} ${JSON.stringify(r.json)}`);
      if (r.finish === "length") n_length++;
      if (r.finish !== "stop") return fail(`${what}: finish_reason ${r.finish}, content ${JSON.stringify(r.content)}`);
      let value;
      try {
        value = JSON.parse(r.content);
      } catch (e) {
        return fail(`${what}: not JSON: ${JSON.stringify(r.content)}`);
      }
      if (!validate(value)) return fail(`${what}: invalid: ${JSON.stringify(r.content)} ${ajv.errorsText(validate.errors)}`);
      n_checked++;
    });
  }
}
for (let s = 1; s <= 4; s++) {
  jobs.push(async () => {
    const r = await post({
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: maxTokens,
      seed: s,
      stream: s % 2 === 0,
      response_format: { type: "json_object" },
    });
    if (r.status !== 200) return fail(`json_object: HTTP ${r.status}`);
    if (r.finish === "length") n_length++;
    try {
      const v = JSON.parse(r.content);
      if (typeof v !== "object" || v === null || Array.isArray(v)) fail(`json_object: not an object: ${r.content}`);
      else n_checked++;
    } catch (e) {
      fail(`json_object: not JSON: ${JSON.stringify(r.content)}`);
    }
  });
}
for (const [kw, schema] of unsupported) {
  jobs.push(async () => {
    const r = await post({ messages: [{ role: "user", content: "x" }], response_format: rf(schema, "u") });
    const e = r.json?.error;
    if (r.status !== 400 || !e || e.param !== "response_format.json_schema.schema" || !e.message.includes(`'${kw}'`))
      fail(`unsupported '${kw}': got ${r.status} ${JSON.stringify(r.json)}`);
  });
}
// malformed response_format
for (const [bad, param] of [
  [{ type: "xml" }, "response_format"],
  [{ type: "json_schema" }, "response_format.json_schema"],
  [{ type: "json_schema", json_schema: { name: "x" } }, "response_format.json_schema.schema"],
  [{ type: "json_schema", json_schema: { name: "x", schema: { type: "string" }, bogus: 1 } }, "response_format.json_schema"],
]) {
  jobs.push(async () => {
    const r = await post({ messages: [{ role: "user", content: "x" }], response_format: bad });
    if (r.status !== 400 || r.json?.error?.param !== param) fail(`bad response_format ${JSON.stringify(bad)}: ${r.status} ${JSON.stringify(r.json)}`);
  });
}

// ------------------------------------------------------------ forced tool calls
// tools built from corpus schemas (objects only: parameters are objects); every
// call must name a listed tool and carry arguments valid under its parameters
const objSchemas = schemas.filter(([, sc]) => sc.type === "object" && !sc.anyOf);
const toolSets = [];
for (let i = 0; i + 3 <= objSchemas.length && toolSets.length < 12; i += 3)
  toolSets.push(objSchemas.slice(i, i + 3).map(([n, sc], k) => ({ type: "function", function: { name: `f${k}_${n}`, description: n, parameters: sc } })));
for (const [ti, tools] of toolSets.entries()) {
  const validators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
  for (const [ci, choice] of ["required", { type: "function", function: { name: tools[1].function.name } }].entries()) {
    for (const stream of [false, true]) {
      jobs.push(async () => {
        const body = { messages: [{ role: "user", content: "Call a tool." }], max_tokens: maxTokens, seed: ti * 10 + ci, tools, tool_choice: choice, stream };
        const r = await post(body);
        const what = `tools set ${ti} choice ${JSON.stringify(choice)} stream ${stream}`;
        if (r.status !== 200) return fail(`${what}: HTTP ${r.status} ${JSON.stringify(r.json)}`);
        if (r.finish === "length") n_length++;
        const calls = r.tool_calls;
        if (r.finish !== "tool_calls" || !Array.isArray(calls) || calls.length !== 1) return fail(`${what}: ${JSON.stringify(r)}`);
        const c = calls[0];
        if (c.type !== "function" || typeof c.id !== "string" || !c.id) return fail(`${what}: bad call ${JSON.stringify(c)}`);
        if (typeof choice === "object" && c.function.name !== choice.function.name) return fail(`${what}: called ${c.function.name}`);
        const v = validators[c.function.name];
        if (!v) return fail(`${what}: unknown function ${c.function.name}`);
        let args;
        try {
          args = JSON.parse(c.function.arguments);
        } catch (e) {
          return fail(`${what}: arguments not JSON: ${c.function.arguments}`);
        }
        if (!v(args)) return fail(`${what}: invalid arguments ${c.function.arguments}: ${ajv.errorsText(v.errors)}`);
        n_checked++;
      });
    }
  }
}
const oneTool = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {} } } }];
const toolsFamily = process.env.TP_STRUCT_TOOLS === "1";
for (const [body, param] of [
  ...(toolsFamily ? [] : [[{ tools: oneTool }, "tool_choice"]]), // auto needs a template with a tool format
  [{ tools: oneTool, tool_choice: { type: "function", function: { name: "g" } } }, "tool_choice"],
  [{ tool_choice: "required" }, "tool_choice"],
  [{ tools: [{ type: "function", function: { name: "bad name" } }], tool_choice: "required" }, "tools"],
  [{ tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { type: "integer", minimum: 1 } } } } }], tool_choice: "required" }, "tools"],
  [{ tools: oneTool, tool_choice: "required", response_format: { type: "json_object" } }, "tool_choice"],
]) {
  jobs.push(async () => {
    const r = await post({ messages: [{ role: "user", content: "x" }], ...body });
    if (r.status !== 400 || r.json?.error?.param !== param) fail(`tools refusal ${JSON.stringify(body)}: ${r.status} ${JSON.stringify(r.json)}`);
  });
}
jobs.push(async () => {
  const hist = [{ role: "user", content: "x" }, { role: "assistant", content: "y", tool_calls: [{ id: "a", type: "function", function: { name: "f", arguments: "{}" } }] }, { role: "user", content: "z" }];
  const r = await post({ messages: hist, max_tokens: 5 });
  const ok = toolsFamily ? r.status === 200
    : r.status === 400 && r.json?.error?.param === "messages" && /no tool format/.test(r.json?.error?.message);
  if (!ok) fail(`history tool_calls: ${r.status} ${JSON.stringify(r.json)}`);
});
jobs.push(async () => {
  const r = await post({ messages: [{ role: "user", content: "x" }], max_tokens: 5, tools: oneTool, tool_choice: "none" });
  if (r.status !== 200 || typeof r.content !== "string" || r.tool_calls) fail(`tool_choice none: ${JSON.stringify(r)}`);
});

// ------------------------------------------------------------ the openai client: parse() with zod
const client = new OpenAI({ baseURL: base, apiKey: key });
const Person = z.object({
  name: z.string().max(16),
  age: z.number().int(),
  pets: z.array(z.object({ kind: z.enum(["cat", "dog"]), name: z.string().max(10) })).max(2),
  nick: z.string().max(8).nullable(),
});
for (let s = 1; s <= 4; s++) {
  jobs.push(async () => {
    const c = await client.beta.chat.completions.parse({
      model: "m",
      messages: [{ role: "user", content: "A person." }],
      seed: s,
      max_tokens: maxTokens,
      response_format: zodResponseFormat(Person, "person"),
    });
    const m = c.choices[0].message;
    if (c.choices[0].finish_reason !== "stop" || !m.parsed || !Person.safeParse(m.parsed).success) return fail(`openai parse: ${JSON.stringify(c)}`);
    n_checked++;
  });
  jobs.push(async () => {
    const c = await client.beta.chat.completions.parse({
      model: "m",
      messages: [{ role: "user", content: "Record a person." }],
      seed: s,
      max_tokens: maxTokens,
      tools: [zodFunction({ name: "record_person", parameters: Person })],
      tool_choice: { type: "function", function: { name: "record_person" } },
    });
    const call = c.choices[0].message.tool_calls?.[0];
    if (c.choices[0].finish_reason !== "tool_calls" || call?.function.name !== "record_person" || !Person.safeParse(call.function.parsed_arguments).success)
      return fail(`openai parse tools: ${JSON.stringify(c)}`);
    n_checked++;
  });
}

const t0 = Date.now();
let next = 0;
await Promise.all(
  Array.from({ length: 4 }, async () => {
    while (next < jobs.length) await jobs[next++]();
  }),
);
console.log(
  `${schemas.length} schemas, ${n_checked} replies valid, ${n_length} cut by max_tokens, ` +
    `${failures} failures, ${((Date.now() - t0) / 1000).toFixed(1)} s`,
);
if (n_length > 0) fail(`${n_length} replies cut by max_tokens`);
if (schemas.length < 100) fail(`corpus has ${schemas.length} schemas; want >= 100`);
process.exit(failures ? 1 : 0);
