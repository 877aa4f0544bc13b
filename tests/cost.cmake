# tests/cost.cmake - the order in which `ctest -j` starts the tests in a fresh build tree.
#
# ctest starts tests in descending COST.  A tree that ran ctest before keeps each test's measured time
# (Testing/Temporary/CTestCostData.txt) and uses that; a fresh one, as in CI's clean clone, has none, so
# without these figures every test costs 0, they start in registration order, and a long test registered
# late (the node and recovery tests come last) starts last while the other core has nothing left to run.
# The figures: seconds per test in CI's two trees on 2 cores (Release / -DTP_SANITIZE=...), for the tests
# that take 2 s or more in either; the rest cost 0 and start after these.  A new test that takes more
# than a few seconds belongs here (scripts/test-costs.sh prints the figures of a tree that ran ctest).
# Included last from tests/CMakeLists.txt: a name not registered in this configuration is ignored.
set(_tp_test_costs
  # name                                      Release  sanitized
  server.recovery_repeat_2                        49    49
  model.fuzz_hf_json                              32     0
  model.fuzz_gguf                                 32     0
  model.fuzz_safetensors                          32     0
  server.node_structured_qwen3_1rank_shared       26    54
  ops.plan_measured                               30    40
  server.http_abuse                               25    28
  server.node_structured_llama3_1rank_shared      21    62
  comm.blame                                      19    19
  server.web_page                                 18    17
  server.recovery_blame_4                         16    18
  parallel.multirank                              12    18
  server.recovery_stop_3                          11    11
  server.node_structured_stories_2rank            10    22
  ops.readme                                      10    21
  server.recovery_stop_2                          10    10
  server.recovery_nofit_3                         10    10
  parallel.kquant_tp                               8    39
  server.node_harmony                              8    15
  comm.failures                                    8     8
  server.e2e_multirank                             7    11
  comm.auth                                        7     7
  server.recovery_replan_3                         7     7
  server.recovery_hand_2                           7     7
  ops.launch_restart                               7     7
  server.node_structured_stories_1rank             6    21
  comm.ring_collectives                            6     9
  server.spec_multirank                            6     9
  comm.shm                                         6     7
  comm.launch_left_out                             6     6
  model.fuzz_safetensors_replay                    6     3
  model.fuzz_gguf_replay                           6     3
  model.fuzz_hf_json_replay                        6     3
  comm.mpi                                         5    10
  ops.bench_nodes_tinyllama                        5     9
  parallel.moe_multirank                           5     9
  model.o200k_tiktoken                             5     6
  server.node_tools_qwen3_1rank_shared             4     9
  server.node_tools_qwen3_2rank_shared             4     7
  ops.launch                                       4     5
  server.node_tools_llama31_1rank_shared           3     7
  server.node_apis_tools_1rank_shared              3     6
  server.node_codex_shared                         3     6
  server.recovery_kill_2                           3     4
  server.recovery_mpi_2                            3     3
  server.recovery_kill_3                           3     3
  parallel.rss                                     3     1
  model.attn                                       2     7
  server.e2e_shared                                2     5
  server.node_apis_tools_2rank_shared              2     5
  parallel.moe_shard_files                         2     5
  model.sampler                                    2     5
  parallel.mlx_tp                                  2     4
  parallel.cli                                     2     4
  server.spec_shared                               2     4
  server.e2e                                       2     3
  model.tokenizer_oracle                           2     3
  parallel.hf_multirank                            2     3
  model.tokenizer_random_shared                    2     3
  server.node_agents_2rank_shared                  2     3
  server.node_agents_1rank_shared                  2     3
  model.synth_shared                               2     3
  model.attn_paths                                 1     8
  model.kv_quant                                   1     3
)
list(LENGTH _tp_test_costs _n)
math(EXPR _last "${_n} - 1")
foreach(_i RANGE 0 ${_last} 3)
  math(EXPR _j "${_i} + 1")
  math(EXPR _k "${_i} + 2")
  list(GET _tp_test_costs ${_i} _name)
  if(TP_SANITIZE)
    list(GET _tp_test_costs ${_k} _cost)
  else()
    list(GET _tp_test_costs ${_j} _cost)
  endif()
  if(TEST ${_name})
    set_tests_properties(${_name} PROPERTIES COST ${_cost})
  endif()
endforeach()
