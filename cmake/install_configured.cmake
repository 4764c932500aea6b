# Run by `cmake --install` (install(CODE) in TesseraInstall.cmake): writes the files that name
# paths under the install prefix, which is known only now (--prefix may differ from the
# configured CMAKE_INSTALL_PREFIX): the systemd unit and tessera-offload.pc.
set(_root "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
if(IS_ABSOLUTE "${TESSERA_BINDIR}")
  set(_bindir "${TESSERA_BINDIR}")
else()
  set(_bindir "${CMAKE_INSTALL_PREFIX}/${TESSERA_BINDIR}")
endif()
if(IS_ABSOLUTE "${TESSERA_DOCDIR}")
  set(_docdir "${TESSERA_DOCDIR}")
else()
  set(_docdir "${CMAKE_INSTALL_PREFIX}/${TESSERA_DOCDIR}")
endif()

file(READ "${TESSERA_SRC}/deploy/systemd/tessera-memserver.service" _unit)
string(REPLACE "/usr/local/bin/tessera" "${_bindir}/tessera" _unit "${_unit}")
string(REPLACE "PREFIX/share/doc/tessera" "${_docdir}" _unit "${_unit}")
set(_unit_path "${_root}/lib/systemd/system/tessera-memserver.service")
message(STATUS "Installing: ${_unit_path}")
file(WRITE "${_unit_path}" "${_unit}")

set(_pc "prefix=${CMAKE_INSTALL_PREFIX}
includedir=\${prefix}/${TESSERA_INCLUDEDIR}/tessera/apps/kayak/server

Name: tessera-offload
Description: C ABI of offload functions for Tessera memory servers (tessera_offload.h)
Version: ${TESSERA_VERSION}
Cflags: -I\${includedir}
")
set(_pc_path "${_root}/${TESSERA_LIBDIR}/pkgconfig/tessera-offload.pc")
message(STATUS "Installing: ${_pc_path}")
file(WRITE "${_pc_path}" "${_pc}")
