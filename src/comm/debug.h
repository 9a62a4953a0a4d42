// Internals of comm::Group shared by its source files: the operation
// kinds, the cross-rank debug descriptors (Note [Debug descriptors],
// debug.cpp) and the error they raise.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "strata/comm/backend.h"
#include "strata/core/error.h"

namespace strata::comm::detail {

enum class OpKind : int64_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier };

/// "all_reduce", "all_gather", ...
const char* op_name(OpKind op);

/// "float32", "bfloat16", ... for a c10::ScalarType's number.
std::string dtype_name(int64_t scalar_type);

constexpr int kMaxDims = 8;
constexpr int kNameWords = 2;  // barrier names: first 16 bytes
/// One call, as every rank compares it (Note [Debug descriptors]).
struct Descriptor {
  int64_t op = 0, reduce_op = -1, dtype = -1, ndim = 0, numel = 0, seq = 0, src = -1;
  int64_t dims[kMaxDims] = {};
  int64_t name[kNameWords] = {};
};
constexpr int kDescriptorWords = sizeof(Descriptor) / sizeof(int64_t);

/// The descriptor of call `seq` of `op` on `t` (nullptr: a barrier).
Descriptor describe(OpKind op, int64_t seq, const at::Tensor* t, int64_t reduce_op, int64_t src,
                    const std::string& name);

/// The mismatch message for `all` (every rank's descriptor), "" when they
/// agree. Identical on every rank.
std::string compare_descriptors(const std::vector<Descriptor>& all);

/// Thrown by the debug check; unlike a backend failure it leaves the group
/// usable (every rank saw the same descriptors and threw together).
class MismatchError final : public CommError {
 public:
  using CommError::CommError;
};

/// Exchanges `mine` with every rank through `backend` (on its device, waiting
/// for a stream-ordered backend's result) and throws MismatchError
/// "[comm] <label>: ..." when the descriptors differ.
void check_descriptors(Backend& backend, const Descriptor& mine, const std::string& label);

}  // namespace strata::comm::detail
