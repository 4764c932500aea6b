# tessera_internal_to(<header file> <out>): the folder ("fabric/") a header is internal to, or ""
# for a public header. A header is internal when its leading comment block (the `//` lines
# before anything else, the first 12 lines at most) says "Internal to <folder>/". One rule for
# the include check (check_internal_includes.cmake) and the include trees (TesseraHeaders.cmake).
function(tessera_internal_to file out)
  set(_dir "")
  file(STRINGS "${file}" _head LIMIT_COUNT 12)
  foreach(_line ${_head})
    if(NOT _line MATCHES "^//")
      break()
    endif()
    if(_line MATCHES "[Ii]nternal to ([A-Za-z0-9_./-]+/)")
      set(_dir "${CMAKE_MATCH_1}")
      break()
    endif()
  endforeach()
  set(${out} "${_dir}" PARENT_SCOPE)
endfunction()
