# comm/: `tpserve launch` end to end (real rank processes on 127.0.0.1).
set(_tp_bin $<TARGET_FILE:tpserve>)
add_test(NAME comm.launch_selftest COMMAND sh -c
  "out=$(\"$0\" launch -n 3 -- \"$0\" comm-selftest) || exit 1; printf '%s\\n' \"$out\"; \
   n=$(printf '%s\\n' \"$out\" | grep -c '^\\[rank [0-2]\\] comm-selftest: rank [0-2] of 3 ok (backend ring over shm)'); \
   [ \"$n\" -eq 3 ]"
  ${_tp_bin})
set_tests_properties(comm.launch_selftest PROPERTIES LABELS multirank TIMEOUT 60)
# Past the shared rings' 8 ranks launch's ranks stay on TCP, and rank 0 says so.
add_test(NAME comm.launch_many_ranks_tcp COMMAND sh -c
  "out=$(\"$0\" launch -n 9 -- \"$0\" comm-selftest 2>&1) || exit 1; printf '%s\\n' \"$out\"; \
   n=$(printf '%s\\n' \"$out\" | grep -c 'comm-selftest: rank [0-8] of 9 ok (backend ring over tcp)'); [ \"$n\" -eq 9 ] && \
   printf '%s\\n' \"$out\" | grep -q 'shm: 9 ranks are more than the shared rings serve (8); staying on TCP'"
  ${_tp_bin})
set_tests_properties(comm.launch_many_ranks_tcp PROPERTIES LABELS multirank TIMEOUT 60)
# The /dev/shm tests below run a rank in a private mount namespace with a tmpfs of its own; where user and mount
# namespaces are not allowed they exit 77 (skipped).
set(_tp_need_mount_ns "unshare --mount --map-root-user sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm' 2>/dev/null || \
     { echo 'skipped: no private mount namespace (unshare --mount --map-root-user) here'; exit 77; };")
# A /dev/shm too small for the rings (1 MiB here, in a private mount namespace; a container's 64 MiB for
# 8 ranks): rank 0 cannot reserve the segment, says why and how to fix it, and every rank stays on TCP
# (before, ftruncate alone succeeded and a rank died of SIGBUS at its first write).
add_test(NAME comm.launch_small_dev_shm COMMAND sh -c
  "${_tp_need_mount_ns} \
   out=$(unshare --mount --map-root-user sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec \"$0\" launch -n 2 -- \"$0\" comm-selftest' \"$0\" 2>&1) || \
     { printf '%s\\n' \"$out\"; exit 1; }; printf '%s\\n' \"$out\"; \
   n=$(printf '%s\\n' \"$out\" | grep -c 'comm-selftest: rank [01] of 2 ok (backend ring over tcp)'); [ \"$n\" -eq 2 ] && \
   printf '%s\\n' \"$out\" | grep -q 'rank 0 cannot create .*No space left on device (/dev/shm is too small; in a container, raise its --shm-size); staying on TCP'"
  ${_tp_bin})
set_tests_properties(comm.launch_small_dev_shm PROPERTIES LABELS multirank TIMEOUT 60 SKIP_RETURN_CODE 77)
# A rank that cannot open the segment (rank 2 of 3 runs in a mount namespace of its own, with an empty
# /dev/shm): it votes no, every rank stays on TCP, and ranks 0 and 1 name rank 2.
add_test(NAME comm.launch_rank_cannot_open_shm COMMAND sh -c
  "${_tp_need_mount_ns} \
   out=$(\"$0\" launch -n 3 -- sh -c 'if [ \"$TP_RANK\" = 2 ]; then exec unshare --mount --map-root-user sh -c \"mount -t tmpfs tmpfs /dev/shm && exec \\\"\\$0\\\" comm-selftest\" \"$0\"; else exec \"$0\" comm-selftest; fi' \"$0\" 2>&1) || \
     { printf '%s\\n' \"$out\"; exit 1; }; printf '%s\\n' \"$out\"; \
   n=$(printf '%s\\n' \"$out\" | grep -c 'comm-selftest: rank [0-2] of 3 ok (backend ring over tcp)'); [ \"$n\" -eq 3 ] && \
   printf '%s\\n' \"$out\" | grep -q '^.rank 2. .warn. comm: shm: rank 2 cannot open /tpc[0-9a-f]*: No such file or directory; staying on TCP' && \
   n=$(printf '%s\\n' \"$out\" | grep -c '^.rank [01]. .warn. comm: shm: rank 2 could not open or map the shared rings; staying on TCP'); [ \"$n\" -eq 2 ]"
  ${_tp_bin})
set_tests_properties(comm.launch_rank_cannot_open_shm PROPERTIES LABELS multirank TIMEOUT 60 SKIP_RETURN_CODE 77)
# Every rank listens on the socket launch bound for it (TP_LISTEN_FD): no window for another process to take the port.
add_test(NAME comm.launch_holds_ports COMMAND sh -c
  "out=$(TP_LOG_LEVEL=debug \"$0\" launch -n 3 -- \"$0\" comm-selftest 2>&1) || exit 1; \
   n=$(printf '%s\\n' \"$out\" | grep -c 'rank [0-2]: listening on inherited socket'); [ \"$n\" -eq 3 ]"
  ${_tp_bin})
set_tests_properties(comm.launch_holds_ports PROPERTIES LABELS multirank TIMEOUT 60)
# One rank exits 7: the others stop because they lost it (exit 3, TP_CLI_EXIT_PEER_LOST) or are stopped by
# launch; whichever launch reaps first, it reports rank 1's 7 and names rank 1.
add_test(NAME comm.launch_failure_propagates COMMAND sh -c
  "out=$(\"$0\" launch -n 3 --grace-ms 1000 -- \"$0\" comm-selftest --exit-rank 1 --exit-code 7 2>&1); rc=$?; \
   printf '%s\\n' \"$out\"; [ $rc -eq 7 ] && printf '%s\\n' \"$out\" | grep -q 'rank 1 exited with status 7'"
  ${_tp_bin})
set_tests_properties(comm.launch_failure_propagates PROPERTIES LABELS multirank TIMEOUT 60)
# The rule without timing: rank 1 makes itself deaf to launch's SIGTERM and says so (the READY file); ranks 0
# and 2 then end with the peer-lost status 3, and rank 1 ends 0.5 s later with 7: launch reports 7.  All
# ending with 3: launch reports 3 (rank 0 first).
add_test(NAME comm.launch_reports_cause COMMAND sh -c
  "d=$(mktemp -d); export READY=\"$d/ready\"; \
   \"$0\" launch -n 3 --grace-ms 3000 -- sh -c 'if [ \"$TP_RANK\" = 1 ]; then trap \"\" TERM; : >\"$READY\"; sleep 0.5; exit 7; fi; \
     i=0; while [ ! -e \"$READY\" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done; exit 3'; \
   rc=$?; rm -rf \"$d\"; [ $rc -eq 7 ] || { echo \"launch exit $rc, want 7\"; exit 1; }; \
   out=$(\"$0\" launch -n 2 -- sh -c 'exit 3' 2>&1); rc=$?; printf '%s\\n' \"$out\"; \
   [ $rc -eq 3 ] && printf '%s\\n' \"$out\" | grep -q 'rank [01] exited with status 3 (it lost a peer rank)'"
  ${_tp_bin})
set_tests_properties(comm.launch_reports_cause PROPERTIES LABELS multirank TIMEOUT 30)
if(TP_WITH_MPI AND TP_MPIEXEC)
  add_test(NAME comm.launch_mpi COMMAND sh -c
    "out=$(\"$0\" launch -n 2 --backend mpi -- \"$0\" comm-selftest) || exit 1; printf '%s\\n' \"$out\"; \
     n=$(printf '%s\\n' \"$out\" | grep -c 'of 2 ok (backend mpi over mpi)'); [ \"$n\" -eq 2 ]"
    ${_tp_bin})
  set_tests_properties(comm.launch_mpi PROPERTIES LABELS multirank TIMEOUT 60)
  # The documented comparison command: ring vs MPI in the same processes, started by launch --backend mpi.
  add_test(NAME comm.launch_compare_mpi COMMAND sh -c
    "out=$(\"$0\" launch -n 2 --backend mpi -- \"$0\" bench comm --compare-mpi --max-bytes 4K --iters 20 --json) \
     || exit 1; printf '%s\\n' \"$out\"; \
     n=$(printf '%s\\n' \"$out\" | grep -c '\"backend\":\"ring\".*\"mpi_lat_us_median\"'); [ \"$n\" -eq 3 ]"
    ${_tp_bin})
  set_tests_properties(comm.launch_compare_mpi PROPERTIES LABELS multirank TIMEOUT 60)
  # The same command's table: the MPI columns in the header and in every row (9 fields).
  add_test(NAME comm.launch_compare_mpi_table COMMAND sh -c
    "out=$(\"$0\" launch -n 2 --backend mpi -- \"$0\" bench comm --compare-mpi --max-bytes 4K --iters 20) \
     || exit 1; printf '%s\\n' \"$out\"; \
     printf '%s\\n' \"$out\" | grep -q 'vs the same op through MPI' || exit 1; \
     printf '%s\\n' \"$out\" | grep -q 'bytes.*iters.*lat_us.*mpi_lat_us.*mpi_busbw.*lat_ratio.*bw_ratio' || exit 1; \
     n=$(printf '%s\\n' \"$out\" | grep -E '[0-9]K ' | sed 's/^.*<stdout>://' | awk '{print NF}' | grep -c '^9$'); [ \"$n\" -eq 3 ]"
    ${_tp_bin})
  set_tests_properties(comm.launch_compare_mpi_table PROPERTIES LABELS multirank TIMEOUT 60)
  if(TP_SANITIZE)
    # OpenMPI's exit-time leaks sit in plugins it dlclose()s: only full unwinding reaches libmpi (lsan.supp).
    set_tests_properties(comm.launch_mpi comm.launch_compare_mpi comm.launch_compare_mpi_table PROPERTIES ENVIRONMENT
      "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0")
  endif()
endif()
# SIGTERM to launch reaches every rank; launch exits 128+15 promptly.
add_test(NAME comm.launch_forwards_signals COMMAND sh -c
  "\"$0\" launch -n 2 -- sleep 30 & pid=$!; sleep 1; kill -TERM $pid; wait $pid; rc=$?; echo \"launch exit $rc\"; [ $rc -eq 143 ]"
  ${_tp_bin})
set_tests_properties(comm.launch_forwards_signals PROPERTIES LABELS multirank TIMEOUT 20)
# The benchmark runs under launch and prints its JSON lines (a smoke test, not a measurement).
add_test(NAME comm.bench_json COMMAND sh -c
  "out=$(\"$0\" launch -n 2 -- \"$0\" bench comm --min-bytes 1K --max-bytes 1M --iters 5 --json) || exit 1; \
   printf '%s\\n' \"$out\"; n=$(printf '%s\\n' \"$out\" | grep -c '\"backend\":\"ring\",\"op\":\"all_sum\".*\"ranks\":2.*\"lat_us_median\":.*\"busbw_gbs\":'); \
   [ \"$n\" -eq 11 ]"
  ${_tp_bin})
set_tests_properties(comm.bench_json PROPERTIES LABELS multirank TIMEOUT 60)
# --decode with the gaps read by the Q4_0 decode kernel, per part (attention, FFN, output head): the three
# collectives of a step, each with the bytes read before it (none before the header, the mean of the two
# parts before an all_sum), its synced times and the first rank's wait (a smoke test, not a measurement).
add_test(NAME comm.bench_decode_gap_kernel COMMAND sh -c
  "out=$(\"$0\" launch -n 2 -- \"$0\" bench comm --decode 64 --gap-bytes 16K,32K,64K --gap-type q4_0 --iters 5 \
   --sync --json) || exit 1; printf '%s\\n' \"$out\"; n=0; \
   for w in 'step header.*\"gap_bytes\":0,' 'all_sum.*\"gap_bytes\":24576,' 'argmax gather.*\"gap_bytes\":65536,'; do \
     printf '%s\\n' \"$out\" | grep -q \"\\\"what\\\":\\\"$w\\\"gap_type\\\":\\\"q4_0\\\".*\\\"wait_us_mean\\\":\" && n=$((n+1)); done; \
   [ \"$n\" -eq 3 ]"
  ${_tp_bin})
set_tests_properties(comm.bench_decode_gap_kernel PROPERTIES LABELS multirank TIMEOUT 60)
# A worker exiting 88 (left out by rank 0's re-plan): launch neither restarts it nor takes it for a failure,
# with or without --restart, and names it at the end; a failure after it still counts; rank 0's 88 is a
# failure (docs/cli.md).
add_test(NAME comm.launch_left_out COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/comm/launch_left_out_test.sh ${_tp_bin})
set_tests_properties(comm.launch_left_out PROPERTIES LABELS multirank TIMEOUT 60)
