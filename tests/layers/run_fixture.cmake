# One case of the layer checks on fixture/ (tests/layers/CMakeLists.txt):
#   cmake -DCASE=<case> -DFIXTURE=<fixture dir> -DWORK=<scratch dir> -DTESSERA_SOURCE_DIR=<tree>
#         -DCMAKE_COMMAND=<cmake> -DCXX=<C++ compiler> -DGENERATOR=<generator> -P run_fixture.cmake
# floors_hold: the fixture configures. link_up_fires / interface_link_up_fires: its configure
# fails naming tessera_pager and tessera_fabric. internal_include_fires: the include check fails
# naming apps/tool_internal.c and fabric/wire_inner.h. internal_include_allowed: it passes with
# the fixture's allow-list.
# The include trees (cmake/TesseraHeaders.cmake): headers_hold: the fixture builds (fabric's
# white-box test included) and its public headers pass check_public_headers.cmake.
# unlinked_include_fires: the pager's file that includes fabric/wire.h, a header of a library the
# pager does not link, fails to compile. internal_include_build_fires: the tool's file that
# includes fabric/wire_inner.h fails to compile although the tool links fabric.
# private_link_header_fires: with fabric linking common PRIVATE, check_public_headers.cmake fails
# naming fabric and common/common.h, which fabric/wire.h includes.
cmake_minimum_required(VERSION 3.25)

function(run_and_expect want_fail expect_regex)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(all "${out}${err}")
  if(want_fail AND rc EQUAL 0)
    message(FATAL_ERROR "${CASE}: expected a failure, got success:\n${all}")
  endif()
  if(NOT want_fail AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${CASE}: expected success, got exit ${rc}:\n${all}")
  endif()
  # Messages are wrapped at any space: match with every space as any whitespace.
  string(REGEX REPLACE "[ \n]+" " " flat "${all}")
  if(NOT flat MATCHES "${expect_regex}")
    message(FATAL_ERROR "${CASE}: output does not match '${expect_regex}':\n${all}")
  endif()
  message(STATUS "${CASE}: as expected")
endfunction()

set(configure ${CMAKE_COMMAND} -S ${FIXTURE} -B ${WORK}/${CASE} -G ${GENERATOR}
              -DTESSERA_SOURCE_DIR=${TESSERA_SOURCE_DIR})
set(build ${CMAKE_COMMAND} --build ${WORK}/${CASE})
set(check_headers ${CMAKE_COMMAND} -DMANIFEST=${WORK}/${CASE}/tessera_public_headers.cmake
                  -DCXX=${CXX} -P ${TESSERA_SOURCE_DIR}/cmake/check_public_headers.cmake)
set(check ${CMAKE_COMMAND} -DROOT=${FIXTURE} -P ${TESSERA_SOURCE_DIR}/cmake/check_internal_includes.cmake)
set(link_error "tessera_pager \\(layer kernel_shim, floor 2\\) links tessera_fabric \\(layer fabric, floor 3\\), a library above it")
file(REMOVE_RECURSE ${WORK}/${CASE})

if(CASE STREQUAL "floors_hold")
  run_and_expect(FALSE "Generating done" ${configure} -DFIXTURE_LINK=none)
elseif(CASE STREQUAL "link_up_fires")
  run_and_expect(TRUE "${link_error}" ${configure} -DFIXTURE_LINK=direct)
elseif(CASE STREQUAL "interface_link_up_fires")
  run_and_expect(TRUE "tessera_pager_api \\(layer kernel_shim, floor 2\\) links tessera_fabric \\(layer fabric, floor 3\\), a library above it"
                 ${configure} -DFIXTURE_LINK=interface)
elseif(CASE STREQUAL "internal_include_fires")
  run_and_expect(TRUE "apps/tool_internal.c includes fabric/wire_inner.h, which is internal to fabric/"
                 ${check} -DALLOWLIST=)
elseif(CASE STREQUAL "internal_include_allowed")
  run_and_expect(FALSE "no include of an internal header from outside its folder"
                 ${CMAKE_COMMAND} -DROOT=${FIXTURE} -DALLOWLIST=${FIXTURE}/allowlist.txt
                 -P ${TESSERA_SOURCE_DIR}/cmake/check_internal_includes.cmake)
elseif(CASE STREQUAL "headers_hold")
  run_and_expect(FALSE "Generating done" ${configure} -DFIXTURE_INCLUDE=none)
  run_and_expect(FALSE "fixture_wire_inner_test" ${build})
  run_and_expect(FALSE "2 public headers of 2 libraries find every header they include"
                 ${check_headers})
elseif(CASE STREQUAL "unlinked_include_fires")
  run_and_expect(FALSE "Generating done" ${configure} -DFIXTURE_INCLUDE=unlinked)
  run_and_expect(TRUE "pager_unlinked.c.*fabric/wire.h: No such file" ${build})
elseif(CASE STREQUAL "internal_include_build_fires")
  run_and_expect(FALSE "Generating done" ${configure} -DFIXTURE_INCLUDE=internal)
  run_and_expect(TRUE "tool_internal.c.*fabric/wire_inner.h: No such file" ${build})
elseif(CASE STREQUAL "private_link_header_fires")
  run_and_expect(FALSE "Generating done" ${configure} -DFIXTURE_INCLUDE=private)
  run_and_expect(TRUE "tessera_fabric: .*fabric/wire.h:[0-9]+:[0-9]+: fatal error: common/common.h: No such file"
                 ${check_headers})
else()
  message(FATAL_ERROR "unknown CASE '${CASE}'")
endif()
file(REMOVE_RECURSE ${WORK}/${CASE})
