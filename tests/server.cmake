# Extra server tests: the official openai npm client (node) against a live
# server, and the chat-template oracle re-rendered with @huggingface/jinja.
# Skips with a reason when node/npm are unavailable.
add_test(NAME server.node_conformance
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/node/run_conformance.sh $<TARGET_FILE:tpserve>
                 ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
set_tests_properties(server.node_conformance PROPERTIES LABELS "model" TIMEOUT 400
                     ENVIRONMENT "TP_SHARED_DIR=${TP_SHARED_DIR}")
