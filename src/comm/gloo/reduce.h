// Element-wise reduction kernels for the Gloo backend's ring
// reduce-scatter, one per (dtype, op): c[i] = a[i] (op) b[i] over n
// elements (c may alias a or b).
//
// Note [Half-precision reductions]
// Reducing 16-bit floats as raw integers would be wrong. Each element is
// widened to float, combined, and rounded back once, which is exact for
// max/min and correctly rounded per step for sum/product (what NCCL, and
// c10d's Gloo all-reduce, do for these types). Accumulation across ranks
// happens one step per peer, so the error is at most one rounding per rank.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstddef>
#include <functional>

#include "strata/comm/backend.h"
#include "strata/core/error.h"

namespace strata::comm::gloo::kernels {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

/// The type arithmetic happens in: float for the 16-bit floats, T otherwise.
template <class T>
struct Accumulate { using type = T; };
template <>
struct Accumulate<c10::BFloat16> { using type = float; };
template <>
struct Accumulate<c10::Half> { using type = float; };

// Note [Vectorized kernels]
// The project builds at -O2, where GCC 12 only vectorizes loops without a
// scalar remainder, so these loops ran one element at a time and made
// reduce_scatter slower than it should be (PyTorch's Gloo kernels are built
// at -O3). Each kernel asks for -O3 itself; `ivdep` is valid because c may
// only alias a or b exactly (element i reads and writes index i only).
template <class T, class Combine>
__attribute__((optimize("O3"))) void reduce_kernel(void* c_, const void* a_, const void* b_, size_t n) {
  using Acc = typename Accumulate<T>::type;
  T* c = static_cast<T*>(c_);
  const T* a = static_cast<const T*>(a_);
  const T* b = static_cast<const T*>(b_);
  Combine combine;
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) {
    c[i] = static_cast<T>(combine(static_cast<Acc>(a[i]), static_cast<Acc>(b[i])));
  }
}

struct SumOp { template <class A> A operator()(A a, A b) const { return a + b; } };
struct ProductOp { template <class A> A operator()(A a, A b) const { return a * b; } };
struct MaxOp { template <class A> A operator()(A a, A b) const { return std::max(a, b); } };
struct MinOp { template <class A> A operator()(A a, A b) const { return std::min(a, b); } };

/// The kernel for element type T and `op` (never kMean).
template <class T>
ReduceFn reduce_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return &reduce_kernel<T, SumOp>;
    case ReduceOp::kProduct: return &reduce_kernel<T, ProductOp>;
    case ReduceOp::kMax: return &reduce_kernel<T, MaxOp>;
    case ReduceOp::kMin: return &reduce_kernel<T, MinOp>;
    case ReduceOp::kMean: break;
  }
  STRATA_ASSERT(false, "[gloo] mean must be lowered to sum by comm::Group");
}

}  // namespace strata::comm::gloo::kernels
