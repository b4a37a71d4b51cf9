# Finds the Python that will run the training scripts (the virtualenv with torch) and what the
# torch build there offers. Everything is asked from that Python, never guessed from paths.
if(NOT MEMPLAN_PYTHON)
  if(DEFINED ENV{MEMPLAN_VENV})
    set(MEMPLAN_PYTHON "$ENV{MEMPLAN_VENV}/bin/python" CACHE FILEPATH "" FORCE)
  else()
    find_program(_py NAMES python3 python REQUIRED)
    set(MEMPLAN_PYTHON "${_py}" CACHE FILEPATH "" FORCE)
  endif()
endif()
message(STATUS "memplan: Python ${MEMPLAN_PYTHON}")

execute_process(
  COMMAND "${MEMPLAN_PYTHON}" -c "import sysconfig,site;print(sysconfig.get_paths()['include']);print(site.getsitepackages()[0]);print(sysconfig.get_config_var('EXT_SUFFIX'))"
  OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "memplan: ${MEMPLAN_PYTHON} does not run")
endif()
string(REPLACE "\n" ";" _out "${_out}")
list(GET _out 0 MEMPLAN_PYTHON_INCLUDE)
list(GET _out 1 MEMPLAN_SITE_PACKAGES)
list(GET _out 2 MEMPLAN_PY_EXT_SUFFIX)

# NVTX3 headers ship with CUDA torch wheels (nvidia/cu13) and with a CUDA toolkit.
find_path(MEMPLAN_NVTX_INCLUDE nvtx3/nvToolsExt.h
  HINTS ${MEMPLAN_SITE_PACKAGES}/nvidia/cu13/include ${MEMPLAN_SITE_PACKAGES}/nvidia/nvtx/include
        /usr/local/cuda/include NO_DEFAULT_PATH)
