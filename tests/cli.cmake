# Command-line contract of the tpserve executable.
add_test(NAME cli.help COMMAND tpserve --help)
set_tests_properties(cli.help PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "Usage: tpserve <command>")
add_test(NAME cli.version COMMAND tpserve --version)
set_tests_properties(cli.version PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "tpserve [0-9]+\\.[0-9]+\\.[0-9]+")
add_test(NAME cli.unknown_command COMMAND tpserve nosuchcmd)
set_tests_properties(cli.unknown_command PROPERTIES LABELS unit WILL_FAIL TRUE)
add_test(NAME cli.unknown_command_message COMMAND tpserve nosuchcmd)
set_tests_properties(cli.unknown_command_message PROPERTIES LABELS unit
  PASS_REGULAR_EXPRESSION "unknown command 'nosuchcmd'")
add_test(NAME cli.unknown_flag COMMAND tpserve version --bogus)
set_tests_properties(cli.unknown_flag PROPERTIES LABELS unit WILL_FAIL TRUE)
# --kv-type: a bad value is a usage error naming the choices; f16 (default) and f32 caches give the
# same greedy text on the bundled model (fp16 rounds K/V by ~1e-3 relative, far below its top-2 gaps).
add_test(NAME cli.kv_type_bad COMMAND sh -c
  "out=$(\"$0\" generate -m \"$1\" -p Once -n 4 --kv-type f64 2>&1); rc=$?; echo \"$out\"; [ $rc -eq 2 ] && \
   echo \"$out\" | grep -q 'want f16 (half the memory) or f32'"
  $<TARGET_FILE:tpserve> ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
set_tests_properties(cli.kv_type_bad PROPERTIES LABELS unit TIMEOUT 30)
add_test(NAME cli.kv_type_same_text COMMAND sh -c
  "a=$(\"$0\" generate -m \"$1\" -p 'Once upon a time' -n 64 --temp 0 --kv-type f16 2>/dev/null) && \
   b=$(\"$0\" generate -m \"$1\" -p 'Once upon a time' -n 64 --temp 0 --kv-type f32 2>/dev/null) && \
   [ -n \"$a\" ] && [ \"$a\" = \"$b\" ]"
  $<TARGET_FILE:tpserve> ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
set_tests_properties(cli.kv_type_same_text PROPERTIES LABELS unit TIMEOUT 60)
