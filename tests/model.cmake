# tests/model.cmake - fuzzing of the GGUF reader (tests/fuzz/fuzz_gguf.c).
#   model.fuzz_gguf_replay  (unit)  plain driver: handcrafted seeds + 5 s of random mutations,
#                                   in whatever build (the ASan/UBSan build makes it a sanitizer check)
#   model.fuzz_gguf         (slow)  libFuzzer + ASan/UBSan build with clang, 30 s bounded, when clang
#                                   with -fsanitize=fuzzer is available (else not registered, with a note)
add_executable(fuzz_gguf_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_gguf.c ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_driver.c)
target_compile_definitions(fuzz_gguf_replay PRIVATE TP_FUZZ_STANDALONE)
target_link_libraries(fuzz_gguf_replay PRIVATE tp_model)
add_test(NAME model.fuzz_gguf_replay COMMAND fuzz_gguf_replay --mutate 5)
set_tests_properties(model.fuzz_gguf_replay PROPERTIES LABELS unit TIMEOUT 60
  PASS_REGULAR_EXPRESSION "no crash")

set(TP_FUZZ_CLANG "" CACHE FILEPATH "clang used to build the libFuzzer target (empty: search)")
if(NOT TP_FUZZ_CLANG)
  find_program(TP_FUZZ_CLANG_FOUND NAMES clang clang-14 clang-15 clang-16 clang-17 clang-18
               PATHS /usr/bin /usr/local/bin /opt/homebrew/opt/llvm/bin)
  if(TP_FUZZ_CLANG_FOUND)
    set(_tp_clang ${TP_FUZZ_CLANG_FOUND})
  endif()
else()
  set(_tp_clang ${TP_FUZZ_CLANG})
endif()
set(_tp_fuzz_ok FALSE)
if(_tp_clang)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe.c
       "#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\n"
       "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
  execute_process(COMMAND ${_tp_clang} -fsanitize=fuzzer,address,undefined ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe.c
                          -o ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe
                  RESULT_VARIABLE _tp_fuzz_rc OUTPUT_QUIET ERROR_QUIET)
  if(_tp_fuzz_rc EQUAL 0)
    set(_tp_fuzz_ok TRUE)
  endif()
endif()
if(_tp_fuzz_ok)
  set(_src ${PROJECT_SOURCE_DIR})
  set(_fuzz_srcs ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_gguf.c ${_src}/model/gguf.c ${_src}/common/status.c
                 ${_src}/common/log.c)
  add_custom_command(
    OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/fuzz_gguf
    COMMAND ${_tp_clang} -std=c11 -D_DEFAULT_SOURCE -O1 -g -fno-omit-frame-pointer
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -I${_src} ${_fuzz_srcs} -o ${CMAKE_CURRENT_BINARY_DIR}/fuzz_gguf
    DEPENDS ${_fuzz_srcs} ${_src}/model/gguf.h ${_src}/common/common.h
    COMMENT "Building libFuzzer target fuzz_gguf with ${_tp_clang}")
  add_custom_target(fuzz_gguf ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/fuzz_gguf)
  set(_corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz_gguf_corpus)
  add_test(NAME model.fuzz_gguf_seeds COMMAND fuzz_gguf_replay --seeds ${_corpus})
  set_tests_properties(model.fuzz_gguf_seeds PROPERTIES LABELS slow TIMEOUT 30 FIXTURES_SETUP fuzz_gguf_corpus)
  add_test(NAME model.fuzz_gguf
           COMMAND ${CMAKE_CURRENT_BINARY_DIR}/fuzz_gguf -max_total_time=30 -rss_limit_mb=2048 -max_len=4096
                   -print_final_stats=1 ${_corpus})
  set_tests_properties(model.fuzz_gguf PROPERTIES LABELS slow TIMEOUT 120 FIXTURES_REQUIRED fuzz_gguf_corpus
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1")
else()
  message(STATUS "clang with -fsanitize=fuzzer not found: model.fuzz_gguf (libFuzzer) is not registered; "
                 "model.fuzz_gguf_replay still runs the seeds and random mutations")
endif()

# ---- safetensors reader (tests/fuzz/fuzz_safetensors.c), same scheme as the GGUF fuzzing above:
#   model.fuzz_safetensors_replay  (unit)  handcrafted seeds (each corrupt one must be refused) + 5 s of mutations
#   model.fuzz_safetensors         (slow)  libFuzzer + ASan/UBSan with clang, 30 s bounded, when available
add_executable(fuzz_safetensors_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_safetensors.c ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_driver.c)
target_compile_definitions(fuzz_safetensors_replay PRIVATE TP_FUZZ_STANDALONE)
target_link_libraries(fuzz_safetensors_replay PRIVATE tp_model)
add_test(NAME model.fuzz_safetensors_replay COMMAND fuzz_safetensors_replay --mutate 5)
set_tests_properties(model.fuzz_safetensors_replay PROPERTIES LABELS unit TIMEOUT 60
  PASS_REGULAR_EXPRESSION "no crash")
if(_tp_fuzz_ok)
  find_library(TP_CJSON_LIB NAMES cjson)
  set(_st_srcs ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_safetensors.c ${PROJECT_SOURCE_DIR}/model/safetensors.c
               ${PROJECT_SOURCE_DIR}/common/status.c ${PROJECT_SOURCE_DIR}/common/log.c)
  add_custom_command(
    OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/fuzz_safetensors
    COMMAND ${_tp_clang} -std=c11 -D_DEFAULT_SOURCE -O1 -g -fno-omit-frame-pointer
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -I${PROJECT_SOURCE_DIR} ${_st_srcs} ${TP_CJSON_LIB} -o ${CMAKE_CURRENT_BINARY_DIR}/fuzz_safetensors
    DEPENDS ${_st_srcs} ${PROJECT_SOURCE_DIR}/model/safetensors.h ${PROJECT_SOURCE_DIR}/common/common.h
    COMMENT "Building libFuzzer target fuzz_safetensors with ${_tp_clang}")
  add_custom_target(fuzz_safetensors ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/fuzz_safetensors)
  set(_st_corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz_safetensors_corpus)
  add_test(NAME model.fuzz_safetensors_seeds COMMAND fuzz_safetensors_replay --seeds ${_st_corpus})
  set_tests_properties(model.fuzz_safetensors_seeds PROPERTIES LABELS slow TIMEOUT 30
    FIXTURES_SETUP fuzz_safetensors_corpus)
  add_test(NAME model.fuzz_safetensors
           COMMAND ${CMAKE_CURRENT_BINARY_DIR}/fuzz_safetensors -max_total_time=30 -rss_limit_mb=2048 -max_len=4096
                   -print_final_stats=1 ${_st_corpus})
  set_tests_properties(model.fuzz_safetensors PROPERTIES LABELS slow TIMEOUT 120
    FIXTURES_REQUIRED fuzz_safetensors_corpus ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1")
endif()

# ---- JSON files of HF / MLX directories (tests/fuzz/fuzz_hf_json.c): config.json (+ the MLX
# quantization block in the replay build) and model.safetensors.index.json, same scheme:
#   model.fuzz_hf_json_replay  (unit)  seeds (valid accepted, corrupt refused) + 5 s of mutations
#   model.fuzz_hf_json         (slow)  libFuzzer + ASan/UBSan with clang, 30 s bounded, when available
add_executable(fuzz_hf_json_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_hf_json.c ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_driver.c)
target_compile_definitions(fuzz_hf_json_replay PRIVATE TP_FUZZ_STANDALONE)
target_link_libraries(fuzz_hf_json_replay PRIVATE tp_model)
add_test(NAME model.fuzz_hf_json_replay COMMAND fuzz_hf_json_replay --mutate 5)
set_tests_properties(model.fuzz_hf_json_replay PROPERTIES LABELS unit TIMEOUT 60
  PASS_REGULAR_EXPRESSION "no crash")
if(_tp_fuzz_ok)
  set(_hj_srcs ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_hf_json.c ${PROJECT_SOURCE_DIR}/model/hf_config.c
               ${PROJECT_SOURCE_DIR}/model/safetensors.c ${PROJECT_SOURCE_DIR}/common/status.c
               ${PROJECT_SOURCE_DIR}/common/log.c)
  add_custom_command(
    OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/fuzz_hf_json
    COMMAND ${_tp_clang} -std=c11 -D_DEFAULT_SOURCE -O1 -g -fno-omit-frame-pointer
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -I${PROJECT_SOURCE_DIR} ${_hj_srcs} ${TP_CJSON_LIB} -lm -o ${CMAKE_CURRENT_BINARY_DIR}/fuzz_hf_json
    DEPENDS ${_hj_srcs} ${PROJECT_SOURCE_DIR}/model/safetensors.h ${PROJECT_SOURCE_DIR}/model/tsrc_impl.h
            ${PROJECT_SOURCE_DIR}/common/common.h
    COMMENT "Building libFuzzer target fuzz_hf_json with ${_tp_clang}")
  add_custom_target(fuzz_hf_json ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/fuzz_hf_json)
  set(_hj_corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz_hf_json_corpus)
  add_test(NAME model.fuzz_hf_json_seeds COMMAND fuzz_hf_json_replay --seeds ${_hj_corpus})
  set_tests_properties(model.fuzz_hf_json_seeds PROPERTIES LABELS slow TIMEOUT 30
    FIXTURES_SETUP fuzz_hf_json_corpus)
  add_test(NAME model.fuzz_hf_json
           COMMAND ${CMAKE_CURRENT_BINARY_DIR}/fuzz_hf_json -max_total_time=30 -rss_limit_mb=2048 -max_len=4096
                   -print_final_stats=1 ${_hj_corpus})
  set_tests_properties(model.fuzz_hf_json PROPERTIES LABELS slow TIMEOUT 120
    FIXTURES_REQUIRED fuzz_hf_json_corpus ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1")
endif()

# `tpserve synth --type q4_k_m` then `tpserve info`: llama.cpp's per-tensor mix on a small shape
# whose rows are whole 256-value super-blocks (4 layers: Q6_K attn_v / ffn_down on layers 2 and 3,
# Q6_K output head, Q4_K elsewhere) and the file type read back.
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/kq_shapes.json
     "{\"shapes\": [{\"name\": \"test-kq\", \"arch\": \"llama\", \"n_embd\": 256, \"n_layer\": 4, \"n_head\": 4, "
     "\"n_head_kv\": 2, \"n_ff\": 512, \"n_vocab\": 512, \"n_ctx\": 256, \"rope_theta\": 10000.0, "
     "\"norm_eps\": 1e-05, \"tied\": false, \"source\": \"made up for tests\"}]}\n")
add_test(NAME model.cli_synth_q4_k_m
         COMMAND sh -c "\"$<TARGET_FILE:tpserve>\" synth --shapes '${CMAKE_CURRENT_BINARY_DIR}/kq_shapes.json' --shape test-kq --type q4_k_m -q -o '${CMAKE_CURRENT_BINARY_DIR}/kq_cli.gguf' && \"$<TARGET_FILE:tpserve>\" info '${CMAKE_CURRENT_BINARY_DIR}/kq_cli.gguf'")
set_tests_properties(model.cli_synth_q4_k_m PROPERTIES LABELS unit TIMEOUT 60
  PASS_REGULAR_EXPRESSION "tensors     39: f32 x9 \\([0-9.]+ MiB\\) q4_k x25 \\([0-9.]+ MiB\\) q6_k x5 \\([0-9.]+ MiB\\).file type   Q4_K_M \\(general.file_type 15\\)")
