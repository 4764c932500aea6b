# Fails when a library's public header includes a header its users cannot see: one of a library
# it links PRIVATE or does not link, or another folder's internal header.
#
#   cmake -DMANIFEST=<build>/tessera_public_headers.cmake -DCXX=<compiler> \
#         -P check_public_headers.cmake
#
# MANIFEST (written by tessera_include_trees(), cmake/TesseraHeaders.cmake) lists each library's
# public headers with the include directories and definitions the library gives its users. A
# file that includes them all is run through the preprocessor with those alone, as a user's file
# would be: every header they include must be found (the first one missing is named).
cmake_minimum_required(VERSION 3.25)

if(NOT EXISTS "${MANIFEST}" OR NOT CXX)
  message(FATAL_ERROR "check_public_headers: -DMANIFEST=<file> and -DCXX=<compiler> are required")
endif()
include("${MANIFEST}")

set(_errors)
set(_n 0)
get_filename_component(_work "${MANIFEST}" DIRECTORY)
set(_work "${_work}/check_public_headers")
file(MAKE_DIRECTORY "${_work}")
foreach(_lib ${TESSERA_LIBRARIES})
  set(_flags -std=c++20)
  foreach(_i ${TESSERA_INCLUDES_${_lib}})
    list(APPEND _flags "-I${_i}")
  endforeach()
  foreach(_d ${TESSERA_DEFINES_${_lib}})
    list(APPEND _flags "-D${_d}")
  endforeach()
  # One file that includes every public header of the library, as a user's file would.
  set(_text "")
  foreach(_h ${TESSERA_HEADERS_${_lib}})
    string(APPEND _text "#include \"${_h}\"\n")
    math(EXPR _n "${_n} + 1")
  endforeach()
  file(WRITE "${_work}/${_lib}.cc" "${_text}")
  execute_process(COMMAND ${CXX} ${_flags} -E -o /dev/null "${_work}/${_lib}.cc"
                  RESULT_VARIABLE _rc ERROR_VARIABLE _err OUTPUT_QUIET)
  if(NOT _rc EQUAL 0)
    string(REGEX MATCH "[^\n]*error[^\n]*" _first "${_err}")
    string(REPLACE "${_work}/" "" _first "${_first}")
    list(APPEND _errors "${_lib}: ${_first}")
  endif()
endforeach()
file(REMOVE_RECURSE "${_work}")
if(_errors)
  list(JOIN _errors "\n  " _msg)
  message(FATAL_ERROR "Public headers that include what their library's users cannot see (link "
                      "the library that owns the header PUBLIC, or move the include to a "
                      "source file; docs/concepts/architecture.md):\n  ${_msg}")
endif()
list(LENGTH TESSERA_LIBRARIES _libs)
message(STATUS "check_public_headers: ${_n} public headers of ${_libs} libraries find every "
               "header they include")
