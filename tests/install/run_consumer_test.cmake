# The installed package is relocatable. Installs the build at
# STRATA_BINARY_DIR into a prefix, moves the prefix to another folder, and
# checks there that:
#  - no installed file names this machine's LibTorch or venv, or the
#    prefix it was installed to (grep over every file, binaries included);
#  - libstrata and the tool's executable have $ORIGIN-relative RUNPATHs;
#  - the README's CMake project (its CMakeLists.txt and train.cpp blocks,
#    taken verbatim) configures against the moved prefix with LibTorch
#    named by Torch_DIR only, builds, and trains on 2 workers;
#  - a consumer naming no LibTorch, or a LibTorch of another version, is
#    refused with what to do; one naming a Python with torch configures;
#  - the installed tool, from a clean environment, finds LibTorch through
#    STRATA_LIBTORCH or STRATA_PYTHON, and trains a few steps.
# Run with cmake -P; fails on any error. Variables: STRATA_BINARY_DIR,
# STRATA_SOURCE_DIR, STRATA_TORCH_DIR (the build's Torch_DIR),
# STRATA_TORCH_PREFIX (its TORCH_INSTALL_PREFIX), STRATA_TORCH_VERSION,
# STRATA_TEST_PYTHON (may be empty).
set(work ${STRATA_BINARY_DIR}/install-test)
file(REMOVE_RECURSE ${work})
set(staging ${work}/installed-here)
set(moved ${work}/moved-there/strata)

# The consumer's steps run without the build's hints in the environment.
set(clean_env ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH --unset=STRATA_PYTHON --unset=STRATA_LIBTORCH
              --unset=CMAKE_PREFIX_PATH --unset=Torch_DIR --unset=Torch_ROOT)

# run_step(cmd...): runs cmd, fails the test unless it exits 0; its output
# in step_output. run_failing_step(cmd...): the same for a cmd that must fail.
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()
function(run_failing_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "step should have failed: ${ARGN}\n${out}\n${err}")
  endif()
  # CMake wraps long messages; compare the text with the line breaks joined.
  string(REGEX REPLACE "[ \n]+" " " joined "${out}${err}")
  set(step_output "${joined}" PARENT_SCOPE)
endfunction()
function(expect_output what)
  foreach(text IN LISTS ARGN)
    string(FIND "${step_output}" "${text}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${what}: the output lacks '${text}':\n${step_output}")
    endif()
  endforeach()
endfunction()

# ---- install, then move ------------------------------------------------------
run_step(${CMAKE_COMMAND} --install ${STRATA_BINARY_DIR} --prefix ${staging})
get_filename_component(moved_parent ${moved} DIRECTORY)
file(MAKE_DIRECTORY ${moved_parent})
file(RENAME ${staging} ${moved})
if(EXISTS ${staging} OR NOT EXISTS ${moved}/lib/cmake/strata/strataConfig.cmake)
  message(FATAL_ERROR "the install at ${staging} was not moved to ${moved}")
endif()

# ---- nothing installed names this machine's paths ---------------------------
set(forbidden ${STRATA_TORCH_PREFIX} ${staging})
get_filename_component(real_torch ${STRATA_TORCH_PREFIX} REALPATH)
list(APPEND forbidden ${real_torch})
if(STRATA_TEST_PYTHON)
  # The venv (when the build's Python is one), which holds LibTorch.
  execute_process(COMMAND ${STRATA_TEST_PYTHON} -c "import sys; print(sys.prefix if sys.prefix != sys.base_prefix else '', end='')"
                  OUTPUT_VARIABLE venv RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND venv)
    list(APPEND forbidden ${venv})
  endif()
endif()
list(REMOVE_DUPLICATES forbidden)
set(patterns "")
foreach(path IN LISTS forbidden)
  list(APPEND patterns -e ${path})
endforeach()
execute_process(COMMAND grep -rlaF ${patterns} ${moved} RESULT_VARIABLE rc OUTPUT_VARIABLE hits)
if(rc EQUAL 0)
  execute_process(COMMAND grep -rhoaF ${patterns} ${moved} OUTPUT_VARIABLE samples)
  message(FATAL_ERROR "installed files name this machine's paths (${forbidden}):\n${hits}\nfor example:\n${samples}")
elseif(NOT rc EQUAL 1)
  message(FATAL_ERROR "grep over ${moved} failed (${rc})")
endif()
message(STATUS "no installed file names ${forbidden}")

# ---- RUNPATHs -----------------------------------------------------------------
find_program(readelf NAMES readelf)
if(readelf)
  file(GLOB libstrata ${moved}/lib/libstrata.so.*.*)
  foreach(pair "${libstrata}=\$ORIGIN" "${moved}/libexec/strata/strata=\$ORIGIN/../../lib")
    string(REGEX MATCH "^([^=]+)=(.*)$" _ "${pair}")
    set(file ${CMAKE_MATCH_1})
    set(want ${CMAKE_MATCH_2})
    run_step(${readelf} -d ${file})
    if(NOT step_output MATCHES "\\((RUNPATH|RPATH)\\)[^\n]*\\[([^\n]*)\\]" OR NOT CMAKE_MATCH_2 STREQUAL want)
      message(FATAL_ERROR "${file}: RUNPATH '${CMAKE_MATCH_2}', expected '${want}'")
    endif()
    message(STATUS "${file}: RUNPATH ${want}")
  endforeach()
endif()

# ---- the README's project, against the moved prefix --------------------------
# readme_block(marker file): writes the fenced block that follows the
# comment `<!-- tests/install: <marker> -->` in README.md to `file`.
file(READ ${STRATA_SOURCE_DIR}/README.md readme)
function(readme_block marker file)
  string(FIND "${readme}" "<!-- tests/install: ${marker} -->" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md has no '<!-- tests/install: ${marker} -->' block")
  endif()
  string(SUBSTRING "${readme}" ${at} -1 rest)
  if(NOT rest MATCHES "^[^\n]*\n```[a-z]*\n(.*)")
    message(FATAL_ERROR "README.md: no fenced block right after the '${marker}' marker")
  endif()
  set(rest "${CMAKE_MATCH_1}")
  string(FIND "${rest}" "\n```" end)
  string(SUBSTRING "${rest}" 0 ${end} block)
  file(WRITE ${file} "${block}\n")
endfunction()
set(project ${work}/my_trainer)
readme_block(CMakeLists.txt ${project}/CMakeLists.txt)
readme_block(train.cpp ${project}/train.cpp)

# Refused: no LibTorch named (a Python that does not exist, no hint).
run_failing_step(${clean_env} ${CMAKE_COMMAND} -S ${project} -B ${work}/no-torch
                 -Dstrata_DIR=${moved}/lib/cmake/strata -DSTRATA_PYTHON=${work}/no-such-python)
expect_output("a consumer with no LibTorch" "strata needs LibTorch ${STRATA_TORCH_VERSION}"
              "-DTorch_DIR=" "-DCMAKE_PREFIX_PATH=" "-DSTRATA_PYTHON=")
# Refused: a LibTorch of another version.
set(fake ${work}/fake-libtorch/share/cmake/Torch)
file(WRITE ${fake}/TorchConfig.cmake "add_library(torch INTERFACE IMPORTED)\nset(TORCH_LIBRARIES torch)\n")
file(WRITE ${fake}/TorchConfigVersion.cmake "set(PACKAGE_VERSION 1.0.0)\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n")
run_failing_step(${clean_env} ${CMAKE_COMMAND} -S ${project} -B ${work}/other-torch
                 -DCMAKE_PREFIX_PATH=${moved} -DTorch_DIR=${fake})
expect_output("a consumer with another LibTorch"
              "strata was built with LibTorch ${STRATA_TORCH_VERSION}, but this project found LibTorch '1.0.0'")
# Found through a Python's torch wheel.
if(STRATA_TEST_PYTHON)
  execute_process(COMMAND ${STRATA_TEST_PYTHON} -c "import torch" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    run_step(${clean_env} ${CMAKE_COMMAND} -S ${project} -B ${work}/by-python
             -DCMAKE_PREFIX_PATH=${moved} -DSTRATA_PYTHON=${STRATA_TEST_PYTHON})
    message(STATUS "the README's project configures with STRATA_PYTHON=${STRATA_TEST_PYTHON}")
  endif()
endif()

# Built with LibTorch named by Torch_DIR only, and run.
run_step(${clean_env} ${CMAKE_COMMAND} -S ${project} -B ${work}/build
         -DCMAKE_PREFIX_PATH=${moved} -DTorch_DIR=${STRATA_TORCH_DIR} -DCMAKE_BUILD_TYPE=Release)
run_step(${CMAKE_COMMAND} --build ${work}/build)
file(MAKE_DIRECTORY ${work}/run)
# One thread per worker here and under torchrun below, so both runs do the
# same arithmetic (a matmul's last bits depend on its thread count).
execute_process(COMMAND ${clean_env} OMP_NUM_THREADS=1 ${work}/build/my_trainer WORKING_DIRECTORY ${work}/run
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "final loss ([0-9.e+-]+)" OR NOT EXISTS ${work}/run/ckpt/final/metadata.json)
  message(FATAL_ERROR "the README's program did not train on 2 workers (${rc}):\n${out}\n${err}")
endif()
if(NOT CMAKE_MATCH_1 LESS 0.5)
  message(FATAL_ERROR "the README's program did not fit its data (final loss ${CMAKE_MATCH_1}):\n${out}")
endif()
message(STATUS "the README's program, built against the moved install: ${out}")
set(own_launch_loss ${CMAKE_MATCH_1})

# The same program under torchrun (docs/launcher.md, "torchrun and
# TorchElastic"): the agent starts the 2 workers, which join its store and
# each print rank 0's result, the one the program printed above.
if(STRATA_TEST_PYTHON)
  get_filename_component(venv_bin ${STRATA_TEST_PYTHON} DIRECTORY)
  if(EXISTS ${venv_bin}/torchrun)
    file(MAKE_DIRECTORY ${work}/torchrun)
    string(RANDOM LENGTH 4 ALPHABET 0123456789 port_tail)
    math(EXPR port "20000 + ${port_tail}")
    execute_process(COMMAND ${clean_env} OMP_NUM_THREADS=1 ${venv_bin}/torchrun --nproc-per-node 2 --master-port ${port}
                            --no-python ${work}/build/my_trainer
                    WORKING_DIRECTORY ${work}/torchrun RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0 OR NOT out MATCHES "final loss ([0-9.e+-]+)")
      message(FATAL_ERROR "the README's program under torchrun failed (${rc}):\n${out}\n${err}")
    endif()
    if(NOT CMAKE_MATCH_1 STREQUAL own_launch_loss)
      message(FATAL_ERROR "the README's program under torchrun ended with final loss ${CMAKE_MATCH_1}, under its own "
                          "launch with ${own_launch_loss}:\n${out}")
    endif()
    message(STATUS "the README's program under torchrun: ${out}")
  endif()
endif()

# The same program under `strata launch` (the in-place launcher in each of
# its 2 workers): rank 0's line, prefixed, with the same loss.
file(MAKE_DIRECTORY ${work}/strata-launch)
execute_process(COMMAND ${clean_env} OMP_NUM_THREADS=1 STRATA_LIBTORCH=${STRATA_TORCH_PREFIX}
                        ${moved}/bin/strata launch -n 2 -- ${work}/build/my_trainer
                WORKING_DIRECTORY ${work}/strata-launch RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\\[rank 0\\] final loss ([0-9.e+-]+)")
  message(FATAL_ERROR "the README's program under strata launch failed (${rc}):\n${out}\n${err}")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL own_launch_loss)
  message(FATAL_ERROR "the README's program under strata launch ended with final loss ${CMAKE_MATCH_1}, under its "
                      "own launch with ${own_launch_loss}:\n${out}")
endif()
message(STATUS "the README's program under strata launch: ${out}")

# ---- the installed tool --------------------------------------------------------
run_failing_step(${clean_env} STRATA_PYTHON=${work}/no-such-python ${moved}/bin/strata --version)
expect_output("the tool with no LibTorch" "STRATA_PYTHON='${work}/no-such-python' has no torch package")
if(STRATA_TEST_PYTHON)
  run_step(${clean_env} STRATA_PYTHON=${STRATA_TEST_PYTHON} ${moved}/bin/strata --version)
  expect_output("the tool through STRATA_PYTHON" "strata 0.1.0")
endif()
run_step(${clean_env} STRATA_LIBTORCH=${STRATA_TORCH_PREFIX}
         ${moved}/bin/strata train --devices 2 --model-size tiny --max-steps 3 --batch-size 4
         --sample-tokens 0 --log-every 1 --ckpt-dir ${work}/ckpt)
if(NOT step_output MATCHES "done: 3 steps" OR NOT EXISTS ${work}/ckpt/step-00000003/metadata.json)
  message(FATAL_ERROR "the installed strata did not train 3 steps:\n${step_output}")
endif()
message(STATUS "the moved strata tool trained: ${step_output}")
