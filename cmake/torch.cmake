# Links against the torch of MEMPLAN_PYTHON directly (include dirs + the .so files) rather than
# through TorchConfig.cmake, which for CUDA wheels wants a matching CUDA toolkit at configure time.
execute_process(
  COMMAND "${MEMPLAN_PYTHON}" -c "import torch,os;print(os.path.dirname(torch.__file__));print(int(torch._C._GLIBCXX_USE_CXX11_ABI));print(torch.version.cuda or '');print(torch.__version__)"
  OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "memplan: cannot import torch with ${MEMPLAN_PYTHON}")
endif()
string(REPLACE "\n" ";" _out "${_out}")
list(GET _out 0 TORCH_DIR)
list(GET _out 1 TORCH_CXX11_ABI)
list(GET _out 2 TORCH_CUDA_VERSION)
list(GET _out 3 TORCH_VERSION)
message(STATUS "memplan: torch ${TORCH_VERSION} at ${TORCH_DIR} (CUDA '${TORCH_CUDA_VERSION}')")

add_library(memplan_torch INTERFACE)
target_include_directories(memplan_torch SYSTEM INTERFACE
  ${TORCH_DIR}/include ${TORCH_DIR}/include/torch/csrc/api/include ${MEMPLAN_PYTHON_INCLUDE})
# torch/include ships its own fmt (12.x), found before the system's: torch-side code uses it
# header-only; torch-free libraries use the system libfmt. Only std::string crosses (agent/log.h).
target_compile_definitions(memplan_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI} FMT_HEADER_ONLY=1)
target_link_libraries(memplan_torch INTERFACE
  ${TORCH_DIR}/lib/libtorch.so ${TORCH_DIR}/lib/libtorch_cpu.so ${TORCH_DIR}/lib/libc10.so)
# libtorch_python needs the interpreter's symbols: only the Python-facing module links it.
add_library(memplan_torch_python INTERFACE)
target_link_libraries(memplan_torch_python INTERFACE memplan_torch ${TORCH_DIR}/lib/libtorch_python.so)

set(MEMPLAN_CUDA OFF)
if(MEMPLAN_WITH_CUDA STREQUAL "ON" OR (MEMPLAN_WITH_CUDA STREQUAL "AUTO" AND TORCH_CUDA_VERSION))
  # The runtime headers need crt/ (shipped with nvcc: the toolkit, or the nvidia-cuda-nvcc wheel).
  find_path(MEMPLAN_CUDA_INCLUDE crt/host_config.h
    HINTS /usr/local/cuda/include ${MEMPLAN_SITE_PACKAGES}/nvidia/cu13/include
          ${MEMPLAN_SITE_PACKAGES}/nvidia/cuda_nvcc/include NO_DEFAULT_PATH)
  find_path(MEMPLAN_CUPTI_INCLUDE cupti_activity.h
    HINTS ${MEMPLAN_SITE_PACKAGES}/nvidia/cu13/include /usr/local/cuda/include
          /usr/local/cuda/extras/CUPTI/include NO_DEFAULT_PATH)
  find_library(MEMPLAN_CUDART NAMES cudart libcudart.so.13 libcudart.so.12
    HINTS ${MEMPLAN_SITE_PACKAGES}/nvidia/cu13/lib /usr/local/cuda/lib64 NO_DEFAULT_PATH)
  find_library(MEMPLAN_CUPTI NAMES cupti libcupti.so.13 libcupti.so.12
    HINTS ${MEMPLAN_SITE_PACKAGES}/nvidia/cu13/lib /usr/local/cuda/lib64 NO_DEFAULT_PATH)
  if(MEMPLAN_CUDA_INCLUDE AND MEMPLAN_CUPTI_INCLUDE AND MEMPLAN_CUDART AND MEMPLAN_CUPTI
     AND EXISTS ${TORCH_DIR}/lib/libc10_cuda.so)
    set(MEMPLAN_CUDA ON)
    add_library(memplan_cuda INTERFACE)
    target_include_directories(memplan_cuda SYSTEM INTERFACE ${MEMPLAN_CUDA_INCLUDE} ${MEMPLAN_CUPTI_INCLUDE})
    target_link_libraries(memplan_cuda INTERFACE ${TORCH_DIR}/lib/libc10_cuda.so ${MEMPLAN_CUDART} ${MEMPLAN_CUPTI})
    target_compile_definitions(memplan_cuda INTERFACE MEMPLAN_HAVE_CUDA=1)
  elseif(MEMPLAN_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "memplan: MEMPLAN_WITH_CUDA=ON but CUDA headers/libraries were not found")
  endif()
endif()
message(STATUS "memplan: CUDA parts ${MEMPLAN_CUDA}")
