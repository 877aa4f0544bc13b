# tests/ops.cmake - operations: simulated multi-host network (scripts/netsim),
# deployment configs (hostfiles, Kubernetes manifests), capacity planner.
# Scripted tests exit 77 to skip (missing namespaces / YAML parser) with a reason.
add_test(NAME ops.netsim COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ops/netsim_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(ops.netsim PROPERTIES LABELS "unit;multirank" TIMEOUT 60 SKIP_RETURN_CODE 77
  RUN_SERIAL TRUE)
# C suites in tests/ops/*.c (capacity planner): test_ops, one ctest entry per suite.
tp_add_suite(ops LIBS tp_parallel)
