# Helpers that keep the per-area targets uniform.

# The precompiled header of every strata target: the LibTorch headers that
# cost ~20 s to parse in each translation unit, parsed once per build.
# Sources still include the narrow headers they need; with these
# precompiled those includes are free. Named as <...>, never by a path in
# the source tree, so the generated header is the same in every clone
# (Note [Compiler cache] in CMakeLists.txt).
set(STRATA_PCH_HEADERS <ATen/ATen.h> <torch/autograd.h> <torch/nn.h> <torch/optim.h> <nlohmann/json.hpp>
    <algorithm> <chrono> <functional> <map> <memory> <string> <vector>)
set(STRATA_AREAS "")

# strata_use_pch(target): compile `target` with the shared precompiled header
# (built once, by strata_core).
function(strata_use_pch target)
  if(STRATA_USE_PCH)
    if(target STREQUAL "strata_core")
      target_precompile_headers(${target} PRIVATE ${STRATA_PCH_HEADERS})
    else()
      target_precompile_headers(${target} REUSE_FROM strata_core)
    endif()
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      # The header was precompiled with -fPIC (for the shared library); an
      # executable's default -fPIE would make GCC ignore it. -fPIC code
      # links into a PIE executable all the same.
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
      target_compile_options(${target} PRIVATE -fPIC)
    endif()
  endif()
endfunction()

# strata_add_area(name): the object library strata_<name> from
# src/<name>/**/*.cpp (backend sources under src/comm/nccl/ are added by hand).
function(strata_add_area name)
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*.cpp)
  list(FILTER sources EXCLUDE REGEX "/src/comm/nccl/")
  if(NOT sources)
    # An area without sources yet still gets a (header-only) target.
    set(sources ${PROJECT_SOURCE_DIR}/cmake/empty.cpp)
  endif()
  add_library(strata_${name} OBJECT ${sources})
  target_include_directories(strata_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(strata_${name} PUBLIC ${TORCH_LIBRARIES} nlohmann_json::nlohmann_json Threads::Threads)
  strata_use_pch(strata_${name})
  set(STRATA_AREAS ${STRATA_AREAS} ${name} PARENT_SCOPE)
endfunction()

# strata_add_test_suite(name AREAS a b c): the GoogleTest executable
# strata_<name>_tests from tests/<name>/*_test.cpp plus the shared test
# support, linked against the objects of the listed areas only (so one
# area's tests build while another area is being changed).
function(strata_add_test_suite name)
  cmake_parse_arguments(ARG "" "" "AREAS;LIBS" ${ARGN})
  if(STRATA_TEST_SUITES AND NOT name IN_LIST STRATA_TEST_SUITES)
    return()
  endif()
  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/${name}/*_test.cpp)
  if(NOT sources)
    return()
  endif()
  set(target strata_${name}_tests)
  add_executable(${target} ${sources})
  # The shared test support is compiled once (tests/CMakeLists.txt).
  target_link_libraries(${target} PRIVATE strata_test_main)
  if("runtime" IN_LIST ARG_AREAS)
    # Multi-process tests start workers through the launcher.
    target_link_libraries(${target} PRIVATE strata_test_multiprocess)
  endif()
  foreach(area IN LISTS ARG_AREAS)
    target_link_libraries(${target} PRIVATE strata_${area})
  endforeach()
  target_link_libraries(${target} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock Threads::Threads)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  strata_use_pch(${target})
  # Tests find the tool, the source tree and the reference readers' Python
  # through the paths test_main sets (tests/support/test_paths.h.in).
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
endfunction()
