// Conformance by the core op list (docs/xla-core-ops.txt): every op the
// dispatcher says the xla device lowers (tests/xla_device/core_ops.h) runs
// its samples on xla and on LibTorch's CPU kernel, compared, with no CPU
// fallback. Each sample runs contiguous, transposed and at a storage
// offset, in f32 and bf16, with NaN, inf and -0 among its inputs where the
// op takes them, and with gradients (f32) where it is differentiable. A
// lowered op without a sample fails the test: a new lowering brings its
// sample here.
//
// Every program the samples make is also replayed on JAX's CPU backend,
// with the arguments and results of its run on the plugin
// (xla_device/jax_replay.h).
//
// The CI-sized run is one seed. STRATA_XLA_CONFORMANCE=full
// (scripts/xla-conformance.sh) runs three seeds and also every sample of
// an op that is not lowered, reporting where it falls back.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "strata/xla_device/device.h"
#include "xla_device/core_ops.h"
#include "xla_device/jax_replay.h"
#include "xla_device/xla_device_test.h"

namespace {

using Tensors = std::vector<at::Tensor>;

// Note [Conformance tolerances]
// Relative to the largest finite |value| of LibTorch's result (at least 1).
// Exact ops (copies, selections, max/min, comparisons) to the bit; sums and
// products ordered by XLA's kernels their own way to 1e-5 (f32 sums of a
// few hundred terms); XLA's polynomial exp/log/tanh/erf 1e-5; bf16 one
// rounding of the largest value, 2e-2, where the f32 values straddle it,
// and f16 the same, 2e-3 (10 bits of mantissa where bf16 has 7).
constexpr double kExact = 0, kSum = 1e-5, kTranscendental = 1e-5, kBf16 = 2e-2, kF16 = 2e-3;

/// One sample call of an op: the shapes of its floating inputs, drawn
/// standard normal, and the call (on either device: every other input it
/// makes on its first input's device).
struct Sample {
  std::string what;
  std::vector<std::vector<int64_t>> shapes;
  std::function<Tensors(const Tensors&)> call;
  double tol = kSum;
  bool grad = true;   ///< differentiable in its floating inputs
  bool edges = true;  ///< NaN, inf and -0 inputs compare as LibTorch's
  bool bf16 = true;  ///< also taken in bf16 and f16
  /// Maps a drawn input into the op's domain (positive for sqrt, ...).
  std::function<at::Tensor(const at::Tensor&)> domain = nullptr;
  /// Whether LibTorch's own kernel takes non-contiguous inputs.
  bool strided = true;
};

at::TensorOptions like(const at::Tensor& t, c10::ScalarType dtype) { return t.options().dtype(dtype); }
at::Tensor longs(const at::Tensor& on, std::vector<int64_t> values) {
  return at::tensor(values, at::kLong).to(on.device());
}
at::Tensor positive(const at::Tensor& t) { return t.abs() + 0.5; }
at::Tensor unit(const at::Tensor& t) { return t.tanh() * 0.9; }

Tensors one(at::Tensor t) { return {std::move(t)}; }

/// The samples, by operator.
std::map<std::string, std::vector<Sample>> samples() {
  std::map<std::string, std::vector<Sample>> s;
  auto unary = [&](const std::string& op, std::function<at::Tensor(const at::Tensor&)> f, double tol,
                   std::function<at::Tensor(const at::Tensor&)> domain = nullptr, bool grad = true) {
    Sample a{op, {{3, 5}}, [f](const Tensors& x) { return one(f(x[0])); }, tol, grad};
    a.domain = domain;
    Sample empty{op + " of an empty tensor", {{0, 4}}, [f](const Tensors& x) { return one(f(x[0])); }, tol, false};
    empty.domain = domain;
    s[op] = {a, empty};
  };
  auto binary = [&](const std::string& op, std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> f,
                    double tol, std::function<at::Tensor(const at::Tensor&)> domain = nullptr) {
    Sample a{op, {{3, 5}, {3, 5}}, [f](const Tensors& x) { return one(f(x[0], x[1])); }, tol};
    Sample b{op + " broadcast", {{4, 1, 5}, {3, 5}}, [f](const Tensors& x) { return one(f(x[0], x[1])); }, tol};
    Sample c{op + " with a wrapped scalar", {{3, 5}},
             [f](const Tensors& x) { return one(f(x[0], at::scalar_tensor(1.5, at::kDouble))); }, tol};
    a.domain = b.domain = c.domain = domain;
    s[op] = {a, b, c};
  };
  auto compare = [&](const std::string& op, std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> f) {
    s[op] = {Sample{op, {{3, 5}, {3, 5}}, [f](const Tensors& x) { return one(f(x[0], x[1])); }, kExact, false},
             Sample{op + " broadcast", {{3, 5}, {5}}, [f](const Tensors& x) { return one(f(x[0], x[1])); }, kExact,
                    false}};
  };

  // Element-wise arithmetic.
  binary("aten::add.Tensor", [](auto& a, auto& b) { return at::add(a, b, 0.5); }, kExact);
  binary("aten::sub.Tensor", [](auto& a, auto& b) { return at::sub(a, b, 2); }, kExact);
  binary("aten::mul.Tensor", [](auto& a, auto& b) { return a * b; }, kExact);
  binary("aten::div.Tensor", [](auto& a, auto& b) { return a / b; }, kSum, positive);
  binary("aten::maximum", [](auto& a, auto& b) { return at::maximum(a, b); }, kExact);
  binary("aten::minimum", [](auto& a, auto& b) { return at::minimum(a, b); }, kExact);
  binary("aten::atan2", [](auto& a, auto& b) { return at::atan2(a, b); }, kTranscendental);
  binary("aten::pow.Tensor_Tensor", [](auto& a, auto& b) { return at::pow(a, b); }, kTranscendental, positive);
  binary("aten::fmod.Tensor", [](auto& a, auto& b) { return at::fmod(a, b); }, kSum, positive);
  binary("aten::remainder.Tensor", [](auto& a, auto& b) { return at::remainder(a, b); }, kSum, positive);
  s["aten::atan2.out"] = {Sample{"atan2 into an out tensor", {{3, 5}, {3, 5}}, [](auto& x) {
                                   at::Tensor o = at::empty_like(x[0]);
                                   return one(at::atan2_out(o, x[0], x[1]));
                                 },
                                 kTranscendental, false}};
  s["aten::remainder.Tensor"].push_back(Sample{"remainder of signed operands", {{3, 5}, {3, 5}}, [](auto& x) {
                                                 return one(at::remainder(x[0] * 3, x[1].sign() * (x[1].abs() + 0.5)));
                                               },
                                               kSum, false, false});
  s["aten::div.Tensor_mode"].push_back(Sample{"div floor and trunc of signed operands", {{3, 5}, {3, 5}}, [](auto& x) {
                                                at::Tensor b = x[1].sign() * (x[1].abs() + 0.5);
                                                return Tensors{at::div(x[0] * 3, b, "floor"), at::div(x[0] * 3, b, "trunc")};
                                              },
                                              kSum, false, false});
  // The bitwise ops on integers and on bools.
  auto ints = [](const at::Tensor& t) { return (t * 8).to(at::kInt); };
  for (const char* op : {"and", "or", "xor"}) {
    const std::string name = op;
    auto f = [name](const at::Tensor& a, const at::Tensor& b) {
      return name == "and" ? a.bitwise_and(b) : name == "or" ? a.bitwise_or(b) : a.bitwise_xor(b);
    };
    s["aten::bitwise_" + name + ".Tensor"] = {
        Sample{"bitwise " + name + " of ints", {{3, 5}, {3, 5}}, [f, ints](auto& x) { return one(f(ints(x[0]), ints(x[1]))); },
               kExact, false, false, false},
        Sample{"bitwise " + name + " of bools", {{3, 5}, {3, 5}}, [f](auto& x) { return one(f(x[0] > 0, x[1] > 0)); },
               kExact, false, false, false}};
  }
  s["aten::add.Scalar"] = {Sample{"add.Scalar", {{3, 5}}, [](auto& x) { return one(at::add(x[0], 1.25, 2)); }, kExact}};
  s["aten::sub.Scalar"] = {Sample{"sub.Scalar", {{3, 5}}, [](auto& x) { return one(at::sub(x[0], 1.25)); }, kExact}};
  s["aten::mul.Scalar"] = {Sample{"mul.Scalar", {{3, 5}}, [](auto& x) { return one(at::mul(x[0], 3.0)); }, kExact}};
  s["aten::div.Scalar"] = {Sample{"div.Scalar", {{3, 5}}, [](auto& x) { return one(at::div(x[0], 3.0)); }, kSum}};
  s["aten::div.Tensor_mode"] = {Sample{"div floor", {{3, 5}, {3, 5}},
                                       [](auto& x) { return one(at::div(x[0], x[1], "floor")); }, kSum, false, true,
                                       true, positive}};
  s["aten::pow.Tensor_Scalar"] = {
      Sample{"pow 2", {{3, 5}}, [](auto& x) { return one(x[0].pow(2)); }, kExact},
      Sample{"pow 0.5", {{3, 5}}, [](auto& x) { return one(x[0].pow(0.5)); }, kTranscendental, true, true, true,
             positive},
      Sample{"pow -1.5", {{3, 5}}, [](auto& x) { return one(x[0].pow(-1.5)); }, kTranscendental, true, true, true,
             positive}};
  s["aten::pow.Scalar"] = {Sample{"2 ** x", {{3, 5}}, [](auto& x) { return one(at::pow(2.0, x[0])); },
                                  kTranscendental}};
  s["aten::clamp"] = {Sample{"clamp", {{3, 5}}, [](auto& x) { return one(x[0].clamp(-0.5, 0.7)); }, kExact},
                      Sample{"clamp min only", {{3, 5}}, [](auto& x) { return one(x[0].clamp(-0.5)); }, kExact}};
  s["aten::clamp.Tensor"] = {Sample{"clamp by tensors", {{3, 5}, {3, 5}, {5}},
                                    [](auto& x) { return one(at::clamp(x[0], x[1], x[2].abs() + x[1])); }, kExact}};
  s["aten::where.self"] = {Sample{"where", {{3, 5}, {3, 5}, {3, 5}},
                                  [](auto& x) { return one(at::where(x[2] > 0, x[0], x[1])); }, kExact}};

  // Element-wise functions.
  unary("aten::abs", [](auto& x) { return x.abs(); }, kExact);
  unary("aten::neg", [](auto& x) { return -x; }, kExact);
  unary("aten::sqrt", [](auto& x) { return x.sqrt(); }, kTranscendental, positive);
  unary("aten::rsqrt", [](auto& x) { return x.rsqrt(); }, kTranscendental, positive);
  unary("aten::reciprocal", [](auto& x) { return x.reciprocal(); }, kSum, positive);
  unary("aten::exp", [](auto& x) { return x.exp(); }, kTranscendental);
  unary("aten::expm1", [](auto& x) { return x.expm1(); }, kTranscendental);
  unary("aten::log", [](auto& x) { return x.log(); }, kTranscendental, positive);
  unary("aten::log1p", [](auto& x) { return x.log1p(); }, kTranscendental, positive);
  unary("aten::log2", [](auto& x) { return x.log2(); }, kTranscendental, positive);
  unary("aten::log10", [](auto& x) { return x.log10(); }, kTranscendental, positive);
  unary("aten::sin", [](auto& x) { return x.sin(); }, kTranscendental);
  unary("aten::cos", [](auto& x) { return x.cos(); }, kTranscendental);
  unary("aten::tan", [](auto& x) { return x.tan(); }, kTranscendental, unit);
  unary("aten::asin", [](auto& x) { return x.asin(); }, kTranscendental, unit);
  unary("aten::acos", [](auto& x) { return x.acos(); }, kTranscendental, unit);
  unary("aten::atan", [](auto& x) { return x.atan(); }, kTranscendental);
  unary("aten::sinh", [](auto& x) { return x.sinh(); }, kTranscendental);
  unary("aten::cosh", [](auto& x) { return x.cosh(); }, kTranscendental);
  unary("aten::tanh", [](auto& x) { return x.tanh(); }, kTranscendental);
  unary("aten::asinh", [](auto& x) { return x.asinh(); }, kTranscendental);
  unary("aten::acosh", [](auto& x) { return x.acosh(); }, kTranscendental, [](auto& t) { return t.abs() + 1.1; });
  unary("aten::atanh", [](auto& x) { return x.atanh(); }, kTranscendental, unit);
  unary("aten::erf", [](auto& x) { return x.erf(); }, kTranscendental);
  unary("aten::sigmoid", [](auto& x) { return x.sigmoid(); }, kTranscendental);
  unary("aten::relu", [](auto& x) { return x.relu(); }, kExact);
  unary("aten::gelu", [](auto& x) { return at::gelu(x); }, kTranscendental);
  unary("aten::elu", [](auto& x) { return at::elu(x); }, kTranscendental);
  unary("aten::hardtanh", [](auto& x) { return at::hardtanh(x, -0.5, 0.5); }, kExact);
  unary("aten::leaky_relu", [](auto& x) { return at::leaky_relu(x, 0.2); }, kExact);
  unary("aten::sign", [](auto& x) { return x.sign(); }, kExact, nullptr, false);
  unary("aten::floor", [](auto& x) { return (x * 3).floor(); }, kExact, nullptr, false);
  unary("aten::ceil", [](auto& x) { return (x * 3).ceil(); }, kExact, nullptr, false);
  unary("aten::round", [](auto& x) { return (x * 3).round(); }, kExact, nullptr, false);
  unary("aten::bitwise_not", [](auto& x) { return (x > 0).bitwise_not(); }, kExact, nullptr, false);
  unary("aten::trunc", [](auto& x) { return (x * 3).trunc(); }, kExact, nullptr, false);
  unary("aten::isnan", [](auto& x) { return x.isnan(); }, kExact, nullptr, false);
  unary("aten::isinf", [](auto& x) { return x.isinf(); }, kExact, nullptr, false);
  unary("aten::logical_not", [](auto& x) { return (x > 0).logical_not(); }, kExact, nullptr, false);
  unary("aten::clone", [](auto& x) { return x.clone(); }, kExact);
  s["aten::gelu"].push_back(
      Sample{"gelu tanh", {{3, 5}}, [](auto& x) { return one(at::gelu(x[0], "tanh")); }, kTranscendental});

  // Comparisons and logic.
  compare("aten::eq.Tensor", [](auto& a, auto& b) { return (a > 0) == (b > 0); });
  compare("aten::ne.Tensor", [](auto& a, auto& b) { return (a > 0) != (b > 0); });
  compare("aten::lt.Tensor", [](auto& a, auto& b) { return a < b; });
  compare("aten::le.Tensor", [](auto& a, auto& b) { return a <= b; });
  compare("aten::gt.Tensor", [](auto& a, auto& b) { return a > b; });
  compare("aten::ge.Tensor", [](auto& a, auto& b) { return a >= b; });
  compare("aten::logical_and", [](auto& a, auto& b) { return at::logical_and(a > 0, b > 0); });
  compare("aten::logical_or", [](auto& a, auto& b) { return at::logical_or(a > 0, b > 0); });
  compare("aten::logical_xor", [](auto& a, auto& b) { return at::logical_xor(a > 0, b > 0); });
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    const std::string name = std::string("aten::") + op + ".Scalar";
    s[name] = {Sample{name, {{3, 5}}, [op = std::string(op)](auto& x) {
                        const at::Tensor& t = x[0];
                        if (op == "eq") return one((t > 0) == 1);
                        if (op == "ne") return one((t > 0) != 1);
                        if (op == "lt") return one(t < 0.25);
                        if (op == "le") return one(t <= 0.25);
                        if (op == "gt") return one(t > 0.25);
                        return one(t >= 0.25);
                      },
                      kExact, false}};
  }

  // Reductions.
  s["aten::sum.dim_IntList"] = {
      Sample{"sum dim 1", {{3, 5}}, [](auto& x) { return one(x[0].sum(1)); }, kSum},
      Sample{"sum dims 0, 2 keepdim", {{2, 3, 4}}, [](auto& x) { return one(x[0].sum({0, 2}, true)); }, kSum},
      Sample{"sum of an empty dim", {{0, 4}}, [](auto& x) { return one(x[0].sum(0)); }, kSum, false}};
  s["aten::mean.dim"] = {Sample{"mean dim -1", {{3, 5}}, [](auto& x) { return one(x[0].mean(-1)); }, kSum},
                         Sample{"mean dims keepdim", {{2, 3, 4}},
                                [](auto& x) { return one(x[0].mean({1, 2}, true)); }, kSum}};
  s["aten::mean"] = {Sample{"mean", {{3, 5}}, [](auto& x) { return one(x[0].mean()); }, kSum}};
  s["aten::prod"] = {Sample{"prod", {{2, 3}}, [](auto& x) { return one(x[0].prod()); }, kSum}};
  s["aten::prod.dim_int"] = {Sample{"prod dim", {{3, 4}}, [](auto& x) { return one(x[0].prod(1)); }, kSum}};
  s["aten::amax"] = {Sample{"amax", {{3, 5}}, [](auto& x) { return one(x[0].amax(1)); }, kExact}};
  s["aten::amin"] = {Sample{"amin", {{3, 5}}, [](auto& x) { return one(x[0].amin(0)); }, kExact}};
  s["aten::max.dim"] = {Sample{"max dim", {{3, 5}}, [](auto& x) {
                                 auto [v, i] = x[0].max(1);
                                 return Tensors{v, i};
                               },
                               kExact, true, false}};
  s["aten::min.dim"] = {Sample{"min dim", {{3, 5}}, [](auto& x) {
                                 auto [v, i] = x[0].min(0, true);
                                 return Tensors{v, i};
                               },
                               kExact, true, false}};
  s["aten::argmax"] = {Sample{"argmax", {{3, 5}}, [](auto& x) { return one(x[0].argmax(1)); }, kExact, false, false}};
  s["aten::argmin"] = {Sample{"argmin", {{3, 5}}, [](auto& x) { return one(x[0].argmin(0)); }, kExact, false, false}};
  s["aten::var.correction"] = {Sample{"var", {{3, 5}}, [](auto& x) {
                                        return one(at::var(x[0], at::IntArrayRef{1}, std::optional<at::Scalar>(1), false));
                                      },
                                      kSum}};
  s["aten::var.dim"] = {Sample{"var dim", {{3, 5}}, [](auto& x) { return one(x[0].var({0}, true, true)); }, kSum}};
  s["aten::any.dim"] = {Sample{"any dim", {{3, 5}}, [](auto& x) { return one((x[0] > 1).any(1)); }, kExact, false}};
  s["aten::any.dims"] = {Sample{"any dims", {{3, 5}},
                                [](auto& x) { return one((x[0] > 1).any(at::IntArrayRef{0, 1})); }, kExact, false}};
  s["aten::any"] = {Sample{"any", {{3, 5}}, [](auto& x) { return one((x[0] > 1).any()); }, kExact, false}};
  s["aten::cumsum"] = {Sample{"cumsum", {{3, 5}}, [](auto& x) { return one(x[0].cumsum(1)); }, kSum}};

  // Linear algebra.
  s["aten::mm"] = {Sample{"mm", {{3, 4}, {4, 5}}, [](auto& x) { return one(x[0].mm(x[1])); }, kSum}};
  s["aten::bmm"] = {Sample{"bmm", {{2, 3, 4}, {2, 4, 5}}, [](auto& x) { return one(x[0].bmm(x[1])); }, kSum}};
  s["aten::addmm"] = {Sample{"addmm", {{5}, {3, 4}, {4, 5}},
                             [](auto& x) { return one(at::addmm(x[0], x[1], x[2])); }, kSum},
                      Sample{"addmm beta alpha", {{3, 5}, {3, 4}, {4, 5}},
                             [](auto& x) { return one(at::addmm(x[0], x[1], x[2], 0.5, 2)); }, kSum}};

  // Shapes, copies and indexing.
  s["aten::cat"] = {Sample{"cat", {{2, 3}, {4, 3}}, [](auto& x) { return one(at::cat({x[0], x[1]})); }, kExact},
                    Sample{"cat dim 1", {{2, 3}, {2, 1}}, [](auto& x) { return one(at::cat({x[0], x[1]}, 1)); },
                           kExact}};
  s["aten::view"] = {Sample{"view", {{3, 4}}, [](auto& x) { return one(x[0].contiguous().view({2, 6}) * 1); },
                            kExact}};
  s["aten::as_strided"] = {Sample{"as_strided", {{3, 4}},
                                  [](auto& x) { return one(x[0].contiguous().as_strided({2, 2}, {4, 1}, 1) * 1); },
                                  kExact}};
  s["aten::permute"] = {Sample{"permute", {{2, 3, 4}},
                               [](auto& x) { return one(x[0].permute({2, 0, 1}).contiguous()); }, kExact}};
  s["aten::expand"] = {Sample{"expand", {{3, 1}}, [](auto& x) { return one(x[0].expand({3, 4}).contiguous()); },
                              kExact}};
  s["aten::flip"] = {Sample{"flip", {{3, 4}}, [](auto& x) { return one(x[0].flip({0, 1})); }, kExact}};
  s["aten::repeat"] = {Sample{"repeat", {{2, 3}}, [](auto& x) { return one(x[0].repeat({2, 1, 2})); }, kExact}};
  s["aten::constant_pad_nd"] = {Sample{"pad", {{2, 3}},
                                       [](auto& x) { return one(at::constant_pad_nd(x[0], {1, 2, 0, 1}, 0.5)); },
                                       kExact}};
  s["aten::_to_copy"] = {Sample{"to double", {{3, 4}}, [](auto& x) { return one(x[0].to(at::kDouble)); }, kExact}};
  s["aten::triu"] = {Sample{"triu", {{4, 4}}, [](auto& x) { return one(x[0].triu(1)); }, kExact}};
  s["aten::index_select"] = {Sample{"index_select", {{5, 3}}, [](auto& x) {
                                      return one(x[0].index_select(0, longs(x[0], {4, 0, 2, 4})));
                                    },
                                    kExact}};
  s["aten::gather"] = {Sample{"gather", {{3, 4}}, [](auto& x) {
                                return one(x[0].gather(1, longs(x[0], {0, 3, 1, 1, 2, 0}).view({3, 2})));
                              },
                              kExact}};
  s["aten::scatter.src"] = {Sample{"scatter", {{3, 4}, {3, 2}}, [](auto& x) {
                                     return one(x[0].scatter(1, longs(x[0], {0, 3, 1, 2, 2, 0}).view({3, 2}), x[1]));
                                   },
                                   kExact}};
  s["aten::scatter_add"] = {Sample{"scatter_add", {{3, 4}, {3, 2}}, [](auto& x) {
                                     return one(
                                         x[0].scatter_add(1, longs(x[0], {0, 0, 1, 2, 3, 3}).view({3, 2}), x[1]));
                                   },
                                   kSum}};
  s["aten::scatter_reduce.two"] = {Sample{"scatter_reduce sum and prod", {{3, 4}, {3, 2}}, [](auto& x) {
                                           const at::Tensor i = longs(x[0], {0, 0, 1, 2, 3, 3}).view({3, 2});
                                           return Tensors{x[0].scatter_reduce(1, i, x[1], "sum"),
                                                          x[0].scatter_reduce(1, i, x[1], "prod")};
                                         },
                                         kSum, false}};
  s["aten::scatter_reduce.two"].push_back(Sample{"scatter_reduce amax and amin", {{3, 4}, {3, 3}}, [](auto& x) {
                                                   const at::Tensor i = longs(x[0], {0, 0, 1, 2, 3, 3, 1, 1, 1}).view({3, 3});
                                                   return Tensors{x[0].scatter_reduce(1, i, x[1], "amax"),
                                                                  x[0].scatter_reduce(1, i, x[1], "amin")};
                                                 },
                                                 kExact, false});
  // EmbeddingBag's three modes, a padding index, per-sample weights, an
  // empty bag and include_last_offset (Note [Bags as segment sums] in
  // src/xla_device/kernels_embedding_bag.cpp); f32 only.
  auto bag = [](int64_t mode, bool weighted, bool last_offset, int64_t padding_idx) {
    return [=](const Tensors& x) {
      const at::Tensor indices = longs(x[0], {1, 2, 4, 5, 4, 3, 2, 6});
      // include_last_offset: the last offset is the number of indices.
      const at::Tensor offsets = last_offset ? longs(x[0], {0, 2, 2, 5, 8}) : longs(x[0], {0, 2, 2, 5});
      auto [out, offset2bag, size, max_indices] =
          at::_embedding_bag(x[0], indices, offsets, false, mode, false, weighted ? x[1] : at::Tensor(), last_offset,
                             padding_idx);
      return mode == 2 ? Tensors{out, size, max_indices} : Tensors{out, size};
    };
  };
  s["aten::_embedding_bag"] = {
      Sample{"embedding_bag sum", {{7, 3}}, bag(0, false, false, -1), kSum, true, false, false},
      Sample{"embedding_bag sum, weighted, padding, last offset", {{7, 3}, {8}}, bag(0, true, true, 4), kSum, true,
             false, false},
      Sample{"embedding_bag mean with padding", {{7, 3}}, bag(1, false, false, 4), kSum, true, false, false},
      Sample{"embedding_bag mean, last offset", {{7, 3}}, bag(1, false, true, -1), kSum, true, false, false},
      Sample{"embedding_bag max with padding", {{7, 3}}, bag(2, false, false, 4), kExact, true, false, false},
      Sample{"embedding_bag max", {{7, 3}}, bag(2, false, true, -1), kExact, true, false, false}};
  // grid_sample: bilinear and nearest, zeros and border, with and without
  // align_corners; the grid reaches past the image's edges.
  auto sample = [](int64_t interpolation, int64_t padding, bool align_corners) {
    return [=](const Tensors& x) {
      return one(at::grid_sampler_2d(x[0], x[1].tanh() * 1.2, interpolation, padding, align_corners));
    };
  };
  s["aten::grid_sampler_2d"] = {
      Sample{"grid_sample bilinear zeros", {{2, 3, 4, 5}, {2, 3, 4, 2}}, sample(0, 0, false), kSum, true, false, false},
      Sample{"grid_sample bilinear border, align_corners", {{2, 3, 4, 5}, {2, 3, 4, 2}}, sample(0, 1, true), kSum,
             true, false, false},
      Sample{"grid_sample nearest zeros, align_corners", {{1, 2, 5, 4}, {1, 3, 3, 2}}, sample(1, 0, true), kSum, true,
             false, false},
      Sample{"grid_sample nearest border", {{1, 2, 5, 4}, {1, 3, 3, 2}}, sample(1, 1, false), kSum, true, false,
             false}};
  s["aten::nonzero"] = {Sample{"nonzero", {{3, 5}}, [](auto& x) { return one(at::nonzero(x[0] > 0)); }, kExact, false,
                               false, false}};
  s["aten::scatter.value"] = {Sample{"scatter value", {{3, 4}}, [](auto& x) {
                                       return one(x[0].scatter(1, longs(x[0], {0, 3, 1, 2, 2, 0}).view({3, 2}), 0.5));
                                     },
                                     kExact}};
  s["aten::index.Tensor"] = {
      Sample{"index", {{5, 3}}, [](auto& x) { return one(x[0].index({longs(x[0], {1, 4, 1})})); }, kExact},
      Sample{"index two dims, negative", {{5, 3}}, [](auto& x) {
               return one(x[0].index({longs(x[0], {1, -1, 0, 2}).view({2, 2}), longs(x[0], {2, 0})}));
             },
             kExact},
      Sample{"index the middle dim", {{2, 5, 3}}, [](auto& x) {
               using at::indexing::Slice;
               return one(x[0].index({Slice(), longs(x[0], {3, 0, 3})}));
             },
             kExact}};
  s["aten::embedding"] = {Sample{"embedding", {{6, 3}}, [](auto& x) {
                                   return one(at::embedding(x[0], longs(x[0], {1, 5, 1, 0}).view({2, 2})));
                                 },
                                 kExact}};
  s["aten::embedding_dense_backward"] = {
      Sample{"embedding backward", {{2, 2, 3}}, [](auto& x) {
               return one(at::embedding_dense_backward(x[0], longs(x[0], {1, 5, 1, 0}).view({2, 2}), 6, -1, false));
             },
             kSum, false}};

  // Normalisation, softmax, losses' pieces.
  s["aten::_softmax"] = {Sample{"softmax", {{3, 5}}, [](auto& x) { return one(x[0].softmax(-1)); }, kTranscendental},
                         Sample{"softmax dim 0", {{3, 5}}, [](auto& x) { return one(x[0].softmax(0)); },
                                kTranscendental}};
  s["aten::_log_softmax"] = {Sample{"log_softmax", {{3, 5}}, [](auto& x) { return one(x[0].log_softmax(1)); },
                                    kTranscendental}};
  s["aten::native_layer_norm"] = {Sample{"layer_norm", {{3, 6}, {6}, {6}}, [](auto& x) {
                                           return one(at::layer_norm(x[0], {6}, x[1], x[2], 1e-5));
                                         },
                                         kSum, true, false}};
  s["aten::native_layer_norm_backward"] = {Sample{
      "layer_norm backward", {{3, 6}, {3, 6}, {6}, {6}}, [](auto& x) {
        auto [y, mean, rstd] = at::native_layer_norm(x[1], {6}, x[2], x[3], 1e-5);
        auto [gi, gw, gb] = at::native_layer_norm_backward(x[0], x[1], {6}, mean, rstd, x[2], x[3], {true, true, true});
        return Tensors{gi, gw, gb};
      },
      kSum, false, false}};
  s["aten::_native_batch_norm_legit"] = {
      Sample{"batch_norm training, running statistics", {{4, 3, 2, 2}, {3}, {3}}, [](auto& x) {
               auto rm = at::zeros({3}, x[0].options()), rv = at::ones({3}, x[0].options());
               auto [y, mean, invstd] = at::_native_batch_norm_legit(x[0], x[1], x[2], rm, rv, true, 0.1, 1e-5);
               return Tensors{y, mean, invstd, rm, rv};
             },
             kSum, true, false}};
  s["aten::_native_batch_norm_legit.no_stats"] = {
      Sample{"batch_norm training, no running statistics", {{4, 3, 2, 2}, {3}, {3}}, [](auto& x) {
               auto [y, mean, invstd] = at::_native_batch_norm_legit(x[0], x[1], x[2], true, 0.1, 1e-5);
               return Tensors{y, mean, invstd};
             },
             kSum, true, false}};
  s["aten::_native_batch_norm_legit_no_training"] = {
      Sample{"batch_norm eval", {{4, 3, 2, 2}, {3}, {3}}, [](auto& x) {
               auto rm = at::full({3}, 0.1, x[0].options()), rv = at::full({3}, 2.0, x[0].options());
               return one(std::get<0>(at::_native_batch_norm_legit_no_training(x[0], x[1], x[2], rm, rv, 0.1, 1e-5)));
             },
             kSum, true, false}};
  // native_group_norm's CPU kernel takes contiguous inputs only.
  s["aten::native_group_norm"] = {Sample{"group_norm", {{2, 4, 3}, {4}, {4}}, [](auto& x) {
                                           auto [y, mean, rstd] = at::native_group_norm(x[0], x[1], x[2], 2, 4, 3, 2,
                                                                                        1e-5);
                                           return Tensors{y, mean, rstd};
                                         },
                                         kSum, true, false, true, nullptr, false}};
  // The mask is drawn on each device by its own generator: the sample
  // checks that the output is the input kept by the mask and scaled.
  s["aten::native_dropout"] = {Sample{"dropout 0.5, output against its mask", {{3, 5}}, [](auto& x) {
                                        auto [out, mask] = at::native_dropout(x[0], 0.5, true);
                                        return one(out - x[0] * mask * 2);
                                      },
                                      kExact, false, false}};

  // Convolutions and pooling.
  static const std::vector<int64_t> k1{1}, k0{0}, k2{2}, k11{1, 1}, k22{2, 2}, k00{0, 0};
  s["aten::convolution"] = {
      Sample{"conv2d", {{2, 3, 5, 5}, {4, 3, 3, 3}, {4}},
             [](auto& x) { return one(at::conv2d(x[0], x[1], x[2], k11, k11)); }, kSum, true, false},
      Sample{"conv2d stride 2 groups", {{1, 4, 6, 6}, {4, 2, 3, 3}},
             [](auto& x) { return one(at::conv2d(x[0], x[1], {}, k22, k00, k11, 2)); }, kSum, true, false},
      Sample{"conv_transpose2d", {{1, 3, 3, 3}, {3, 2, 4, 4}},
             [](auto& x) { return one(at::conv_transpose2d(x[0], x[1], {}, k22, k11)); }, kSum, true, false},
      Sample{"conv1d dilation", {{2, 2, 7}, {3, 2, 3}},
             [](auto& x) { return one(at::conv1d(x[0], x[1], {}, k1, k0, k2)); }, kSum, true, false}};
  s["aten::max_pool2d_with_indices"] = {Sample{"max_pool2d", {{2, 2, 5, 5}}, [](auto& x) {
                                                 auto [v, i] = at::max_pool2d_with_indices(x[0], {2, 2});
                                                 return Tensors{v, i};
                                               },
                                               kExact, true, false}};
  s["aten::avg_pool2d"] = {Sample{"avg_pool2d", {{2, 2, 5, 5}},
                                  [](auto& x) { return one(at::avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1})); }, kSum}};
  s["aten::_adaptive_avg_pool2d"] = {Sample{"adaptive_avg_pool2d", {{2, 3, 4, 4}},
                                            [](auto& x) { return one(at::adaptive_avg_pool2d(x[0], {1, 1})); }, kSum}};
  // Folding: sums of the same terms in the same order, so exact; its
  // gradient is im2col's (nn::Unfold's) lowering.
  s["aten::col2im"] = {
      Sample{"fold stride padding", {{2, 12, 15}},
             [](auto& x) { return one(at::col2im(x[0], {5, 6}, {2, 2}, k11, {1, 0}, {2, 1})); }, kExact},
      Sample{"fold dilation unbatched", {{12, 12}},
             [](auto& x) { return one(at::col2im(x[0], {6, 5}, {2, 3}, {2, 1}, {0, 1}, {1, 2})); }, kExact}};
  // Distances: f32 only (as LibTorch's CPU kernels), NaN left out (Note
  // [Distances as ATen ops] in src/xla_device/kernels_distance.cpp).
  auto distances = [](const std::string& what, double p) {
    return std::vector<Sample>{
        Sample{"cdist p=" + what, {{2, 4, 3}, {5, 3}}, [p](auto& x) { return one(at::cdist(x[0], x[1], p)); }, kSum,
               true, false, false},
        Sample{"pdist p=" + what, {{5, 3}}, [p](auto& x) { return one(at::pdist(x[0], p)); }, kSum, true, false, false,
               nullptr, false}};
  };
  for (const auto& [what, p] : std::vector<std::pair<std::string, double>>{
           {"0", 0}, {"0.5", 0.5}, {"1", 1}, {"1.5", 1.5}, {"2", 2}, {"3", 3}, {"inf", INFINITY}}) {
    for (Sample& sample : distances(what, p)) {
      s[sample.what.rfind("cdist", 0) == 0 ? "aten::_cdist_forward" : "aten::_pdist_forward"].push_back(sample);
    }
  }
  s["aten::_cdist_forward"].push_back(Sample{"cdist p=2 as a matrix product (compute_mode 1)", {{4, 3}, {5, 3}},
                                             [](auto& x) { return one(at::_cdist_forward(x[0], x[1], 2, 1)); }, kSum,
                                             true, false, false});
  s["aten::_cdist_forward"].push_back(Sample{"cdist of no columns", {{4, 0}, {5, 0}},
                                             [](auto& x) { return one(at::cdist(x[0], x[1], 2)); }, kExact, false,
                                             false, false});
  // Fourier transforms: f32 and f64 only (LibTorch's CPU kernels refuse
  // half precision); an infinity spreads through a transform as each FFT
  // orders its sums, so no edge values. Complex results compare as their
  // parts, complex inputs are made of a last dim of 2.
  auto parts = [](const at::Tensor& z) { return one(at::view_as_real(z)); };
  auto complex_of = [](const at::Tensor& x) { return at::view_as_complex(x.contiguous()); };
  s["aten::_fft_r2c"] = {
      Sample{"rfft", {{3, 8}}, [=](auto& x) { return parts(at::fft_rfft(x[0])); }, kSum, true, false, false},
      Sample{"rfft2 ortho", {{2, 4, 6}},
             [=](auto& x) { return parts(at::fft_rfft2(x[0], std::nullopt, {0, 1}, "ortho")); }, kSum, true, false,
             false},
      Sample{"fft of reals over dim 0", {{5, 3}}, [=](auto& x) { return parts(at::fft_fft(x[0], std::nullopt, 0)); },
             kSum, true, false, false}};
  s["aten::_fft_c2r"] = {
      Sample{"irfft", {{3, 5, 2}}, [=](auto& x) { return one(at::fft_irfft(complex_of(x[0]), 8)); }, kSum, true, false,
             false},
      Sample{"irfft2 forward", {{4, 3, 2}},
             [=](auto& x) { return one(at::fft_irfft2(complex_of(x[0]), std::vector<int64_t>{4, 5}, {0, 1}, "forward")); },
             kSum, true, false, false}};
  s["aten::sort"] = {Sample{"sort", {{3, 5}}, [](auto& x) {
                              auto [v, i] = x[0].sort(1);
                              return Tensors{v, i};
                            },
                            kExact, true, false}};
  s["aten::topk"] = {Sample{"topk", {{3, 5}}, [](auto& x) {
                              auto [v, i] = x[0].topk(2, 1);
                              return Tensors{v, i};
                            },
                            kExact, true, false}};

  // Memory kernels: exercised by every sample, checked by these.
  s["aten::empty.memory_format"] = {Sample{"empty then fill", {{3, 4}}, [](auto& x) {
                                             return one(at::empty({3, 4}, x[0].options()).fill_(2.5) + x[0]);
                                           },
                                           kExact, false}};
  s["aten::empty_strided"] = {Sample{"empty_strided then copy", {{3, 4}}, [](auto& x) {
                                       return one(at::empty_strided({3, 4}, {1, 3}, x[0].options()).copy_(x[0]));
                                     },
                                     kExact, false}};
  s["aten::resize_"] = {Sample{"resize_ then fill", {{3, 4}}, [](auto& x) {
                                 auto t = at::empty({2}, x[0].options());
                                 t.resize_({3, 4});
                                 return one(t.fill_(1.5) * x[0]);
                               },
                               kExact, false}};
  s["aten::_local_scalar_dense"] = {Sample{"item", {{3, 4}}, [](auto& x) {
                                             const double v = x[0].sum().template item<double>();
                                             return one(at::scalar_tensor(v, at::kDouble));
                                           },
                                           kSum, false, false}};
  s["aten::copy"] = {Sample{"copy", {{3, 4}, {3, 4}}, [](auto& x) { return one(at::copy(x[0], x[1])); }, kExact,
                            false}};
  s["aten::fill.Scalar"] = {Sample{"fill", {{3, 4}}, [](auto& x) { return one(at::fill(x[0], 0.75)); }, kExact,
                                   false}};
  s["aten::full_like"] = {Sample{"full_like", {{3, 4}}, [](auto& x) { return one(at::full_like(x[0], 3.5) + x[0]); },
                                 kExact}};
  s["aten::arange.start_step"] = {Sample{"arange", {{4}}, [](auto& x) {
                                           return one(at::arange(1, 9, 2, x[0].options()) * x[0]);
                                         },
                                         kExact}};
  return s;
}

// Note [Known gaps]
// Variants of lowered ops that still fall back to the CPU on this branch,
// while the lowerings of issue 39 land: such a variant runs and is
// compared, and its fallback is printed instead of failing. In the full
// run (every variant) a listed gap that no longer falls back anywhere
// fails the test, so the list only shrinks: delete its line when a
// lowering covers it.
struct Gap {
  const char* op;
  const char* variant;  ///< "transposed", "bf16", "empty", "gradients", "offset" or "edge values"
  const char* why;
};
const std::vector<Gap> kKnownGaps = {};  // none left

// |xla - cpu| within `tol` of the largest finite |cpu| (at least 1); NaN
// and infinities at the same places; -0 kept where LibTorch keeps it.
::testing::AssertionResult same(const at::Tensor& xla, const at::Tensor& cpu, double tol) {
  at::Tensor a = xla.cpu();
  if (a.scalar_type() != cpu.scalar_type() || a.sizes() != cpu.sizes())
    return ::testing::AssertionFailure() << "dtype/shape " << a.scalar_type() << a.sizes() << " vs "
                                         << cpu.scalar_type() << cpu.sizes();
  if (a.numel() == 0) return ::testing::AssertionSuccess();
  if (!at::isFloatingType(cpu.scalar_type())) {
    if (at::equal(a, cpu)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "values differ:\n" << a << "\nLibTorch:\n" << cpu;
  }
  at::Tensor x = a.to(at::kDouble), y = cpu.to(at::kDouble);
  if (!at::equal(x.isnan(), y.isnan())) return ::testing::AssertionFailure() << "NaN at other places: " << x;
  at::Tensor inf = y.isinf();
  if (!at::equal(x.isinf(), inf) || !at::equal(x.masked_select(inf), y.masked_select(inf)))
    return ::testing::AssertionFailure() << "infinities differ: " << x << " vs " << y;
  at::Tensor finite = y.isfinite();
  x = x.masked_select(finite), y = y.masked_select(finite);
  if (y.numel() == 0) return ::testing::AssertionSuccess();
  const double scale = std::max(1.0, y.abs().max().item<double>());
  const double diff = (x - y).abs().max().item<double>();
  if (diff > tol * scale) return ::testing::AssertionFailure() << "max difference " << diff << " over " << tol * scale;
  if (tol == kExact && !at::equal(x.signbit(), y.signbit()))
    return ::testing::AssertionFailure() << "signs of zero differ";
  return ::testing::AssertionSuccess();
}

enum class Layout { kContiguous, kTransposed, kOffset };
const char* to_string(Layout l) {
  return l == Layout::kContiguous ? "contiguous" : l == Layout::kTransposed ? "transposed" : "at an offset";
}

// `t` (CPU) laid out as `layout` on `device`, the same values: transposed
// storage read through a transpose, or a narrow of a larger storage.
at::Tensor laid_out(const at::Tensor& t, Layout layout, c10::Device device) {
  if (layout == Layout::kTransposed && t.dim() >= 2)
    return t.transpose(-1, -2).contiguous().to(device).transpose(-1, -2);
  if (layout == Layout::kOffset && t.dim() >= 1 && t.size(0) > 0)
    return at::cat({t.narrow(0, 0, 1), t}).to(device).narrow(0, 1, t.size(0));
  return t.to(device);
}

std::string fallback_names(const strata::xla::Metrics& m) {
  std::string out;
  for (const auto& [op, n] : m.fallbacks) out += (out.empty() ? "" : ", ") + op + " x" + std::to_string(n);
  return out;
}

struct Tally {
  int compared = 0;
  std::set<const Gap*> gaps_seen;  ///< known gaps that fell back
  int64_t compiles = 0;
  double compile_seconds = 0, execute_seconds = 0;
  std::set<std::string> fallbacks;  ///< of ops sampled while not lowered (full runs)
};

/// One way to call a sample: its inputs' dtype and layout, edge values
/// among them, gradients through it.
struct Variant {
  const Sample* sample;
  c10::ScalarType dtype;
  Layout layout;
  bool edges, grad;
  uint64_t seed;
};

std::string describe(const std::string& op, const Variant& v) {
  return op + " [" + v.sample->what + ", " + c10::toString(v.dtype) + ", " + to_string(v.layout) +
         (v.edges ? ", edge values" : "") + (v.grad ? ", gradients" : "") + ", seed " + std::to_string(v.seed) + "]";
}

/// The known gap (Note [Known gaps]) that covers `v`, if any.
const Gap* known_gap(const std::string& op, const Variant& v) {
  const std::vector<std::string> tags = {v.layout == Layout::kTransposed ? "transposed" : "",
                                         v.layout == Layout::kOffset ? "offset" : "",
                                         v.dtype == at::kBFloat16 ? "bf16" : "",
                                         v.dtype == at::kHalf ? "f16" : "",
                                         v.edges ? "edge values" : "",
                                         v.grad ? "gradients" : "",
                                         v.sample->what.find("empty") != std::string::npos ? "empty" : ""};
  const Gap* gap = nullptr;
  for (const Gap& g : kKnownGaps)
    if (op == g.op && std::find(tags.begin(), tags.end(), g.variant) != tags.end()) gap = &g;
  return gap;
}

/// A variant called on both devices (and its backward taken), not yet
/// compared: the xla side is pending until the step is marked.
struct Called {
  std::string what;
  const Variant* variant;
  Tensors cpu, xla, want, got;
};

Called call_variant(const std::string& op, const Variant& v, c10::Device dev) {
  Called c{describe(op, v), &v};
  const Sample& sample = *v.sample;
  auto gen = at::detail::createCPUGenerator(v.seed);
  for (const auto& shape : sample.shapes) {
    at::Tensor t = at::randn(shape, gen, at::kFloat);
    if (sample.domain) t = sample.domain(t);
    if (v.edges && t.numel() >= 4) {
      auto flat = t.view({-1});
      flat[0] = std::numeric_limits<float>::quiet_NaN();
      flat[1] = std::numeric_limits<float>::infinity();
      flat[2] = -std::numeric_limits<float>::infinity();
      flat[3] = -0.0f;
    }
    t = t.to(v.dtype);
    c.cpu.push_back(laid_out(t, v.layout, c10::kCPU));
    c.xla.push_back(laid_out(t, v.layout, dev));
  }
  if (v.grad) {
    for (auto& t : c.cpu) t = t.detach().requires_grad_();
    for (auto& t : c.xla) t = t.detach().requires_grad_();
  }
  c.want = sample.call(c.cpu);
  c.got = sample.call(c.xla);
  if (v.grad) {
    // A weighted sum of the outputs, so every output element's gradient
    // differs.
    Tensors cpu_terms, xla_terms;
    for (size_t o = 0; o < c.want.size(); ++o) {
      if (!c.want[o].requires_grad()) continue;
      at::Tensor w = at::randn(c.want[o].sizes(), gen, at::kFloat).to(c.want[o].scalar_type());
      cpu_terms.push_back((c.want[o] * w).sum());
      xla_terms.push_back((c.got[o] * w.to(dev)).sum());
    }
    if (!cpu_terms.empty()) {
      at::stack(cpu_terms).sum().backward();
      at::stack(xla_terms).sum().backward();
    }
  }
  return c;
}

/// Compares a called variant's outputs and gradients (after the step ran).
void compare(const Called& c, Tally& run) {
  SCOPED_TRACE(c.what);
  const Variant& v = *c.variant;
  const double tol = v.dtype == at::kBFloat16 ? std::max(v.sample->tol, kBf16)
                     : v.dtype == at::kHalf   ? std::max(v.sample->tol, kF16)
                                              : v.sample->tol;
  ASSERT_EQ(c.got.size(), c.want.size());
  for (size_t o = 0; o < c.want.size(); ++o) EXPECT_TRUE(same(c.got[o], c.want[o], tol)) << "output " << o;
  if (v.grad) {
    for (size_t i = 0; i < c.cpu.size(); ++i) {
      if (!c.cpu[i].grad().defined()) continue;
      ASSERT_TRUE(c.xla[i].grad().defined()) << "input " << i << " has no gradient on xla";
      EXPECT_TRUE(same(c.xla[i].grad(), c.cpu[i].grad(), std::max(tol, kSum))) << "gradient of input " << i;
    }
  }
  ++run.compared;
}

void tally(Tally& run, const strata::xla::Metrics& m) {
  run.compiles += m.compiles;
  run.compile_seconds += m.compile_seconds;
  run.execute_seconds += m.execute_seconds;
}

/// `variants` of `op` recorded into one step and run as one program, then
/// compared. Returns false, comparing nothing, when a call threw or the
/// step fell back without `may_fall_back`: the caller then runs them one
/// by one to say which.
bool run_together(const std::string& op, const std::vector<Variant>& variants, bool may_fall_back, c10::Device dev,
                  Tally& run) {
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  std::vector<Called> called;
  try {
    for (const Variant& v : variants) called.push_back(call_variant(op, v, dev));
    strata::xla::mark_step();
  } catch (const std::exception&) {
    strata::xla::mark_step();
    return false;
  }
  const auto m = strata::xla::metrics();
  tally(run, m);
  if (!m.fallbacks.empty() && !may_fall_back) return false;
  if (!m.fallbacks.empty()) std::printf("known gaps of %s: fell back on %s\n", op.c_str(), fallback_names(m).c_str());
  for (const Called& c : called) compare(c, run);
  return true;
}

/// One variant in a step of its own: forward (and backward where asked)
/// on both devices, compared. `lowered`: no fallback allowed but a known
/// gap's.
void run_alone(const std::string& op, const Variant& v, bool lowered, c10::Device dev, Tally& run) {
  const std::string what = describe(op, v);
  SCOPED_TRACE(what);
  try {
    strata::xla::mark_step();
    strata::xla::reset_metrics();
    Called c = call_variant(op, v, dev);
    strata::xla::mark_step();
    const auto m = strata::xla::metrics();
    tally(run, m);
    const Gap* gap = known_gap(op, v);
    if (lowered && gap != nullptr && !m.fallbacks.empty()) {
      run.gaps_seen.insert(gap);
      std::printf("known gap, %s: fell back on %s\n", what.c_str(), fallback_names(m).c_str());
    } else if (lowered) {
      EXPECT_TRUE(m.fallbacks.empty()) << "fell back to the CPU: " << fallback_names(m);
    } else {
      for (const auto& [name, n] : m.fallbacks) run.fallbacks.insert(name);
    }
    compare(c, run);
  } catch (const std::exception& e) {
    // A crash of the device is a failure of this variant only: the rest run.
    std::string message = e.what();
    ADD_FAILURE() << "threw: " << message.substr(0, message.find('\n'));
    strata::xla::mark_step();
  }
}

bool full_run() {
  const char* mode = std::getenv("STRATA_XLA_CONFORMANCE");
  return mode != nullptr && std::string(mode) == "full";
}

/// The variants of `sample` a run takes. The CI-sized run: bf16, edge
/// values and gradients contiguous only, the layouts in f32.
std::vector<Variant> variants_of(const Sample& sample, const std::vector<uint64_t>& seeds) {
  std::vector<Variant> out;
  for (uint64_t seed : seeds) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      if (dtype != at::kFloat && !sample.bf16) continue;
      for (Layout layout : {Layout::kContiguous, Layout::kTransposed, Layout::kOffset}) {
        if (layout != Layout::kContiguous && !sample.strided) continue;
        const bool all = full_run() || layout == Layout::kContiguous;
        if (dtype != at::kFloat && !all) continue;
        out.push_back({&sample, dtype, layout, false, false, seed});
        if (sample.edges && dtype == at::kFloat && all) out.push_back({&sample, dtype, layout, true, false, seed});
        if (sample.grad && dtype == at::kFloat && layout != Layout::kOffset && all)
          out.push_back({&sample, dtype, layout, false, true, seed});
      }
    }
  }
  return out;
}

// Note [One program per op]
// Compiling a program takes about 0.1 s on the CPU plugin, so the CI-sized
// run records every variant of a lowered op that no known gap covers into
// one step, and runs them one by one (to say which fell back or threw)
// only when that step did not stay on the device; the variants known gaps
// cover make a second step, which may fall back. The full run takes every
// variant alone, so each known gap is checked to still fall back.
void run_op(const std::string& op, const std::vector<Sample>& op_samples, const std::vector<uint64_t>& seeds,
            bool lowered, c10::Device dev, Tally& run) {
  std::vector<Variant> together, gaps, alone;
  for (const Sample& sample : op_samples)
    for (const Variant& v : variants_of(sample, seeds)) {
      if (!lowered || full_run())
        alone.push_back(v);
      else
        (known_gap(op, v) == nullptr ? together : gaps).push_back(v);
    }
  if (!together.empty() && !run_together(op, together, /*may_fall_back=*/false, dev, run))
    alone.insert(alone.end(), together.begin(), together.end());
  if (!gaps.empty() && !run_together(op, gaps, /*may_fall_back=*/true, dev, run))
    alone.insert(alone.end(), gaps.begin(), gaps.end());
  for (const Variant& v : alone) run_alone(op, v, lowered, dev, run);
}

class CoreOpConformanceTest : public strata::testing::XlaDeviceFixture {};

TEST_F(CoreOpConformanceTest, EveryLoweredCoreOpHasASample) {
  const auto table = samples();
  std::vector<std::string> missing;
  // Lowered ops compared with LibTorch's CPU kernels, gradients included,
  // in a test of their own rather than here.
  static const std::set<std::string> kTestedElsewhere = {
      "aten::native_group_norm_backward",      // norm_test.cpp
      "aten::_adaptive_avg_pool2d_backward",   // conv_pool_test.cpp, from here on
      "aten::_adaptive_avg_pool3d",           "aten::avg_pool2d_backward",
      "aten::avg_pool3d",                      "aten::max_pool2d_with_indices_backward",
      "aten::max_pool3d_with_indices",         "aten::reflection_pad1d",
      "aten::reflection_pad2d",                "aten::reflection_pad3d",
      "aten::replication_pad2d",               "aten::replication_pad3d"};
  for (const auto& op : strata::testing::classify_core_ops())
    if (op.kind == strata::testing::CoreOpClass::kLowered && !table.count(op.name) && !kTestedElsewhere.count(op.name))
      missing.push_back(op.name);
  std::string names;
  for (const auto& n : missing) names += " " + n;
  EXPECT_TRUE(missing.empty()) << "lowered core ops without a sample in tests/xla_device/conformance_test.cpp:"
                               << names;
}

TEST_F(CoreOpConformanceTest, LoweredCoreOpsMatchLibTorchsCpuKernels) {
  const auto table = samples();
  const std::vector<uint64_t> seeds = full_run() ? std::vector<uint64_t>{1, 2, 3} : std::vector<uint64_t>{1};
  Tally run;
  int lowered = 0;
  // Every program the samples make also runs on JAX, as on the plugin.
  const auto replay = strata::testing::replay_on_jax("conformance", [&] {
    for (const auto& op : strata::testing::classify_core_ops()) {
      const bool is_lowered = op.kind == strata::testing::CoreOpClass::kLowered;
      auto it = table.find(op.name);
      if (it == table.end() || (!is_lowered && !full_run())) continue;
      lowered += is_lowered;
      run_op(op.name, it->second, seeds, is_lowered, device_, run);
    }
  });
  std::printf("%d lowered core ops, %d comparisons; %lld programs compiled in %.1f s, run in %.1f s\n", lowered,
              run.compared, static_cast<long long>(run.compiles), run.compile_seconds, run.execute_seconds);
  if (replay.skipped.empty()) {
    std::printf("%zu distinct programs replayed on jax %s\n", replay.cases.size(), replay.jax.c_str());
    EXPECT_GT(replay.cases.size(), 0u);
    strata::testing::expect_all_agree(replay);
  } else {
    std::printf("not replayed on jax: %s\n", replay.skipped.c_str());
  }
  for (const Gap& g : kKnownGaps)
    if (full_run())
      EXPECT_TRUE(run.gaps_seen.count(&g))
        << "the known gap " << g.op << " (" << g.variant << ") no longer falls back: delete it from kKnownGaps";
  if (full_run()) {
    std::string names;
    for (const auto& n : run.fallbacks) names += " " + n;
    std::printf("samples of ops not lowered fell back on:%s\n", names.c_str());
  }
  EXPECT_GT(lowered, 0);
}

}  // namespace
