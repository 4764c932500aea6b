# The layers of the build: every target stands on a floor, and links only libraries on its own
# floor or below. tessera_check_layers() (called once every folder is added) fails the
# configure, naming both targets, when a target links a library above it.
#
# A target's layer is the top-level folder it is defined in (kernel_shim/pager/ -> kernel_shim),
# unless tessera_layer() names another. The floors, bottom first (docs/concepts/architecture.md):
#
#   0  common        Status, logging, RAII, clocks: links nothing of Tessera
#   1  pagestore     the PageStore seam alone (tessera_pagestore_api, tessera_pagestore_testing)
#   2  kernel_shim   page consumers (pager, NBD export, FUSE swap file): see a store only
#                    through the seam, so they stand below everything that implements one
#   3  coding placement fabric
#      kayak_wire kayak_client
#                    Kayak's wire format and its client (apps/kayak/wire, apps/kayak/client):
#                    below the memserver and Kayak's server, so a client links nothing of them
#   4  memserver     the daemon and the service API (memserver/service.h)
#   5  client        the page stores (erasure-coded, copies, local), their fault injection
#      kayak_server  Kayak's service (apps/kayak/server): above the memserver, which hosts
#                    services it does not know

#   6  membership    etcd views; StoreFollower binds a view to a remote store
#   7  apps          subcommands, Kayak, the Parameter Service, the experiment runner, and the
#                    LD_PRELOAD shim (the one library that constructs a store in-process)
#   8  tests bench
set(TESSERA_FLOORS
  "common"
  "pagestore"
  "kernel_shim"
  "coding placement fabric kayak_wire kayak_client"
  "memserver"
  "client kayak_server"
  "membership"
  "apps"
  "tests bench")

# tessera_layer(<layer> <target>...): the targets belong to <layer> (a name in TESSERA_FLOORS),
# not to the folder they are defined in.
function(tessera_layer layer)
  foreach(t ${ARGN})
    set_property(TARGET ${t} PROPERTY TESSERA_LAYER ${layer})
  endforeach()
endfunction()

# The floor number of `layer` in `out` ("" when no floor names it).
function(tessera_floor_of layer out)
  set(_n 0)
  foreach(_floor IN LISTS TESSERA_FLOORS)
    string(REPLACE " " ";" _layers "${_floor}")
    if(layer IN_LIST _layers)
      set(${out} ${_n} PARENT_SCOPE)
      return()
    endif()
    math(EXPR _n "${_n} + 1")
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# The layer of target `t` in `out`: its TESSERA_LAYER, else its top-level folder.
function(tessera_layer_of t out)
  get_target_property(_layer ${t} TESSERA_LAYER)
  if(NOT _layer)
    get_target_property(_dir ${t} SOURCE_DIR)
    file(RELATIVE_PATH _rel ${PROJECT_SOURCE_DIR} ${_dir})
    string(REGEX REPLACE "/.*" "" _layer "${_rel}")
  endif()
  set(${out} ${_layer} PARENT_SCOPE)
endfunction()

function(tessera_collect_targets dir out)
  set(_found ${${out}})
  get_property(_targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  list(APPEND _found ${_targets})
  get_property(_subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(d ${_subdirs})
    tessera_collect_targets(${d} _found)
  endforeach()
  set(${out} ${_found} PARENT_SCOPE)
endfunction()

# Checks every target of the project (executables and libraries) against the floors: each
# direct link (LINK_LIBRARIES and INTERFACE_LINK_LIBRARIES, aliases resolved, imported
# libraries ignored) must be on the target's floor or below. Checking every direct link of
# every target checks every transitive one too.
function(tessera_check_layers)
  set(_targets)
  tessera_collect_targets(${PROJECT_SOURCE_DIR} _targets)
  set(_errors)
  foreach(t ${_targets})
    get_target_property(_type ${t} TYPE)
    if(NOT _type MATCHES
           "^(EXECUTABLE|(STATIC|SHARED|MODULE|OBJECT|INTERFACE)_LIBRARY)$")
      continue()
    endif()
    tessera_layer_of(${t} _layer)
    tessera_floor_of("${_layer}" _floor)
    if(_floor STREQUAL "")
      string(CONCAT _e "${t}: its layer '${_layer}' is on no floor (add it to TESSERA_FLOORS in "
                       "cmake/TesseraLayers.cmake, or name its layer with tessera_layer())")
      list(APPEND _errors "${_e}")
      continue()
    endif()
    set(_links)
    foreach(_prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      if(_prop STREQUAL "LINK_LIBRARIES" AND _type STREQUAL "INTERFACE_LIBRARY")
        continue()
      endif()
      get_target_property(_l ${t} ${_prop})
      if(_l)
        list(APPEND _links ${_l})
      endif()
    endforeach()
    foreach(l ${_links})
      # $<LINK_ONLY:x> (a private link of a static library, seen by its dependents) is x.
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" l "${l}")
      if(NOT TARGET "${l}")
        continue()  # A plain library (-ldl) or a generator expression.
      endif()
      get_target_property(_aliased ${l} ALIASED_TARGET)
      if(_aliased)
        set(l ${_aliased})
      endif()
      get_target_property(_imported ${l} IMPORTED)
      if(_imported)
        continue()  # Third-party (PkgConfig::ISAL, GTest::gtest, ...).
      endif()
      tessera_layer_of(${l} _dep_layer)
      tessera_floor_of("${_dep_layer}" _dep_floor)
      if(NOT _dep_floor STREQUAL "" AND _dep_floor GREATER _floor)
        string(CONCAT _e "${t} (layer ${_layer}, floor ${_floor}) links ${l} (layer "
                         "${_dep_layer}, floor ${_dep_floor}), a library above it")
        list(APPEND _errors "${_e}")
      endif()
    endforeach()
  endforeach()
  if(_errors)
    list(REMOVE_DUPLICATES _errors)
    list(JOIN _errors "\n  " _msg)
    message(FATAL_ERROR "Layering: a target may link only libraries on its own floor or below "
                        "(cmake/TesseraLayers.cmake, docs/concepts/architecture.md):\n  ${_msg}")
  endif()
endfunction()
