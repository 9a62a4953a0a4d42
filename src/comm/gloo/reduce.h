// The Gloo backend's ring reduce-scatter step, c[i] = a[i] (op) b[i] over
// n elements (c may alias a or b): the shared N-input kernels
// (comm/reduce_kernels.h, Notes [Half-precision reductions] and
// [Vectorized kernels]) with two inputs.
#pragma once

#include <cstddef>
#include <functional>

#include "../reduce_kernels.h"

namespace strata::comm::gloo::kernels {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

/// The kernel for element type T and `op` (never kMean).
template <class T>
ReduceFn reduce_function(ReduceOp op) {
  const comm::kernels::ReduceFn reduce = comm::kernels::reduce_function<T>(op);
  return [reduce](void* c, const void* a, const void* b, size_t n) {
    const void* in[2] = {a, b};
    reduce(c, nullptr, in, 2, n);
  };
}

}  // namespace strata::comm::gloo::kernels
