# tp_module(NAME [DIRS dir...] [SOURCES file...] [DEPS lib...]): one module library.
#
#   NAME_obj  OBJECT library of every *.c in DIRS (default: the module folder itself; sub-folders
#             are listed explicitly) plus SOURCES.  Include path: the module folder (PRIVATE, so
#             private headers are included as "kernels/kernels_impl.h", "comm_impl.h") and
#             include/ (PUBLIC: "<module>/<name>.h").  White-box tests link this directly.
#   NAME      STATIC library made of those objects; its users see include/ only, so including
#             another module's private header is a build failure (tests/boundaries.cmake).
function(tp_module name)
  cmake_parse_arguments(M "" "" "DIRS;SOURCES;DEPS" ${ARGN})
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
  add_library(${name} STATIC $<TARGET_OBJECTS:${name}_obj>)
  target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_link_libraries(${name} PUBLIC ${M_DEPS})
  set_property(GLOBAL APPEND PROPERTY TP_MODULES ${name})
  set_property(TARGET ${name} PROPERTY TP_MODULE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
endfunction()
