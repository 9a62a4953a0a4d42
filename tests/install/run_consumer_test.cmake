# Installs the build at STRATA_BINARY_DIR into a temporary prefix, then
# configures, builds and runs tests/install/consumer (a project that only
# does find_package(strata)). Run with cmake -P; fails on any error.
set(work ${STRATA_BINARY_DIR}/install-test)
file(REMOVE_RECURSE ${work})
set(prefix ${work}/prefix)

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step(${CMAKE_COMMAND} --install ${STRATA_BINARY_DIR} --prefix ${prefix})
run_step(${CMAKE_COMMAND} -S ${STRATA_SOURCE_DIR}/tests/install/consumer -B ${work}/build
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run_step(${CMAKE_COMMAND} --build ${work}/build)
run_step(${work}/build/consumer)
if(NOT step_output MATCHES "consumer: world size 1, all_reduce ok")
  message(FATAL_ERROR "consumer printed unexpected output:\n${step_output}")
endif()
message(STATUS "consumer output: ${step_output}")
