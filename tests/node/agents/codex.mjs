// tests/node/agents/codex.mjs BASE_URL API_KEY
// Codex CLI (@openai/codex, its native binary from the npm package) with tpserve as a custom model
// provider: `codex exec --json` in an empty directory, CODEX_HOME a fresh folder whose config.toml
// names the provider (base_url this server, wire_api "responses": Codex 0.169 has no other) and
// turns off what would reach the internet.  One turn must complete with no protocol error: the JSONL
// events hold turn.completed with usage (and the reply as an agent message), and no error or turn.failed event; the
// process exits 0.  Codex sends its tools with tool_choice auto and samples at temperature 1; the
// server's --logit-bias on <|im_end|> (tests/server.cmake) makes the random-weight model end its
// text reply (Codex takes a reply cut by the context for a failure), so the turn is one request.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const baseURL = process.argv[2];
const apiKey = process.argv[3] || "none";
const wireApi = "responses";
const require = createRequire(import.meta.url);
const codexJs = require.resolve("@openai/codex/bin/codex.js");

const home = mkdtempSync(join(tmpdir(), "tp-codex-home-"));
const work = mkdtempSync(join(tmpdir(), "tp-codex-work-"));
writeFileSync(join(home, "config.toml"), `model = "m"
model_provider = "tpserve"
check_for_update_on_startup = false

[model_providers.tpserve]
name = "tpserve"
base_url = "${baseURL}"
env_key = "TPSERVE_API_KEY"
wire_api = "${wireApi}"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[otel]
exporter = "none"
`);

const env = { ...process.env, CODEX_HOME: home, TPSERVE_API_KEY: apiKey, NO_COLOR: "1", RUST_LOG: "error" };
delete env.OPENAI_API_KEY;
delete env.OPENAI_BASE_URL;
const args = [codexJs, "exec", "--json", "--skip-git-repo-check", "--sandbox", "read-only", "-C", work,
              "Say hello in one word."];
const child = spawn(process.execPath, args, { env, stdio: ["ignore", "pipe", "pipe"] });
let out = "", err = "";
child.stdout.on("data", (d) => (out += d));
child.stderr.on("data", (d) => (err += d));
const timer = setTimeout(() => child.kill("SIGKILL"), 420000);
const code = await new Promise((res) => child.on("close", (c) => res(c)));
clearTimeout(timer);
rmSync(home, { recursive: true, force: true });
rmSync(work, { recursive: true, force: true });

const events = out.split("\n").filter((l) => l.trim().startsWith("{")).map((l) => JSON.parse(l));
const types = events.map((e) => e.type);
const show = () => `exit ${code}\nevents: ${types.join(", ")}\nstdout: ${out.slice(-3000)}\nstderr: ${err.slice(-3000)}`;
assert.equal(code, 0, show());
assert.ok(!types.includes("error") && !types.includes("turn.failed"), show());
const done = events.find((e) => e.type === "turn.completed");
assert.ok(done, show());
assert.ok(done.usage.input_tokens > 1000 && done.usage.output_tokens >= 0, show());
// the reply (sampled: it may be the end token alone, about 1 time in 150 with the bias of tests/server.cmake) as an agent message
const msg = events.find((e) => e.type === "item.completed" && e.item?.type === "agent_message");
assert.ok(!msg || typeof msg.item.text === "string", show());
console.log(`ok 1 - codex exec (${wireApi}): one turn, ${done.usage.input_tokens} input tokens, ` +
            `${done.usage.output_tokens} output tokens`);
console.log("1..1");
