# tests/build.cmake - checks on the build itself: module boundaries, exported symbols, function length.

# The include path each module's own files are compiled with, written at generate time.
set(_tp_incs_dir ${CMAKE_CURRENT_BINARY_DIR}/boundaries)
foreach(_m common comm model model_synth parallel server)
  file(GENERATE OUTPUT ${_tp_incs_dir}/incs_${_m}.cmake
       CONTENT "set(INCS \"$<TARGET_PROPERTY:tp_${_m}_obj,INCLUDE_DIRECTORIES>\")\n")
endforeach()
file(GENERATE OUTPUT ${_tp_incs_dir}/incs_cli.cmake
     CONTENT "set(INCS \"$<TARGET_PROPERTY:tpserve,INCLUDE_DIRECTORIES>\")\n")
# A file outside a module that includes one of its private headers fails to compile.
add_test(NAME build.private_headers
         COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR} -DCC=${CMAKE_C_COMPILER} -DINCS_DIR=${_tp_incs_dir}
                 -DOUT=${_tp_incs_dir} -P ${CMAKE_CURRENT_SOURCE_DIR}/build/check_includes.cmake)
set_tests_properties(build.private_headers PROPERTIES LABELS unit TIMEOUT 120)

# Each library's global symbols are names its public headers declare; private functions are local.
if(TP_LOCALIZE)
  set(_tp_libs)
  foreach(_m common comm model model_synth parallel server)
    string(APPEND _tp_libs ",tp_${_m}|$<TARGET_FILE:tp_${_m}>|$<TARGET_PROPERTY:tp_${_m},TP_EXPORTS>|$<TARGET_PROPERTY:tp_${_m},TP_MODULE_DIR>")
  endforeach()
  set(_tp_prefix "")
  if(APPLE)
    set(_tp_prefix _)
  endif()
  add_test(NAME build.exported_symbols
           COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} -DSRC=${PROJECT_SOURCE_DIR} "-DLIBS=${_tp_libs}"
                   -DPREFIX=${_tp_prefix} -P ${CMAKE_CURRENT_SOURCE_DIR}/build/check_symbols.cmake)
  set_tests_properties(build.exported_symbols PROPERTIES LABELS unit TIMEOUT 120)
endif()

# No function over 120 lines but those scripts/long_functions.allow lets stand (each no longer than there).
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME build.long_functions
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/long_functions.py --max 120
                   --allow ${PROJECT_SOURCE_DIR}/scripts/long_functions.allow)
  set_tests_properties(build.long_functions PROPERTIES LABELS unit TIMEOUT 60)
else()
  message(STATUS "python3 not found: build.long_functions is not registered")
endif()
