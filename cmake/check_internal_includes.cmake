# Fails when a file includes another folder's internal header.
#
#   cmake -DROOT=<source tree> [-DALLOWLIST=<file>] [-DEXCLUDE=<dir>;...] \
#         -P check_internal_includes.cmake
#
# A header is internal when its leading comment block (the `//` lines before anything else)
# says "Internal to <folder>/" (for example "// Internal to fabric/: the socket helpers ...").
# Only files under <folder>/ may include it, and the folder's own tests: tests/<name>/ for any
# name in the folder's path (tests/fabric/ for fabric/, tests/nbd/ for kernel_shim/nbd/,
# tests/paramsvc/ for apps/paramsvc/), white-box unit tests. Includes are written from the
# repository root ("fabric/socket.h"), so an include names the header's path.
#
# ALLOWLIST (default ROOT/tests/layers/internal_includes_allowlist.txt, when present) holds
# exceptions, one a line: "<including file> <internal header>  # why". An entry that no longer
# matches an include fails too, so the list only shrinks. EXCLUDE: directories under ROOT not
# scanned (the layer tests' own fixture).
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/tessera_internal_header.cmake)

if(NOT ROOT OR NOT IS_DIRECTORY "${ROOT}")
  message(FATAL_ERROR "check_internal_includes: -DROOT=<source tree> is required")
endif()
get_filename_component(ROOT "${ROOT}" ABSOLUTE)
if(NOT DEFINED ALLOWLIST AND EXISTS "${ROOT}/tests/layers/internal_includes_allowlist.txt")
  set(ALLOWLIST "${ROOT}/tests/layers/internal_includes_allowlist.txt")
endif()

# The source files: every top-level folder but build trees and hidden ones.
file(GLOB _tops LIST_DIRECTORIES true RELATIVE "${ROOT}" "${ROOT}/*")
set(_files)
foreach(_top ${_tops})
  if(NOT IS_DIRECTORY "${ROOT}/${_top}" OR _top MATCHES "^(build|\\.)")
    continue()
  endif()
  file(GLOB_RECURSE _found RELATIVE "${ROOT}" "${ROOT}/${_top}/*.h" "${ROOT}/${_top}/*.hpp"
       "${ROOT}/${_top}/*.cc" "${ROOT}/${_top}/*.cpp" "${ROOT}/${_top}/*.c")
  list(APPEND _files ${_found})
endforeach()
foreach(_ex ${EXCLUDE})
  list(FILTER _files EXCLUDE REGEX "^${_ex}/")
endforeach()
list(SORT _files)

# Internal headers and the folder each is internal to.
set(_errors)
set(_internal)
foreach(_f ${_files})
  if(NOT _f MATCHES "\\.(h|hpp)$")
    continue()
  endif()
  tessera_internal_to("${ROOT}/${_f}" _dir)
  if(_dir)
    if(NOT IS_DIRECTORY "${ROOT}/${_dir}")
      list(APPEND _errors "${_f}: marked internal to ${_dir}, which is no folder")
    endif()
    string(MAKE_C_IDENTIFIER "${_f}" _key)
    set(_owner_${_key} "${_dir}")
    list(APPEND _internal ${_f})
  endif()
endforeach()

# The allow-list.
set(_allowed)
if(ALLOWLIST)
  file(STRINGS "${ALLOWLIST}" _entries)
  foreach(_e ${_entries})
    string(REGEX REPLACE "#.*" "" _e "${_e}")
    string(STRIP "${_e}" _e)
    if(_e STREQUAL "")
      continue()
    endif()
    string(REGEX REPLACE "[ \t]+" ";" _pair "${_e}")
    list(LENGTH _pair _n)
    if(NOT _n EQUAL 2)
      list(APPEND _errors "${ALLOWLIST}: '${_e}' is not '<including file> <internal header>'")
      continue()
    endif()
    list(JOIN _pair " " _e)
    list(APPEND _allowed "${_e}")
  endforeach()
endif()
set(_used_allowed)

# Every include of an internal header from outside its folder.
foreach(_f ${_files})
  file(STRINGS "${ROOT}/${_f}" _incs REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(_inc ${_incs})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" _h "${_inc}")
    if(NOT _h IN_LIST _internal)
      continue()
    endif()
    string(MAKE_C_IDENTIFIER "${_h}" _key)
    set(_dir "${_owner_${_key}}")
    string(FIND "${_f}" "${_dir}" _in_dir)
    if(_in_dir EQUAL 0)
      continue()
    endif()
    # The folder's tests: tests/<name>/ for a name in its path.
    string(REPLACE "/" ";" _names "${_dir}")
    set(_in_tests FALSE)
    foreach(_name ${_names})
      string(FIND "${_f}" "tests/${_name}/" _at)
      if(_at EQUAL 0)
        set(_in_tests TRUE)
      endif()
    endforeach()
    if(_in_tests)
      continue()
    endif()
    if("${_f} ${_h}" IN_LIST _allowed)
      list(APPEND _used_allowed "${_f} ${_h}")
      continue()
    endif()
    list(APPEND _errors "${_f} includes ${_h}, which is internal to ${_dir}")
  endforeach()
endforeach()
foreach(_e ${_allowed})
  if(NOT _e IN_LIST _used_allowed)
    list(APPEND _errors
         "${ALLOWLIST}: '${_e}' matches no include of an internal header any more: remove it")
  endif()
endforeach()

list(LENGTH _internal _n_internal)
list(LENGTH _files _n_files)
if(_errors)
  list(JOIN _errors "\n  " _msg)
  message(FATAL_ERROR "Internal headers included from outside their folder (a header whose "
                      "leading comment says 'Internal to <folder>/' is for <folder>/ and its "
                      "tests/<name>/ only; docs/concepts/architecture.md):\n  ${_msg}")
endif()
message(STATUS "check_internal_includes: ${_n_files} files, ${_n_internal} internal headers, "
               "no include of an internal header from outside its folder")
