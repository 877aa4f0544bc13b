# comm/: `tpserve launch` end to end (real rank processes on 127.0.0.1).
set(_tp_bin $<TARGET_FILE:tpserve>)
add_test(NAME comm.launch_selftest COMMAND sh -c
  "out=$(\"$0\" launch -n 3 -- \"$0\" comm-selftest) || exit 1; printf '%s\\n' \"$out\"; \
   n=$(printf '%s\\n' \"$out\" | grep -c '^\\[rank [0-2]\\] comm-selftest: rank [0-2] of 3 ok'); [ \"$n\" -eq 3 ]"
  ${_tp_bin})
set_tests_properties(comm.launch_selftest PROPERTIES LABELS multirank TIMEOUT 60)
# One rank exits 7: launch stops the others and exits with 7.
add_test(NAME comm.launch_failure_propagates COMMAND sh -c
  "\"$0\" launch -n 3 --grace-ms 1000 -- \"$0\" comm-selftest --exit-rank 1 --exit-code 7; [ $? -eq 7 ]"
  ${_tp_bin})
set_tests_properties(comm.launch_failure_propagates PROPERTIES LABELS multirank TIMEOUT 60)
if(TP_WITH_MPI AND TP_MPIEXEC)
  add_test(NAME comm.launch_mpi COMMAND sh -c
    "out=$(\"$0\" launch -n 2 --backend mpi -- \"$0\" comm-selftest) || exit 1; printf '%s\\n' \"$out\"; \
     n=$(printf '%s\\n' \"$out\" | grep -c 'of 2 ok (backend mpi)'); [ \"$n\" -eq 2 ]"
    ${_tp_bin})
  set_tests_properties(comm.launch_mpi PROPERTIES LABELS multirank TIMEOUT 60)
  if(TP_SANITIZE)
    # OpenMPI's exit-time leaks sit in plugins it dlclose()s: only full unwinding reaches libmpi (lsan.supp).
    set_tests_properties(comm.launch_mpi PROPERTIES ENVIRONMENT
      "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0")
  endif()
endif()
