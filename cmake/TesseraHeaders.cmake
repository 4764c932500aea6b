# Include directories per target: a file can include a header only when its target links the
# library that owns it (directly or through PUBLIC links), and never another folder's internal
# header. Includes stay written from the repository root ("fabric/wire.h").
#
# tessera_include_trees() (called once every folder is added) gives each library of the project,
# in the build directory, a tree of symbolic links to the headers it owns, at their paths from
# the repository root:
#
#   include/<library>/<folder>/<header>           its public headers: its PUBLIC include directory
#   include-internal/<library>/<folder>/<header>  its internal headers ("Internal to <folder>/",
#                                                 cmake/tessera_internal_header.cmake): PRIVATE,
#                                                 for its own sources and its white-box tests
#   include-local/<folder>/<header>               a folder's headers no library owns (an
#                                                 executable's own, a test's helpers): PRIVATE to
#                                                 the executables of that folder
#
# Which library owns a header of its folder (the folder a library is defined in, with its
# subfolders that have no CMakeLists.txt of their own):
#   1. the library that lists the header among its sources (a header-only INTERFACE library);
#   2. else the library with the source of the same path and name ("memserver/slab_pool.h" goes
#      with "memserver/slab_pool.cc");
#   3. else the folder's only library, or, in a folder of several, the one named by
#      tessera_folder_library() (the configure fails, naming the headers, when none is).
# The trees are rebuilt at every configure; a header added or removed re-runs the configure.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/tessera_internal_header.cmake)

set(TESSERA_INCLUDE_ROOT ${CMAKE_BINARY_DIR}/include)
set(TESSERA_INTERNAL_INCLUDE_ROOT ${CMAKE_BINARY_DIR}/include-internal)
set(TESSERA_LOCAL_INCLUDE_ROOT ${CMAKE_BINARY_DIR}/include-local)
set(TESSERA_PUBLIC_HEADERS_MANIFEST ${CMAKE_BINARY_DIR}/tessera_public_headers.cmake)

# tessera_folder_library(<library>): in a folder that defines several libraries, <library> owns
# the headers no library's sources implement (rule 3 above).
function(tessera_folder_library target)
  set_property(DIRECTORY PROPERTY TESSERA_FOLDER_LIBRARY ${target})
endfunction()

# tessera_white_box(<target> <library>...): <target>, a white-box test in tests/<name>/, may
# include the internal headers of each <library>. As with the include check
# (cmake/check_internal_includes.cmake), <name> must be a folder name in the library's path
# (tests/fabric/ for fabric/, tests/nbd/ for kernel_shim/nbd/).
function(tessera_white_box target)
  get_target_property(_dir ${target} SOURCE_DIR)
  file(RELATIVE_PATH _rel ${PROJECT_SOURCE_DIR} ${_dir})
  foreach(_lib ${ARGN})
    get_target_property(_aliased ${_lib} ALIASED_TARGET)
    if(_aliased)
      set(_lib ${_aliased})
    endif()
    get_target_property(_lib_dir ${_lib} SOURCE_DIR)
    file(RELATIVE_PATH _lib_rel ${PROJECT_SOURCE_DIR} ${_lib_dir})
    string(REPLACE "/" ";" _names "${_lib_rel}")
    set(_ok FALSE)
    foreach(_name ${_names})
      if(_rel STREQUAL "tests/${_name}" OR _rel MATCHES "^tests/${_name}/")
        set(_ok TRUE)
      endif()
    endforeach()
    if(NOT _ok)
      message(FATAL_ERROR "tessera_white_box: ${target} (${_rel}/) is no test of ${_lib_rel}/: "
                          "only tests/<name>/ for a name in ${_lib_rel} may include the internal "
                          "headers of ${_lib}")
    endif()
    target_include_directories(${target} PRIVATE ${TESSERA_INTERNAL_INCLUDE_ROOT}/${_lib})
  endforeach()
endfunction()

# The path of `file` from the project root without its extension, in `out`.
function(_tessera_stem file base out)
  if(NOT IS_ABSOLUTE "${file}")
    set(file "${base}/${file}")
  endif()
  file(RELATIVE_PATH _rel ${PROJECT_SOURCE_DIR} "${file}")
  string(REGEX REPLACE "\\.[^./]*$" "" _rel "${_rel}")
  set(${out} "${_rel}" PARENT_SCOPE)
endfunction()

# The headers of folder `dir` (absolute) and of its subfolders that have no CMakeLists.txt,
# as paths from the project root, in `out`.
function(_tessera_folder_headers dir out)
  file(GLOB_RECURSE _headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}
       ${dir}/*.h ${dir}/*.hpp)
  file(GLOB_RECURSE _lists RELATIVE ${dir} ${dir}/*/CMakeLists.txt)
  foreach(_l ${_lists})
    get_filename_component(_sub ${_l} DIRECTORY)
    file(RELATIVE_PATH _sub_rel ${PROJECT_SOURCE_DIR} ${dir}/${_sub})
    list(FILTER _headers EXCLUDE REGEX "^${_sub_rel}/")
  endforeach()
  set(${out} ${_headers} PARENT_SCOPE)
endfunction()

function(_tessera_link_header root target header)
  get_filename_component(_parent ${root}/${target}/${header} DIRECTORY)
  file(MAKE_DIRECTORY ${_parent})
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${header} ${root}/${target}/${header} SYMBOLIC)
endfunction()

# Builds the trees and sets every target's include directories (see the top of this file).
# Each library gets the property TESSERA_PUBLIC_HEADERS (its public headers, paths from the
# project root), which the install rules use.
function(tessera_include_trees)
  file(REMOVE_RECURSE ${TESSERA_INCLUDE_ROOT} ${TESSERA_INTERNAL_INCLUDE_ROOT}
       ${TESSERA_LOCAL_INCLUDE_ROOT})
  set(_targets)
  tessera_collect_targets(${PROJECT_SOURCE_DIR} _targets)
  # The folders that define a library or an executable, and their targets.
  set(_dirs)
  foreach(t ${_targets})
    get_target_property(_type ${t} TYPE)
    if(_type MATCHES "^(STATIC|SHARED|MODULE|OBJECT|INTERFACE)_LIBRARY$")
      set(_kind libs)
    elseif(_type STREQUAL "EXECUTABLE")
      set(_kind exes)
    else()
      continue()
    endif()
    get_target_property(_dir ${t} SOURCE_DIR)
    string(MAKE_C_IDENTIFIER "${_dir}" _key)
    if(NOT _dir IN_LIST _dirs)
      list(APPEND _dirs ${_dir})
      set(_libs_${_key})
      set(_exes_${_key})
    endif()
    list(APPEND _${_kind}_${_key} ${t})
  endforeach()

  set(_errors)
  foreach(_dir ${_dirs})
    string(MAKE_C_IDENTIFIER "${_dir}" _key)
    set(_libs ${_libs_${_key}})
    _tessera_folder_headers(${_dir} _headers)
    # Rules 1 and 2: the sources of each library, by path without extension.
    foreach(_lib ${_libs})
      set(_owned_${_lib})
      get_target_property(_sources ${_lib} SOURCES)
      if(NOT _sources)
        set(_sources)
      endif()
      foreach(_s ${_sources})
        if(_s MATCHES "^\\$<")
          continue()
        endif()
        _tessera_stem("${_s}" ${_dir} _stem)
        string(MAKE_C_IDENTIFIER "${_stem}" _skey)
        if(_s MATCHES "\\.(h|hpp)$")
          set(_by_header_${_skey} ${_lib})
        elseif(NOT DEFINED _by_source_${_skey})
          set(_by_source_${_skey} ${_lib})
        endif()
      endforeach()
    endforeach()
    get_directory_property(_main DIRECTORY ${_dir} TESSERA_FOLDER_LIBRARY)
    list(LENGTH _libs _n_libs)
    if(NOT _main AND _n_libs EQUAL 1)
      set(_main ${_libs})
    endif()
    set(_local)
    set(_unowned)
    foreach(_h ${_headers})
      _tessera_stem("${_h}" ${PROJECT_SOURCE_DIR} _stem)
      string(MAKE_C_IDENTIFIER "${_stem}" _skey)
      if(DEFINED _by_header_${_skey})
        set(_owner ${_by_header_${_skey}})
      elseif(DEFINED _by_source_${_skey})
        set(_owner ${_by_source_${_skey}})
      elseif(_main)
        set(_owner ${_main})
      elseif(_n_libs EQUAL 0)
        list(APPEND _local ${_h})
        continue()
      else()
        list(APPEND _unowned ${_h})
        continue()
      endif()
      list(APPEND _owned_${_owner} ${_h})
    endforeach()
    if(_unowned)
      file(RELATIVE_PATH _rel ${PROJECT_SOURCE_DIR} ${_dir})
      list(JOIN _libs ", " _names)
      list(JOIN _unowned " " _hs)
      list(APPEND _errors "${_rel}/ defines ${_names}; no library's sources implement ${_hs}: "
                          "name the folder's main library with tessera_folder_library()")
    endif()

    # Each library's trees and include directories.
    foreach(_lib ${_libs})
      set(_public)
      set(_internal)
      foreach(_h ${_owned_${_lib}})
        tessera_internal_to(${PROJECT_SOURCE_DIR}/${_h} _to)
        if(_to)
          list(APPEND _internal ${_h})
          _tessera_link_header(${TESSERA_INTERNAL_INCLUDE_ROOT} ${_lib} ${_h})
        else()
          list(APPEND _public ${_h})
          _tessera_link_header(${TESSERA_INCLUDE_ROOT} ${_lib} ${_h})
        endif()
      endforeach()
      set_property(TARGET ${_lib} PROPERTY TESSERA_PUBLIC_HEADERS ${_public})
      get_target_property(_type ${_lib} TYPE)
      if(_type STREQUAL "INTERFACE_LIBRARY")
        if(_internal)
          list(APPEND _errors "${_lib}: a header-only library with internal headers (${_internal})")
        endif()
        if(_public)
          target_include_directories(${_lib} INTERFACE
                                     $<BUILD_INTERFACE:${TESSERA_INCLUDE_ROOT}/${_lib}>)
        endif()
        continue()
      endif()
      if(_public)
        target_include_directories(${_lib} PUBLIC $<BUILD_INTERFACE:${TESSERA_INCLUDE_ROOT}/${_lib}>)
      endif()
      if(_internal)
        target_include_directories(${_lib} PRIVATE ${TESSERA_INTERNAL_INCLUDE_ROOT}/${_lib})
      endif()
    endforeach()

    # The folder's own headers, for its executables.
    if(_local)
      file(RELATIVE_PATH _rel ${PROJECT_SOURCE_DIR} ${_dir})
      foreach(_h ${_local})
        _tessera_link_header(${TESSERA_LOCAL_INCLUDE_ROOT} ${_rel} ${_h})
      endforeach()
      foreach(_exe ${_exes_${_key}})
        target_include_directories(${_exe} PRIVATE ${TESSERA_LOCAL_INCLUDE_ROOT}/${_rel})
      endforeach()
    endif()
  endforeach()
  if(_errors)
    list(JOIN _errors "\n  " _msg)
    message(FATAL_ERROR "Include trees (cmake/TesseraHeaders.cmake):\n  ${_msg}")
  endif()

  # For check_public_headers.cmake (tests/layers): each library's public headers, and the
  # include directories and definitions it gives its users (its own and those of its PUBLIC
  # links), as the build will use them.
  set(_manifest "# Generated by tessera_include_trees() (cmake/TesseraHeaders.cmake).\n")
  foreach(_dir ${_dirs})
    string(MAKE_C_IDENTIFIER "${_dir}" _key)
    foreach(_lib ${_libs_${_key}})
      get_target_property(_public ${_lib} TESSERA_PUBLIC_HEADERS)
      if(NOT _public)
        continue()
      endif()
      string(APPEND _manifest "list(APPEND TESSERA_LIBRARIES ${_lib})\n"
        "set(TESSERA_HEADERS_${_lib} \"${_public}\")\n"
        "set(TESSERA_INCLUDES_${_lib} \"$<TARGET_PROPERTY:${_lib},INTERFACE_INCLUDE_DIRECTORIES>\")\n"
        "set(TESSERA_DEFINES_${_lib} \"$<TARGET_PROPERTY:${_lib},INTERFACE_COMPILE_DEFINITIONS>\")\n")
    endforeach()
  endforeach()
  file(GENERATE OUTPUT ${TESSERA_PUBLIC_HEADERS_MANIFEST} CONTENT "${_manifest}")
endfunction()
