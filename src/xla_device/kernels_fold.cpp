// Lowered kernels of im2col and col2im (nn::Unfold and nn::Fold, and each
// other's backward), functional and `.out` (Note [What is lowered] in
// lowerings.cpp).
//
// Note [Sliding windows as strided slices]
// Of a 2-d input padded by (ph, pw), the window offset (ki, kj) of every
// block is one strided slice: rows ki*dh, ki*dh + sh, ... (bh of them)
// and columns likewise. im2col stacks the kh*kw slices as the rows of
// its result (channel-major, then ki, then kj, as LibTorch lays them
// out). col2im is the adjoint: each offset's (bh, bw) blocks are padded
// back into place (stablehlo.pad: low ki*dh, sh - 1 between elements)
// and added, offset by offset in the order LibTorch's CPU loop adds them
// (ki, then kj, into zeros), so each output element is the same sum in
// the same order; a bf16 sum rounds after each addition, as the CPU
// kernel accumulates in the tensor's own dtype. The padding is cut off
// at the end.
#include <ATen/ops/col2im.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/im2col.h>

#include <vector>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

// One spatial dim of the fold: its size before padding, and the
// window's kernel size, dilation, padding and stride along it.
struct FoldDim {
  int64_t size, kernel, dilation, padding, stride;
  int64_t padded() const { return size + 2 * padding; }
  // How many blocks fit (LibTorch's formula); < 1 is not lowered.
  int64_t blocks() const { return (padded() - (dilation * (kernel - 1) + 1)) / stride + 1; }
  // Where offset k's last block ends, one past it.
  int64_t end(int64_t k) const { return k * dilation + (blocks() - 1) * stride + 1; }
};

// The two dims, checked; an argument LibTorch refuses is left to the
// fallback, which raises LibTorch's error.
std::vector<FoldDim> fold_dims(int64_t height, int64_t width, c10::IntArrayRef kernel, c10::IntArrayRef dilation,
                               c10::IntArrayRef padding, c10::IntArrayRef stride) {
  if (kernel.size() != 2 || dilation.size() != 2 || padding.size() != 2 || stride.size() != 2) throw NotLowered{};
  std::vector<FoldDim> dims{{height, kernel[0], dilation[0], padding[0], stride[0]},
                            {width, kernel[1], dilation[1], padding[1], stride[1]}};
  for (const FoldDim& d : dims) {
    if (d.size < 1 || d.kernel < 1 || d.dilation < 1 || d.padding < 0 || d.stride < 1) throw NotLowered{};
    if (d.padded() < d.dilation * (d.kernel - 1) + 1) throw NotLowered{};
  }
  return dims;
}

// A 4-d (batch, channel, h, w) value: the batch of 1 an unbatched input
// gets, so the lowerings see one layout.
NodePtr batched(Recorder& r, const at::Tensor& t, int64_t batched_rank) {
  NodePtr x = r.tensor(t);
  if (t.dim() == batched_rank) return x;
  std::vector<int64_t> dims = x->type().dims;
  dims.insert(dims.begin(), 1);
  return r.reshape(x, dims);
}

// Note [Sliding windows as strided slices]
at::Tensor& im2col_out(const at::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef dilation,
                       c10::IntArrayRef padding, c10::IntArrayRef stride, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (self.dim() != 3 && self.dim() != 4) throw NotLowered{};
    const ElementType t = element_type(self.scalar_type());
    if (!is_floating(t) || out.scalar_type() != self.scalar_type()) throw NotLowered{};
    const std::vector<FoldDim> d = fold_dims(self.size(-2), self.size(-1), kernel_size, dilation, padding, stride);
    NodePtr x = batched(r, self, 4);
    const int64_t n = x->type().dims[0], c = x->type().dims[1];
    const std::vector<int64_t> low{0, 0, d[0].padding, d[1].padding}, interior(4, 0);
    const std::vector<int64_t> padded_dims{n, c, d[0].padded(), d[1].padded()};
    NodePtr zero = r.constant(0.0, t);
    NodePtr xp = r.op("pad", {x, zero}, {t, padded_dims}, lazy::Attributes{}.add(low).add(interior),
                      [low, interior](shlo::Function& f,
                                                                         const std::vector<shlo::Value>& in) {
      return f.pad(in[0], in[1], low, low, interior);
    });
    const int64_t blocks = d[0].blocks() * d[1].blocks();
    std::vector<NodePtr> rows;
    for (int64_t ki = 0; ki < d[0].kernel; ++ki) {
      for (int64_t kj = 0; kj < d[1].kernel; ++kj) {
        const std::vector<int64_t> start{0, 0, ki * d[0].dilation, kj * d[1].dilation};
        const std::vector<int64_t> limit{n, c, d[0].end(ki), d[1].end(kj)};
        const std::vector<int64_t> strides{1, 1, d[0].stride, d[1].stride};
        NodePtr window = r.op("slice", {xp}, {t, {n, c, d[0].blocks(), d[1].blocks()}},
                              lazy::Attributes{}.add(start).add(limit).add(strides),
                              [start, limit, strides](shlo::Function& f, const std::vector<shlo::Value>& in) {
                                return f.slice(in[0], start, limit, strides);
                              });
        rows.push_back(r.reshape(window, {n, c, 1, blocks}));
      }
    }
    NodePtr cols = r.concat(rows, 2);  // (n, c, kh*kw, blocks)
    std::vector<int64_t> dims{n, c * d[0].kernel * d[1].kernel, blocks};
    if (self.dim() == 3) dims.erase(dims.begin());
    r.write(out, r.reshape(cols, dims));
  };
  STRATA_LOWER("aten::im2col.out", im2col_out, self, kernel_size, dilation, padding, stride, out);
}

at::Tensor im2col(const at::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef dilation,
                  c10::IntArrayRef padding, c10::IntArrayRef stride) {
  at::Tensor out = at::empty({0}, self.options());
  return im2col_out(self, kernel_size, dilation, padding, stride, out);
}

// Note [Sliding windows as strided slices]
at::Tensor& col2im_out(const at::Tensor& self, c10::IntArrayRef output_size, c10::IntArrayRef kernel_size,
                       c10::IntArrayRef dilation, c10::IntArrayRef padding, c10::IntArrayRef stride,
                       at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (self.dim() != 2 && self.dim() != 3) throw NotLowered{};
    if (output_size.size() != 2) throw NotLowered{};
    const ElementType stored = element_type(self.scalar_type());
    if (!is_floating(stored) || out.scalar_type() != self.scalar_type()) throw NotLowered{};
    const ElementType t = opmath(stored);
    const std::vector<FoldDim> d = fold_dims(output_size[0], output_size[1], kernel_size, dilation, padding, stride);
    const int64_t window = d[0].kernel * d[1].kernel, bh = d[0].blocks(), bw = d[1].blocks();
    if (bh < 1 || bw < 1 || self.size(-2) % window != 0 || self.size(-1) != bh * bw) throw NotLowered{};
    NodePtr x = r.convert(batched(r, self, 3), t);
    const int64_t n = x->type().dims[0], c = self.size(-2) / window;
    x = r.reshape(x, {n, c, d[0].kernel, d[1].kernel, bh, bw});
    const std::vector<int64_t> padded_dims{n, c, d[0].padded(), d[1].padded()};
    NodePtr zero = r.constant(0.0, t);
    NodePtr sum = r.splat(0.0, t, padded_dims);
    for (int64_t ki = 0; ki < d[0].kernel; ++ki) {
      for (int64_t kj = 0; kj < d[1].kernel; ++kj) {
        NodePtr blocks = r.reshape(r.slice(x, {0, 0, ki, kj, 0, 0}, {n, c, ki + 1, kj + 1, bh, bw}), {n, c, bh, bw});
        const std::vector<int64_t> low{0, 0, ki * d[0].dilation, kj * d[1].dilation};
        const std::vector<int64_t> high{0, 0, d[0].padded() - d[0].end(ki), d[1].padded() - d[1].end(kj)};
        const std::vector<int64_t> interior{0, 0, d[0].stride - 1, d[1].stride - 1};
        NodePtr placed = r.op("pad", {blocks, zero}, {t, padded_dims},
                              lazy::Attributes{}.add(low).add(high).add(interior),
                              [low, high, interior](shlo::Function& f, const std::vector<shlo::Value>& in) {
                                return f.pad(in[0], in[1], low, high, interior);
                              });
        sum = rounded(r, r.binary(Binary::kAdd, sum, placed), stored);
      }
    }
    NodePtr image = r.slice(sum, {0, 0, d[0].padding, d[1].padding},
                            {n, c, d[0].padding + d[0].size, d[1].padding + d[1].size});
    if (self.dim() == 2) image = r.reshape(image, {c, d[0].size, d[1].size});
    r.write(out, image);
  };
  STRATA_LOWER("aten::col2im.out", col2im_out, self, output_size, kernel_size, dilation, padding, stride, out);
}

at::Tensor col2im(const at::Tensor& self, c10::IntArrayRef output_size, c10::IntArrayRef kernel_size,
                  c10::IntArrayRef dilation, c10::IntArrayRef padding, c10::IntArrayRef stride) {
  at::Tensor out = at::empty({0}, self.options());
  return col2im_out(self, output_size, kernel_size, dilation, padding, stride, out);
}

}  // namespace

void register_fold(torch::Library& library) {
  library.impl("im2col", TORCH_FN(im2col));
  library.impl("im2col.out", TORCH_FN(im2col_out));
  library.impl("col2im", TORCH_FN(col2im));
  library.impl("col2im.out", TORCH_FN(col2im_out));
}

}  // namespace strata::xla::detail::lowering
