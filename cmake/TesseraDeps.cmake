# Finds Tessera's dependencies. Each one comes from a Debian package (scripts/setup.sh installs
# them all). A required one that is missing stops configure with the package name to install;
# an optional one (rdma-core, Jerasure) turns its feature off with a configure message, and the
# feature says at run time that this build is without it.
find_package(PkgConfig REQUIRED)

function(tessera_require_pkg target pcname debpkg)
  pkg_check_modules(${target} IMPORTED_TARGET ${pcname})
  if(NOT ${target}_FOUND)
    message(FATAL_ERROR "Tessera needs ${pcname}: install the Debian package '${debpkg}' "
                        "(or run scripts/setup.sh)")
  endif()
endfunction()

function(tessera_require_lib target libname header debpkg)
  find_library(${target}_LIB NAMES ${libname})
  find_path(${target}_INC NAMES ${header})
  if(NOT ${target}_LIB OR NOT ${target}_INC)
    message(FATAL_ERROR "Tessera needs lib${libname}: install the Debian package '${debpkg}' "
                        "(or run scripts/setup.sh)")
  endif()
  add_library(${target} INTERFACE IMPORTED GLOBAL)
  target_link_libraries(${target} INTERFACE ${${target}_LIB})
  target_include_directories(${target} INTERFACE ${${target}_INC})
endfunction()

# tessera_optional(<FEATURE> <found> <what> <packages> <without>): the cache option
# TESSERA_<FEATURE> is AUTO (on when <found>), ON (required: stops the configure when not found)
# or OFF; sets TESSERA_WITH_<FEATURE> and says which in a configure message.
function(tessera_optional feature found what packages without)
  set(TESSERA_${feature} AUTO CACHE STRING "${what}: AUTO, ON or OFF")
  set_property(CACHE TESSERA_${feature} PROPERTY STRINGS AUTO ON OFF)
  set(_mode "${TESSERA_${feature}}")
  if(NOT _mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "TESSERA_${feature} is '${_mode}': AUTO, ON or OFF")
  endif()
  if(_mode STREQUAL "ON" AND NOT found)
    message(FATAL_ERROR "TESSERA_${feature}=ON: ${what} needs ${packages} (or run scripts/setup.sh)")
  endif()
  if(found AND NOT _mode STREQUAL "OFF")
    message(STATUS "${what}: on")
    set(TESSERA_WITH_${feature} ON PARENT_SCOPE)
  else()
    message(STATUS "${what}: off (TESSERA_${feature}=${_mode}; install ${packages} for it): "
                   "${without}")
    set(TESSERA_WITH_${feature} OFF PARENT_SCOPE)
  endif()
endfunction()

tessera_require_pkg(ISAL libisal libisal-dev)
tessera_require_pkg(URING liburing liburing-dev)

# RDMA verbs (rdma-core): optional. Without it the fabric has the TCP transport only, and
# `--transport=rdma` says the build has no verbs.
pkg_check_modules(IBVERBS QUIET IMPORTED_TARGET libibverbs)
pkg_check_modules(RDMACM QUIET IMPORTED_TARGET librdmacm)
set(_found OFF)
if(IBVERBS_FOUND AND RDMACM_FOUND)
  set(_found ON)
endif()
tessera_optional(RDMA ${_found} "RDMA verbs transport (rdma-core)"
                 "'libibverbs-dev' and 'librdmacm-dev'" "TCP on io_uring only")

# SHA-256 / HMAC-SHA256 of the fabric handshake (fabric/auth.h says why nettle, not libcrypto).
tessera_require_pkg(NETTLE nettle nettle-dev)
# LZ4 compresses the pager's local tier (kernel_shim/pager/compressed_tier.h).
tessera_require_pkg(LZ4 liblz4 liblz4-dev)

find_package(Threads REQUIRED)

find_package(Boost 1.74 QUIET)
if(NOT Boost_FOUND OR NOT EXISTS "${Boost_INCLUDE_DIRS}/boost/lockfree/spsc_queue.hpp")
  message(FATAL_ERROR "Tessera needs Boost.Lockfree: install the Debian package 'libboost-dev'")
endif()

find_package(gflags QUIET)
if(NOT gflags_FOUND)
  message(FATAL_ERROR "Tessera needs gflags: install the Debian package 'libgflags-dev'")
endif()

if(TESSERA_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    message(FATAL_ERROR "Tessera's tests need GoogleTest: install 'libgtest-dev' and 'libgmock-dev' "
                        "(or configure with -DTESSERA_BUILD_TESTS=OFF)")
  endif()
endif()

set(TESSERA_WITH_JERASURE OFF)
if(TESSERA_BUILD_BENCH)
  # Jerasure is only the peer in `tessera bench coding`: optional.
  find_library(JERASURE_LIB NAMES Jerasure)
  find_path(JERASURE_INC NAMES jerasure.h)
  find_library(GF_COMPLETE_LIB NAMES gf_complete)
  find_path(GF_COMPLETE_INC NAMES gf_complete.h)
  set(_found OFF)
  if(JERASURE_LIB AND JERASURE_INC AND GF_COMPLETE_LIB AND GF_COMPLETE_INC)
    set(_found ON)
  endif()
  tessera_optional(JERASURE ${_found} "Jerasure peer of tessera bench coding"
                   "'libjerasure-dev' and 'libgf-complete-dev'"
                   "the bench compares Tessera with bare ISA-L and replication only")
  if(TESSERA_WITH_JERASURE)
    tessera_require_lib(JERASURE Jerasure jerasure.h libjerasure-dev)
    tessera_require_lib(GF_COMPLETE gf_complete gf_complete.h libgf-complete-dev)
  endif()
endif()

# The Parameter Service (apps/paramsvc): Highway for its summation kernels, nlohmann-json for
# its STATUS output and bench JSON.
find_package(hwy QUIET)
if(NOT hwy_FOUND)
  message(FATAL_ERROR "Tessera needs Highway: install the Debian package 'libhwy-dev'")
endif()
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_package(nlohmann_json 3 QUIET)
  if(NOT nlohmann_json_FOUND)
    message(FATAL_ERROR "Tessera needs nlohmann-json: install the Debian package 'nlohmann-json3-dev'")
  endif()
endif()

# Scenario files of `tessera experiment` (TOML).
pkg_check_modules(TOMLPLUSPLUS IMPORTED_TARGET tomlplusplus)
if(NOT TOMLPLUSPLUS_FOUND)
  message(FATAL_ERROR "Tessera needs toml++: install the Debian package 'libtomlplusplus-dev'")
endif()

# Cluster membership in etcd (membership/): libcurl speaks to etcd's v3 JSON gateway. The
# tests start Debian's etcd (etcd-server) and skip with a message when /usr/bin/etcd is absent.
pkg_check_modules(CURL IMPORTED_TARGET libcurl)
if(NOT CURL_FOUND)
  message(FATAL_ERROR "Tessera needs libcurl (etcd membership): install the Debian package "
                      "'libcurl4-openssl-dev'")
endif()

# What `tessera --version` lists as enabled.
set(TESSERA_FEATURES "tcp-io_uring")
if(TESSERA_WITH_RDMA)
  string(APPEND TESSERA_FEATURES " rdma-verbs")
endif()
string(APPEND TESSERA_FEATURES " etcd")
if(TESSERA_BUILD_BENCH)
  string(APPEND TESSERA_FEATURES " bench")
endif()
if(TESSERA_BUILD_TESTS)
  string(APPEND TESSERA_FEATURES " tests")
endif()
if(TESSERA_SANITIZE)
  string(APPEND TESSERA_FEATURES " sanitize=${TESSERA_SANITIZE}")
endif()
