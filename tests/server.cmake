# Extra server tests: the official openai npm client (node) against a live
# server, and the chat-template oracle re-rendered with @huggingface/jinja.
# Skips with a reason when node/npm are unavailable.
add_test(NAME server.node_conformance
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_conformance.sh $<TARGET_FILE:tpserve>
                 ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
set_tests_properties(server.node_conformance PROPERTIES LABELS "model" TIMEOUT 400
                     ENVIRONMENT "TP_SHARED_DIR=${TP_SHARED_DIR}")

# Command-line refusals of `tpserve serve` (one-line errors, no hang).
add_test(NAME server.cli_no_model COMMAND tpserve serve --port 0)
set_tests_properties(server.cli_no_model PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "-m MODEL is required")
add_test(NAME server.cli_bad_template
         COMMAND tpserve serve -m ${PROJECT_SOURCE_DIR}/models/stories260K.gguf --port 0 --chat-template jinja2000)
set_tests_properties(server.cli_bad_template PROPERTIES LABELS unit TIMEOUT 30
                     PASS_REGULAR_EXPRESSION "--chat-template jinja2000: unknown; known templates: llama2, llama3")
add_test(NAME server.cli_missing_key_file
         COMMAND tpserve serve -m ${PROJECT_SOURCE_DIR}/models/stories260K.gguf --port 0 --api-key-file /nonexistent/key)
set_tests_properties(server.cli_missing_key_file PROPERTIES LABELS unit TIMEOUT 30
                     PASS_REGULAR_EXPRESSION "--api-key-file /nonexistent/key: cannot read a key")
add_test(NAME server.cli_bad_log_format COMMAND tpserve serve -m x.gguf --log-format yaml)
set_tests_properties(server.cli_bad_log_format PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "want text or json")
add_test(NAME server.cli_bad_host
         COMMAND tpserve serve -m ${PROJECT_SOURCE_DIR}/models/stories260K.gguf --host not-an-ip --port 0)
set_tests_properties(server.cli_bad_host PROPERTIES LABELS unit TIMEOUT 30 PASS_REGULAR_EXPRESSION "not an IPv4 address")
add_test(NAME server.cli_mem_budget_small
         COMMAND tpserve serve -m ${PROJECT_SOURCE_DIR}/models/stories260K.gguf --port 0 --mem-budget 1000)
set_tests_properties(server.cli_mem_budget_small PROPERTIES LABELS unit TIMEOUT 30
                     PASS_REGULAR_EXPRESSION "--mem-budget 1000 is too small for one request of --max-body 1048576")
add_test(NAME server.cli_missing_model COMMAND tpserve serve -m /nonexistent/model.gguf --port 0)
set_tests_properties(server.cli_missing_model PROPERTIES LABELS unit TIMEOUT 30 WILL_FAIL TRUE)
add_test(NAME server.cli_missing_model_message COMMAND tpserve serve -m /nonexistent/model.gguf --port 0)
set_tests_properties(server.cli_missing_model_message PROPERTIES LABELS unit TIMEOUT 30
                     PASS_REGULAR_EXPRESSION "tpserve serve: .*/nonexistent/model.gguf")

# HTTP abuse (slow clients, connection caps, framing, HEAD, Bearer case,
# /metrics counting, /tokenize memory bound, memory budget): real servers on
# 127.0.0.1, about 40 s.  Passes or fails by its exit status.
find_program(TP_PYTHON3 python3)
if(TP_PYTHON3)
  add_test(NAME server.http_abuse
           COMMAND ${TP_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/server/http_abuse.py $<TARGET_FILE:tpserve>
                   ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
  set_tests_properties(server.http_abuse PROPERTIES LABELS "model" TIMEOUT 600 RUN_SERIAL TRUE)
endif()

# The web page (GET /): headless Chromium through puppeteer-core against real
# servers at 1 and 2 ranks and a stand-in server (tests/node/web_test.mjs);
# about 10 s.  Skipped (77) without node, npm, Chromium or the npm packages.
add_test(NAME server.web_page
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_web.sh $<TARGET_FILE:tpserve> ${PROJECT_SOURCE_DIR})
set_tests_properties(server.web_page PROPERTIES LABELS "model;multirank" TIMEOUT 300 SKIP_RETURN_CODE 77)
