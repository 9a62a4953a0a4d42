// What the xla device's lowered kernels share (lowerings.cpp,
// kernels_*.cpp): the Recorder that makes one call's graph nodes, reading
// tensors of any layout and writing results into them; then, through
// lowering_kernels.h, the meta-tensor result of an op and STRATA_LOWER,
// which runs a lowering and takes the CPU fallback where it does not apply
// (Note [What is lowered] in lowerings.cpp).
#pragma once

#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>

#include "strata/xla/lazy_graph.h"
#include "lazy_buffer.h"
#include "runtime.h"

namespace strata::xla::detail::lowering {
namespace shlo = stablehlo;
using lazy::Node;
using lazy::NodePtr;

constexpr c10::DeviceType kXla = c10::DeviceType::PrivateUse1;

// Thrown where a call is not lowered (Note [What is lowered]); the kernel
// then takes the CPU fallback. Nothing has been written when it is thrown.
struct NotLowered {};

inline std::vector<int64_t> vec(c10::IntArrayRef a) { return {a.begin(), a.end()}; }

inline ElementType element_type(c10::ScalarType type) {
  ElementType out = ElementType::kF32;
  if (!element_type_of(type, out)) throw NotLowered{};
  return out;
}

// Note [bf16 computes in f32]
// LibTorch's CPU kernels compute a bf16 (or f16) result in float (their
// opmath type: TensorIterator's vectorised loops, the reductions' and
// the softmax's and layer norm's accumulators, the matrix products'
// accumulators) and round to bf16 once, when the result is stored; the
// Scalars of mul, div, addcmul and addcdiv stay float. So a lowered op
// converts its bf16 inputs to f32, computes in f32 and rounds at the
// write: each op's result is the f32 result rounded once, as on the CPU.
// Where LibTorch rounds inside an op, the lowering rounds there too (add's
// alpha, mse_loss's squares); what is left is the order of a sum and
// XLA's own exp/tanh/erf, which can move a result across a bf16 rounding
// boundary (one bf16 ulp, 2^-8 relative).
inline ElementType opmath(ElementType t) {
  return t == ElementType::kBF16 || t == ElementType::kF16 ? ElementType::kF32 : t;
}
inline bool reduced_float(ElementType t) { return opmath(t) != t; }

// The nodes one kernel call makes, and the helpers that make them.
class Recorder {
 public:
  explicit Recorder(const char* op) : op_(op) {}
  // A call that wrote its outputs counts once, with every node it made
  // (an op with several outputs writes each).
  ~Recorder() {
    if (written_) count_lowered(op_, nodes_, std::chrono::steady_clock::now() - start_);
  }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Node::op's three forms (Note [Programs known by their structure] in
  // strata/xla/lazy_graph.h): an emitter that captures plain values, one
  // with its attributes named, or an EmitFn (no identity).
  template <class F>
  NodePtr op(std::string name, std::vector<NodePtr> inputs, shlo::Type type, F&& emit) {
    ++nodes_;
    return Node::op(std::move(name), std::move(inputs), std::move(type), std::forward<F>(emit));
  }
  template <class F>
  NodePtr op(std::string name, std::vector<NodePtr> inputs, shlo::Type type, lazy::Attributes attributes, F&& emit) {
    ++nodes_;
    return Node::op(std::move(name), std::move(inputs), std::move(type), std::move(attributes), std::forward<F>(emit));
  }

  // A 0-dim constant baked into the program.
  NodePtr constant(double value, ElementType dtype) {
    if (dtype == ElementType::kF32) value = static_cast<float>(value);
    const shlo::Type type{dtype, {}};
    return op("constant", {}, type,
              lazy::Attributes{}.add(type).add(value),
              [type, value](shlo::Function& f, const std::vector<shlo::Value>&) { return f.constant(type, {value}); });
  }

  // Note [Scalars in the graph]
  NodePtr scalar(const at::Scalar& s, ElementType dtype) {
    if (s.isComplex()) throw NotLowered{};
    const double v = s.toDouble();
    if (v == 0.0 || v == 1.0 || v == -1.0) return constant(v, dtype);
    return Node::host_scalar(v, dtype);
  }

  // Note [A reshape of a reshape]
  // Storages hold flat values, so every op's result is reshaped to one
  // dimension when written and back to its shape when read. A reshape of
  // a reshape is a reshape of the first one's input (both keep the
  // elements' order), and none when that input has the shape asked for:
  // a read then takes the op's result itself, and the write's reshape runs
  // only where the storage outlives the step. GPT tiny's step ran 1,523
  // nodes before and runs 1,087 (bench_xla's nodes_executed).
  NodePtr reshape(const NodePtr& x, const std::vector<int64_t>& dims) {
    if (x->type().dims == dims) return x;
    if (x->kind() == lazy::Node::Kind::kOp && x->op_name() == "reshape") return reshape(x->inputs()[0], dims);
    return op("reshape", {x}, {x->type().dtype, dims},
              lazy::Attributes{}.add(dims),
              [dims](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.reshape(in[0], dims); });
  }

  NodePtr transpose(const NodePtr& x, const std::vector<int64_t>& perm) {
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
    if (identity) return x;
    shlo::Type type{x->type().dtype, {}};
    for (int64_t p : perm) type.dims.push_back(x->type().dims[static_cast<size_t>(p)]);
    return op("transpose", {x}, type,
              lazy::Attributes{}.add(perm),
              [perm](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.transpose(in[0], perm); });
  }

  NodePtr convert(const NodePtr& x, ElementType dtype) {
    if (x->type().dtype == dtype) return x;
    return op("convert", {x}, {dtype, x->type().dims},
              lazy::Attributes{}.add(dtype),
              [dtype](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.convert(in[0], dtype); });
  }

  // Numpy-style broadcast to `dims` (trailing dims aligned).
  NodePtr broadcast(const NodePtr& x, const std::vector<int64_t>& dims) {
    if (x->type().dims == dims) return x;
    const size_t rank = x->type().dims.size();
    if (rank > dims.size()) throw NotLowered{};
    std::vector<int64_t> mapping(rank);
    std::iota(mapping.begin(), mapping.end(), static_cast<int64_t>(dims.size() - rank));
    return op("broadcast", {x}, {x->type().dtype, dims}, lazy::Attributes{}.add(dims).add(mapping),
              [dims, mapping](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.broadcast_in_dim(in[0], dims, mapping);
              });
  }

  enum class Binary { kAdd, kSubtract, kMultiply, kDivide, kMaximum, kMinimum };

  NodePtr binary(Binary kind, const NodePtr& a, const NodePtr& b) {
    if (!(a->type() == b->type())) throw NotLowered{};
    static const char* const kNames[] = {"add", "subtract", "multiply", "divide", "maximum", "minimum"};
    return op(kNames[static_cast<int>(kind)], {a, b}, a->type(),
              lazy::Attributes{}.add(kind), [kind](shlo::Function& f, const std::vector<shlo::Value>& in) {
                switch (kind) {
                  case Binary::kAdd: return f.add(in[0], in[1]);
                  case Binary::kSubtract: return f.subtract(in[0], in[1]);
                  case Binary::kMultiply: return f.multiply(in[0], in[1]);
                  case Binary::kDivide: return f.divide(in[0], in[1]);
                  case Binary::kMaximum: return f.maximum(in[0], in[1]);
                  case Binary::kMinimum: return f.minimum(in[0], in[1]);
                }
                return f.add(in[0], in[1]);
              });
  }

  // `s` times `x` (x itself when s is 1).
  NodePtr scaled(const at::Scalar& s, const NodePtr& x) {
    if (!s.isComplex() && s.toDouble() == 1.0) return x;
    return binary(Binary::kMultiply, broadcast(scalar(s, x->type().dtype), x->type().dims), x);
  }

  using UnaryFn = shlo::Value (shlo::Function::*)(const shlo::Value&);
  NodePtr unary(const char* name, const NodePtr& x, UnaryFn fn) {
    return op(name, {x}, x->type(), [fn](shlo::Function& f, const std::vector<shlo::Value>& in) { return (f.*fn)(in[0]); });
  }

  // A constant of `dtype` broadcast to `dims`.
  NodePtr splat(double value, ElementType dtype, const std::vector<int64_t>& dims) {
    return broadcast(constant(value, dtype), dims);
  }

  NodePtr compare(const NodePtr& a, const NodePtr& b, shlo::Direction direction) {
    if (!(a->type() == b->type())) throw NotLowered{};
    return op("compare", {a, b}, {ElementType::kPred, a->type().dims},
              lazy::Attributes{}.add(direction),
              [direction](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.compare(in[0], in[1], direction);
              });
  }

  NodePtr select(const NodePtr& pred, const NodePtr& on_true, const NodePtr& on_false) {
    return op("select", {pred, on_true, on_false}, on_true->type(),
              [](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.select(in[0], in[1], in[2]); });
  }

  // `x` reduced over `dims` by `kind` from `init`.
  NodePtr reduce(const NodePtr& x, std::vector<int64_t> dims, shlo::ReduceOp kind, double init) {
    if (dims.empty()) return x;
    std::sort(dims.begin(), dims.end());
    shlo::Type type{x->type().dtype, {}};
    for (int64_t d = 0; d < static_cast<int64_t>(x->type().dims.size()); ++d)
      if (!std::binary_search(dims.begin(), dims.end(), d)) type.dims.push_back(x->type().dims[static_cast<size_t>(d)]);
    NodePtr start = constant(init, x->type().dtype);
    return op("reduce", {x, start}, type, lazy::Attributes{}.add(dims).add(kind),
              [dims, kind](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.reduce(in[0], in[1], dims, kind);
              });
  }

  // A reduction's result `x` over `reduced` (sorted) broadcast back to `dims`.
  NodePtr expand_back(const NodePtr& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& reduced) {
    std::vector<int64_t> mapping;
    for (int64_t d = 0; d < static_cast<int64_t>(dims.size()); ++d)
      if (!std::binary_search(reduced.begin(), reduced.end(), d)) mapping.push_back(d);
    return op("broadcast", {x}, {x->type().dtype, dims}, lazy::Attributes{}.add(dims).add(mapping),
              [dims, mapping](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.broadcast_in_dim(in[0], dims, mapping);
              });
  }

  // 0, 1, 2, ... along `dim` of {dtype, dims}.
  NodePtr iota(ElementType dtype, const std::vector<int64_t>& dims, int64_t dim) {
    const shlo::Type type{dtype, dims};
    return op("iota", {}, type, lazy::Attributes{}.add(type).add(dim),
              [type, dim](shlo::Function& f, const std::vector<shlo::Value>&) { return f.iota(type, dim); });
  }

  NodePtr sum(const NodePtr& x, std::vector<int64_t> dims) {
    if (dims.empty()) return x;
    std::sort(dims.begin(), dims.end());
    shlo::Type type{x->type().dtype, {}};
    for (int64_t d = 0; d < static_cast<int64_t>(x->type().dims.size()); ++d)
      if (!std::binary_search(dims.begin(), dims.end(), d)) type.dims.push_back(x->type().dims[static_cast<size_t>(d)]);
    NodePtr zero = constant(0.0, x->type().dtype);
    return op("reduce_sum", {x, zero}, type, lazy::Attributes{}.add(dims),
              [dims](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.reduce(in[0], in[1], dims, shlo::ReduceOp::kSum);
              });
  }

  NodePtr slice(const NodePtr& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit) {
    shlo::Type type{x->type().dtype, {}};
    bool whole = true;
    for (size_t i = 0; i < start.size(); ++i) {
      type.dims.push_back(limit[i] - start[i]);
      whole = whole && start[i] == 0 && limit[i] == x->type().dims[i];
    }
    if (whole) return x;
    return op("slice", {x}, type, lazy::Attributes{}.add(start).add(limit),
              [start, limit](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.slice(in[0], start, limit);
              });
  }

  // Note [Strided views as slices]
  // An input view is read from its storage's whole 1-d value without a
  // sync: its dims that move (size > 1, stride > 0), outermost first, must
  // each have a stride that divides the one outside it, so the storage's
  // first elements form a box of those strides' ratios, and the view (its
  // offset included) is a sub-box of it: a slice, a reshape and a
  // transpose. qkv.split(...) and the head transposes of attention are
  // such views; dims of stride 0 (expand) are broadcast afterwards. Any
  // other layout is read by a gather (Note [Any strided view]). Writes
  // into such a view are the same box with the sub-box replaced (Note
  // [Writes into a view]).
  struct Box {
    std::vector<int64_t> laid;      // the dims that move, outermost first
    std::vector<int64_t> original;  // the same dims in the tensor's order
    std::vector<int64_t> extents;   // the box the storage's first `used` elements form
    std::vector<int64_t> start, limit;  // the view in the box
    int64_t used = 0;
    bool broadcasts = false;  // some dim of size > 1 has stride 0
  };

  // The box of `t`'s layout; false when it is not a sub-box of its storage.
  static bool box_of(const at::Tensor& t, Box& b) {
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.size(d) > 1 && t.stride(d) > 0) b.laid.push_back(d);
      if (t.size(d) > 1 && t.stride(d) == 0) b.broadcasts = true;
      if (t.stride(d) < 0) return false;
    }
    b.original = b.laid;
    std::stable_sort(b.laid.begin(), b.laid.end(), [&](int64_t x, int64_t y) { return t.stride(x) > t.stride(y); });
    int64_t rest = t.storage_offset();
    for (size_t i = 0; i < b.laid.size(); ++i) {
      const int64_t stride = t.stride(b.laid[i]), size = t.size(b.laid[i]);
      if (i > 0 && t.stride(b.laid[i - 1]) % stride != 0) return false;
      const int64_t extent = i == 0 ? 0 : t.stride(b.laid[i - 1]) / stride;
      b.start.push_back(rest / stride);
      rest %= stride;
      b.limit.push_back(b.start.back() + size);
      b.extents.push_back(i == 0 ? b.limit.back() : extent);
      if (i > 0 && b.limit.back() > extent) return false;
    }
    if (b.laid.empty()) {
      b.extents = {rest + 1};
      b.start = {rest};
      b.limit = {rest + 1};
      b.used = rest + 1;
      return true;
    }
    b.extents.push_back(t.stride(b.laid.back()));
    b.start.push_back(rest);
    b.limit.push_back(rest + 1);
    b.used = 1;
    for (int64_t e : b.extents) b.used *= e;
    return true;
  }

  // Note [Any strided view]
  // A view whose strides do not nest (a slice of a transposed gradient
  // viewed again, as the gradient of a patch embedding's
  // flatten(2).transpose(1, 2) followed by a cat is) is read element by
  // element: each element's storage index, offset + sum of index times
  // stride over the dims, is computed from iotas in the program, and one
  // gather takes those elements from the storage's flat value. Negative
  // strides still take the fallback.
  NodePtr gathered(const at::Tensor& t, const NodePtr& base) {
    const int64_t n = base->type().dims.at(0);
    const std::vector<int64_t> dims = vec(t.sizes());
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.stride(d) < 0) throw NotLowered{};
      last += (t.size(d) - 1) * t.stride(d);
    }
    if (last >= n) throw NotLowered{};
    const ElementType index_type = n < (int64_t{1} << 31) ? ElementType::kS32 : ElementType::kS64;
    NodePtr index = splat(static_cast<double>(t.storage_offset()), index_type, dims);
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.size(d) == 1 || t.stride(d) == 0) continue;
      NodePtr step = iota(index_type, dims, d);
      if (t.stride(d) != 1)
        step = binary(Binary::kMultiply, step, splat(static_cast<double>(t.stride(d)), index_type, dims));
      index = binary(Binary::kAdd, index, step);
    }
    return op("take_rows", {base, index}, {base->type().dtype, dims},
              [](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.take_rows(in[0], in[1], 0); });
  }

  // The value of an xla tensor, of its own shape and dtype.
  //
  // Note [Empty tensors]
  // A tensor with no elements has no value to read: it is a constant of
  // its shape (StableHLO has zero-sized arrays), so an op on it records
  // as on any other tensor, and a reduction over an empty dim gives its
  // initial value (a sum of zeros, as LibTorch's). An output with no
  // elements has nothing to bind: write() only resizes it. Ops whose
  // LibTorch kernel refuses empty inputs (max without a dim, ...) check
  // that themselves before recording.
  NodePtr tensor(const at::Tensor& t) {
    if (t.defined() && t.device().type() != kXla && t.numel() > 0) throw_other_device(op_, t);
    if (!t.defined() || t.device().type() != kXla) throw NotLowered{};
    const ElementType dtype = element_type(t.scalar_type());
    if (t.numel() == 0) return splat(0.0, dtype, vec(t.sizes()));  // Note [Empty tensors]
    LazyBuffer& storage = lazy_buffer(t);
    NodePtr base = storage.value_node(dtype);
    if (!base) throw NotLowered{};
    const int64_t n = base->type().dims.at(0);
    if (t.is_contiguous()) {
      // Elements [offset, offset + numel) of the storage, at any offset (a
      // slot of DDP's bucket, a shard of FSDP's flat buffer).
      const int64_t offset = t.storage_offset();
      if (offset + t.numel() > n) throw NotLowered{};
      return reshape(slice(base, {offset}, {offset + t.numel()}), vec(t.sizes()));
    }
    Box b;
    if (!box_of(t, b) || b.used > n) return gathered(t, base);
    NodePtr box = reshape(slice(base, {0}, {b.used}), b.extents);
    std::vector<int64_t> laid_sizes, perm;
    for (int64_t d : b.laid) laid_sizes.push_back(t.size(d));
    NodePtr value = reshape(slice(box, b.start, b.limit), laid_sizes);
    for (int64_t d : b.original)
      perm.push_back(static_cast<int64_t>(std::find(b.laid.begin(), b.laid.end(), d) - b.laid.begin()));
    value = transpose(value, perm);
    if (!b.broadcasts) return reshape(value, vec(t.sizes()));
    const std::vector<int64_t> dims = vec(t.sizes());
    const std::vector<int64_t> original = b.original;
    return op("broadcast", {value}, {dtype, dims}, lazy::Attributes{}.add(dims).add(original),
              [dims, original](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.broadcast_in_dim(in[0], dims, original);
              });
  }

  // An operand of an element-wise op: an xla tensor or a 0-dim CPU tensor
  // (Note [Scalars in the graph]), converted to `dtype` and broadcast to
  // `dims`.
  NodePtr operand(const at::Tensor& t, ElementType dtype, const std::vector<int64_t>& dims) {
    if (t.defined() && t.device().is_cpu() && t.dim() == 0) return broadcast(scalar(t.item(), dtype), dims);
    return broadcast(convert(tensor(t), dtype), dims);
  }

  // `parts` joined along `dim` (the one part itself).
  NodePtr concat(const std::vector<NodePtr>& parts, int64_t dim) {
    if (parts.size() == 1) return parts[0];
    shlo::Type type = parts.at(0)->type();
    type.dims.at(static_cast<size_t>(dim)) = 0;
    for (const NodePtr& p : parts) type.dims[static_cast<size_t>(dim)] += p->type().dims.at(static_cast<size_t>(dim));
    return op("concatenate", parts, type, lazy::Attributes{}.add(dim),
              [dim](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.concatenate(in, dim);
              });
  }

  // Rebinds `out` (resized to `dims` first, as an out= kernel does) to
  // `value`, converted to out's dtype.
  //
  // Note [Writes into a view]
  // An output of any layout that reads as a box (Note [Strided views as
  // slices]) and has no two elements in one place is written:
  //   - dense (its elements fill [o, o + n) of the storage, in any order of
  //     dims: the output TensorIterator gives a functional op on a
  //     transposed input, a transposed tensor written in place) is the
  //     value transposed into memory order, flattened: the storage's whole
  //     value when it covers the storage, else elements [o, o + n) replaced
  //     (slices around the new part, joined);
  //   - any other sub-box (a narrow, a strided slice, a column written in
  //     place) is the storage's box with the sub-box replaced
  //     (dynamic_update_slice at constant starts).
  // Partial writes read and rebind the storage under its lock, so writes
  // from two threads into two views of one storage both stay. Expanded
  // outputs (stride 0) take the fallback, which refuses them as LibTorch
  // does.
  void write(const at::Tensor& out, NodePtr value) {
    const std::vector<int64_t> dims = value->type().dims;
    if (out.device().type() != kXla) throw NotLowered{};
    if (vec(out.sizes()) != dims) at::native::resize_output(out, dims);
    const ElementType dtype = element_type(out.scalar_type());
    written_ = true;
    if (out.numel() == 0) return;  // Note [Empty tensors]: nothing to bind
    value = convert(value, dtype);
    if (out.is_contiguous()) {
      write_flat(out, reshape(value, {out.numel()}), dtype);
    } else if (out.is_non_overlapping_and_dense()) {
      std::vector<int64_t> perm(static_cast<size_t>(out.dim()));
      std::iota(perm.begin(), perm.end(), 0);
      std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return out.stride(a) > out.stride(b); });
      write_flat(out, reshape(transpose(value, perm), {out.numel()}), dtype);
    } else {
      write_box(out, value, dtype);
    }
  }

 private:
  // `value` (1-d, numel elements of out's dtype) bound to elements
  // [o, o + numel) of out's storage (Note [Writes into a view]).
  void write_flat(const at::Tensor& out, NodePtr value, ElementType dtype) {
    const int64_t n = out.numel();
    const size_t needed = static_cast<size_t>(n) * out.element_size();
    LazyBuffer& storage = lazy_buffer(out);
    if (out.storage_offset() == 0 && storage.nbytes() == needed) {
      storage.set_pending(std::move(value));
    } else if (out.storage_offset() == 0 && out.storage().use_count() == 1 && !out.is_view()) {
      // A storage larger than its only tensor (an out= tensor made for a
      // bigger shape and resized down, as the structured kernels of the
      // losses do): nothing else can see the rest, so the tensor gets a
      // storage of its own size.
      c10::DeviceGuard guard(out.device());
      out.unsafeGetTensorImpl()->set_storage_keep_dtype(c10::Storage(c10::Storage::use_byte_size_t(), needed,
                                                                     allocator(), /*resizable=*/true));
      lazy_buffer(out).set_pending(std::move(value));
    } else {
      const int64_t o = out.storage_offset();
      const bool written = storage.rewrite(dtype, [&](const NodePtr& base) -> NodePtr {
        const int64_t total = base->type().dims.at(0);
        if (o + n > total) return nullptr;
        std::vector<NodePtr> parts;
        if (o > 0) parts.push_back(slice(base, {0}, {o}));
        parts.push_back(value);
        if (o + n < total) parts.push_back(slice(base, {o + n}, {total}));
        return concat(parts, 0);
      });
      if (!written) throw NotLowered{};
    }
  }

  // `value` (out's shape and dtype) written into the sub-box `out` is of
  // its storage's box (Note [Writes into a view]).
  void write_box(const at::Tensor& out, NodePtr value, ElementType dtype) {
    Box b;
    if (!box_of(out, b) || b.broadcasts) throw NotLowered{};
    std::vector<int64_t> moving, perm, update_dims;
    for (int64_t d : b.original) moving.push_back(out.size(d));
    for (int64_t d : b.laid)
      perm.push_back(static_cast<int64_t>(std::find(b.original.begin(), b.original.end(), d) - b.original.begin()));
    for (size_t i = 0; i < b.start.size(); ++i) update_dims.push_back(b.limit[i] - b.start[i]);
    NodePtr update = reshape(transpose(reshape(value, moving), perm), update_dims);
    const std::vector<int64_t> start = b.start;
    const bool written = lazy_buffer(out).rewrite(dtype, [&](const NodePtr& base) -> NodePtr {
      const int64_t total = base->type().dims.at(0);
      if (b.used > total) return nullptr;
      NodePtr box = reshape(slice(base, {0}, {b.used}), b.extents);
      NodePtr updated = op("dynamic_update_slice", {box, update}, box->type(),
                           lazy::Attributes{}.add(start),
                           [start](shlo::Function& f, const std::vector<shlo::Value>& in) {
                             std::vector<shlo::Value> at;
                             for (int64_t s : start) at.push_back(f.constant({ElementType::kS64, {}}, {static_cast<double>(s)}));
                             return f.dynamic_update_slice(in[0], in[1], at);
                           });
      NodePtr flat = reshape(updated, {b.used});
      if (b.used == total) return flat;
      return concat({flat, slice(base, {b.used}, {total})}, 0);
    });
    if (!written) throw NotLowered{};
  }

  RecordingScope recording_;
  const char* op_;
  int64_t nodes_ = 0;
  bool written_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

using Binary = Recorder::Binary;

}  // namespace strata::xla::detail::lowering

// The meta-tensor results, STRATA_LOWER and the formulas the kernels share.
#include "lowering_kernels.h"  // IWYU pragma: export
