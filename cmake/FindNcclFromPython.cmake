# Finding NCCL for the NCCL backend (STRATA_WITH_NCCL).
#
# strata_find_nccl(): sets STRATA_NCCL_INCLUDE_DIR (nccl.h) and
# STRATA_NCCL_LIBRARY (libnccl.so.2). Looks, in order, under NCCL_ROOT
# (CMake or environment variable), in the nvidia-nccl wheel of
# STRATA_PYTHON (the one a CUDA torch wheel brings and loads: the process
# then has one NCCL), and in the system's default paths. Fails with what to
# do when none has it, or when it is older than NCCL 2.14 (non-blocking
# communicators, bfloat16).
function(strata_find_nccl)
  set(hints "")
  if(NCCL_ROOT)
    list(APPEND hints "${NCCL_ROOT}")
  endif()
  if(DEFINED ENV{NCCL_ROOT})
    list(APPEND hints "$ENV{NCCL_ROOT}")
  endif()
  if(STRATA_PYTHON)
    execute_process(
      COMMAND "${STRATA_PYTHON}" -c "import nvidia.nccl as m; print(list(m.__path__)[0], end='')"
      OUTPUT_VARIABLE wheel ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND wheel)
      list(APPEND hints "${wheel}")
    endif()
  endif()
  find_path(STRATA_NCCL_INCLUDE_DIR nccl.h HINTS ${hints} PATH_SUFFIXES include)
  find_library(STRATA_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${hints} PATH_SUFFIXES lib lib64)
  if(NOT STRATA_NCCL_INCLUDE_DIR OR NOT STRATA_NCCL_LIBRARY)
    message(FATAL_ERROR
      "STRATA_WITH_NCCL=ON but NCCL was not found (nccl.h: '${STRATA_NCCL_INCLUDE_DIR}', library: "
      "'${STRATA_NCCL_LIBRARY}'). Use a STRATA_PYTHON whose CUDA torch wheel brought nvidia-nccl "
      "(scripts/build-cuda.sh makes one), or set NCCL_ROOT to a folder with include/nccl.h and lib/libnccl.so*.")
  endif()
  file(STRINGS "${STRATA_NCCL_INCLUDE_DIR}/nccl.h" lines REGEX "^#define NCCL_(MAJOR|MINOR) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*" "\\1" major "${lines}")
  string(REGEX REPLACE ".*NCCL_MINOR ([0-9]+).*" "\\1" minor "${lines}")
  if(NOT major MATCHES "^[0-9]+$" OR NOT minor MATCHES "^[0-9]+$" OR "${major}.${minor}" VERSION_LESS 2.14)
    message(FATAL_ERROR "strata: NCCL ${major}.${minor} in ${STRATA_NCCL_INCLUDE_DIR} is too old; the NCCL backend needs 2.14 or newer")
  endif()
  message(STATUS "strata: NCCL ${major}.${minor} from ${STRATA_NCCL_LIBRARY}")
endfunction()
