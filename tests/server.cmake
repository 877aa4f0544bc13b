# Extra server tests: the official openai npm client (node) against a live
# server, and the chat-template oracle re-rendered with @huggingface/jinja.
# Skip (exit 77) with a reason when node/npm are unavailable; the template check also needs ../shared.
# The node tests run in parallel with each other: a script that finds a package missing installs it
# through tests/node/npm_install.sh, which lets one install at a time into a folder.
add_test(NAME server.node_conformance
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_conformance.sh $<TARGET_FILE:tpserve>
                 ${PROJECT_SOURCE_DIR}/models/stories260K.gguf client)
set_tests_properties(server.node_conformance PROPERTIES LABELS "model" TIMEOUT 400 SKIP_RETURN_CODE 77)
add_test(NAME server.node_templates_shared
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_conformance.sh $<TARGET_FILE:tpserve>
                 ${PROJECT_SOURCE_DIR}/models/stories260K.gguf templates)
set_tests_properties(server.node_templates_shared PROPERTIES LABELS "model" TIMEOUT 400 SKIP_RETURN_CODE 77
                     ENVIRONMENT "TP_SHARED_DIR=${TP_SHARED_DIR}")

# Command-line refusals of `tpserve serve` (one-line errors, no hang): exit status and message together.
set(_tp_bin $<TARGET_FILE:tpserve>)
set(_tp_stories ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
tp_expect_test(server.cli_no_model RC 2 REGEX "-m MODEL is required" LABELS unit COMMAND ${_tp_bin} serve --port 0)
tp_expect_test(server.cli_bad_template RC 1 REGEX "--chat-template jinja2000: unknown; known templates: llama2, llama3"
               LABELS unit COMMAND ${_tp_bin} serve -m ${_tp_stories} --port 0 --chat-template jinja2000)
tp_expect_test(server.cli_missing_key_file RC 1 REGEX "--api-key-file /nonexistent/key: cannot read a key"
               LABELS unit COMMAND ${_tp_bin} serve -m ${_tp_stories} --port 0 --api-key-file /nonexistent/key)
tp_expect_test(server.cli_bad_log_format RC 2 REGEX "want text or json" LABELS unit
               COMMAND ${_tp_bin} serve -m x.gguf --log-format yaml)
# generation defaults: out-of-range values exit 2 naming the flag and the range, before anything loads
tp_expect_test(server.cli_bad_temp RC 2 REGEX "--temp must be between 0 and 2, got 2.5" LABELS unit
               COMMAND ${_tp_bin} serve -m x.gguf --temp 2.5)
tp_expect_test(server.cli_bad_top_p RC 2 REGEX "--top-p 0: want a number above 0 and at most 1" LABELS unit
               COMMAND ${_tp_bin} serve -m x.gguf --top-p 0)
tp_expect_test(server.cli_bad_seed RC 2 REGEX "--seed 12x: want an integer from 0 to 18446744073709551615, or -1"
               LABELS unit COMMAND ${_tp_bin} serve -m x.gguf --seed 12x)
tp_expect_test(server.cli_bad_n_predict RC 2 REGEX "--n-predict 0: want a token count of at least 1, or -1"
               LABELS unit COMMAND ${_tp_bin} serve -m x.gguf -n 0)
tp_expect_test(server.cli_bad_host RC 1 REGEX "not an IPv4 address" LABELS unit
               COMMAND ${_tp_bin} serve -m ${_tp_stories} --host not-an-ip --port 0)
tp_expect_test(server.cli_missing_model RC 1 REGEX "tpserve serve: .*/nonexistent/model.gguf" LABELS unit
               COMMAND ${_tp_bin} serve -m /nonexistent/model.gguf --port 0)
tp_expect_test(server.cli_bad_cors_origin RC 1 REGEX "--cors-origin 'https://app.example.com/path': want '\\*' or an origin"
               LABELS unit COMMAND ${_tp_bin} serve -m ${_tp_stories} --port 0 --cors-origin https://app.example.com/path)
# --on-rank-loss replan needs a group that can form smaller in place: the ring backend (docs/recovery.md)
tp_expect_test(server.cli_replan_mpi RC 2 REGEX "--on-rank-loss replan does not apply to --backend mpi: an MPI job cannot re-form in place"
               LABELS unit COMMAND env TP_BACKEND=mpi TP_WORLD_SIZE=2 TP_RANK=0
                       ${_tp_bin} serve -m ${_tp_stories} --port 0 --on-rank-loss replan)
tp_expect_test(server.cli_replan_rdma RC 2 REGEX "--on-rank-loss replan does not apply to --backend rdma: only the ring backend"
               LABELS unit COMMAND env TP_BACKEND=rdma TP_WORLD_SIZE=2 TP_RANK=0
                       ${_tp_bin} serve -m ${_tp_stories} --port 0 --on-rank-loss replan)
tp_expect_test(server.cli_mem_budget_small RC 1 REGEX "--mem-budget 1000 is too small for one request of --max-body 1048576"
               LABELS unit COMMAND ${_tp_bin} serve -m ${_tp_stories} --port 0 --mem-budget 1000)

# HTTP abuse (slow clients, connection caps, framing, HEAD, Bearer case,
# /metrics counting, /tokenize memory bound, memory budget): real servers on
# 127.0.0.1, about 40 s.  Passes or fails by its exit status.
find_program(TP_PYTHON3 python3)
if(TP_PYTHON3)
  add_test(NAME server.http_abuse
           COMMAND ${TP_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/server/http_abuse.py $<TARGET_FILE:tpserve>
                   ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
  # Its time bounds (/health within 1 s under 300 trickling connections, stalled bodies cut 3 s after a 2 s
  # deadline) hold beside another test, so it does not run alone.
  set_tests_properties(server.http_abuse PROPERTIES LABELS "model" TIMEOUT 600)
  # Rank loss and recovery under `tpserve launch --restart` (docs/recovery.md): SIGKILL a worker under load
  # from 4 streaming clients, SIGSTOP/SIGCONT one (short and long), kill one 20 times (rank 0 RSS flat);
  # --on-rank-loss replan: 3 ranks go on as 2 (then 1) with the same greedy text, or wait and say why.
  # Real ranks on 127.0.0.1; each passes or fails by its exit status.
  set(_scs kill_2 kill_3 stop_2 stop_3 repeat_2 rank0_3 hand_2 replan_3 nofit_3 blame_4)
  if(TP_WITH_MPI AND TP_MPIEXEC)
    list(APPEND _scs mpi_2)  # a killed rank ends an mpirun job quickly, non-zero, saying why
  endif()
  foreach(_sc ${_scs})
    string(REPLACE "_" ";" _args ${_sc})
    add_test(NAME server.recovery_${_sc}
             COMMAND ${TP_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/server/recovery_test.py $<TARGET_FILE:tpserve>
                     ${PROJECT_SOURCE_DIR}/models/stories260K.gguf ${_args})
    set_tests_properties(server.recovery_${_sc} PROPERTIES LABELS "multirank;model" TIMEOUT 300 SKIP_RETURN_CODE 77)
    # Which rank /health names after a SIGSTOP is a race between op timeouts (stop, nofit, blame), and with 3 or
    # more ranks a killed rank's neighbours may give up at the same time as rank 0 (kill_3, replan_3): those run
    # alone, no other test competing for the 2 cores.  The rest (2 ranks, or rank 0 killed) name the one worker
    # there is or none, and spend most of their time waiting for restarts: they run beside other tests.
    if(NOT _sc MATCHES "^(kill_2|repeat_2|rank0_3|hand_2|mpi_2)$")
      set_tests_properties(server.recovery_${_sc} PROPERTIES RUN_SERIAL TRUE)
    endif()
  endforeach()
endif()

# response_format: >= 100 JSON schemas x seeds, greedy, logit_bias, streamed and not, forced tool
# calls, the openai client's parse() with zod - every reply validated by ajv; unsupported keywords
# refused.  At 1 and 2 ranks (the token mask is applied on each rank's vocabulary slice), on
# stories260K and on random-weight models with the Llama 3 / Qwen3 tokenizer (128K / 152K tokens).
# Then the Vercel AI SDK and LangChain (clients.mjs) against the same server where both run.
# The whole corpus with 3 seeds, greedy and logit_bias runs at 1 rank; at 2 ranks one seed (the token
# mask on each rank's vocabulary slice is what 2 ranks add); with the 128K / 152K vocabularies the
# seeded replies only (the mask over a real BPE vocabulary is what they add).  The Qwen3 server also
# answers think_e2e.mjs (<think> replies split into reasoning_content and content).
foreach(_tp_case "stories_1rank|${PROJECT_SOURCE_DIR}/models/stories260K.gguf|1|structured.mjs,clients.mjs"
                 "stories_2rank|${PROJECT_SOURCE_DIR}/models/stories260K.gguf|2|structured.mjs"
                 "llama3_1rank_shared|synth:llama3|1|structured.mjs,clients.mjs"
                 "qwen3_1rank_shared|synth:qwen3|1|structured.mjs,think_e2e.mjs")
  string(REPLACE "|" ";" _tp_case "${_tp_case}")
  list(GET _tp_case 0 _n)
  list(GET _tp_case 1 _m)
  list(GET _tp_case 2 _r)
  list(GET _tp_case 3 _s)
  add_test(NAME server.node_structured_${_n}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_structured.sh $<TARGET_FILE:tpserve> ${_m} ${_r} ${_s})
  set_tests_properties(server.node_structured_${_n} PROPERTIES LABELS "model" TIMEOUT 600
                       SKIP_RETURN_CODE 77 ENVIRONMENT "TP_SHARED_DIR=${TP_SHARED_DIR}")
  if(_r GREATER 1)
    set_tests_properties(server.node_structured_${_n} PROPERTIES ENVIRONMENT
                         "TP_SHARED_DIR=${TP_SHARED_DIR};TP_STRUCT_SEEDS=1")
  endif()
  if(_m MATCHES "^synth:")
    # random weights at a 128K+ vocabulary: one seed keeps it short
    set_tests_properties(server.node_structured_${_n} PROPERTIES ENVIRONMENT
                         "TP_SHARED_DIR=${TP_SHARED_DIR};TP_STRUCT_SEEDS=1;TP_STRUCT_VARIANTS=sampled;TP_STRUCT_MAX_TOKENS=300")
  endif()
endforeach()

# tool_choice "auto" (tests/node/tools.mjs): calls pushed by logit_bias on the format's marker token
# are made under the tools' grammar, parsed into tool_calls and streamed as fragments; raw HTTP, the
# openai stream helper, the Vercel AI SDK streamText with tools, LangChain bindTools.  Hermes
# (Qwen3's template) at 1 and 2 ranks; Llama 3.1 (the Llama 3 tokenizer served with its template).
foreach(_tp_case "qwen3_1rank|1|qwen3||<tool_call>|1" "qwen3_2rank|2|qwen3||<tool_call>|1"
                 "llama31_1rank|1|llama3|llama3.1|{|0")
  string(REPLACE "|" ";" _tp_case "${_tp_case}")
  list(GET _tp_case 0 _n)
  list(GET _tp_case 1 _r)
  list(GET _tp_case 2 _m)
  list(GET _tp_case 3 _t)
  list(GET _tp_case 4 _k)
  list(GET _tp_case 5 _p)
  add_test(NAME server.node_tools_${_n}_shared
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_structured.sh $<TARGET_FILE:tpserve> synth:${_m} ${_r} tools.mjs)
  set_tests_properties(server.node_tools_${_n}_shared PROPERTIES LABELS "model" TIMEOUT 400 SKIP_RETURN_CODE 77
                       ENVIRONMENT
                       "TP_SHARED_DIR=${TP_SHARED_DIR};TP_SERVE_CHAT_TEMPLATE=${_t};TP_TOOLS_MARKER=${_k};TP_TOOLS_PARALLEL=${_p}")
endforeach()

# Anthropic Messages, OpenAI Responses and Ollama through their official npm clients
# (tests/node/apis.mjs), at 1 and 2 ranks.
foreach(_r 1 2)
  add_test(NAME server.node_apis_${_r}rank
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_structured.sh $<TARGET_FILE:tpserve>
                   ${PROJECT_SOURCE_DIR}/models/stories260K.gguf ${_r} apis.mjs)
  set_tests_properties(server.node_apis_${_r}rank PROPERTIES LABELS "model" TIMEOUT 400 SKIP_RETURN_CODE 77)
endforeach()

# Tool calls through Messages, Responses and Ollama (tests/node/apis_tools.mjs): tool_choice auto
# answered as each API's tool blocks / items, streamed and not, equal to chat completions' call;
# tool turns in the history rendered as chat completions renders them; GET/DELETE /v1/responses/{id}.
# The Qwen3 template's Hermes format on a random-weight model, pushed into calls by the server-wide
# --logit-bias on <tool_call> (token 151657 of the Qwen3 vocabulary), at 1 and 2 ranks.
# Then the OpenAI Agents SDK (tests/node/agents/agents.mjs): an agent's full tool round trip over the
# Responses API (the SDK takes a response cut by max_output_tokens for a failure: a slight --logit-bias
# on <|im_end|>, 151645, makes the random-weight model end its final answer); and Codex CLI (agents/codex.mjs) completing one `codex exec` turn (its prompt of
# ~10K tokens needs a larger context).  Skipped (77) without node, npm, the npm packages or ../shared.
foreach(_r 1 2)
  add_test(NAME server.node_apis_tools_${_r}rank_shared
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_structured.sh $<TARGET_FILE:tpserve> synth:qwen3 ${_r}
                   apis_tools.mjs)
  set_tests_properties(server.node_apis_tools_${_r}rank_shared PROPERTIES LABELS "model" TIMEOUT 400
                       SKIP_RETURN_CODE 77 ENVIRONMENT
                       "TP_SHARED_DIR=${TP_SHARED_DIR};TP_SERVE_ARGS=--logit-bias 151657+100")
  add_test(NAME server.node_agents_${_r}rank_shared
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_structured.sh $<TARGET_FILE:tpserve> synth:qwen3 ${_r}
                   agents/agents.mjs)
  set_tests_properties(server.node_agents_${_r}rank_shared PROPERTIES LABELS "model" TIMEOUT 400
                       SKIP_RETURN_CODE 77 ENVIRONMENT
                       "TP_SHARED_DIR=${TP_SHARED_DIR};TP_SERVE_ARGS=--logit-bias 151645+0.6")
endforeach()
add_test(NAME server.node_codex_shared
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_structured.sh $<TARGET_FILE:tpserve> synth:qwen3 1
                 agents/codex.mjs)
set_tests_properties(server.node_codex_shared PROPERTIES LABELS "model" TIMEOUT 600 SKIP_RETURN_CODE 77
                     ENVIRONMENT "TP_SHARED_DIR=${TP_SHARED_DIR};TP_SERVE_ARGS=-c 16384 --logit-bias 151645+7")

# The web page (GET /): headless Chromium through puppeteer-core against real
# servers at 1 and 2 ranks and a stand-in server (tests/node/web_test.mjs);
# about 10 s.  Skipped (77) without node, npm, Chromium or the npm packages.
add_test(NAME server.web_page
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_web.sh $<TARGET_FILE:tpserve> ${PROJECT_SOURCE_DIR})
set_tests_properties(server.web_page PROPERTIES LABELS "model;multirank" TIMEOUT 300 SKIP_RETURN_CODE 77)

# The harmony format (gpt-oss) end to end: prompt token counts against tiktoken of the real
# template's rendering, streamed vs non-streamed channel splits, refusals (tests/node/harmony_e2e.mjs
# on a random-weight model with the o200k vocabulary).  Skipped (77) without node or the npm packages.
add_test(NAME server.node_harmony COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_harmony.sh $<TARGET_FILE:tpserve>)
set_tests_properties(server.node_harmony PROPERTIES LABELS "model" TIMEOUT 400 SKIP_RETURN_CODE 77)
