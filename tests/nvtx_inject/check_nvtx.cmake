# cmake -DEMIT=<nvtx_emit> -DRECORDER=<libmemplan_nvtx_recorder.so> -DLOG=<file> -P check_nvtx.cmake
# Runs nvtx_emit under the recorder and requires the exact event sequence; also runs it without
# the recorder to prove the lines come from NVTX injection and not from anything else.
file(REMOVE "${LOG}")
set(expected "push memplan step
mark memplan begin
push memplan forward
push memplan aten::add_ \"x\"
pop memplan
pop memplan
push memplan backward
pop memplan
pop memplan
")

unset(ENV{NVTX_INJECTION64_PATH})
set(ENV{MEMPLAN_NVTX_LOG} "${LOG}")
execute_process(COMMAND "${EMIT}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nvtx_emit without the recorder failed: ${rc}")
endif()
if(EXISTS "${LOG}")
  message(FATAL_ERROR "${LOG} was written without NVTX_INJECTION64_PATH")
endif()

set(ENV{NVTX_INJECTION64_PATH} "${RECORDER}")
execute_process(COMMAND "${EMIT}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nvtx_emit failed: ${rc}")
endif()
if(NOT EXISTS "${LOG}")
  message(FATAL_ERROR "the recorder wrote no log: no NVTX range reached it")
endif()
file(READ "${LOG}" got)
if(NOT got STREQUAL expected)
  message(FATAL_ERROR "NVTX sequence differs.\n--- expected\n${expected}--- got\n${got}")
endif()
message(STATUS "NVTX sequence ok")
