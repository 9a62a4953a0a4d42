// Element-wise reductions of N inputs, shared by the shm backend (N ranks'
// slots at once) and the Gloo backend's ring (N = 2: the running sum and
// the peer's chunk): out[i] = in[0][i] op in[1][i] op ... op in[N-1][i],
// folded left in rank order, so every rank that reduces the same elements
// gets the same bits.
//
// Note [Reduction order and 16-bit floats]
// Sums fold in rank order ((x0 + x1) + x2) + ...: the same order on every
// rank and for every size, so replicas never drift apart. With 2 ranks
// this equals what the Gloo backend gives (x0 + x1 == x1 + x0 in IEEE
// arithmetic); with more ranks Gloo's ring adds in another order and the
// last bit may differ.
//
// Note [Half-precision reductions]
// Reducing 16-bit floats as raw integers would be wrong. bfloat16 and
// float16 are widened to float32, combined, and rounded back once per
// call: for the ring (two inputs a step) that is widen-combine-round per
// peer, what NCCL and c10d's Gloo all-reduce do, with at most one rounding
// per rank; for shm (all ranks in one call) it is one rounding in all,
// which for 2 ranks equals the ring and for more is the more accurate.
//
// Note [Vectorized kernels]
// The project builds at -O2, where GCC 12 only vectorizes loops without a
// scalar remainder, so these loops would run one element at a time
// (PyTorch's Gloo kernels are built at -O3). Each kernel asks for -O3
// itself; `ivdep` is valid because the output may only alias an input
// exactly (element i reads and writes index i only).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "strata/comm/backend.h"
#include "strata/core/error.h"

namespace strata::comm::kernels {

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
// have no dependencies between elements, so -O3 vectorizes them (Note
// [Vectorized kernels]).
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
  STRATA_ASSERT(false, "[comm] mean must be lowered to sum by comm::Group");
}

}  // namespace strata::comm::kernels
