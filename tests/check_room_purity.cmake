# Fails if any file of one room (ROOM_DIR) has a line matching BAD: a room kept free of
# what it must not reach. Two tests use it (tests/CMakeLists.txt):
#   sched.purity  src/sched includes no header and calls no function that does I/O, starts
#                 threads, opens sockets or reads clocks: the runtime, the benchmark harness,
#                 the simulator and the tests share it (docs/design.md §4);
#   sim.purity    src/sim includes no header of src/runtime/: the simulator runs the
#                 scheduling code and the experiment core, never the runtime's internals
#                 (docs/simulator.md, "Where the code is").
# WHAT names the fault in the failure message.
file(GLOB files ${ROOM_DIR}/*.c ${ROOM_DIR}/*.h)
set(found "")
foreach(f ${files})
  file(STRINGS ${f} hits REGEX "${BAD}")
  foreach(h ${hits})
    list(APPEND found "${f}: ${h}")
  endforeach()
endforeach()
list(LENGTH files nfiles)
if(nfiles EQUAL 0)
  message(FATAL_ERROR "no sources under ${ROOM_DIR}")
endif()
if(found)
  string(REPLACE ";" "\n" found "${found}")
  message(FATAL_ERROR "${WHAT}:\n${found}")
endif()
message(STATUS "${nfiles} files of ${ROOM_DIR}: none has ${WHAT}")
