// The lowered ops the example GPT reaches (kernels_nn.cpp, kernels_shape.cpp)
// against LibTorch's CPU kernels: shapes, broadcasts, dims, dtypes and the
// options each op takes, recorded into one step with no fallback. Inputs
// include strided views (splits, narrows, transposes, expands), read as
// slices of their storage. Skips, saying so, without the CPU PJRT plugin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "strata/core/error.h"
#include "strata/xla_device/device.h"

namespace {

using strata::xla::metrics;

// |a - b| <= tol * max(1, max|b|) elementwise, same dtype and shape.
::testing::AssertionResult close(const at::Tensor& xla, const at::Tensor& cpu, double tol) {
  at::Tensor a = xla.cpu();
  if (a.scalar_type() != cpu.scalar_type() || a.sizes() != cpu.sizes())
    return ::testing::AssertionFailure() << "dtype/shape " << a.scalar_type() << a.sizes() << " vs "
                                         << cpu.scalar_type() << cpu.sizes();
  at::Tensor x = a.to(torch::kDouble), y = cpu.to(torch::kDouble);
  // -inf where LibTorch has -inf (masked_fill): compare the rest.
  at::Tensor same_inf = (x == y) & y.isinf();
  x = x.masked_fill(same_inf, 0), y = y.masked_fill(same_inf, 0);
  const double scale = std::max(1.0, y.abs().max().item<double>());
  const double diff = (x - y).abs().max().item<double>();
  if (diff <= tol * scale) return ::testing::AssertionSuccess() << diff;
  return ::testing::AssertionFailure() << "max difference " << diff << " over " << tol * scale;
}

struct Case {
  const char* what;
  at::Tensor xla, cpu;
  double tol;
};

// Note [Tolerances of the lowered nn ops]
// Exact ops (indexing, cat, triu, arange, masked_fill, clamp) must match to
// the bit. Sums (bmm, norm, softmax, layer norm, nll_loss) are ordered by
// XLA's CPU kernels their own way: 1e-6 of the largest value. exp, log,
// tanh and erf are XLA's polynomial approximations, not libm's (LibTorch's
// vectorised CPU kernels use Sleef): 2e-6. bf16 results differ by one bf16
// rounding where the f32 values straddle it: 1e-2.
constexpr double kExact = 0, kSum = 1e-6, kTranscendental = 2e-6, kBf16 = 1e-2;

TEST(XlaNnOpsTest, LoweredNnOpsMatchTheCpu) {
  try {
    strata::xla::find_plugin();
  } catch (const strata::ConfigError& e) {
    GTEST_SKIP() << "no PJRT plugin for the xla device: " << e.what();
  }
  strata::xla::init();
  const c10::Device dev = strata::xla::device(0);
  auto on = [&](const at::Tensor& t) { return t.to(dev); };
  torch::manual_seed(7);
  const at::Tensor a3 = torch::randn({3, 4, 5}), b3 = torch::randn({3, 5, 2}), c3 = torch::randn({3, 2, 5});
  const at::Tensor m = torch::randn({6, 8}), g = torch::randn({6, 8}), n = torch::randn({2, 6, 8});
  const at::Tensor wide = torch::randn({4, 12});  // split into three [4, 4] views
  const at::Tensor ints = torch::arange(12, torch::kInt).view({3, 4});
  const at::Tensor mask = torch::rand({6, 8}) > 0.5, row_mask = torch::rand({8}) > 0.5;
  const at::Tensor table = torch::randn({10, 4}), idx = torch::tensor({3, 0, 2, 3, 3}, torch::kLong);
  const at::Tensor idx2 = torch::tensor({{1, 2, 1}, {0, 2, 1}}, torch::kLong), eg = torch::randn({2, 3, 4});
  const at::Tensor lw = torch::randn({8}), lb = torch::randn({8});
  const at::Tensor logits = torch::randn({5, 7}), target = torch::tensor({1, 6, 0, 3, 3}, torch::kLong);
  const at::Tensor cw = torch::rand({7}) + 0.5;
  const at::Tensor xa3 = on(a3), xb3 = on(b3), xc3 = on(c3), xm = on(m), xg = on(g), xn = on(n), xwide = on(wide),
                   xints = on(ints), xmask = on(mask), xrow_mask = on(row_mask), xtable = on(table), xidx = on(idx),
                   xidx2 = on(idx2), xeg = on(eg), xlw = on(lw), xlb = on(lb), xlogits = on(logits),
                   xtarget = on(target), xcw = on(cw);
  const auto pieces = wide.split(4, 1);
  const auto xpieces = xwide.split(4, 1);
  const double ninf = -std::numeric_limits<double>::infinity();
  const at::Tensor lm = m.to(torch::kBFloat16), xlm = xm.to(torch::kBFloat16);
  const at::Tensor causal = m.masked_fill(torch::ones({6, 8}, torch::kBool).triu(1), ninf), xcausal = on(causal);
  strata::xla::mark_step();
  strata::xla::reset_metrics();

  const auto ln = at::native_layer_norm(m, {8}, lw, lb, 1e-5);
  const auto xln = at::native_layer_norm(xm, {8}, xlw, xlb, 1e-5);
  const auto ln3 = at::native_layer_norm(n, {6, 8}, {}, {}, 1e-5);
  const auto xln3 = at::native_layer_norm(xn, {6, 8}, {}, {}, 1e-5);
  const auto lnb = at::native_layer_norm_backward(g, m, {8}, std::get<1>(ln), std::get<2>(ln), lw, lb,
                                                  {true, true, true});
  const auto xlnb = at::native_layer_norm_backward(xg, xm, {8}, std::get<1>(xln), std::get<2>(xln), xlw, xlb,
                                                   {true, true, true});
  const auto nll = at::nll_loss_forward(logits.log_softmax(1), target, {}, at::Reduction::Mean, -100);
  const auto xnll = at::nll_loss_forward(xlogits.log_softmax(1), xtarget, {}, at::Reduction::Mean, -100);
  const auto nllw = at::nll_loss_forward(logits, target, cw, at::Reduction::Mean, 3);
  const auto xnllw = at::nll_loss_forward(xlogits, xtarget, xcw, at::Reduction::Mean, 3);
  const at::Tensor one = torch::tensor(0.7f), xone = on(one);
  at::Tensor filled = m.clone(), xfilled = xm.clone();
  filled.masked_fill_(mask, ninf);
  xfilled.masked_fill_(xmask, ninf);
  at::Tensor filled2 = m.clone(), xfilled2 = xm.clone();
  filled2.masked_fill_(row_mask, 2.5);
  xfilled2.masked_fill_(xrow_mask, 2.5);

  std::vector<Case> cases = {
      {"bmm", xa3.bmm(xb3), a3.bmm(b3), kSum},
      {"bmm, transposed operand", xa3.bmm(xc3.transpose(1, 2)), a3.bmm(c3.transpose(1, 2)), kSum},
      {"matmul of 4-d heads", at::matmul(xn.view({2, 2, 3, 8}), xn.view({2, 2, 3, 8}).transpose(-2, -1)),
       at::matmul(n.view({2, 2, 3, 8}), n.view({2, 2, 3, 8}).transpose(-2, -1)), kSum},
      {"cat dim 0", torch::cat({xm, xg}), torch::cat({m, g}), kExact},
      {"cat dim -1 of split views", torch::cat({xpieces[2], xpieces[0]}, -1), torch::cat({pieces[2], pieces[0]}, -1),
       kExact},
      {"cat promotes int with float", torch::cat({xints.to(torch::kFloat), xints}, 0),
       torch::cat({ints.to(torch::kFloat), ints}, 0), kExact},
      {"stack", torch::stack({xm, xg}), torch::stack({m, g}), kExact},
      {"split view + add", xpieces[1] + xpieces[2], pieces[1] + pieces[2], kExact},
      {"narrow view * 2", xm.narrow(0, 2, 3) * 2, m.narrow(0, 2, 3) * 2, kExact},
      {"strided slice view", xm.slice(1, 1, 8, 2) + 1, m.slice(1, 1, 8, 2) + 1, kExact},
      {"selected row and element", xm[2] * xm[4][3], m[2] * m[4][3], kExact},
      {"expand view", xlw.expand({6, 8}).contiguous(), lw.expand({6, 8}).contiguous(), kExact},
      {"triu", xm.triu(), m.triu(), kExact},
      {"triu 1 of bool", torch::ones({5, 5}, torch::TensorOptions(dev).dtype(torch::kBool)).triu(1),
       torch::ones({5, 5}, torch::kBool).triu(1), kExact},
      {"triu -1 of 3-d", xa3.triu(-1), a3.triu(-1), kExact},
      {"arange", torch::arange(7, torch::TensorOptions(dev).dtype(torch::kLong)), torch::arange(7, torch::kLong),
       kExact},
      {"arange start step", torch::arange(2, 11, 3, torch::TensorOptions(dev).dtype(torch::kInt)),
       torch::arange(2, 11, 3, torch::kInt), kExact},
      {"masked_fill_ -inf", xfilled, filled, kExact},
      {"masked_fill_ broadcast mask", xfilled2, filled2, kExact},
      {"index_select dim 0", xtable.index_select(0, xidx), table.index_select(0, idx), kExact},
      {"index_select dim 1 of a narrowed index", xtable.index_select(1, xidx.narrow(0, 1, 2)),
       table.index_select(1, idx.narrow(0, 1, 2)), kExact},
      {"embedding", torch::embedding(xtable, xidx2), torch::embedding(table, idx2), kExact},
      {"embedding_dense_backward, repeated indices",
       at::embedding_dense_backward(xeg, xidx2, 5, -1, false), at::embedding_dense_backward(eg, idx2, 5, -1, false),
       kSum},
      {"embedding_dense_backward, padding_idx", at::embedding_dense_backward(xeg, xidx2, 5, 1, false),
       at::embedding_dense_backward(eg, idx2, 5, 1, false), kSum},
      {"softmax -1", xm.softmax(-1), m.softmax(-1), kTranscendental},
      {"softmax 0", xm.softmax(0), m.softmax(0), kTranscendental},
      {"softmax of a causal mask's -inf", xcausal.softmax(-1), causal.softmax(-1), kTranscendental},
      {"softmax bf16", xlm.softmax(-1), lm.softmax(-1), kBf16},
      {"log_softmax", xm.log_softmax(1), m.log_softmax(1), kTranscendental},
      {"_softmax_backward_data", at::_softmax_backward_data(xg, xm.softmax(1), 1, torch::kFloat),
       at::_softmax_backward_data(g, m.softmax(1), 1, torch::kFloat), kTranscendental},
      {"_log_softmax_backward_data", at::_log_softmax_backward_data(xg, xm.log_softmax(0), 0, torch::kFloat),
       at::_log_softmax_backward_data(g, m.log_softmax(0), 0, torch::kFloat), kTranscendental},
      {"gelu", torch::gelu(xm), torch::gelu(m), kTranscendental},
      {"gelu tanh", torch::gelu(xm, "tanh"), torch::gelu(m, "tanh"), kTranscendental},
      {"gelu bf16", torch::gelu(xlm), torch::gelu(lm), kBf16},
      {"gelu_backward", at::gelu_backward(xg, xm), at::gelu_backward(g, m), kTranscendental},
      {"gelu_backward tanh", at::gelu_backward(xg, xm, "tanh"), at::gelu_backward(g, m, "tanh"), kTranscendental},
      {"layer_norm out", std::get<0>(xln), std::get<0>(ln), kTranscendental},
      {"layer_norm mean", std::get<1>(xln), std::get<1>(ln), kSum},
      {"layer_norm rstd", std::get<2>(xln), std::get<2>(ln), kTranscendental},
      {"layer_norm over 2 dims, no affine", std::get<0>(xln3), std::get<0>(ln3), kTranscendental},
      {"layer_norm_backward input", std::get<0>(xlnb), std::get<0>(lnb), kTranscendental},
      {"layer_norm_backward weight", std::get<1>(xlnb), std::get<1>(lnb), kTranscendental},
      {"layer_norm_backward bias", std::get<2>(xlnb), std::get<2>(lnb), kSum},
      {"nll_loss mean", std::get<0>(xnll), std::get<0>(nll), kTranscendental},
      {"nll_loss total_weight", std::get<1>(xnll), std::get<1>(nll), kExact},
      {"nll_loss weight, ignore_index", std::get<0>(xnllw), std::get<0>(nllw), kSum},
      {"nll_loss sum", at::nll_loss(xlogits, xtarget, {}, at::Reduction::Sum),
       at::nll_loss(logits, target, {}, at::Reduction::Sum), kSum},
      {"nll_loss none", at::nll_loss(xlogits, xtarget, {}, at::Reduction::None),
       at::nll_loss(logits, target, {}, at::Reduction::None), kExact},
      {"nll_loss_backward mean", at::nll_loss_backward(xone, xlogits, xtarget, {}, at::Reduction::Mean, -100,
                                                        std::get<1>(xnll)),
       at::nll_loss_backward(one, logits, target, {}, at::Reduction::Mean, -100, std::get<1>(nll)), kSum},
      {"nll_loss_backward weight, ignore_index",
       at::nll_loss_backward(xone, xlogits, xtarget, xcw, at::Reduction::Mean, 3, std::get<1>(xnllw)),
       at::nll_loss_backward(one, logits, target, cw, at::Reduction::Mean, 3, std::get<1>(nllw)), kSum},
      {"cross_entropy", torch::nn::functional::cross_entropy(xlogits, xtarget),
       torch::nn::functional::cross_entropy(logits, target), kTranscendental},
      {"norm", xm.norm(), m.norm(), kSum},
      {"norm dim keepdim", xm.norm(2, {1}, true), m.norm(2, {1}, true), kSum},
      {"norm inf", xm.norm(std::numeric_limits<double>::infinity()),
       m.norm(std::numeric_limits<double>::infinity()), kExact},
      {"pow 2", xm.pow(2), m.pow(2), kExact},
      // XLA's CPU f64 sqrt may differ from libm's by an ulp.
      {"pow 0.5 of f64", xg.abs().to(torch::kDouble).pow(0.5), g.abs().to(torch::kDouble).pow(0.5), kSum},
      {"abs", xg.abs(), g.abs(), kExact},
      {"pow -1", xg.pow(-1), g.pow(-1), kExact},
      {"pow 1.5", xg.abs().pow(1.5), g.abs().pow(1.5), kTranscendental},
      {"pow 3 of int", xints.pow(3), ints.pow(3), kExact},
      {"clamp", xm.clamp(-0.5, 0.5), m.clamp(-0.5, 0.5), kExact},
      {"clamp_max", xm.clamp_max(0.25), m.clamp_max(0.25), kExact},
      {"clamp_min of int", xints.clamp_min(5), ints.clamp_min(5), kExact},
  };
  const auto recorded = metrics();
  for (const auto& [op, count] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << count << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
}

// bf16 inputs against LibTorch's CPU kernels on the same bf16 values (Note
// [bf16 computes in f32] in src/xla_device/lowering.h): element-wise ops,
// Scalars, casts, matrix products, reductions, softmax, layer norm (its
// statistics in the CPU's dtype), gelu, mse_loss and the AdamW update,
// with no fallback. Element-wise results match to the bit (each is one
// f32 op rounded once, on both sides); results built on a sum or on
// XLA's exp/erf may differ by one bf16 ulp where the two f32 values fall
// on either side of a rounding boundary: one ulp of the largest value,
// which is at most 2^-7 of it (kBf16Ulp); the differing elements are
// counted and printed. Layer norm backward's bf16 weight and bias
// gradients differ by one ulp on more elements than the order of a sum
// explains (f32 sums of 6 bf16 rows are exact): LibTorch's bf16 kernel
// rounds an intermediate there that the lowering does not yet (the
// bf16-mixed GPT does not reach it: its layer norms run in f32).
TEST(XlaNnOpsTest, LoweredOpsOnBf16MatchTheCpu) {
  try {
    strata::xla::find_plugin();
  } catch (const strata::ConfigError& e) {
    GTEST_SKIP() << "no PJRT plugin for the xla device: " << e.what();
  }
  strata::xla::init();
  const c10::Device dev = strata::xla::device(0);
  auto on = [&](const at::Tensor& t) { return t.to(dev); };
  auto bf = [](const at::Tensor& t) { return t.to(torch::kBFloat16); };
  torch::manual_seed(17);
  const at::Tensor a = bf(torch::randn({6, 8})), b = bf(torch::randn({8})), c = bf(torch::rand({6, 8}) + 0.5);
  const at::Tensor w = bf(torch::randn({8, 5})), bias = bf(torch::randn({5})), h = bf(torch::randn({2, 6, 8}));
  const at::Tensor lw = torch::randn({8}), lb = torch::randn({8}), g = bf(torch::randn({6, 8}));
  const at::Tensor xa = on(a), xb = on(b), xc = on(c), xw = on(w), xbias = on(bias), xh = on(h), xlw = on(lw),
                   xlb = on(lb), xg = on(g);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  constexpr double kBf16Ulp = 1.0 / 128;
  const auto ln = at::native_layer_norm(a, {8}, lw, lb, 1e-5);
  const auto xln = at::native_layer_norm(xa, {8}, xlw, xlb, 1e-5);
  const auto lnp = at::native_layer_norm(a, {8}, bf(lw), bf(lb), 1e-5);
  const auto xlnp = at::native_layer_norm(xa, {8}, on(bf(lw)), on(bf(lb)), 1e-5);
  const auto lnb = at::native_layer_norm_backward(g, a, {8}, std::get<1>(lnp), std::get<2>(lnp), bf(lw), bf(lb),
                                                  {true, true, true});
  const auto xlnb = at::native_layer_norm_backward(xg, xa, {8}, std::get<1>(xlnp), std::get<2>(xlnp), on(bf(lw)),
                                                   on(bf(lb)), {true, true, true});
  // AdamW's update of a bf16 parameter (torch/csrc/api/src/optim/adamw.cpp).
  auto adamw = [](at::Tensor p, at::Tensor m, at::Tensor v, const at::Tensor& grad) {
    p.mul_(1 - 1e-2 * 0.1);
    m.mul_(0.9).add_(grad, 1 - 0.9);
    v.mul_(0.999).addcmul_(grad, grad, 1 - 0.999);
    at::Tensor denom = (v.sqrt() / std::sqrt(1 - 0.999)).add_(1e-8);
    p.addcdiv_(m, denom, -1e-2 / (1 - 0.9));
    return p;
  };
  std::vector<Case> cases = {
      // LibTorch's vectorised loop computes self + alpha * other in f32 with
      // alpha in bf16; its scalar loop for the tail elements rounds the
      // product to bf16 first: those may differ by one ulp.
      {"add, alpha rounded to bf16", torch::add(xa, xb, 0.1), torch::add(a, b, 0.1), kBf16Ulp},
      {"sub", xa - xc, a - c, kExact},
      {"mul by a Scalar kept in f32", xa * 0.1, a * 0.1, kExact},
      {"mul", xa * xc, a * c, kExact},
      {"div", xa / xc, a / c, kExact},
      {"div by a Scalar", xa / 3.0, a / 3.0, kBf16Ulp},
      {"addcmul", torch::addcmul(xa, xb, xc, 0.3), torch::addcmul(a, b, c, 0.3), kExact},
      {"addcdiv", torch::addcdiv(xa, xb, xc, -0.7), torch::addcdiv(a, b, c, -0.7), kExact},
      {"sqrt", torch::sqrt(xc), torch::sqrt(c), kExact},
      {"relu", torch::relu(xa), torch::relu(a), kExact},
      {"cast to f32", xa.to(torch::kFloat), a.to(torch::kFloat), kExact},
      {"cast from f32", on(lw).to(torch::kBFloat16), lw.to(torch::kBFloat16), kExact},
      {"cast of a transposed view", xw.t().to(torch::kFloat), w.t().to(torch::kFloat), kExact},
      {"mm", xa.mm(xw), a.mm(w), kBf16Ulp},
      {"addmm (linear)", torch::addmm(xbias, xa, xw), torch::addmm(bias, a, w), kBf16Ulp},
      {"bmm", xh.bmm(xh.transpose(1, 2)), h.bmm(h.transpose(1, 2)), kBf16Ulp},
      {"sum dim 0", xa.sum(0), a.sum(0), kBf16Ulp},
      {"sum all", xa.sum(), a.sum(), kBf16Ulp},
      {"mean", xa.mean(1), a.mean(1), kBf16Ulp},
      {"norm", xa.norm(), a.norm(), kBf16Ulp},
      {"softmax", xa.softmax(-1), a.softmax(-1), kBf16Ulp},
      {"log_softmax", xa.log_softmax(-1), a.log_softmax(-1), kBf16Ulp},
      {"_softmax_backward_data", at::_softmax_backward_data(xg, xa.softmax(1), 1, torch::kBFloat16),
       at::_softmax_backward_data(g, a.softmax(1), 1, torch::kBFloat16), kBf16Ulp},
      {"gelu", torch::gelu(xa), torch::gelu(a), kBf16Ulp},
      {"gelu_backward", at::gelu_backward(xg, xa), at::gelu_backward(g, a), kBf16Ulp},
      {"layer_norm, f32 affine", std::get<0>(xln), std::get<0>(ln), kBf16Ulp},
      {"layer_norm, f32 affine: f32 mean", std::get<1>(xln), std::get<1>(ln), kSum},
      {"layer_norm, bf16 affine", std::get<0>(xlnp), std::get<0>(lnp), kBf16Ulp},
      {"layer_norm, bf16 affine: bf16 rstd", std::get<2>(xlnp), std::get<2>(lnp), kBf16Ulp},
      {"layer_norm_backward input", std::get<0>(xlnb), std::get<0>(lnb), kBf16Ulp},
      {"layer_norm_backward weight", std::get<1>(xlnb), std::get<1>(lnb), kBf16Ulp},
      {"layer_norm_backward bias", std::get<2>(xlnb), std::get<2>(lnb), kBf16Ulp},
      {"mse_loss", torch::mse_loss(xa, xc), torch::mse_loss(a, c), kBf16Ulp},
      {"mse_loss_backward", at::mse_loss_backward(on(bf(torch::tensor(0.5f))), xa, xc, at::Reduction::Mean),
       at::mse_loss_backward(bf(torch::tensor(0.5f)), a, c, at::Reduction::Mean), kExact},
      {"AdamW step", adamw(xa.clone(), xc.clone() * 0.1, xc.clone() * 0.01, xg),
       adamw(a.clone(), c.clone() * 0.1, c.clone() * 0.01, g), kBf16Ulp},
  };
  const auto recorded = metrics();
  for (const auto& [op, count] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << count << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) {
    EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
    const at::Tensor got = c.xla.cpu().to(torch::kDouble), want = c.cpu.to(torch::kDouble);
    std::printf("%-40s %s differing elements %lld of %lld, max difference %.3g\n", c.what,
                c10::toString(c.cpu.scalar_type()), static_cast<long long>((got != want).sum().item<int64_t>()),
                static_cast<long long>(want.numel()), (got - want).abs().max().item<double>());
  }
}

}  // namespace
