// Shared by the CUDA tests: the skip, with its reason, where there is no GPU.
#pragma once

#include <gtest/gtest.h>

#include <ATen/Context.h>

/// Skips the test, saying why, when LibTorch sees no GPU (a CPU build of
/// LibTorch, no driver, or CUDA_VISIBLE_DEVICES hiding every GPU).
#define STRATA_REQUIRE_GPU()                                                                                 \
  do {                                                                                                      \
    if (!at::hasCUDA())                                                                                     \
      GTEST_SKIP() << "no GPU visible: this test needs a CUDA LibTorch and an NVIDIA GPU "                  \
                      "(scripts/gpu-check.sh builds strata against one and runs it)";                       \
  } while (0)
