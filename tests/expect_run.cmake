# tests/expect_run.cmake - run one command and check both its exit status and its output.
#
#   cmake -DEXPECT_RC=<status> [-DEXPECT_REGEX=<regex>] -P expect_run.cmake -- <command> [args...]
#
# Passes when the command exits with exactly EXPECT_RC and its stdout + stderr (together) match
# EXPECT_REGEX (CMake regex syntax); prints the output, then the status and the verdict.  A signal,
# a sanitizer report that changes the status, or the right text with the wrong status all fail.
# Registered through tp_expect_test() in tests/CMakeLists.txt.
cmake_minimum_required(VERSION 3.16)
if(NOT DEFINED EXPECT_RC)
  message(FATAL_ERROR "expect_run: -DEXPECT_RC=<exit status> is required")
endif()
set(_cmd)
set(_take FALSE)
math(EXPR _last "${CMAKE_ARGC} - 1")
foreach(_i RANGE ${_last})
  if(_take)
    list(APPEND _cmd "${CMAKE_ARGV${_i}}")
  elseif("${CMAKE_ARGV${_i}}" STREQUAL "--")
    set(_take TRUE)
  endif()
endforeach()
if(NOT _cmd)
  message(FATAL_ERROR "expect_run: no command after --")
endif()
execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
set(_ok TRUE)
if(NOT "${_rc}" STREQUAL "${EXPECT_RC}")
  message("expect_run: exit status ${_rc}, want ${EXPECT_RC}")
  set(_ok FALSE)
endif()
if(DEFINED EXPECT_REGEX AND NOT "${_out}" MATCHES "${EXPECT_REGEX}")
  message("expect_run: output does not match /${EXPECT_REGEX}/")
  set(_ok FALSE)
endif()
string(JOIN " " _cmd_text ${_cmd})
if(NOT _ok)
  message(FATAL_ERROR "expect_run: FAILED: ${_cmd_text}")
endif()
message("expect_run: ok (exit status ${_rc}, output matches)")
