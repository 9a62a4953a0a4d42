// Forward hooks kept by the module itself (core/module_hooks.h), the
// variadic hooked_forward, and activation checkpointing with several
// tensors in and out.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>

#include <memory>
#include <tuple>
#include <vector>

#include "strata/core/module_hooks.h"
#include "strata/strategies/recompute.h"

namespace {

using strata::ForwardFn;
using strata::TensorList;

// Counts the calls and the tensors that went through it, and scales every
// output by 2 (so a test sees that the hooks really ran).
struct Doubling : strata::ForwardHooks {
  int calls = 0;
  size_t inputs_seen = 0;
  TensorList run(torch::nn::Module&, const TensorList& inputs, const ForwardFn& body) override {
    ++calls;
    inputs_seen += inputs.size();
    TensorList out = body(inputs);
    for (at::Tensor& t : out) t = t * 2;
    return out;
  }
};

struct Pair : torch::nn::Module {
  // Two tensors in, two out.
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& a, const at::Tensor& b) {
    return strata::hooked_forward(
        *this, [](const at::Tensor& x, const at::Tensor& y) { return std::make_tuple(x + y, x * y); }, a, b);
  }
};

TEST(ModuleHooksTest, HooksDoNotPassToAModuleBuiltAtAFreedModulesAddress) {
  auto hooks = std::make_shared<Doubling>();
  auto first = std::make_shared<Pair>();
  const void* address = first.get();
  strata::set_forward_hooks(*first, hooks);
  ASSERT_EQ(strata::forward_hooks(*first), hooks);
  first.reset();
  // The allocator hands the freed block out again for an object of the
  // same size; keep the others alive so each try gets a new block.
  std::vector<std::shared_ptr<Pair>> tries;
  std::shared_ptr<Pair> reused;
  for (int i = 0; i < 64 && !reused; ++i) {
    tries.push_back(std::make_shared<Pair>());
    if (tries.back().get() == address) reused = tries.back();
  }
  if (!reused) GTEST_SKIP() << "the allocator never reused the freed module's address";
  EXPECT_EQ(strata::forward_hooks(*reused), nullptr);
  auto [sum, product] = reused->forward(at::full({2}, 3.0), at::full({2}, 4.0));
  EXPECT_TRUE(sum.equal(at::full({2}, 7.0)));
  EXPECT_TRUE(product.equal(at::full({2}, 12.0)));
  EXPECT_EQ(hooks->calls, 0);
}

TEST(ModuleHooksTest, HooksLiveInTheModuleWithoutParametersAndAreRemovable) {
  torch::nn::Linear linear(3, 2);
  const size_t params = linear->parameters().size();
  auto hooks = std::make_shared<Doubling>();
  strata::set_forward_hooks(*linear, hooks);
  EXPECT_EQ(linear->parameters().size(), params);
  EXPECT_TRUE(linear->buffers().empty());
  bool holder_found = false;
  for (const auto& child : linear->children()) holder_found = holder_found || strata::is_forward_hooks_holder(*child);
  EXPECT_TRUE(holder_found);
  strata::set_forward_hooks(*linear, nullptr);
  EXPECT_EQ(strata::forward_hooks(*linear), nullptr);
  EXPECT_TRUE(linear->children().empty());
}

TEST(ModuleHooksTest, VariadicHookedForwardRunsEveryTensorThroughTheHooks) {
  Pair pair;
  auto hooks = std::make_shared<Doubling>();
  strata::set_forward_hooks(pair, hooks);
  auto [sum, product] = pair.forward(at::full({2}, 3.0), at::full({2}, 4.0));
  EXPECT_EQ(hooks->calls, 1);
  EXPECT_EQ(hooks->inputs_seen, 2u);
  EXPECT_TRUE(sum.equal(at::full({2}, 14.0)));
  EXPECT_TRUE(product.equal(at::full({2}, 24.0)));
  strata::set_forward_hooks(pair, nullptr);
  auto [plain_sum, plain_product] = pair.forward(at::full({2}, 3.0), at::full({2}, 4.0));
  EXPECT_TRUE(plain_sum.equal(at::full({2}, 7.0)));
  EXPECT_EQ(hooks->calls, 1);
}

// LibTorch's modules whose forward returns a tuple, nested for the LSTM:
// strata::call compiles for them and returns what forward returns, every
// tensor of it through the hooks.
TEST(ModuleHooksTest, CallTakesModulesThatReturnTuplesNestedOrNot) {
  at::manual_seed(2);
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(3, 4).batch_first(true));
  torch::nn::GRU gru(torch::nn::GRUOptions(3, 4).batch_first(true));
  torch::nn::MultiheadAttention attention(4, 2);
  at::Tensor x = at::randn({2, 5, 3}), q = at::randn({5, 2, 4});
  auto lstm_plain = lstm->forward(x);
  auto gru_plain = gru->forward(x);
  auto attention_plain = attention->forward(q, q, q);
  auto hooks = std::make_shared<Doubling>();
  strata::set_forward_hooks(*lstm, hooks);
  strata::set_forward_hooks(*gru, hooks);
  strata::set_forward_hooks(*attention, hooks);

  std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>> lstm_out = strata::call(lstm, x);
  EXPECT_TRUE(at::allclose(std::get<0>(lstm_out), std::get<0>(lstm_plain) * 2));
  EXPECT_TRUE(at::allclose(std::get<0>(std::get<1>(lstm_out)), std::get<0>(std::get<1>(lstm_plain)) * 2));
  EXPECT_TRUE(at::allclose(std::get<1>(std::get<1>(lstm_out)), std::get<1>(std::get<1>(lstm_plain)) * 2));
  std::tuple<at::Tensor, at::Tensor> gru_out = strata::call(gru, x);
  EXPECT_TRUE(at::allclose(std::get<1>(gru_out), std::get<1>(gru_plain) * 2));
  std::tuple<at::Tensor, at::Tensor> attention_out = strata::call(attention, q, q, q);
  EXPECT_TRUE(at::allclose(std::get<0>(attention_out), std::get<0>(attention_plain) * 2));
  EXPECT_TRUE(at::allclose(std::get<1>(attention_out), std::get<1>(attention_plain) * 2));
  EXPECT_EQ(hooks->calls, 3);
  EXPECT_EQ(hooks->inputs_seen, 5u);
}

TEST(RecomputeTest, SeveralInputsAndOutputsGetThePlainGradients) {
  torch::nn::Linear a(4, 4), b(4, 4);
  auto body = [&](const TensorList& in) {
    at::Tensor h = at::tanh(a->forward(in[0]) + in[1]);
    return TensorList{h, b->forward(h * in[1])};
  };
  at::Tensor x = at::randn({3, 4}).requires_grad_(true);
  at::Tensor y = at::randn({3, 4}).requires_grad_(true);
  auto loss_of = [](const TensorList& out) { return (out[0].sum() + (out[1] * out[1]).sum()); };

  loss_of(body({x, y})).backward();
  std::vector<at::Tensor> plain = {x.grad().clone(), y.grad().clone(), a->weight.grad().clone(),
                                   b->weight.grad().clone()};
  for (at::Tensor t : {x, y, a->weight, b->weight}) t.mutable_grad() = at::Tensor();

  TensorList out = strata::strategies::recomputed_forward(ForwardFn(body), TensorList{x, y});
  ASSERT_EQ(out.size(), 2u);
  loss_of(out).backward();
  std::vector<at::Tensor> recomputed = {x.grad(), y.grad(), a->weight.grad(), b->weight.grad()};
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(recomputed[i].defined()) << i;
    EXPECT_TRUE(at::allclose(plain[i], recomputed[i], 1e-6, 1e-6)) << i;
  }
}

// Note [One update of the running statistics]: a buffer the forward
// updates in place (a running count) moves once, not again in the
// recomputation.
TEST(RecomputeTest, ABufferTheForwardUpdatesMovesOnce) {
  torch::nn::Linear a(4, 4);
  at::Tensor count = at::zeros({1});
  auto body = [&](const TensorList& in) {
    count.add_(1);
    return TensorList{a->forward(in[0])};
  };
  at::Tensor x = at::randn({3, 4}).requires_grad_(true);
  TensorList out = strata::strategies::recomputed_forward(ForwardFn(body), TensorList{x}, {count});
  out[0].sum().backward();
  EXPECT_EQ(count.item<float>(), 1.0f) << "the recomputation moved the count again";
  ASSERT_TRUE(a->weight.grad().defined());
}

}  // namespace
