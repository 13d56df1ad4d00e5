# Fails if a file of one module of src/ includes another module's private header: a header
# named internal.h or *_internal.h is included only by files of its own module (the folder
# under src/ it is in), and by tests. What other modules need of a module is in its
# library-internal header (src/<module>/<module>_lib.h) or in include/datahelix. The one
# exception is src/core/internal.h, the library's common internals (dh__set_error, dh__count,
# ...), which every module includes (docs/conventions.md, "Names").
#   cmake -DSRC_DIR=src -P check_private_headers.cmake
file(GLOB_RECURSE files ${SRC_DIR}/*.c ${SRC_DIR}/*.h)
list(LENGTH files nfiles)
if(nfiles EQUAL 0)
  message(FATAL_ERROR "no sources under ${SRC_DIR}")
endif()
set(found "")
foreach(f ${files})
  file(RELATIVE_PATH rel ${SRC_DIR} ${f})
  if(NOT rel MATCHES "^([^/]+)/")
    continue()
  endif()
  set(module ${CMAKE_MATCH_1})
  file(STRINGS ${f} hits REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(h ${hits})
    if(NOT h MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      continue()
    endif()
    set(inc ${CMAKE_MATCH_1})
    if(inc STREQUAL "core/internal.h")
      continue()
    endif()
    if(NOT inc MATCHES "(^|/)([A-Za-z0-9_]*_)?internal\\.h$")
      continue()
    endif()
    # "m/x_internal.h" is module m's; a bare "x_internal.h" is the including file's folder's
    if(inc MATCHES "^([^/]+)/")
      set(owner ${CMAKE_MATCH_1})
    else()
      set(owner ${module})
    endif()
    if(NOT owner STREQUAL module)
      list(APPEND found "src/${rel}: includes ${inc}, a private header of ${owner}")
    endif()
  endforeach()
endforeach()
if(found)
  string(REPLACE ";" "\n" found "${found}")
  message(FATAL_ERROR "a module includes another module's private header (use its "
                      "<module>_lib.h or include/datahelix, docs/conventions.md \"Names\"):\n"
                      "${found}")
endif()
message(STATUS "${nfiles} files of src/: no module includes another module's private header")
