# Finding LibTorch 2.x, and building against the Gloo inside it.
#
# strata_find_torch(MIN_VERSION): find_package(Torch MIN_VERSION) from
# CMAKE_PREFIX_PATH or Torch_DIR when either names a LibTorch; otherwise
# asks STRATA_PYTHON (default: python3 on PATH) for the LibTorch inside its
# torch wheel (torch.utils.cmake_prefix_path). Fails with what to do when
# neither has one, or when the one found is older than MIN_VERSION.
set(STRATA_PYTHON "" CACHE FILEPATH "Python whose torch wheel provides LibTorch when CMAKE_PREFIX_PATH/Torch_DIR name none")

macro(strata_find_torch min_version)
  find_package(Torch ${min_version} QUIET CONFIG)
  if(NOT Torch_FOUND)
    set(_strata_python "${STRATA_PYTHON}")
    if(NOT _strata_python)
      find_program(_strata_python NAMES python3 python)
    endif()
    if(_strata_python)
      execute_process(
        COMMAND "${_strata_python}" -c "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
        OUTPUT_VARIABLE _strata_torch_prefix ERROR_QUIET RESULT_VARIABLE _strata_rc)
      if(_strata_rc EQUAL 0 AND _strata_torch_prefix)
        find_package(Torch ${min_version} QUIET CONFIG PATHS "${_strata_torch_prefix}" NO_DEFAULT_PATH)
      endif()
    endif()
  endif()
  # The Python the tests run their reference readers with (torch,
  # safetensors): STRATA_PYTHON, else python3 on PATH.
  if(STRATA_PYTHON)
    set(STRATA_TEST_PYTHON "${STRATA_PYTHON}")
  else()
    find_program(STRATA_TEST_PYTHON NAMES python3 python)
  endif()
  if(NOT Torch_FOUND)
    message(FATAL_ERROR
      "strata needs LibTorch >= ${min_version}. None was found in CMAKE_PREFIX_PATH or Torch_DIR, "
      "nor in the torch wheel of STRATA_PYTHON ('${STRATA_PYTHON}'; python3 on PATH when empty). "
      "Run scripts/install-deps.sh (it makes a venv with torch==2.13.0 and passes it here), or pass "
      "-DCMAKE_PREFIX_PATH=<libtorch> or -DSTRATA_PYTHON=<python with torch>.")
  endif()
  message(STATUS "strata: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
  # The headers of the found LibTorch, for the Gloo check below.
  find_path(STRATA_TORCH_INCLUDE_DIR torch/csrc/distributed/c10d/ProcessGroupGloo.hpp
            PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(NOT STRATA_TORCH_INCLUDE_DIR)
    message(FATAL_ERROR "strata: this LibTorch (${Torch_DIR}) has no c10d headers "
                        "(torch/csrc/distributed/c10d/ProcessGroupGloo.hpp); use a build with distributed support")
  endif()
endmacro()

# strata_gloo_bridge(TARGET SOURCE): adds SOURCE, the one file that includes
# c10d's ProcessGroupGloo.hpp, to TARGET. That header includes five Gloo
# headers. LibTorch archives may ship them; the torch wheels do not. Without
# them, SOURCE compiles against src/comm/gloo/decl/, strata's declarations
# of the four Gloo names the header mentions (every one held by pointer, so
# the class layout does not depend on them). Either way, the Gloo that runs
# is the copy inside libtorch_cpu: strata links no other.
function(strata_gloo_bridge target source)
  target_sources(${target} PRIVATE ${source})
  set_source_files_properties(${source} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  if(NOT EXISTS "${STRATA_TORCH_INCLUDE_DIR}/gloo/context.h")
    set_source_files_properties(${source} PROPERTIES INCLUDE_DIRECTORIES ${PROJECT_SOURCE_DIR}/src/comm/gloo/decl)
    message(STATUS "strata: LibTorch ships no Gloo headers; c10d's ProcessGroupGloo compiled with strata's declarations")
  endif()
endfunction()
