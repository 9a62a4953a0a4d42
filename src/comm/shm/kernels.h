// Element-wise reductions of N inputs for the shm backend:
// out[i] = in[0][i] op in[1][i] op ... op in[N-1][i], folded left in rank
// order, so every rank that reduces the same elements gets the same bits.
//
// Note [Reduction order and 16-bit floats]
// Sums fold in rank order ((x0 + x1) + x2) + ...: the same order on every
// rank and for every size, so replicas never drift apart. With 2 ranks
// this equals what the Gloo backend gives (x0 + x1 == x1 + x0 in IEEE
// arithmetic); with more ranks Gloo's ring adds in another order and the
// last bit may differ. bfloat16 and float16 accumulate in float32 across
// all ranks and round once at the end, which for 2 ranks equals Gloo's
// widen-add-round and for more ranks is the more accurate of the two.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstddef>

#include "strata/comm/backend.h"
#include "strata/core/error.h"

namespace strata::comm::shm::kernels {

/// out (count elements) = the reduction of the n arrays in[0..n-1], also
/// written to `also` when it is not null (one pass instead of a reduction
/// and a copy). `out` may alias one of the inputs exactly.
using ReduceFn = void (*)(void* out, void* also, const void* const* in, int n, size_t count);

template <class T> struct Acc { using type = T; };
template <> struct Acc<c10::BFloat16> { using type = float; };
template <> struct Acc<c10::Half> { using type = float; };

struct Sum { template <class A> A operator()(A a, A b) const { return a + b; } };
struct Product { template <class A> A operator()(A a, A b) const { return a * b; } };
struct Max { template <class A> A operator()(A a, A b) const { return std::max(a, b); } };
struct Min { template <class A> A operator()(A a, A b) const { return std::min(a, b); } };

// Blocks of kBlock elements keep the accumulator in L1; the inner loops
// have no dependencies between elements, so -O3 vectorizes them (the
// project builds at -O2: see the Gloo backend's Note [Vectorized kernels]).
constexpr size_t kBlock = 1024;

template <class T, class Op>
__attribute__((optimize("O3"))) void reduce_n(void* out_, void* also_, const void* const* in_, int n, size_t count) {
  using A = typename Acc<T>::type;
  T* out = static_cast<T*>(out_);
  T* also = static_cast<T*>(also_);
  Op op;
  if constexpr (std::is_same_v<A, T>) {
    if (n == 2) {
      const T* a = static_cast<const T*>(in_[0]);
      const T* b = static_cast<const T*>(in_[1]);
      if (also == nullptr) {
#pragma GCC ivdep
        for (size_t i = 0; i < count; ++i) out[i] = op(a[i], b[i]);
      } else {
#pragma GCC ivdep
        for (size_t i = 0; i < count; ++i) {
          const T v = op(a[i], b[i]);
          out[i] = v;
          also[i] = v;
        }
      }
      return;
    }
  }
  A acc[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t m = std::min(kBlock, count - start);
    const T* first = static_cast<const T*>(in_[0]) + start;
    for (size_t i = 0; i < m; ++i) acc[i] = static_cast<A>(first[i]);
    for (int k = 1; k < n; ++k) {
      const T* x = static_cast<const T*>(in_[k]) + start;
      for (size_t i = 0; i < m; ++i) acc[i] = op(acc[i], static_cast<A>(x[i]));
    }
    for (size_t i = 0; i < m; ++i) out[start + i] = static_cast<T>(acc[i]);
    if (also != nullptr) {
      for (size_t i = 0; i < m; ++i) also[start + i] = out[start + i];
    }
  }
}

template <class T>
ReduceFn reduce_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return &reduce_n<T, Sum>;
    case ReduceOp::kProduct: return &reduce_n<T, Product>;
    case ReduceOp::kMax: return &reduce_n<T, Max>;
    case ReduceOp::kMin: return &reduce_n<T, Min>;
    case ReduceOp::kMean: break;
  }
  STRATA_ASSERT(false, "[shm] mean must be lowered to sum by comm::Group");
}

}  // namespace strata::comm::shm::kernels
