// Stub compiled when strata is built without NCCL (STRATA_WITH_NCCL=OFF).
#include "strata/comm/nccl/backend.h"
#include "strata/core/error.h"

namespace strata::comm::nccl {

bool is_available() { return false; }

std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store>, int, int, std::chrono::milliseconds) {
  throw ConfigError(
      "[nccl] strata was built without NCCL; rebuild against a CUDA LibTorch with NCCL "
      "(cmake -DSTRATA_WITH_NCCL=ON), or use the gloo backend for CPU tensors");
}

}  // namespace strata::comm::nccl
