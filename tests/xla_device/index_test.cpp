// The lowered reductions with indices, gather, scatter_add and cumsum
// (src/xla_device/kernels_index.cpp), bernoulli_ and feature dropout
// (kernels_random.cpp), and scaled_dot_product_attention's math form,
// against LibTorch's CPU kernels with no fallback. Skips, saying so,
// without the CPU PJRT plugin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::xla::metrics;

class XlaIndexTest : public strata::testing::XlaDeviceFixture {};

// Same dtype and shape; equal where both are NaN; within tol elsewhere.
::testing::AssertionResult close(const at::Tensor& xla, const at::Tensor& cpu, double tol) {
  at::Tensor a = xla.cpu();
  if (a.scalar_type() != cpu.scalar_type() || a.sizes() != cpu.sizes())
    return ::testing::AssertionFailure() << "dtype/shape " << a.scalar_type() << a.sizes() << " vs "
                                         << cpu.scalar_type() << cpu.sizes();
  if (a.numel() == 0) return ::testing::AssertionSuccess() << "empty";
  at::Tensor x = a.to(torch::kDouble), y = cpu.to(torch::kDouble);
  if (!torch::equal(x.isnan(), y.isnan())) return ::testing::AssertionFailure() << "NaNs differ: " << a << cpu;
  x = x.nan_to_num(0), y = y.nan_to_num(0);
  const double scale = std::max(1.0, y.abs().max().item<double>());
  const double diff = (x - y).abs().max().item<double>();
  if (diff <= tol * scale) return ::testing::AssertionSuccess() << diff;
  return ::testing::AssertionFailure() << "max difference " << diff << " over " << tol * scale;
}

struct Case {
  std::string what;
  at::Tensor xla, cpu;
  double tol;
};

TEST_F(XlaIndexTest, ReductionsWithIndicesGatherScatterAndCumsumMatchTheCpu) {
  torch::manual_seed(61);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Ties (first index wins), a NaN (it wins, for max and min), ints.
  const at::Tensor a = torch::tensor({{1.0, 3.0, 3.0, -2.0}, {0.5, nan, 4.0, nan}, {-1.0, -1.0, 2.0, -0.0}});
  const at::Tensor i = torch::tensor({{3, -7, 3, 2}, {5, 5, -9, 0}}, at::kInt);
  const at::Tensor m = torch::randn({3, 5}), h = m.to(at::kBFloat16);
  const at::Tensor idx = torch::tensor({{0, 2, 2, 1, 0}, {1, 1, 0, 2, 2}}, at::kLong);
  const at::Tensor src = torch::randn({2, 5});
  const at::Tensor xa = on(a), xi = on(i), xm = on(m), xh = on(h), xidx = on(idx), xsrc = on(src);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  auto values = [](const std::tuple<at::Tensor, at::Tensor>& t) { return std::get<0>(t); };
  auto indices = [](const std::tuple<at::Tensor, at::Tensor>& t) { return std::get<1>(t); };
  std::vector<Case> cases = {
      {"max dim 1 values", values(xa.max(1)), values(a.max(1)), 0},
      {"max dim 1 indices", indices(xa.max(1)), indices(a.max(1)), 0},
      {"min dim 0 keepdim values", values(xa.min(0, true)), values(a.min(0, true)), 0},
      {"min dim 0 keepdim indices", indices(xa.min(0, true)), indices(a.min(0, true)), 0},
      {"max of ints", values(xi.max(-1)), values(i.max(-1)), 0},
      {"min of ints indices", indices(xi.min(1)), indices(i.min(1)), 0},
      {"max of a transposed bf16 view", values(xh.t().max(1)), values(h.t().max(1)), 0},
      {"argmax", xm.argmax(1), m.argmax(1), 0},
      {"argmax of all", xm.argmax(), m.argmax(), 0},
      {"argmax keepdim", xm.argmax(0, true), m.argmax(0, true), 0},
      {"argmin", xa.argmin(1), a.argmin(1), 0},
      {"max of all", xm.max(), m.max(), 0},
      {"max of all with a NaN", xa.max(), a.max(), 0},
      {"min of all ints", xi.min(), i.min(), 0},
      {"gather dim 0", xm.gather(0, xidx), m.gather(0, idx), 0},
      {"gather dim 1", xm.gather(1, xidx.narrow(1, 0, 3)), m.gather(1, idx.narrow(1, 0, 3)), 0},
      {"scatter_add dim 0, repeated indices", xm.scatter_add(0, xidx, xsrc), m.scatter_add(0, idx, src), 1e-6},
      {"scatter_add_ dim 1 of a smaller index", xm.clone().scatter_add_(1, xidx.narrow(1, 0, 2) * 2, xsrc),
       m.clone().scatter_add_(1, idx.narrow(1, 0, 2) * 2, src), 1e-6},
      {"cumsum dim 1", xm.cumsum(1), m.cumsum(1), 1e-6},
      {"cumsum dim 0 of ints", xi.cumsum(0), i.cumsum(0), 0},
      {"cumsum of a transposed view", xm.t().cumsum(1), m.t().cumsum(1), 1e-6},
      {"sort values", values(xm.sort(1)), values(m.sort(1)), 0},
      {"sort indices", indices(xm.sort(1)), indices(m.sort(1)), 0},
      {"sort descending with NaN and ties, stable", values(xa.sort(true, 1, true)), values(a.sort(true, 1, true)), 0},
      {"sort descending indices", indices(xa.sort(true, 1, true)), indices(a.sort(true, 1, true)), 0},
      {"sort ascending with NaN and ties indices", indices(xa.sort(true, 0, false)), indices(a.sort(true, 0, false)), 0},
      {"sort of ints", values(xi.sort(1)), values(i.sort(1)), 0},
      {"topk values", values(xm.topk(2, 1)), values(m.topk(2, 1)), 0},
      {"topk indices", indices(xm.topk(2, 1)), indices(m.topk(2, 1)), 0},
      {"topk smallest dim 0", values(xm.topk(2, 0, false)), values(m.topk(2, 0, false)), 0},
  };
  const auto recorded = metrics();
  for (const auto& [op, n] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
}

// Indexing by integer tensors (Note [Indexing by integer tensors] in
// kernels_index.cpp), scatter with replacement and flip: as the CPU, with
// no fallback, backwards included (index's backward is index_put_ with
// accumulate; the backward of max along a dim and of topk a scatter; of
// cumsum a flip).
TEST_F(XlaIndexTest, IndexingByTensorsIndexPutScatterAndFlipMatchTheCpu) {
  using at::indexing::Slice;
  torch::manual_seed(62);
  const at::Tensor m = torch::randn({4, 5}), t = torch::randn({2, 4, 3}), v = torch::randn({3, 5});
  const at::Tensor rows = torch::tensor({2, -1, 0}, at::kLong), cols = torch::tensor({4, 0, 1}, at::kLong);
  const at::Tensor pairs = torch::tensor({{0, 3}, {1, 1}}, at::kInt);
  const at::Tensor two = torch::tensor({0, 1, 0}, at::kLong), two_cols = torch::tensor({1, 0, 1}, at::kLong);  // (0, 1) twice
  const at::Tensor at_ = torch::tensor({{0, 4}, {3, 1}, {2, 0}}, at::kLong);
  const at::Tensor down = torch::tensor({{0, 3, 2}, {1, 2, 0}}, at::kLong);  // distinct in each column
  const at::Tensor xm = on(m), xt = on(t), xv = on(v), xrows = on(rows), xcols = on(cols), xpairs = on(pairs),
                   xat = on(at_), xdown = on(down),
                   xtwo = on(two), xtwo_cols = on(two_cols);
  at::Tensor gm = m.clone().requires_grad_(true), xgm = xm.clone().detach().requires_grad_(true);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  auto put = [](at::Tensor x, const at::Tensor& r, const at::Tensor& c, const at::Tensor& val, bool acc) {
    return x.index_put_({r, c}, val, acc);
  };
  // The backwards: of index (index_put_ accumulating, repeated rows), max
  // along a dim and topk (scatter), cumsum (flip).
  auto backwards = [](const at::Tensor& x, const at::Tensor& r) {
    at::Tensor loss = x.index({r}).square().sum() + std::get<0>(x.max(1)).sum() + std::get<0>(x.topk(2, 1)).sum() * 0.5 +
                      (x.cumsum(1) * x).sum();
    loss.backward();
    return x.grad();
  };
  std::vector<Case> cases = {
      {"rows", xm.index({xrows}), m.index({rows}), 0},
      {"rows and columns", xm.index({xrows, xcols}), m.index({rows, cols}), 0},
      {"broadcast int32 pairs", xm.index({xpairs, xcols.narrow(0, 0, 2)}), m.index({pairs, cols.narrow(0, 0, 2)}), 0},
      {"the middle dim", xt.index({Slice(), xrows.narrow(0, 0, 2)}), t.index({Slice(), rows.narrow(0, 0, 2)}), 0},
      {"of a transposed view", xm.t().index({xcols}), m.t().index({cols}), 0},
      {"index_put_ values", put(xm.clone(), xrows, xcols, xv.index({Slice(), 0}), false),
       put(m.clone(), rows, cols, v.index({Slice(), 0}), false), 0},
      {"index_put_ a scalar", xm.clone().index_put_({xrows}, at::scalar_tensor(2.5)),
       m.clone().index_put_({rows}, at::scalar_tensor(2.5)), 0},
      {"index_put_ rows", xm.clone().index_put_({xrows}, xv), m.clone().index_put_({rows}, v), 0},
      {"index_put_ accumulate, repeated", put(xm.clone(), xtwo, xtwo_cols, xv.index({0, Slice(0, 3)}), true),
       put(m.clone(), two, two_cols, v.index({0, Slice(0, 3)}), true), 1e-6},
      {"scatter dim 1", xm.index({Slice(0, 3)}).scatter(1, xat, xv), m.index({Slice(0, 3)}).scatter(1, at_, v), 0},
      {"scatter_ a value", xm.clone().scatter_(0, xdown, -1.5), m.clone().scatter_(0, down, -1.5), 0},
      {"flip", xt.flip({0, 2}), t.flip({0, 2}), 0},
      {"gradients", backwards(xgm, xtwo), backwards(gm, two), 1e-6},
  };
  const auto recorded = metrics();
  for (const auto& [op, n] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
}

// Indices on dims apart from each other put the broadcast index shape
// first; a boolean mask indexes by its true elements (read to the host,
// Note [Indexing by integer tensors]); index tensors on the CPU are
// uploaded. As the CPU, backwards included, with no fallback.
TEST_F(XlaIndexTest, IndicesApartBooleanMasksAndCpuIndicesMatchTheCpu) {
  using at::indexing::Slice;
  torch::manual_seed(63);
  const at::Tensor t = torch::randn({3, 4, 5}), v = torch::randn({2, 4});
  const at::Tensor first = torch::tensor({2, 0}, at::kLong), last = torch::tensor({4, -1}, at::kLong);
  const at::Tensor mask = t.select(2, 0) > 0.2, row_mask = torch::tensor({true, false, true});
  const at::Tensor xt = on(t), xv = on(v), xfirst = on(first), xlast = on(last), xmask = on(mask), xrow_mask = on(row_mask);
  at::Tensor g = t.clone().requires_grad_(true), xg = xt.clone().detach().requires_grad_(true);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  auto accumulate = [](at::Tensor x, const at::Tensor& i, const at::Tensor& val) {
    return x.index_put_(c10::List<std::optional<at::Tensor>>({i, std::nullopt, i}), val, /*accumulate=*/true);
  };
  auto masked_loss = [](const at::Tensor& x, const at::Tensor& m) {
    (x.index({m}).square().sum() + x.index({Slice(), Slice(), torch::tensor({1, 3})}).sum()).backward();
    return x.grad();
  };
  std::vector<Case> cases = {
      {"dims 0 and 2", xt.index({xfirst, Slice(), xlast}), t.index({first, Slice(), last}), 0},
      {"index_put_ on dims 0 and 2", xt.clone().index_put_({xfirst, Slice(), xlast}, xv),
       t.clone().index_put_({first, Slice(), last}, v), 0},
      {"accumulate on dims 0 and 2", accumulate(xt.clone(), xfirst, xv), accumulate(t.clone(), first, v), 1e-6},
      {"a mask over two dims", xt.index({xmask}), t.index({mask}), 0},
      {"a mask over the rows", xt.index({xrow_mask}), t.index({row_mask}), 0},
      {"a mask after a slice", xt.index({Slice(), Slice(), xt.select(0, 0).select(0, 0) > 0}),
       t.index({Slice(), Slice(), t.select(0, 0).select(0, 0) > 0}), 0},
      {"a mask on the CPU", xt.index({row_mask}), t.index({row_mask}), 0},
      {"indices on the CPU", xt.index({first, Slice(), last}), t.index({first, Slice(), last}), 0},
      {"masked fill through index_put_", xt.clone().index_put_({xmask}, at::scalar_tensor(0.0)),
       t.clone().index_put_({mask}, at::scalar_tensor(0.0)), 0},
      {"no true element", xt.index({xt.abs() > 100}), t.index({t.abs() > 100}), 0},
      {"gradients", masked_loss(xg, xmask), masked_loss(g, mask), 1e-6},
  };
  const auto recorded = metrics();
  for (const auto& [op, n] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
}

// Element-wise ops, reductions and matmuls of tensors with no elements
// record like any other (Note [Empty tensors] in lowering.h): no fallback,
// LibTorch's shapes and values (a sum over an empty dim is zeros).
TEST_F(XlaIndexTest, EmptyTensorsRecordWithoutFallingBack) {
  const at::Tensor e = torch::randn({0, 4}), w = torch::randn({4, 3});
  const at::Tensor xe = on(e), xw = on(w);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  at::Tensor xo = at::empty({0, 4}, xe.options()), o = at::empty({0, 4}, e.options());
  std::vector<Case> cases = {
      {"neg", xe.neg(), e.neg(), 0},
      {"exp then sigmoid", xe.exp().sigmoid(), e.exp().sigmoid(), 0},
      {"add broadcast", xe + xw.select(1, 0), e + w.select(1, 0), 0},
      {"sum over the empty dim", xe.sum(0), e.sum(0), 0},
      {"mean of a row-less tensor over dim 1", xe.mean(1), e.mean(1), 0},
      {"matmul", xe.matmul(xw), e.matmul(w), 0},
      {"contraction over an empty dim", xe.t().matmul(xe), e.t().matmul(e), 0},
      {"relu_ in place", xe.clone().relu_(), e.clone().relu_(), 0},
      {"tanh into an out tensor", at::tanh_out(xo, xe), at::tanh_out(o, e), 0},
  };
  const auto recorded = metrics();
  for (const auto& [op, n] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
}

// pow's backward with a 0-dim CPU exponent compares the exponent on the
// CPU and hands where() that CPU bool beside xla tensors: a host scalar,
// as the values are, and the gradient stays on the device.
TEST_F(XlaIndexTest, WhereTakesAZeroDimCpuConditionAsPowsBackwardDoes) {
  torch::manual_seed(63);
  const at::Tensor base = torch::rand({3, 5}) + 0.5;
  at::Tensor x = on(base).requires_grad_(true), cpu = base.clone().requires_grad_(true);
  const at::Tensor exponent = at::scalar_tensor(1.5, at::kDouble);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  at::pow(x, exponent).sum().backward();
  at::pow(cpu, exponent).sum().backward();
  const at::Tensor picked = at::where(at::scalar_tensor(true, at::kBool), on(base), on(base) * 2);
  // pow with a tensor exponent is not lowered yet: only where must stay.
  for (const auto& [op, n] : metrics().fallbacks)
    EXPECT_EQ(op.rfind("aten::where", 0), std::string::npos) << op << " fell back " << n << " times";
  ASSERT_EQ(x.grad().device(), x.device());
  EXPECT_TRUE(close(x.grad(), cpu.grad(), 1e-5));
  ASSERT_EQ(picked.device(), x.device());
  EXPECT_TRUE(close(picked, base, 0));
}

TEST_F(XlaIndexTest, ComparisonsMasksAndLogicalReductionsMatchTheCpu) {
  torch::manual_seed(64);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const at::Tensor a = torch::tensor({{1.0, -inf, 2.0}, {-inf, -inf, -inf}, {nan, 0.0, 3.0}});
  const at::Tensor b = torch::tensor({{1.0, 0.0, 2.5}, {-inf, 1.0, -2.0}, {nan, -0.0, 3.0}});
  const at::Tensor i = torch::tensor({{1, 0, 2}, {0, 0, 0}, {3, 0, 1}}, at::kInt);
  const at::Tensor xa = on(a), xb = on(b), xi = on(i);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  std::vector<Case> cases = {
      {"eq", xa == xb, a == b, 0},
      {"ne", xa != xb, a != b, 0},
      {"lt", xa < xb, a < b, 0},
      {"le of a transposed view", xa.t() <= xb, a.t() <= b, 0},
      {"gt int with float", xi > xa, i > a, 0},
      {"ge", xa >= xb, a >= b, 0},
      {"eq -inf", xa.eq(-inf), a.eq(-inf), 0},
      {"lt 0.5 of int", xi.lt(0.5), i.lt(0.5), 0},
      {"logical_not", xi.logical_not(), i.logical_not(), 0},
      {"all dim 1", xa.eq(-inf).all(1), a.eq(-inf).all(1), 0},
      {"all dim 1 keepdim", xi.all(1, true), i.all(1, true), 0},
      {"all", xi.all(), i.all(), 0},
      {"any dim 0", xi.any(0), i.any(0), 0},
      {"any", xa.isnan().any(), a.isnan().any(), 0},
      {"tril", xa.tril(), a.tril(), 0},
      {"tril -1 of bool", torch::ones({3, 4}, torch::TensorOptions(device_).dtype(at::kBool)).tril(-1),
       torch::ones({3, 4}, at::kBool).tril(-1), 0},
  };
  const auto recorded = metrics();
  for (const auto& [op, n] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
}

// The draws are the device's own (Note [Random bits on the device]), so
// the law is checked: the share of ones, and feature dropout's zeroing of
// whole channels with the survivors scaled by 1 / (1 - p).
TEST_F(XlaIndexTest, BernoulliAndFeatureDropoutFollowTheLaw) {
  torch::manual_seed(62);
  strata::xla::reset_metrics();
  const at::Tensor draws = torch::empty({4000}, device_).bernoulli_(0.3);
  const at::Tensor x = on(torch::rand({8, 16, 3, 3}) + 1);
  const at::Tensor y = torch::nn::functional::dropout2d(x, torch::nn::functional::Dropout2dFuncOptions().p(0.25));
  const auto recorded = metrics();
  for (const auto& [op, n] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  const at::Tensor d = draws.cpu();
  EXPECT_TRUE(torch::equal(d * (1 - d), torch::zeros({4000}))) << "only zeros and ones";
  EXPECT_NEAR(d.mean().item<double>(), 0.3, 0.03);  // 4 standard deviations: sqrt(0.21 / 4000) = 0.007
  const at::Tensor ratio = (y.cpu() / x.cpu()).view({8, 16, 9});
  const at::Tensor kept = ratio.select(2, 0) != 0;
  EXPECT_TRUE(torch::allclose(ratio, kept.unsqueeze(2).to(at::kFloat).expand({8, 16, 9}) / 0.75))
      << "each channel is all dropped or all kept and scaled";
  EXPECT_NEAR(kept.to(at::kFloat).mean().item<double>(), 0.75, 0.15);  // 128 channels: 4 standard deviations
}

TEST_F(XlaIndexTest, ScaledDotProductAttentionTakesItsMathFormAndMatchesTheCpu) {
  torch::manual_seed(63);
  const at::Tensor q = torch::randn({2, 2, 4, 8}, torch::requires_grad()), k = torch::randn({2, 2, 4, 8}),
                   v = torch::randn({2, 2, 4, 8});
  const at::Tensor xq = q.detach().to(device_).requires_grad_(), xk = on(k), xv = on(v);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  const at::Tensor y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  const at::Tensor xy = at::scaled_dot_product_attention(xq, xk, xv, {}, 0.0, /*is_causal=*/true);
  const at::Tensor g = torch::randn(y.sizes());
  y.backward(g);
  xy.backward(on(g));
  const auto recorded = metrics();
  for (const auto& [op, n] : recorded.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  EXPECT_TRUE(close(xy, y, 1e-5));
  EXPECT_TRUE(close(xq.grad(), q.grad(), 1e-5));
}

}  // namespace
