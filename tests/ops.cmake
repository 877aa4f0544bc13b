# tests/ops.cmake - operations: simulated multi-host network (scripts/netsim),
# deployment configs (hostfiles, Kubernetes manifests), capacity planner.
# Scripted tests exit 77 to skip (missing namespaces / YAML parser) with a reason.
add_test(NAME ops.netsim COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ops/netsim_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(ops.netsim PROPERTIES LABELS "unit;multirank" TIMEOUT 60 SKIP_RETURN_CODE 77
  RUN_SERIAL TRUE)
# C suites in tests/ops/*.c (capacity planner): test_ops, one ctest entry per suite.
tp_add_suite(ops LIBS tp_parallel)
# Hostfile examples + Kubernetes manifests: valid, consistent, and every tpserve flag accepted by the binary.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME ops.configs COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/ops/configs_test.py
           ${PROJECT_SOURCE_DIR} $<TARGET_FILE:tpserve>)
  set_tests_properties(ops.configs PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)
else()
  message(STATUS "python3 not found: ops.configs (hostfile / Kubernetes manifest checks) is not registered")
endif()
# tpserve launch --hostfile (ssh path, ssh replaced by tests/ops/fake_ssh.sh): mechanics, then 2 and 4
# ranks of tpserve serve on simulated hosts (127.0.0.1 without namespaces), one killed.
add_test(NAME ops.launch COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ops/launch_test.sh ${PROJECT_SOURCE_DIR}
         $<TARGET_FILE:tpserve>)
set_tests_properties(ops.launch PROPERTIES LABELS "multirank;model" TIMEOUT 180 SKIP_RETURN_CODE 77)
if(TP_PYTHON3)
  # launch --hostfile --restart over ssh (fake_ssh.sh): a killed worker is restarted through ssh and rejoins
  # with the same greedy output; with --on-rank-loss replan and its host down, rank 0 goes on with 2 of 3
  # ranks and the launcher does not restart the rank that was left out.
  add_test(NAME ops.launch_restart COMMAND ${TP_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/ops/launch_restart_test.py
                                           ${PROJECT_SOURCE_DIR} $<TARGET_FILE:tpserve>)
  set_tests_properties(ops.launch_restart PROPERTIES LABELS "multirank;model" TIMEOUT 240 SKIP_RETURN_CODE 77
                       RUN_SERIAL TRUE)
endif()
# tpserve plan end to end through the command line: a 70B model over three unequal nodes that fits, and one that does not.
tp_expect_test(ops.plan_70b_fits RC 0 REGEX "Fits\\. Serve it with: --shard-weights 3,2,1" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> plan --shape llama3-70b --type q4_0 --nodes 192G,128G,64G --link tb5)
tp_expect_test(ops.plan_70b_refused RC 1 REGEX "Refused: does not fit: .* short by 12\\.6 GiB" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> plan --shape llama3-70b --type q4_0 --nodes 16G,16G)
# Where a draft model would run (tp_parallel_draft_placement): Llama-3.1-8B drafting for a 70B over 4 nodes with
# 15 us all_sums (RDMA) is sharded; Llama-3.2-1B over 2 nodes with 260 us all_sums (TCP) stays on rank 0.
tp_expect_test(ops.plan_draft_sharded RC 0
               REGEX "Draft model llama3\\.1-8b: draft sharded, sharded is at least 10% faster: a drafted token costs 42\\.22 ms on rank 0 .* against 11\\.55 ms sharded over 4 ranks"
               LABELS unit
               COMMAND $<TARGET_FILE:tpserve> plan --shape llama3.1-70b --type q4_0 --nodes 192G,192G,192G,192G
                       --allsum-us 15 --mem-bw 100 --efficiency 1 --draft-shape llama3.1-8b)
tp_expect_test(ops.plan_draft_rank0 RC 0
               REGEX "Draft model llama3\\.2-1b: draft on rank 0, sharded is not at least 10% faster"
               LABELS unit
               COMMAND $<TARGET_FILE:tpserve> plan --shape llama3.1-70b --type q4_0 --nodes 192G,192G --allsum-us 260
                       --draft-shape llama3.2-1b)
# tpserve bench nodes writes its four outputs (bundled model, 1 and 2 nodes, 10gbe).
add_test(NAME ops.bench_nodes COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ops/bench_nodes_test.sh ${PROJECT_SOURCE_DIR}
         $<TARGET_FILE:tpserve>)
set_tests_properties(ops.bench_nodes PROPERTIES LABELS "multirank;model" TIMEOUT 180 SKIP_RETURN_CODE 77)
add_test(NAME ops.bench_nodes_tinyllama COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ops/bench_nodes_test.sh
         ${PROJECT_SOURCE_DIR} $<TARGET_FILE:tpserve> tinyllama)
set_tests_properties(ops.bench_nodes_tinyllama PROPERTIES LABELS "multirank;model;slow" TIMEOUT 900
  SKIP_RETURN_CODE 77)
if(TP_SANITIZE)
  set_tests_properties(ops.bench_nodes ops.bench_nodes_tinyllama PROPERTIES ENVIRONMENT "TP_TEST_SANITIZED=1")
endif()
# Every shell block of README.md, run as written against this build (tests/ops/readme_test.sh: servers
# in the background, blocks marked not-run skipped); also checks .ci/run = the README's test command.
add_test(NAME ops.readme COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ops/readme_test.sh ${PROJECT_SOURCE_DIR}
         $<TARGET_FILE:tpserve>)
set_tests_properties(ops.readme PROPERTIES LABELS "multirank;model" TIMEOUT 600 SKIP_RETURN_CODE 77)
if(TP_SANITIZE)
  # OpenMPI's exit-time leaks sit in plugins it dlclose()s: only full unwinding reaches libmpi (lsan.supp).
  set_tests_properties(ops.readme PROPERTIES ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0")
endif()
# The commands and options README.md names in its prose (inline code that cannot run as written): each
# option in that command's --help, each lower-case value among the choices its help line names.
if(Python3_Interpreter_FOUND)
  add_test(NAME ops.readme_options COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/ops/readme_options_test.py
           ${PROJECT_SOURCE_DIR} $<TARGET_FILE:tpserve>)
  set_tests_properties(ops.readme_options PROPERTIES LABELS unit TIMEOUT 60)
endif()
# tpserve plan against a measured run here: 2 and 4 local ranks of a 2-layer synthetic tinyllama-1.1b Q4_0;
# bytes per token asserted within 5% of bench gen's; communication time per token on a simulated 20 ms link
# (TP_COMM_SIM_LATENCY_US), timed from every collective's last entry to its last exit, reported
# (TP_PLAN_CHECK_TIME=1 asserts 25%).
if(Python3_Interpreter_FOUND)
  add_test(NAME ops.plan_measured COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ops/plan_measured_test.sh $<TARGET_FILE:tpserve>)
  set_tests_properties(ops.plan_measured PROPERTIES LABELS multirank TIMEOUT 300)
  if(TP_SANITIZE)
    # Under the sanitizers the reported times mean nothing; every assertion (bytes per token, the runs
    # under a simulated link) holds at any latency: a 2 ms link instead of 20 ms waits a tenth as long.
    set_tests_properties(ops.plan_measured PROPERTIES ENVIRONMENT "TP_PLAN_SIM_LATENCY_US=2000")
  endif()
  # bench gen under launch: bytes read per token per rank (a tied output head read once by the group), a probe per rank.
  add_test(NAME ops.bench_gen_ranks COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ops/bench_gen_ranks_test.sh
           $<TARGET_FILE:tpserve>)
  set_tests_properties(ops.bench_gen_ranks PROPERTIES LABELS multirank TIMEOUT 120)
  # bench serve against a stand-in server streaming two tokens per event: TPOT and steady rate from token counts.
  add_test(NAME ops.bench_serve_tokens COMMAND ${Python3_EXECUTABLE}
           ${CMAKE_CURRENT_SOURCE_DIR}/ops/bench_serve_tokens_test.py $<TARGET_FILE:tpserve>)
  set_tests_properties(ops.bench_serve_tokens PROPERTIES LABELS bench TIMEOUT 60)
endif()
