// The Fourier transforms on the xla device: `_fft_r2c`, `_fft_c2r` and
// `_fft_c2c`, which torch::fft's functions and torch::stft reduce to, and
// which are each other's backwards.
//
// Note [Transforms as StableHLO ffts]
// StableHLO's fft transforms the innermost one to three dims of a complex
// array (RFFT: of a real one, keeping the n / 2 + 1 non-negative
// frequencies of the last; IRFFT: back to n reals). A call's dims are
// moved innermost in the order given, transformed three at a time from
// the innermost (RFFT first for r2c, IRFFT last for c2r, as LibTorch's
// pocketfft orders its passes) and moved back; where they are already the
// innermost, as for rfft over the last dim or fftn over all, nothing
// moves. XLA's inverse transforms divide by the points' count and its
// forward ones do not; LibTorch's `normalization` (0: none, 1: by the
// square root of the count, 2: by the count, in either direction) is one
// multiplication of the result. Complex operands and results are read and
// written through their real views (Note [Complex tensors on the xla
// device] in lazy_buffer.h). XLA's and pocketfft's passes round their own
// way: results agree to f32 rounding of sums of the inputs.
//
// Lowered: f32 and f64 (complex64 and complex128), any layout, any dims.
// What LibTorch's CPU kernel refuses (half precision, repeated dims, a
// c2r input that is not last_dim_size / 2 + 1 long) takes the fallback,
// which raises LibTorch's own error where there is one.
#include <ATen/ops/_fft_c2c.h>
#include <ATen/ops/_fft_c2r.h>
#include <ATen/ops/_fft_r2c.h>
#include <ATen/ops/empty.h>
#include <c10/core/SymIntArrayRef.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

using shlo::FftType;

// The transform dims of `self`, wrapped; NotLowered when there are none or
// one repeats (LibTorch's kernels decide what that means).
std::vector<int64_t> fft_dims(const at::Tensor& self, c10::IntArrayRef dim) {
  std::vector<int64_t> dims;
  for (int64_t d : dim) dims.push_back(c10::maybe_wrap_dim(d, self.dim()));
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  if (dims.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) throw NotLowered{};
  if (self.numel() == 0) throw NotLowered{};
  return dims;
}

// `x` transformed over `dims` by `type` (Note [Transforms as StableHLO
// ffts]): `first` for the innermost group (RFFT, IRFFT) and `rest` for the
// others; IRFFT's group gives `last_length` reals along dims.back().
NodePtr transformed(Recorder& r, NodePtr x, const std::vector<int64_t>& dims, FftType first, FftType rest,
                    int64_t last_length) {
  std::vector<std::vector<int64_t>> groups;  // innermost first
  for (size_t end = dims.size(); end > 0;) {
    const size_t begin = end >= 3 ? end - 3 : 0;
    groups.emplace_back(dims.begin() + static_cast<std::ptrdiff_t>(begin),
                        dims.begin() + static_cast<std::ptrdiff_t>(end));
    end = begin;
  }
  // c2r's real result is last: its complex groups go first.
  std::vector<size_t> order;
  for (size_t g = 0; g < groups.size(); ++g) order.push_back(g);
  if (first == FftType::kRealInverse) std::reverse(order.begin(), order.end());
  for (size_t g : order) {
    const std::vector<int64_t>& group = groups[g];
    const int64_t rank = static_cast<int64_t>(x->type().dims.size());
    std::vector<int64_t> perm, back(static_cast<size_t>(rank));
    for (int64_t d = 0; d < rank; ++d)
      if (std::find(group.begin(), group.end(), d) == group.end()) perm.push_back(d);
    perm.insert(perm.end(), group.begin(), group.end());
    for (size_t i = 0; i < perm.size(); ++i) back[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
    const NodePtr moved = r.transpose(x, perm);
    const FftType type = g == 0 ? first : rest;
    std::vector<int64_t> lengths;
    for (int64_t d : group) lengths.push_back(x->type().dims[static_cast<size_t>(d)]);
    shlo::Type result = moved->type();
    if (type == FftType::kRealForward) {
      result.dtype = moved->type().dtype == ElementType::kF32 ? ElementType::kC64 : ElementType::kC128;
      result.dims.back() = lengths.back() / 2 + 1;
    } else if (type == FftType::kRealInverse) {
      lengths.back() = last_length;
      result.dtype = complex_part(moved->type().dtype);
      result.dims.back() = last_length;
    }
    const NodePtr done = r.op("fft", {moved}, result, lazy::Attributes{}.add(type).add(lengths),
                              [type, lengths](shlo::Function& f, const std::vector<shlo::Value>& in) {
                                return f.fft(in[0], type, lengths);
                              });
    x = r.transpose(done, back);
  }
  return x;
}

// What the result is multiplied by: LibTorch's normalization of `count`
// points, undoing XLA's division by the count in an inverse transform.
double scale_of(int64_t normalization, double count, bool inverse) {
  const double wanted = normalization == 0 ? 1.0 : normalization == 1 ? 1.0 / std::sqrt(count) : 1.0 / count;
  if (!inverse) return wanted;
  return normalization == 2 ? 1.0 : normalization == 1 ? std::sqrt(count) : count;
}

// The number of points of `dims` of `sizes`, the last one `last`.
double points(const std::vector<int64_t>& sizes, const std::vector<int64_t>& dims, int64_t last) {
  double n = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) n *= static_cast<double>(sizes[static_cast<size_t>(dims[i])]);
  return n * static_cast<double>(last);
}

// f32 or f64, and `out` of the matching complex (or real) dtype.
void check_dtypes(const at::Tensor& real, const at::Tensor& complex) {
  if (real.scalar_type() != at::kFloat && real.scalar_type() != at::kDouble) throw NotLowered{};
  if (complex.scalar_type() != c10::toComplexType(real.scalar_type())) throw NotLowered{};
}

void check_normalization(int64_t normalization) {
  if (normalization < 0 || normalization > 2) throw NotLowered{};
}

at::Tensor& fft_r2c_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, bool onesided,
                        at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    check_dtypes(self, out);
    check_normalization(normalization);
    const std::vector<int64_t> dims = fft_dims(self, dim);
    NodePtr x = r.tensor(self);
    const std::vector<int64_t> sizes = x->type().dims;
    NodePtr y;
    if (onesided) {
      y = transformed(r, x, dims, FftType::kRealForward, FftType::kForward, 0);
    } else {
      const NodePtr zero = r.splat(0.0, x->type().dtype, sizes);
      x = r.op("complex", {x, zero}, {x->type().dtype == ElementType::kF32 ? ElementType::kC64 : ElementType::kC128, sizes},
               [](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.complex(in[0], in[1]); });
      y = transformed(r, x, dims, FftType::kForward, FftType::kForward, 0);
    }
    const auto [re, im] =
        complex_parts(r, y, scale_of(normalization, points(sizes, dims, sizes[static_cast<size_t>(dims.back())]), false));
    write_complex(r, out, re, im);
  };
  STRATA_LOWER("aten::_fft_r2c.out", _fft_r2c_out, self, dim, normalization, onesided, out);
}

at::Tensor fft_r2c(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, bool onesided) {
  if (!at::isFloatingType(self.scalar_type()))
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_fft_r2c>::call(self, dim, normalization, onesided);
  at::Tensor out = at::empty({0}, self.options().dtype(c10::toComplexType(self.scalar_type())));
  return fft_r2c_out(self, dim, normalization, onesided, out);
}

at::Tensor& fft_c2r_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, int64_t last_dim_size,
                        at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    check_dtypes(out, self);
    check_normalization(normalization);
    const std::vector<int64_t> dims = fft_dims(self, dim);
    if (last_dim_size < 1 || self.size(dims.back()) != last_dim_size / 2 + 1) throw NotLowered{};
    const NodePtr x = complex_value(r, self);
    const NodePtr y = transformed(r, x, dims, FftType::kRealInverse, FftType::kInverse, last_dim_size);
    const double scale = scale_of(normalization, points(x->type().dims, dims, last_dim_size), true);
    r.write(out, scale == 1.0 ? y : r.binary(Binary::kMultiply, y, r.splat(scale, y->type().dtype, y->type().dims)));
  };
  STRATA_LOWER("aten::_fft_c2r.out", _fft_c2r_out, self, dim, normalization, last_dim_size, out);
}

at::Tensor fft_c2r(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, int64_t last_dim_size) {
  at::Tensor out = at::empty({0}, self.options().dtype(c10::toRealValueType(self.scalar_type())));
  return fft_c2r_out(self, dim, normalization, last_dim_size, out);
}

at::Tensor& fft_c2c_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, bool forward,
                        at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (self.scalar_type() != out.scalar_type()) throw NotLowered{};
    check_normalization(normalization);
    const std::vector<int64_t> dims = fft_dims(self, dim);
    const NodePtr x = complex_value(r, self);
    const FftType type = forward ? FftType::kForward : FftType::kInverse;
    const NodePtr y = transformed(r, x, dims, type, type, 0);
    const std::vector<int64_t>& sizes = x->type().dims;
    const auto [re, im] =
        complex_parts(r, y, scale_of(normalization, points(sizes, dims, sizes[static_cast<size_t>(dims.back())]), !forward));
    write_complex(r, out, re, im);
  };
  STRATA_LOWER("aten::_fft_c2c.out", _fft_c2c_out, self, dim, normalization, forward, out);
}

at::Tensor fft_c2c(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, bool forward) {
  at::Tensor out = at::empty({0}, self.options());
  return fft_c2c_out(self, dim, normalization, forward, out);
}

}  // namespace

void register_fft(torch::Library& library) {
  library.impl("_fft_r2c", TORCH_FN(fft_r2c));
  library.impl("_fft_r2c.out", TORCH_FN(fft_r2c_out));
  library.impl("_fft_c2r", TORCH_FN(fft_c2r));
  library.impl("_fft_c2r.out", TORCH_FN(fft_c2r_out));
  library.impl("_fft_c2c", TORCH_FN(fft_c2c));
  library.impl("_fft_c2c.out", TORCH_FN(fft_c2c_out));
}

}  // namespace strata::xla::detail::lowering
