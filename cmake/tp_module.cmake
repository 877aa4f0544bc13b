# tp_module(NAME [DIRS dir...] [SOURCES file...] [DEPS] lib...): one module library.
#
#   NAME_obj  OBJECT library of every *.c in DIRS (default: the module folder itself; sub-folders
#             are listed explicitly) plus SOURCES.  Include path: the module folder (PRIVATE, so
#             private headers are included as "kernels/kernels_impl.h", "comm_impl.h") and
#             include/ (PUBLIC: "<module>/<name>.h").  White-box tests link this directly.
#   NAME      STATIC library made of those objects; its users see include/ only, so including
#             another module's private header is a build failure (tests/build.cmake).
#             Exported symbols are the public API: the objects are combined into one
#             relocatable object (ld -r) in which every global symbol not declared in the
#             public headers (cmake/tp_exports.cmake) is made local, so no other library or
#             program can link against a module's internals (checked by build.exported_symbols).
#             TP_LOCALIZE=OFF (or no objcopy) archives the objects as they are.
function(tp_module name)
  cmake_parse_arguments(M "" "" "DIRS;SOURCES;DEPS" ${ARGN})
  list(APPEND M_DEPS ${M_UNPARSED_ARGUMENTS})
  if(NOT M_DIRS)
    set(M_DIRS .)
  endif()
  set(_srcs ${M_SOURCES})
  foreach(d ${M_DIRS})
    file(GLOB _s CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${d}/*.c)
    list(APPEND _srcs ${_s})
  endforeach()
  add_library(${name}_obj OBJECT ${_srcs})
  target_include_directories(${name}_obj
    PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${name}_obj PUBLIC ${M_DEPS})
  file(GLOB _pub CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/include/*/*.h)
  string(REPLACE ";" "|" _pub_arg "${_pub}")
  set(_exports ${CMAKE_CURRENT_BINARY_DIR}/${name}.exports)
  set(_all ${CMAKE_CURRENT_BINARY_DIR}/${name}_all.o)
  if(TP_LOCALIZE AND APPLE)
    # ld64 -r hides every symbol not in the exported list (they become private externs).
    add_custom_command(OUTPUT ${_all} ${_exports}
      COMMAND ${CMAKE_COMMAND} -DHEADERS=${_pub_arg} -DOUT=${_exports} -DPREFIX=_ -DNM=${CMAKE_NM}
              "-DOBJECTS=$<JOIN:$<TARGET_OBJECTS:${name}_obj>,|>" -P ${PROJECT_SOURCE_DIR}/cmake/tp_exports.cmake
      COMMAND ${CMAKE_LINKER} -r -exported_symbols_list ${_exports} -o ${_all} $<TARGET_OBJECTS:${name}_obj>
      DEPENDS ${name}_obj $<TARGET_OBJECTS:${name}_obj> ${_pub} ${PROJECT_SOURCE_DIR}/cmake/tp_exports.cmake
      COMMAND_EXPAND_LISTS VERBATIM COMMENT "Combining ${name} (public API exported)")
  elseif(TP_LOCALIZE)
    add_custom_command(OUTPUT ${_all} ${_exports}
      COMMAND ${CMAKE_COMMAND} -DHEADERS=${_pub_arg} -DOUT=${_exports} -P ${PROJECT_SOURCE_DIR}/cmake/tp_exports.cmake
      COMMAND ${CMAKE_LINKER} -r -o ${_all} $<TARGET_OBJECTS:${name}_obj>
      COMMAND ${CMAKE_OBJCOPY} --keep-global-symbols=${_exports} ${_all}
      DEPENDS ${name}_obj $<TARGET_OBJECTS:${name}_obj> ${_pub} ${PROJECT_SOURCE_DIR}/cmake/tp_exports.cmake
      COMMAND_EXPAND_LISTS VERBATIM COMMENT "Combining ${name} (public API exported)")
  endif()
  if(TP_LOCALIZE)
    set_source_files_properties(${_all} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    add_library(${name} STATIC ${_all})
    set_target_properties(${name} PROPERTIES LINKER_LANGUAGE C)
  else()
    add_library(${name} STATIC $<TARGET_OBJECTS:${name}_obj>)
  endif()
  set_property(TARGET ${name} PROPERTY TP_EXPORTS ${_exports})
  target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_link_libraries(${name} PUBLIC ${M_DEPS})
  set_property(TARGET ${name} PROPERTY TP_MODULE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
endfunction()
