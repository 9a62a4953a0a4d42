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
  set(step_output "${out}${err}" PARENT_SCOPE)
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

# The installed tool starts from a clean environment (no LD_LIBRARY_PATH:
# its RUNPATH finds libstrata and LibTorch) and trains a few steps on 2
# workers.
run_step(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
         ${prefix}/bin/strata train --devices 2 --model-size tiny --max-steps 3 --batch-size 4
         --sample-tokens 0 --log-every 1 --ckpt-dir ${work}/ckpt)
if(NOT step_output MATCHES "done: 3 steps" OR NOT EXISTS ${work}/ckpt/step-00000003/metadata.json)
  message(FATAL_ERROR "the installed strata did not train 3 steps:\n${step_output}")
endif()
message(STATUS "installed strata trained: ${step_output}")
