# `cmake --install`: the command and its subcommands, the preload shim, the libraries with
# their headers and a CMake package (find_package(Tessera) -> tessera:: targets), a pkg-config
# file for the offload ABI, the systemd unit, the built-in scenarios and their workloads.
#
#   bin/tessera                         the command
#   libexec/tessera/tessera-*           its subcommands (and a copy of tessera), as git does
#   lib/libtessera_preload.so           found by tessera-run relative to its own directory
#   lib/libtessera_paramsvc_c.so        the C API the Python package loads
#   lib/libtessera_*.a, include/tessera/<folder>/*.h, lib/cmake/Tessera/
#   lib/pkgconfig/tessera-offload.pc    apps/kayak/server/tessera_offload.h, for offload functions
#   lib/systemd/system/tessera-memserver.service, share/doc/tessera/memserver.env
#   share/tessera/scenarios/*.toml, share/tessera/workloads/
include(CMakePackageConfigHelpers)

set(_libexec ${CMAKE_INSTALL_LIBEXECDIR}/tessera)
set(_docdir ${CMAKE_INSTALL_DATAROOTDIR}/doc/tessera)

# Every executable of apps/ and bench/ named tessera-*: the subcommands and their helpers.
# (tessera_collect_targets: cmake/TesseraLayers.cmake.)
function(tessera_collect_executables dir out)
  set(_targets)
  tessera_collect_targets(${dir} _targets)
  set(_found ${${out}})
  foreach(t ${_targets})
    get_target_property(_type ${t} TYPE)
    if(_type STREQUAL "EXECUTABLE" AND t MATCHES "^tessera-")
      list(APPEND _found ${t})
    endif()
  endforeach()
  set(${out} ${_found} PARENT_SCOPE)
endfunction()
set(_tools)
tessera_collect_executables(${PROJECT_SOURCE_DIR}/apps _tools)
if(TESSERA_BUILD_BENCH)
  tessera_collect_executables(${PROJECT_SOURCE_DIR}/bench _tools)
endif()

install(TARGETS tessera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
# The subcommands start each other (and `tessera memserver`) from their own directory.
install(TARGETS tessera ${_tools} RUNTIME DESTINATION ${_libexec} COMPONENT runtime)
install(TARGETS tessera_preload tessera_paramsvc_c
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)

# Libraries and headers for programs built against Tessera. Headers keep their paths from
# the repository root ("apps/kayak/client/client.h"), under include/tessera: each exported
# library's public headers (TESSERA_PUBLIC_HEADERS, cmake/TesseraHeaders.cmake), never an
# internal one, and the offload ABI (tessera_offload.h, for tessera-offload.pc).
set(_export_libs tessera_common tessera_coding tessera_placement tessera_fabric
    tessera_memserver_core tessera_pagestore_api tessera_client tessera_membership
    tessera_kayak_wire tessera_kayak tessera_paramsvc)
foreach(l ${_export_libs})
  target_include_directories(${l} INTERFACE
                             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/tessera>)
  string(REGEX REPLACE "^tessera_" "" _short ${l})
  set_target_properties(${l} PROPERTIES EXPORT_NAME ${_short})
endforeach()
install(TARGETS ${_export_libs} EXPORT TesseraTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
foreach(l ${_export_libs} tessera_offload_abi)
  get_target_property(_headers ${l} TESSERA_PUBLIC_HEADERS)
  foreach(h ${_headers})
    get_filename_component(_hdir ${h} DIRECTORY)
    install(FILES ${PROJECT_SOURCE_DIR}/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera/${_hdir}
            COMPONENT dev)
  endforeach()
endforeach()
install(EXPORT TesseraTargets NAMESPACE tessera::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera COMPONENT dev)
set(TESSERA_CONFIG_PKG_DEPS "ISAL:libisal URING:liburing")
if(TESSERA_WITH_RDMA)
  string(APPEND TESSERA_CONFIG_PKG_DEPS " IBVERBS:libibverbs RDMACM:librdmacm")
endif()
string(APPEND TESSERA_CONFIG_PKG_DEPS " NETTLE:nettle CURL:libcurl")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesseraConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/TesseraConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/TesseraConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/TesseraConfig.cmake ${CMAKE_BINARY_DIR}/TesseraConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera COMPONENT dev)

# The offload ABI (one C header, no library: a function library is loaded by the memserver)
# and the systemd unit name paths under the prefix, which `cmake --install --prefix P` may
# choose after configure: both are written at install time (cmake/install_configured.cmake).
install(CODE "
  set(TESSERA_SRC \"${PROJECT_SOURCE_DIR}\")
  set(TESSERA_VERSION \"${PROJECT_VERSION}\")
  set(TESSERA_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(TESSERA_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(TESSERA_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  set(TESSERA_DOCDIR \"${_docdir}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/install_configured.cmake\")
" COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/memserver.env
        DESTINATION ${_docdir} COMPONENT runtime)

# Data: the built-in scenarios (also embedded in tessera-experiment) and their workloads.
install(DIRECTORY ${TESSERA_DATA_DIR}/ DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera
        COMPONENT runtime)

# Man pages, generated from each command's --help and --version (help2man), and bash
# completion (which reads --help when it completes). Without help2man, no man pages.
find_program(TESSERA_HELP2MAN help2man)
if(TESSERA_HELP2MAN)
  set(_man_pages)
  foreach(t tessera ${_tools})
    if(t STREQUAL "tessera-bench-pager-workload")  # A bench's helper program, not a command.
      continue()
    endif()
    set(_page ${CMAKE_BINARY_DIR}/man/${t}.1)
    add_custom_command(OUTPUT ${_page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${TESSERA_HELP2MAN} --no-info --no-discard-stderr
              "--name=Tessera, erasure-coded remote memory" --version-string=${PROJECT_VERSION}
              --output=${_page} $<TARGET_FILE:${t}>
      DEPENDS ${t}
      COMMENT "Man page of ${t}"
      VERBATIM)
    list(APPEND _man_pages ${_page})
  endforeach()
  add_custom_target(tessera_man ALL DEPENDS ${_man_pages})
  install(FILES ${_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT runtime)
else()
  message(STATUS "help2man not found: no man pages (install the Debian package 'help2man')")
endif()
install(FILES ${PROJECT_SOURCE_DIR}/deploy/bash-completion/tessera
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions COMPONENT runtime)
