# tests/model.cmake - fuzzing of the model file parsers, and a synth + info command-line check.
#
# Each fuzz target NAME (tests/fuzz/NAME.c) is registered twice (tp_fuzz_target below):
#   model.NAME_replay  (unit)  plain driver (tests/fuzz/fuzz_driver.c): the handcrafted seeds (valid ones
#                              accepted, corrupt ones refused) + random mutations, in whatever build (the
#                              ASan/UBSan build makes it a sanitizer check): 5 s, 2 s under the sanitizers
#   model.NAME         (slow)  libFuzzer + ASan/UBSan build with clang, 30 s bounded on the seed corpus, when
#                              clang with -fsanitize=fuzzer is available (else not registered, with a note).
#                              Registered in the build without TP_SANITIZE only: the libFuzzer binary is
#                              built the same way (its own ASan/UBSan) in every build tree, so CI, which
#                              runs both trees, fuzzes once.
# Targets: fuzz_gguf (GGUF reader), fuzz_safetensors (safetensors reader), fuzz_hf_json (config.json with the
# MLX quantization block, model.safetensors.index.json; tokenizer.json / tokenizer_config.json in the replay
# build only, which links the whole model library).

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
  find_library(TP_CJSON_LIB NAMES cjson)
else()
  message(STATUS "clang with -fsanitize=fuzzer not found: the libFuzzer targets (model.fuzz_*) are not "
                 "registered; model.fuzz_*_replay still run the seeds and random mutations")
endif()

# tp_fuzz_target(NAME SOURCES <library sources the libFuzzer build compiles> DEPENDS <headers>)
function(tp_fuzz_target name)
  cmake_parse_arguments(F "" "" "SOURCES;DEPENDS" ${ARGN})
  set(_fuzz_c ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${name}.c)
  add_executable(${name}_replay ${_fuzz_c} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_driver.c)
  target_compile_definitions(${name}_replay PRIVATE TP_FUZZ_STANDALONE)
  target_link_libraries(${name}_replay PRIVATE tp_model)
  if(TP_SANITIZE)
    set(_mutate_s 2) # instrumented: fewer mutations per second, and the libFuzzer run is the other tree's
  else()
    set(_mutate_s 5)
  endif()
  tp_expect_test(model.${name}_replay RC 0 REGEX "no crash" LABELS unit TIMEOUT 60
                 COMMAND $<TARGET_FILE:${name}_replay> --mutate ${_mutate_s})
  if(NOT _tp_fuzz_ok OR TP_SANITIZE)
    return()
  endif()
  set(_srcs ${_fuzz_c} ${F_SOURCES} ${PROJECT_SOURCE_DIR}/common/status.c ${PROJECT_SOURCE_DIR}/common/log.c
            ${PROJECT_SOURCE_DIR}/common/util.c)
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/${name}_libfuzzer) # not the target's own name: Ninja refuses a file named as a target
  add_custom_command(
    OUTPUT ${_out}
    COMMAND ${_tp_clang} -std=c11 -D_DEFAULT_SOURCE -O1 -g -fno-omit-frame-pointer
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -I${PROJECT_SOURCE_DIR}/common/include -I${PROJECT_SOURCE_DIR}/model/include
            -I${PROJECT_SOURCE_DIR}/model -I${PROJECT_SOURCE_DIR} ${_srcs} ${TP_CJSON_LIB} -lm -o ${_out}
    DEPENDS ${_srcs} ${F_DEPENDS} ${PROJECT_SOURCE_DIR}/common/include/common/common.h
    COMMENT "Building libFuzzer target ${name} with ${_tp_clang}")
  add_custom_target(${name} ALL DEPENDS ${_out})
  set(_corpus ${CMAKE_CURRENT_BINARY_DIR}/${name}_corpus)
  add_test(NAME model.${name}_seeds COMMAND ${name}_replay --seeds ${_corpus})
  set_tests_properties(model.${name}_seeds PROPERTIES LABELS slow TIMEOUT 30 FIXTURES_SETUP ${name}_corpus)
  add_test(NAME model.${name}
           COMMAND ${_out} -max_total_time=30 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 ${_corpus})
  set_tests_properties(model.${name} PROPERTIES LABELS slow TIMEOUT 120 FIXTURES_REQUIRED ${name}_corpus
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1")
endfunction()

set(_tp_mf ${PROJECT_SOURCE_DIR}/model/format)
set(_tp_mi ${PROJECT_SOURCE_DIR}/model/include/model)
tp_fuzz_target(fuzz_gguf SOURCES ${_tp_mf}/gguf.c DEPENDS ${_tp_mi}/gguf.h)
tp_fuzz_target(fuzz_safetensors SOURCES ${_tp_mf}/safetensors.c DEPENDS ${_tp_mi}/safetensors.h)
tp_fuzz_target(fuzz_hf_json SOURCES ${_tp_mf}/hf_config.c ${_tp_mf}/json_field.c ${_tp_mf}/safetensors.c
               DEPENDS ${_tp_mi}/safetensors.h ${_tp_mi}/tensor_source.h)

# `tpserve synth --type q4_k_m` then `tpserve info`: llama.cpp's per-tensor mix on a small shape
# whose rows are whole 256-value super-blocks (4 layers: Q6_K attn_v / ffn_down on layers 2 and 3,
# Q6_K output head, Q4_K elsewhere) and the file type read back.
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/kq_shapes.json
     "{\"shapes\": [{\"name\": \"test-kq\", \"arch\": \"llama\", \"n_embd\": 256, \"n_layer\": 4, \"n_head\": 4, "
     "\"n_head_kv\": 2, \"n_ff\": 512, \"n_vocab\": 512, \"n_ctx\": 256, \"rope_theta\": 10000.0, "
     "\"norm_eps\": 1e-05, \"tied\": false, \"source\": \"made up for tests\"}]}\n")
tp_expect_test(model.cli_synth_q4_k_m RC 0 LABELS unit TIMEOUT 60
  REGEX "tensors     39: f32 x9 \\([0-9.]+ MiB\\) q4_k x25 \\([0-9.]+ MiB\\) q6_k x5 \\([0-9.]+ MiB\\).file type   Q4_K_M \\(general.file_type 15\\)"
  COMMAND sh -c "\"$<TARGET_FILE:tpserve>\" synth --shapes '${CMAKE_CURRENT_BINARY_DIR}/kq_shapes.json' --shape test-kq --type q4_k_m -q -o '${CMAKE_CURRENT_BINARY_DIR}/kq_cli.gguf' && \"$<TARGET_FILE:tpserve>\" info '${CMAKE_CURRENT_BINARY_DIR}/kq_cli.gguf'")
