# A Kayak client links nothing of the server (docs/concepts/architecture.md, "Services in the
# memory server"):
#   cmake -DROOT=<source tree> -DLINKS=<file: tessera_kayak's transitive links> -P this
# Fails, naming the library or the include, when the client library's links reach Kayak's
# server part or the memory server, when they miss the wire part, or when a file of
# apps/kayak/client or apps/kayak/wire includes a header of apps/kayak/server or memserver/.
cmake_minimum_required(VERSION 3.25)

file(READ ${LINKS} links)
set(errors)
if(NOT "tessera_kayak_wire" IN_LIST links)
  list(APPEND errors "tessera_kayak does not link tessera_kayak_wire (links: ${links})")
endif()
foreach(server_part tessera_kayak_server tessera_memserver tessera_memserver_core)
  if(server_part IN_LIST links)
    list(APPEND errors "tessera_kayak links ${server_part} (links: ${links})")
  endif()
endforeach()

file(GLOB_RECURSE sources RELATIVE ${ROOT}
     ${ROOT}/apps/kayak/client/*.h ${ROOT}/apps/kayak/client/*.cc
     ${ROOT}/apps/kayak/wire/*.h ${ROOT}/apps/kayak/wire/*.cc)
if(NOT sources)
  list(APPEND errors "no sources under apps/kayak/client or apps/kayak/wire")
endif()
foreach(f ${sources})
  file(STRINGS ${ROOT}/${f} includes REGEX "^#include \"(apps/kayak/server|memserver)/")
  foreach(line ${includes})
    list(APPEND errors "${f}: ${line} (a client part includes a server header)")
  endforeach()
endforeach()

if(errors)
  list(JOIN errors "\n  " msg)
  message(FATAL_ERROR "Kayak's client links or includes its server part:\n  ${msg}")
endif()
list(LENGTH sources n)
message(STATUS "kayak client: links ${links}; ${n} client and wire files include no server header")
