# Configuring against a CUDA LibTorch (STRATA_WITH_NCCL) on a machine that
# may have no GPU and only a bare CUDA toolkit (nvcc and the runtime): the
# CUDA torch wheel brings its own CUDA libraries. strata compiles no CUDA
# code, but TorchConfig.cmake turns the CUDA language on and looks for
# them. strata_prepare_cuda_torch() runs before find_package(Torch) and:
#  - names the GPU architectures (TORCH_CUDA_ARCH_LIST), so that torch's
#    config does not try to run a program on a GPU;
#  - asks nvcc for C++17 device code (CMake may not know nvcc's C++20 flags);
#  - finds the toolkit from the nvcc on PATH even when that is a wrapper
#    script outside the toolkit (nvcc -dryrun says where it lives), unless
#    CUDA_TOOLKIT_ROOT_DIR, CUDAToolkit_ROOT or CUDA_HOME name it;
#  - takes NVRTC, which torch's targets link, from the torch wheel's
#    nvidia-* packages when the toolkit has none.
macro(strata_prepare_cuda_torch)
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
  endif()
  if(NOT DEFINED CMAKE_CUDA_STANDARD)
    set(CMAKE_CUDA_STANDARD 17)
  endif()
  set(CMAKE_CUDA_EXTENSIONS OFF)
  # Leave the architectures to TORCH_CUDA_ARCH_LIST (torch warns about
  # CMAKE_CUDA_ARCHITECTURES, which CMake would otherwise set).
  cmake_policy(SET CMP0104 OLD)
  if(NOT CUDA_TOOLKIT_ROOT_DIR AND NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDA_HOME})
    find_program(_strata_nvcc nvcc)
    if(_strata_nvcc)
      execute_process(COMMAND "${_strata_nvcc}" -dryrun -x cu /dev/null -o /dev/null
                      ERROR_VARIABLE _strata_dryrun OUTPUT_QUIET RESULT_VARIABLE _strata_rc)
      if(_strata_dryrun MATCHES "#\\$ TOP=([^\n]+)")
        get_filename_component(_strata_cuda_root "${CMAKE_MATCH_1}" REALPATH)
        if(EXISTS "${_strata_cuda_root}/include/cuda_runtime_api.h")
          set(CUDA_TOOLKIT_ROOT_DIR "${_strata_cuda_root}" CACHE PATH "The CUDA toolkit (found from nvcc)")
        endif()
      endif()
    endif()
  endif()
  if(NOT CUDA_nvrtc_LIBRARY AND STRATA_PYTHON)
    execute_process(
      COMMAND "${STRATA_PYTHON}" -c
              "import nvidia, os; print(';'.join(os.path.join(p, d, 'lib') for p in nvidia.__path__ for d in sorted(os.listdir(p))), end='')"
      OUTPUT_VARIABLE _strata_nvidia_libs ERROR_QUIET RESULT_VARIABLE _strata_rc)
    if(_strata_rc EQUAL 0 AND _strata_nvidia_libs)
      find_library(CUDA_nvrtc_LIBRARY NAMES nvrtc libnvrtc.so.13 libnvrtc.so.12 HINTS ${_strata_nvidia_libs} NO_DEFAULT_PATH)
    endif()
  endif()
endmacro()
