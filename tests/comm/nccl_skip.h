// Why the NCCL tests cannot run on this machine: shared by the NCCL
// backend's tests and the conformance suite's NCCL cases.
#pragma once

#include <torch/cuda.h>

#include <string>

#include "strata/comm/nccl/backend.h"

namespace strata::testing {

/// Why the NCCL tests cannot run here with `gpus` GPUs, or "" when they can.
inline std::string nccl_unavailable(int gpus) {
  if (!comm::nccl::is_available()) {
    return "strata was built without NCCL (STRATA_WITH_NCCL=OFF; scripts/build-cuda.sh builds it)";
  }
  if (!torch::cuda::is_available()) return "no CUDA device is visible";
  const int found = static_cast<int>(torch::cuda::device_count());
  if (found < gpus) {
    return "needs " + std::to_string(gpus) + " GPUs (NCCL refuses two ranks on one GPU), found " + std::to_string(found);
  }
  return "";
}

}  // namespace strata::testing
