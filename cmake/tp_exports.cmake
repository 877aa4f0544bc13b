# Script mode: cmake -DHEADERS=<h1|h2|...> -DOUT=<file> [-DPREFIX=_] [-DNM=nm -DOBJECTS=<o1|o2|...>]
#                    -P tp_exports.cmake
#
# Writes the names a module exports, one per line: every tp_* function or extern variable
# declared in its public headers (comments stripped).  The public headers are the export list:
# a function not declared there is local to its library (cmake/tp_module.cmake).  PREFIX is
# prepended to each name (Mach-O symbols carry a leading underscore).  With OBJECTS, only the
# names those objects define are written (ld64 refuses to export a symbol that is not defined,
# e.g. a static inline function of a header).
set(_names)
string(REPLACE "|" ";" HEADERS "${HEADERS}")
foreach(h ${HEADERS})
  file(READ ${h} _t)
  string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" " " _t "${_t}")   # /* comments */
  string(REGEX REPLACE "//[^\n]*" "" _t "${_t}")                        # // comments
  string(REGEX MATCHALL "tp_[A-Za-z0-9_]+[ \t\n]*\\(" _fns "${_t}")
  foreach(f ${_fns})
    string(REGEX REPLACE "[ \t\n]*\\($" "" f "${f}")
    list(APPEND _names ${f})
  endforeach()
  string(REGEX MATCHALL "extern[^;(){}]*tp_[A-Za-z0-9_]+[ \t]*(\\[[^;]*\\])?[ \t]*;" _vars "${_t}")
  foreach(v ${_vars})
    string(REGEX MATCH "tp_[A-Za-z0-9_]+[ \t]*(\\[[^;]*\\])?[ \t]*;$" v "${v}")
    string(REGEX REPLACE "[ \t]*(\\[[^;]*\\])?[ \t]*;$" "" v "${v}")
    list(APPEND _names ${v})
  endforeach()
endforeach()
list(REMOVE_DUPLICATES _names)
if(OBJECTS)
  string(REPLACE "|" ";" OBJECTS "${OBJECTS}")
  execute_process(COMMAND ${NM} -g ${OBJECTS} OUTPUT_VARIABLE _nm RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on the module's objects")
  endif()
  set(_kept)
  foreach(n ${_names})
    if(_nm MATCHES " [A-TV-Z] ${PREFIX}${n}\n")
      list(APPEND _kept ${n})
    endif()
  endforeach()
  set(_names ${_kept})
endif()
list(SORT _names)
set(_out "")
foreach(n ${_names})
  string(APPEND _out "${PREFIX}${n}\n")
endforeach()
# Rewrite only on change, so dependent steps do not rerun needlessly.
if(EXISTS ${OUT})
  file(READ ${OUT} _old)
  if(_old STREQUAL _out)
    return()
  endif()
endif()
file(WRITE ${OUT} "${_out}")
