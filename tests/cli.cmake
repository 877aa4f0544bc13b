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
